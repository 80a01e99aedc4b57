//! The process API's durable state (stored through `crate::state`): per process its record (`meta.json`: command, arguments,
//! creation, and how it ended) and its output as it is written (`events.log`, one record per
//! chunk: the chunk's start offset + 1 as the id, then its stream, time and bytes). After a
//! restart every process is listed again with that output (within the log cap); one that was
//! still running at the crash is `exited` with the reason `daemon_restart`. None is restarted.

use std::sync::{Arc, Mutex};

use bytes::Bytes;
use serde::{Deserialize, Serialize};

use crate::processes::log::{Chunk, LogStream};
use crate::state::{Durable, Entry, StateStore};
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

/// Reads one process record back; `None` when it is not one (the caller moves it aside).
pub fn recover(e: Entry) -> Option<RecoveredProcess> {
    let meta = serde_json::from_value::<ProcMeta>(e.meta).ok()?;
    if meta.id != e.name {
        return None;
    }
    let mut chunks = Vec::with_capacity(e.records.len());
    for (id, payload) in e.records {
        if payload.len() < 9 || id == 0 {
            return None;
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
    Some(RecoveredProcess { meta, exit, chunks })
}

/// One process's durable state.
pub struct ProcTrack {
    d: Durable,
    meta: Mutex<ProcMeta>,
}

impl ProcTrack {
    /// The one constructor: `fresh` for a new process (its entry starts afresh), otherwise the
    /// record goes on with the files it has (recovered at start, or carried by a reload).
    pub fn new(store: &Arc<StateStore>, meta: ProcMeta, fresh: bool) -> Arc<Self> {
        let t = Arc::new(ProcTrack {
            d: store.entry("processes", &meta.id, fresh),
            meta: Mutex::new(meta),
        });
        t.write_meta();
        t
    }

    fn write_meta(&self) {
        let meta = crate::sys::lock(&self.meta);
        self.d.meta(serde_json::to_vec(&*meta).unwrap_or_default());
    }

    /// Waits until the output appended so far is written (see `Durable::written`).
    pub async fn written(&self) {
        self.d.written().await
    }

    /// One chunk of output (never blocks).
    pub fn output(&self, start: u64, stream: LogStream, at_ms: u64, data: &[u8]) {
        let mut p = Vec::with_capacity(9 + data.len());
        p.push(match stream {
            LogStream::Stdout => 0,
            LogStream::Stderr => 1,
            LogStream::Pty => 2,
        });
        p.extend_from_slice(&at_ms.to_le_bytes());
        p.extend_from_slice(data);
        self.d.append(start + 1, Bytes::from(p));
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
        let reason = if self.d.store().is_stopping() {
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

    /// The record was deleted (or forgotten): its state goes, and nothing more is written.
    pub fn forget(&self) {
        self.d.forget();
    }
}
