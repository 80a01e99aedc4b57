//! The process API's durable state: per process its record (`meta.json`: command, arguments,
//! creation, and how it ended) and its output as it is written (`events.log`, one record per
//! chunk: the chunk's start offset + 1 as the id, then its stream, time and bytes). After a
//! restart every process is listed again with that output (within the log cap); one that was
//! still running at the crash is `exited` with the reason `daemon_restart`. None is restarted.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::StateStore;
use crate::processes::log::{Chunk, LogStream};
use crate::supervisor::{ExitInfo, ExitReason};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ProcMeta {
    pub id: String,
    pub command: String,
    pub args: Vec<String>,
    #[serde(default)]
    pub cwd: Option<String>,
    pub tty: bool,
    pub interactive: bool,
    pub created_at_ms: u64,
    #[serde(default)]
    pub exit: Option<ProcExit>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ProcExit {
    pub reason: ExitReason,
    pub code: Option<i32>,
    pub signal: Option<i32>,
    pub exited_at_ms: u64,
}

pub struct RecoveredProcess {
    pub meta: ProcMeta,
    /// How it ended (`daemon_restart` for one that still ran) and when.
    pub exit: (ExitInfo, u64),
    pub chunks: Vec<Chunk>,
}

pub(super) fn recover(
    name: &str,
    meta: &Value,
    records: Vec<(u64, Bytes)>,
    out: &mut Vec<RecoveredProcess>,
) -> bool {
    let Ok(meta) = serde_json::from_value::<ProcMeta>(meta.clone()) else {
        return false;
    };
    if meta.id != name {
        return false;
    }
    let mut chunks = Vec::with_capacity(records.len());
    for (id, payload) in records {
        if payload.len() < 9 {
            return false;
        }
        let stream = match payload[0] {
            0 => LogStream::Stdout,
            1 => LogStream::Stderr,
            _ => LogStream::Pty,
        };
        let at_ms = u64::from_le_bytes(payload[1..9].try_into().expect("8 bytes"));
        chunks.push(Chunk {
            start: id - 1,
            stream,
            at_ms,
            data: payload.slice(9..),
        });
    }
    let last_at = chunks.last().map_or(meta.created_at_ms, |c| c.at_ms);
    let exit = match &meta.exit {
        Some(e) => (
            ExitInfo {
                reason: e.reason,
                code: e.code,
                signal: e.signal,
            },
            e.exited_at_ms,
        ),
        None => (
            ExitInfo {
                reason: ExitReason::DaemonRestart,
                code: None,
                signal: None,
            },
            last_at,
        ),
    };
    out.push(RecoveredProcess { meta, exit, chunks });
    true
}

/// One process's durable state.
pub struct ProcTrack {
    store: Arc<StateStore>,
    key: Arc<str>,
    off: AtomicBool,
    meta: Mutex<ProcMeta>,
}

impl ProcTrack {
    pub fn new(store: Arc<StateStore>, meta: ProcMeta) -> Arc<Self> {
        let t = Arc::new(ProcTrack {
            store,
            key: format!("processes/{}", meta.id).into(),
            off: AtomicBool::new(false),
            meta: Mutex::new(meta),
        });
        t.write_meta();
        t
    }

    fn write_meta(&self) {
        let json = serde_json::to_vec(&*crate::sys::lock(&self.meta)).unwrap_or_default();
        self.store.meta(&self.key, json);
    }

    /// One chunk of output (never blocks).
    pub fn output(&self, start: u64, stream: LogStream, at_ms: u64, data: &[u8]) {
        if self.off.load(Ordering::Acquire) {
            return;
        }
        let mut p = Vec::with_capacity(9 + data.len());
        p.push(match stream {
            LogStream::Stdout => 0,
            LogStream::Stderr => 1,
            LogStream::Pty => 2,
        });
        p.extend_from_slice(&at_ms.to_le_bytes());
        p.extend_from_slice(data);
        if !self.store.append(&self.key, start + 1, Bytes::from(p)) {
            self.off.store(true, Ordering::Release);
        }
    }

    /// Writes the chunks of `log` that start at `from` or later: what a log carried across a
    /// reload holds that the disk does not (output taken just before the reload's exec, or
    /// everything when the previous image had no state dir).
    pub fn catch_up(&self, log: &crate::processes::OutputLog, from: u64) {
        let read = log.read_after(from, crate::processes::StreamFilter::Combined, usize::MAX);
        for c in read.chunks.iter().filter(|c| c.start >= from) {
            self.output(c.start, c.stream, c.at_ms, &c.data);
        }
    }

    /// The process ended: its record says how, for the next start.
    /// One stopped by the daemon's own shutdown is recorded as ended by the restart.
    pub fn ended(&self, exit: &ExitInfo, at_ms: u64) {
        let reason = if self.store.is_stopping() {
            ExitReason::DaemonRestart
        } else {
            exit.reason
        };
        crate::sys::lock(&self.meta).exit = Some(ProcExit {
            reason,
            code: exit.code,
            signal: exit.signal,
            exited_at_ms: at_ms,
        });
        self.write_meta();
    }

    /// The record was deleted (or forgotten): its state goes too.
    pub fn forget(&self) {
        self.off.store(true, Ordering::Release);
        self.store.remove(&self.key);
    }
}
