//! Durable state (`--state-dir`): what the daemon must still know after it was restarted,
//! crashed or was restored from a snapshot — every serverId's event log and sessions, every
//! process record and its final output.
//!
//! Layout: `DIR/acp/<serverId>/{meta.json,events.log}` and `DIR/processes/<id>/{meta.json,
//! output.log}`. A *log* is an append-only file of CRC-checked records (`log.rs`); a *meta* is
//! a small JSON document replaced atomically (temporary + rename).
//!
//! **Invariant:** nothing on the request path waits for the disk. Appends and meta updates go
//! to one writer thread through a bounded queue with `try_send`; when the queue is full the
//! entry's owner (one serverId) stops being durable (its files are removed, a WARN says so),
//! and any write error (a full disk, `--state-total-bytes`) turns the whole store to memory-only
//! with a WARN; `GET /v1/health` then says `"durable": false`. The API never stops for it.
//!
//! What a crash can lose: the entries still in the queue (not yet written) and, on a power
//! failure, what was written but not yet synced (`--state-sync`). Ids issued but lost are
//! skipped after the restart (`RESTART_ID_SKIP`), never reused.

pub mod acp;
pub mod log;
pub mod processes;

use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, SyncSender, TrySendError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;

use crate::config::{Config, StateSync};

/// Entries the writer queue holds; a full queue makes the entry's owner memory-only.
pub const QUEUE: usize = 16 * 1024;

/// After a restart the numbering of a recovered log resumes this far beyond its last record on
/// disk: every id that may have been issued (and seen by a client) but was still in the queue at
/// the crash lies in between, so none is ever issued twice. Larger than `QUEUE`.
pub const RESTART_ID_SKIP: u64 = QUEUE as u64 + 1;

/// One thing for the writer to do.
enum Op {
    /// Replace `key`'s meta.json.
    Meta { key: Arc<str>, json: Vec<u8> },
    /// Append a record to `key`'s log.
    Append {
        key: Arc<str>,
        id: u64,
        payload: Bytes,
    },
    /// Remove `key`'s directory.
    Remove { key: Arc<str> },
    /// Everything sent before is written and synced: answer.
    Barrier(std::sync::mpsc::Sender<()>),
}

/// The file names under a key's directory.
const META: &str = "meta.json";
const LOG: &str = "events.log";

/// Shared between the handles and the writer.
struct Shared {
    durable: AtomicBool,
    /// Why the store went memory-only (the first reason).
    problem: Mutex<Option<String>>,
    /// Keys whose queue overflowed: the writer removes their files and ignores them.
    abandoned: Mutex<HashSet<Arc<str>>>,
    abandon_pending: AtomicBool,
    /// The daemon is stopping: what ends now ends because of it.
    stopping: AtomicBool,
}

impl Shared {
    fn degrade(&self, why: String) {
        if self.durable.swap(false, Ordering::AcqRel) {
            tracing::warn!(problem = %why,
                "the state dir is no longer written: state is kept in memory only from now on");
            *crate::sys::lock(&self.problem) = Some(why);
        }
    }
}

/// The store: a handle to the writer thread plus what was recovered at start.
pub struct StateStore {
    dir: PathBuf,
    tx: SyncSender<Op>,
    shared: Arc<Shared>,
}

/// Everything found in the state dir at start.
#[derive(Default)]
pub struct Recovered {
    pub acp: Vec<acp::RecoveredInstance>,
    pub processes: Vec<processes::RecoveredProcess>,
}

/// How a key's log is retained on disk.
#[derive(Debug, Clone, Copy)]
pub struct Retention {
    /// Newest records kept at a compaction (the memory ring's `--event-buffer`).
    pub events: usize,
    /// Bytes of payload kept at a compaction.
    pub bytes: u64,
    /// A log is compacted when it grows past this (`--state-max-bytes`, or twice `bytes`).
    pub max_file: u64,
}

impl StateStore {
    /// Opens (creating) the state dir, reads back what it holds (cutting corrupt tails) and
    /// starts the writer thread. Blocking: call it on the blocking pool.
    pub fn open(config: &Config, dir: &Path) -> anyhow::Result<(Arc<StateStore>, Recovered)> {
        use anyhow::Context as _;
        for sub in ["acp", "processes"] {
            std::fs::create_dir_all(dir.join(sub))
                .with_context(|| format!("cannot create the state dir {}", dir.display()))?;
        }
        let mut sizes = HashMap::new();
        let mut recovered = Recovered::default();
        for (sub, is_acp) in [("acp", true), ("processes", false)] {
            let entries = std::fs::read_dir(dir.join(sub))
                .with_context(|| format!("cannot read {}", dir.join(sub).display()))?;
            for e in entries.flatten() {
                let name = e.file_name().to_string_lossy().into_owned();
                let path = e.path();
                if !path.is_dir() {
                    continue;
                }
                let key: Arc<str> = format!("{sub}/{name}").into();
                match read_entry(&path) {
                    Ok((meta, log)) => {
                        if log.cut > 0 {
                            tracing::warn!(key = %key, bytes = log.cut,
                                "cut a corrupt or truncated tail off a state log");
                        }
                        sizes.insert(key.clone(), (log.good_len, log.records.len() as u64));
                        let ok = if is_acp {
                            acp::recover(&name, &meta, log.records, &mut recovered.acp)
                        } else {
                            processes::recover(&name, &meta, log.records, &mut recovered.processes)
                        };
                        if !ok {
                            tracing::warn!(key = %key, "dropped unreadable state");
                            let _ = std::fs::remove_dir_all(&path);
                            sizes.remove(&key);
                        }
                    }
                    Err(e) => {
                        tracing::warn!(key = %key, error = %e, "dropped unreadable state");
                        let _ = std::fs::remove_dir_all(&path);
                    }
                }
            }
        }
        let (tx, rx) = std::sync::mpsc::sync_channel(QUEUE);
        let shared = Arc::new(Shared {
            durable: AtomicBool::new(true),
            problem: Mutex::new(None),
            abandoned: Mutex::new(HashSet::new()),
            abandon_pending: AtomicBool::new(false),
            stopping: AtomicBool::new(false),
        });
        let retention = Retention {
            events: config.event_buffer.max(1),
            bytes: config
                .event_buffer_bytes
                .min(config.state_max_bytes / 2)
                .max(1),
            max_file: config
                .state_max_bytes
                .min(config.event_buffer_bytes.saturating_mul(2)),
        };
        let mut writer = Writer {
            dir: dir.to_path_buf(),
            open: HashMap::new(),
            sizes,
            total: 0,
            total_cap: config.state_total_bytes,
            retention,
            sync: config.state_sync,
            shared: shared.clone(),
            abandoned: HashSet::new(),
            dirty_since: None,
            buf: Vec::with_capacity(64 * 1024),
        };
        writer.total = writer.sizes.values().map(|s| s.0).sum();
        std::thread::Builder::new()
            .name("state-writer".into())
            .spawn(move || writer.run(rx))
            .context("cannot start the state writer thread")?;
        Ok((
            Arc::new(StateStore {
                dir: dir.to_path_buf(),
                tx,
                shared,
            }),
            recovered,
        ))
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// False once the store went memory-only (a full disk, the total cap, a write error).
    pub fn is_durable(&self) -> bool {
        self.shared.durable.load(Ordering::Acquire)
    }

    /// The daemon stops: processes that end from now on are recorded as ended by the restart.
    pub fn set_stopping(&self) {
        self.shared.stopping.store(true, Ordering::Release);
    }

    pub fn is_stopping(&self) -> bool {
        self.shared.stopping.load(Ordering::Acquire)
    }

    /// Why the store is not durable, if it is not.
    pub fn problem(&self) -> Option<String> {
        crate::sys::lock(&self.shared.problem).clone()
    }

    fn send(&self, key: &Arc<str>, op: Op) -> bool {
        if !self.is_durable() {
            return false;
        }
        match self.tx.try_send(op) {
            Ok(()) => true,
            Err(TrySendError::Full(_)) => {
                self.abandon(
                    key,
                    "the state writer's queue is full (the disk is too slow)",
                );
                false
            }
            Err(TrySendError::Disconnected(_)) => {
                self.shared
                    .degrade("the state writer thread is gone".to_string());
                false
            }
        }
    }

    /// `key` stops being durable: its files are removed (a log with a hole would replay as if
    /// complete), and it is kept in memory only.
    fn abandon(&self, key: &Arc<str>, why: &str) {
        let first = crate::sys::lock(&self.shared.abandoned).insert(key.clone());
        self.shared.abandon_pending.store(true, Ordering::Release);
        if first {
            tracing::warn!(key = %key, problem = why,
                "no longer written to the state dir: kept in memory only");
            *crate::sys::lock(&self.shared.problem) = Some(format!("{key}: {why}"));
        }
    }

    /// True when `key` was abandoned (its queue overflowed).
    fn is_abandoned(&self, key: &Arc<str>) -> bool {
        self.shared.abandon_pending.load(Ordering::Acquire)
            && crate::sys::lock(&self.shared.abandoned).contains(key)
    }

    pub(crate) fn meta(&self, key: &Arc<str>, json: Vec<u8>) {
        if !self.is_abandoned(key) {
            self.send(
                key,
                Op::Meta {
                    key: key.clone(),
                    json,
                },
            );
        }
    }

    /// Never blocks (see the module doc).
    pub(crate) fn append(&self, key: &Arc<str>, id: u64, payload: Bytes) -> bool {
        self.send(
            key,
            Op::Append {
                key: key.clone(),
                id,
                payload,
            },
        )
    }

    pub(crate) fn remove(&self, key: &Arc<str>) {
        // Removal must not be lost to a full queue: it waits for room on the blocking pool
        // when it has to (rare: only DELETEs do this).
        match self.tx.try_send(Op::Remove { key: key.clone() }) {
            Ok(()) => {}
            Err(TrySendError::Full(op)) => {
                let tx = self.tx.clone();
                tokio::task::spawn_blocking(move || {
                    let _ = tx.send(op);
                });
            }
            Err(TrySendError::Disconnected(_)) => {}
        }
    }

    /// Waits (blocking) until everything queued so far is written and synced, or `timeout`.
    pub fn flush_blocking(&self, timeout: Duration) -> bool {
        let (tx, rx) = std::sync::mpsc::channel();
        let deadline = Instant::now() + timeout;
        let mut op = Op::Barrier(tx);
        loop {
            match self.tx.try_send(op) {
                Ok(()) => break,
                Err(TrySendError::Full(back)) if Instant::now() < deadline => {
                    op = back;
                    std::thread::sleep(Duration::from_millis(5));
                }
                Err(_) => return false,
            }
        }
        rx.recv_timeout(deadline.saturating_duration_since(Instant::now()))
            .is_ok()
    }
}

fn read_entry(path: &Path) -> anyhow::Result<(serde_json::Value, log::LogRead)> {
    let meta = std::fs::read(path.join(META))?;
    let meta: serde_json::Value = serde_json::from_slice(&meta)?;
    let log = log::read_and_repair(&path.join(LOG))?;
    Ok((meta, log))
}

struct OpenLog {
    file: File,
    bytes: u64,
    records: u64,
    dirty: bool,
}

struct Writer {
    dir: PathBuf,
    open: HashMap<Arc<str>, OpenLog>,
    /// (bytes, records) of each key's log on disk, also for logs not open.
    sizes: HashMap<Arc<str>, (u64, u64)>,
    total: u64,
    total_cap: u64,
    retention: Retention,
    sync: StateSync,
    shared: Arc<Shared>,
    abandoned: HashSet<Arc<str>>,
    dirty_since: Option<Instant>,
    buf: Vec<u8>,
}

impl Writer {
    fn run(mut self, rx: Receiver<Op>) {
        let mut batch = Vec::with_capacity(1024);
        loop {
            let wait = match (self.sync, self.dirty_since) {
                (StateSync::Batch(d), Some(t)) => d.saturating_sub(t.elapsed()),
                _ => Duration::from_secs(3600),
            };
            match rx.recv_timeout(wait) {
                Ok(op) => batch.push(op),
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => {
                    self.sync_all();
                    return;
                }
            }
            while batch.len() < 1024 {
                match rx.try_recv() {
                    Ok(op) => batch.push(op),
                    Err(_) => break,
                }
            }
            if self.shared.abandon_pending.load(Ordering::Acquire) {
                self.take_abandoned();
            }
            let mut barriers = Vec::new();
            for op in batch.drain(..) {
                match op {
                    Op::Barrier(tx) => barriers.push(tx),
                    op if self.shared.durable.load(Ordering::Acquire) => {
                        if let Err(e) = self.apply(op) {
                            self.shared.degrade(e);
                        }
                    }
                    _ => {}
                }
            }
            let due = match self.sync {
                StateSync::Every => true,
                StateSync::Batch(d) => self.dirty_since.is_some_and(|t| t.elapsed() >= d),
                StateSync::Os => false,
            };
            if due || !barriers.is_empty() {
                self.sync_all();
            }
            for b in barriers {
                let _ = b.send(());
            }
        }
    }

    fn take_abandoned(&mut self) {
        let keys: Vec<Arc<str>> = crate::sys::lock(&self.shared.abandoned)
            .iter()
            .cloned()
            .collect();
        for k in keys {
            if self.abandoned.insert(k.clone()) {
                self.drop_key(&k);
            }
        }
    }

    fn drop_key(&mut self, key: &Arc<str>) {
        self.open.remove(key);
        if let Some((b, _)) = self.sizes.remove(key) {
            self.total = self.total.saturating_sub(b);
        }
        let _ = std::fs::remove_dir_all(self.dir.join(&**key));
    }

    fn apply(&mut self, op: Op) -> Result<(), String> {
        let key = match &op {
            Op::Meta { key, .. } | Op::Append { key, .. } | Op::Remove { key } => key.clone(),
            Op::Barrier(_) => return Ok(()),
        };
        if self.abandoned.contains(&key) {
            return Ok(());
        }
        let dir = self.dir.join(&*key);
        match op {
            Op::Meta { json, .. } => {
                std::fs::create_dir_all(&dir).map_err(|e| io_problem(&dir, &e))?;
                let tmp = dir.join("meta.json.tmp");
                let mut f = File::create(&tmp).map_err(|e| io_problem(&tmp, &e))?;
                f.write_all(&json).map_err(|e| io_problem(&tmp, &e))?;
                if self.sync != StateSync::Os {
                    f.sync_data().map_err(|e| io_problem(&tmp, &e))?;
                }
                std::fs::rename(&tmp, dir.join(META)).map_err(|e| io_problem(&tmp, &e))?;
            }
            Op::Append { id, payload, .. } => {
                let need = (log::HEADER + payload.len()) as u64;
                if self.total + need > self.total_cap {
                    return Err(format!(
                        "the state dir holds --state-total-bytes ({} bytes)",
                        self.total_cap
                    ));
                }
                if !self.open.contains_key(&key) {
                    std::fs::create_dir_all(&dir).map_err(|e| io_problem(&dir, &e))?;
                    let path = dir.join(LOG);
                    let file = std::fs::OpenOptions::new()
                        .create(true)
                        .append(true)
                        .open(&path)
                        .map_err(|e| io_problem(&path, &e))?;
                    let (bytes, records) = self.sizes.get(&key).copied().unwrap_or((0, 0));
                    self.open.insert(
                        key.clone(),
                        OpenLog {
                            file,
                            bytes,
                            records,
                            dirty: false,
                        },
                    );
                }
                self.buf.clear();
                log::encode(&mut self.buf, id, &payload);
                let o = self.open.get_mut(&key).expect("opened above");
                if let Err(e) = o.file.write_all(&self.buf) {
                    // Leave no half record behind for the next start to cut.
                    let _ = o.file.set_len(o.bytes);
                    return Err(io_problem(&dir.join(LOG), &e));
                }
                o.bytes += need;
                o.records += 1;
                o.dirty = true;
                self.total += need;
                self.sizes.insert(key.clone(), (o.bytes, o.records));
                self.dirty_since.get_or_insert_with(Instant::now);
                let r = self.retention;
                if o.bytes > r.max_file || o.records > 2 * r.events as u64 {
                    self.compact(&key)?;
                }
            }
            Op::Remove { .. } => {
                self.open.remove(&key);
                if let Some((b, _)) = self.sizes.remove(&key) {
                    self.total = self.total.saturating_sub(b);
                }
                match std::fs::remove_dir_all(&dir) {
                    Ok(()) => {}
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                    Err(e) => return Err(io_problem(&dir, &e)),
                }
            }
            Op::Barrier(_) => {}
        }
        Ok(())
    }

    /// Rewrites `key`'s log with the newest records within the retention (the newest always).
    fn compact(&mut self, key: &Arc<str>) -> Result<(), String> {
        let path = self.dir.join(&**key).join(LOG);
        self.open.remove(key);
        let read = log::read_and_repair(&path).map_err(|e| io_problem(&path, &e))?;
        let r = self.retention;
        let mut kept = 0usize;
        let mut bytes = 0u64;
        let mut start = read.records.len();
        for (i, (_, p)) in read.records.iter().enumerate().rev() {
            let size = p.len() as u64;
            if kept > 0 && (kept >= r.events || bytes + size > r.bytes) {
                break;
            }
            kept += 1;
            bytes += size;
            start = i;
        }
        let new_len =
            log::rewrite(&path, &read.records[start..]).map_err(|e| io_problem(&path, &e))?;
        let old = self.sizes.get(key).map_or(0, |s| s.0);
        self.total = self.total.saturating_sub(old) + new_len;
        self.sizes.insert(key.clone(), (new_len, kept as u64));
        Ok(())
    }

    fn sync_all(&mut self) {
        let mut failed = None;
        for (k, o) in self.open.iter_mut() {
            if o.dirty {
                o.dirty = false;
                if let Err(e) = o.file.sync_data() {
                    failed = Some(io_problem(&self.dir.join(&**k), &e));
                }
            }
        }
        self.dirty_since = None;
        if let Some(f) = failed {
            self.shared.degrade(f);
        }
    }
}

fn io_problem(path: &Path, e: &std::io::Error) -> String {
    format!("{}: {e}", path.display())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(dir: &Path, events: usize, max_bytes: u64, total: u64) -> Config {
        let mut c = Config::defaults();
        c.state_dir = Some(dir.to_path_buf());
        c.state_sync = StateSync::Every;
        c.event_buffer = events;
        c.state_max_bytes = max_bytes;
        c.state_total_bytes = total;
        c
    }

    fn meta(store: &StateStore, key: &Arc<str>) {
        let m = acp::AcpMeta {
            agent: "mock".into(),
            ..Default::default()
        };
        store.meta(key, serde_json::to_vec(&m).unwrap());
    }

    /// A log is compacted to the retained window (the newest events) once it outgrows twice
    /// that, so the disk holds what memory would, and the restart numbers on past every id.
    #[test]
    fn compaction_keeps_the_newest_window_and_recovery_skips_ahead() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("state");
        let c = config(&dir, 10, 1 << 20, 1 << 30);
        let (store, rec) = StateStore::open(&c, &dir).unwrap();
        assert!(rec.acp.is_empty());
        let key: Arc<str> = "acp/s1".into();
        meta(&store, &key);
        for id in 1..=105u64 {
            assert!(store.append(&key, id, Bytes::from(format!("{{\"n\":{id}}}"))));
        }
        assert!(store.flush_blocking(Duration::from_secs(10)));
        let on_disk = log::read_and_repair(&dir.join("acp/s1/events.log")).unwrap();
        assert!(on_disk.records.len() <= 20, "{}", on_disk.records.len());
        assert_eq!(on_disk.records.last().unwrap().0, 105);
        drop(store);
        let (_store, rec) = StateStore::open(&c, &dir).unwrap();
        let r = &rec.acp[0];
        assert_eq!(r.server_id, "s1");
        assert_eq!(r.meta.agent, "mock");
        assert_eq!(r.events.last().unwrap().0, 105);
        assert_eq!(r.next_id, 105 + RESTART_ID_SKIP + 1);
    }

    /// Over `--state-total-bytes` the store turns memory-only and says why; nothing more is
    /// written.
    #[test]
    fn the_total_cap_turns_the_store_memory_only() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("state");
        let c = config(&dir, 4096, 1 << 20, 4096);
        let (store, _) = StateStore::open(&c, &dir).unwrap();
        let key: Arc<str> = "acp/big".into();
        meta(&store, &key);
        let line = Bytes::from(vec![b'x'; 1000]);
        for id in 1..=10u64 {
            store.append(&key, id, line.clone());
        }
        store.flush_blocking(Duration::from_secs(10));
        assert!(!store.is_durable());
        assert!(store.problem().unwrap().contains("--state-total-bytes"));
        let size = std::fs::metadata(dir.join("acp/big/events.log"))
            .unwrap()
            .len();
        assert!(size <= 4096, "{size}");
        assert!(!store.append(&key, 11, line));
    }

    /// A key whose queue overflowed is abandoned: its files are removed, later entries are
    /// ignored, the reason is reported, and the rest of the store stays durable.
    #[test]
    fn an_abandoned_key_is_removed_and_ignored() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("state");
        let c = config(&dir, 100, 1 << 20, 1 << 30);
        let (store, _) = StateStore::open(&c, &dir).unwrap();
        let (slow, other): (Arc<str>, Arc<str>) = ("acp/slow".into(), "acp/other".into());
        meta(&store, &slow);
        meta(&store, &other);
        store.append(&slow, 1, Bytes::from_static(b"{}"));
        store.flush_blocking(Duration::from_secs(10));
        assert!(dir.join("acp/slow/events.log").exists());
        store.abandon(
            &slow,
            "the state writer's queue is full (the disk is too slow)",
        );
        store.append(&slow, 2, Bytes::from_static(b"{}"));
        store.meta(&slow, b"{}".to_vec());
        store.append(&other, 1, Bytes::from_static(b"{}"));
        store.flush_blocking(Duration::from_secs(10));
        assert!(!dir.join("acp/slow").exists());
        assert!(dir.join("acp/other/events.log").exists());
        assert!(store.is_durable());
        assert!(store.problem().unwrap().starts_with("acp/slow: "));
    }

    /// A removed key's files are gone, and unreadable entries are dropped at open.
    #[test]
    fn remove_and_unreadable_entries() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("state");
        let c = config(&dir, 100, 1 << 20, 1 << 30);
        let (store, _) = StateStore::open(&c, &dir).unwrap();
        let key: Arc<str> = "acp/gone".into();
        meta(&store, &key);
        store.append(&key, 1, Bytes::from_static(b"{}"));
        store.flush_blocking(Duration::from_secs(10));
        assert!(dir.join("acp/gone/events.log").exists());
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        rt.block_on(async { store.remove(&key) });
        store.flush_blocking(Duration::from_secs(10));
        assert!(!dir.join("acp/gone").exists());
        std::fs::create_dir_all(dir.join("acp/bad")).unwrap();
        std::fs::write(dir.join("acp/bad/meta.json"), b"not json").unwrap();
        drop(store);
        let (_s, rec) = StateStore::open(&c, &dir).unwrap();
        assert!(rec.acp.is_empty());
        assert!(!dir.join("acp/bad").exists());
    }
}
