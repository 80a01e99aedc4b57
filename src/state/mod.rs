//! Durable state (`--state-dir`), storage only: the dir (its lock, its ownership, its
//! permissions: `dir.rs`), the record log (`log.rs`), the sealing of secrets (`seal.rs`) and the
//! store, whose one writer thread appends records and replaces `meta.json` files. What is stored
//! and what it means belongs to the services: the proxy's serverIds (`acp::durable`) and the
//! process API's records (`processes::durable`); each holds one `Durable` per entry.
//!
//! Layout: `DIR/acp/<serverId>/{meta.json,events.log}`, `DIR/processes/<id>/{meta.json,
//! events.log}`, `DIR/lock`, `DIR/sandbox-agent-state` (the marker), `DIR/durable` (the flag),
//! `DIR/quarantine/` (what did not read back). A *log* is an append-only file of CRC-checked
//! records; a *meta* is a small JSON document replaced atomically (temporary + rename).
//!
//! **Invariants:** no request waits for the disk: appends and meta updates go to the writer
//! through a queue and never block their caller. The producers of records (an agent's stdout
//! reader, a process's output pump) wait for the writer instead (`Durable::written`) before they
//! read more from their child, so the queue holds at most about one read per producer and a
//! serverId never stops being durable because the disk is slow. The writer batches: every record
//! that arrived while it wrote the previous batch goes out in one `write` per entry (group
//! commit) and one `fdatasync` per entry and batch. Any write error (a full disk,
//! `--state-total-bytes`) turns the whole store memory-only with a WARN, removes the `durable`
//! flag, and `GET /v1/health` then says `"durable": false`; after the next start a reader gets a
//! `gap` for the ids that were not written.
//!
//! What a crash of the daemon can lose: nothing a client saw (an agent's events are written
//! before the reader wakes the streams or hands a response to its POST); on a power failure,
//! what was written but not yet synced (`--state-sync`). Ids issued but not written are skipped
//! after the restart (`RESTART_ID_SKIP`), never reused.

pub mod dir;
pub mod log;
pub mod seal;

use std::collections::HashMap;
use std::fs::File;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;

use crate::config::{Config, StateSync};

/// After a restart the numbering of a recovered log resumes this far beyond the last id written
/// (or the floor its meta records): every id that may have been issued but not yet written at
/// the crash lies in between. A producer waits for the writer at least every `PRODUCER_AHEAD`
/// records, so fewer than this are ever outstanding.
pub const RESTART_ID_SKIP: u64 = 16 * 1024 + 1;

/// Most records a producer (a stdout reader) pushes before it waits for the writer.
pub const PRODUCER_AHEAD: u64 = 4096;

/// Records of one entry gathered in memory before the writer writes them out, within a batch.
const WRITE_CHUNK: usize = 1 << 20;

/// The file names under an entry's directory.
const META: &str = "meta.json";
const LOG: &str = "events.log";

/// Why the state dir cannot be used, or stopped being written.
#[derive(Debug, thiserror::Error)]
pub enum StateError {
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("the state dir holds --state-total-bytes ({cap} bytes)")]
    TotalCap { cap: u64 },
    #[error("the state dir {} is in use by another sandbox-agent (pid {holder}); one dir, one daemon", dir.display())]
    Locked { dir: PathBuf, holder: String },
    #[error("refusing {} as (part of) the state dir: {why}", path.display())]
    NotOurs { path: PathBuf, why: String },
    #[error("the state writer thread is gone")]
    WriterGone,
}

impl StateError {
    /// True for the errors that must stop the daemon from starting (the dir is someone else's).
    pub fn is_refusal(&self) -> bool {
        matches!(self, StateError::Locked { .. } | StateError::NotOurs { .. })
    }
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> StateError + '_ {
    move |source| StateError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// How far an entry's log is written: a producer waits on it.
#[derive(Default)]
struct Mark {
    written: AtomicU64,
    notify: tokio::sync::Notify,
}

/// One thing for the writer to do. `generation` names the `Durable` that sent it: an entry forgotten
/// (or made afresh under the same key) ignores whatever an older one still sends.
enum Op {
    Open {
        key: Arc<str>,
        generation: u64,
        mark: Arc<Mark>,
        fresh: bool,
    },
    Meta {
        key: Arc<str>,
        generation: u64,
        json: Vec<u8>,
    },
    Append {
        key: Arc<str>,
        generation: u64,
        id: u64,
        payload: Bytes,
    },
    Remove {
        key: Arc<str>,
        generation: u64,
    },
    /// Move an entry a service could not read aside (never delete it).
    Quarantine {
        key: Arc<str>,
    },
    /// Everything sent before is written and synced: answer.
    Barrier(std::sync::mpsc::Sender<()>),
}

/// Shared between the handles and the writer.
struct Shared {
    durable: AtomicBool,
    /// Why the store went memory-only (the first reason).
    problem: Mutex<Option<String>>,
    /// The daemon is stopping: what ends now ends because of it.
    stopping: AtomicBool,
}

impl Shared {
    fn degrade(&self, dir: &Path, why: &StateError) {
        if self.durable.swap(false, Ordering::AcqRel) {
            tracing::warn!(problem = %why,
                "the state dir is no longer written: state is kept in memory only from now on");
            *crate::sys::lock(&self.problem) = Some(why.to_string());
            dir::clear_durable_flag(dir);
        }
    }
}

/// The store: a handle to the writer thread.
pub struct StateStore {
    dir: PathBuf,
    tx: Sender<Op>,
    shared: Arc<Shared>,
    gens: AtomicU64,
    seal: Option<seal::Sealer>,
}

/// One entry found in the state dir at start, for its service to read.
pub struct Entry {
    /// The entry's name (serverId, process id).
    pub name: String,
    pub meta: serde_json::Value,
    /// The newest records within the retention, oldest first.
    pub records: Vec<(u64, Bytes)>,
    /// The id of the last record on disk.
    pub last_id: u64,
    /// The previous run stopped being durable: records after `last_id` may have been lost.
    pub incomplete: bool,
}

/// Everything found in the state dir at start.
#[derive(Default)]
pub struct Recovered {
    pub acp: Vec<Entry>,
    pub processes: Vec<Entry>,
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

impl Retention {
    fn keep(&self) -> log::Keep {
        log::Keep {
            records: self.events,
            bytes: self.bytes,
        }
    }
}

impl StateStore {
    /// Claims the state dir (refusing one that is not ours or is locked by another daemon),
    /// reads back what it holds (cutting corrupt tails, moving unreadable entries aside) and
    /// starts the writer thread. Blocking: call it on the blocking pool.
    pub fn open(config: &Config, dir: &Path) -> Result<(Arc<StateStore>, Recovered), StateError> {
        let (lock, was_durable) = dir::claim(dir)?;
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
        let mut keys = HashMap::new();
        let mut recovered = Recovered::default();
        for sub in dir::SUBDIRS {
            let path = dir.join(sub);
            for e in std::fs::read_dir(&path).map_err(io_err(&path))? {
                let e = e.map_err(io_err(&path))?;
                let Some(name) = e.file_name().to_str().map(str::to_string) else {
                    set_aside(
                        dir,
                        &format!("{sub}/{}", e.file_name().to_string_lossy()),
                        "not UTF-8",
                    );
                    continue;
                };
                let key = format!("{sub}/{name}");
                // `file_type` does not follow a symlink: a symlink is not an entry.
                if !e.file_type().is_ok_and(|t| t.is_dir()) {
                    set_aside(dir, &key, "not a directory");
                    continue;
                }
                match read_entry(&e.path(), retention.keep()) {
                    Ok((meta, log)) => {
                        if log.cut > 0 {
                            tracing::warn!(key = %key, bytes = log.cut,
                                "cut a corrupt or truncated tail off a state log");
                        }
                        keys.insert(
                            Arc::<str>::from(key.as_str()),
                            KeyState::on_disk(log.good_len, log.count),
                        );
                        let entry = Entry {
                            name,
                            meta,
                            records: log.records,
                            last_id: log.last_id,
                            incomplete: !was_durable,
                        };
                        if sub == "acp" {
                            recovered.acp.push(entry);
                        } else {
                            recovered.processes.push(entry);
                        }
                    }
                    Err(why) => set_aside(dir, &key, &why.to_string()),
                }
            }
        }
        dir::set_durable_flag(dir)?;
        let (tx, rx) = std::sync::mpsc::channel();
        let shared = Arc::new(Shared {
            durable: AtomicBool::new(true),
            problem: Mutex::new(None),
            stopping: AtomicBool::new(false),
        });
        let total = keys.values().map(|k| k.bytes).sum();
        let writer = Writer {
            dir: dir.to_path_buf(),
            keys,
            total,
            pending_total: 0,
            total_cap: config.state_total_bytes,
            retention,
            sync: config.state_sync,
            shared: shared.clone(),
            dirty_since: None,
            _lock: lock,
        };
        std::thread::Builder::new()
            .name("state-writer".into())
            .spawn(move || writer.run(rx))
            .map_err(io_err(dir))?;
        let seal = seal::Sealer::for_state(&config.data_dir, dir);
        Ok((
            Arc::new(StateStore {
                dir: dir.to_path_buf(),
                tx,
                shared,
                gens: AtomicU64::new(1),
                seal,
            }),
            recovered,
        ))
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The sealer of secrets (`None` when no key can be kept outside the state dir).
    pub fn sealer(&self) -> Option<&seal::Sealer> {
        self.seal.as_ref()
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

    fn send(&self, op: Op) -> bool {
        if !self.is_durable() {
            return false;
        }
        if self.tx.send(op).is_err() {
            self.shared.degrade(&self.dir, &StateError::WriterGone);
            return false;
        }
        true
    }

    /// The durable handle of entry `sub/name`. `fresh`: a new entry (whatever an older one of
    /// the same name left is replaced); otherwise one recovered at start, whose files go on.
    pub fn entry(self: &Arc<Self>, sub: &str, name: &str, fresh: bool) -> Durable {
        let key: Arc<str> = format!("{sub}/{name}").into();
        let generation = self.gens.fetch_add(1, Ordering::Relaxed);
        let mark = Arc::new(Mark::default());
        self.send(Op::Open {
            key: key.clone(),
            generation,
            mark: mark.clone(),
            fresh,
        });
        Durable {
            store: self.clone(),
            key,
            generation,
            forgotten: Mutex::new(false),
            off: AtomicBool::new(false),
            mark,
            sent: AtomicU64::new(0),
        }
    }

    /// Moves an entry its service could not read aside (into `quarantine/`), never deleting it.
    pub fn quarantine(&self, sub: &str, name: &str) {
        self.send(Op::Quarantine {
            key: format!("{sub}/{name}").into(),
        });
    }

    /// Waits (blocking) until everything queued so far is written and synced, or `timeout`.
    pub fn flush_blocking(&self, timeout: Duration) -> bool {
        let (tx, rx) = std::sync::mpsc::channel();
        if self.tx.send(Op::Barrier(tx)).is_err() {
            return false;
        }
        rx.recv_timeout(timeout).is_ok()
    }
}

/// Moves an entry that does not read back aside at open (reported, never deleted).
fn set_aside(dir: &Path, key: &str, why: &str) {
    match dir::quarantine(dir, key) {
        Ok(to) => tracing::warn!(key, problem = why, moved_to = %to.display(),
            "moved an unreadable state entry aside"),
        Err(e) => tracing::warn!(key, problem = why, error = %e,
            "skipped an unreadable state entry (it could not be moved aside)"),
    }
}

fn read_entry(
    path: &Path,
    keep: log::Keep,
) -> Result<(serde_json::Value, log::LogRead), StateError> {
    let meta_path = path.join(META);
    let mut meta = Vec::new();
    dir::open_existing(&meta_path)
        .and_then(|mut f| f.read_to_end(&mut meta))
        .map_err(io_err(&meta_path))?;
    let meta: serde_json::Value =
        serde_json::from_slice(&meta).map_err(|e| io_err(&meta_path)(e.into()))?;
    let log_path = path.join(LOG);
    let log = log::read_and_repair(&log_path, keep).map_err(io_err(&log_path))?;
    Ok((meta, log))
}

/// One entry's durable handle: its meta, its log, and its forgetting. **Invariant:** after
/// `forget` nothing more of it reaches the disk (the writer drops what this handle still sends,
/// by its generation), so a deleted entry never comes back after a restart.
pub struct Durable {
    store: Arc<StateStore>,
    key: Arc<str>,
    generation: u64,
    /// The gate: meta writes and the forgetting take it, so a meta is never sent after the
    /// removal.
    forgotten: Mutex<bool>,
    /// Appends stop (forgotten, or the store is off).
    off: AtomicBool,
    mark: Arc<Mark>,
    /// The id of the last record sent.
    sent: AtomicU64,
}

impl Durable {
    pub fn store(&self) -> &Arc<StateStore> {
        &self.store
    }

    /// Replaces the entry's meta (never blocks).
    pub fn meta(&self, json: Vec<u8>) {
        let gone = crate::sys::lock(&self.forgotten);
        if !*gone {
            self.store.send(Op::Meta {
                key: self.key.clone(),
                generation: self.generation,
                json,
            });
        }
    }

    /// Appends one record (never blocks); false once the entry is not written any more.
    pub fn append(&self, id: u64, payload: Bytes) -> bool {
        if self.off.load(Ordering::Acquire) {
            return false;
        }
        self.sent.store(id, Ordering::Release);
        let ok = self.store.send(Op::Append {
            key: self.key.clone(),
            generation: self.generation,
            id,
            payload,
        });
        if !ok {
            self.off.store(true, Ordering::Release);
        }
        ok
    }

    /// The id of the last record sent (0 for none).
    pub fn last_sent(&self) -> u64 {
        self.sent.load(Ordering::Acquire)
    }

    /// The id of the last record written (0 for none in this run).
    pub fn last_written(&self) -> u64 {
        self.mark.written.load(Ordering::Acquire)
    }

    /// Waits until every record sent so far is written (or the entry or the store stopped being
    /// written). What a producer awaits before it reads more from its child.
    pub async fn written(&self) {
        let want = self.last_sent();
        loop {
            let notified = self.mark.notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if self.mark.written.load(Ordering::Acquire) >= want
                || self.off.load(Ordering::Acquire)
                || !self.store.is_durable()
            {
                return;
            }
            notified.await;
        }
    }

    /// The entry is gone for good (a client's DELETE): its files are removed, and nothing this
    /// handle sends afterwards is written.
    pub fn forget(&self) {
        let mut gone = crate::sys::lock(&self.forgotten);
        if std::mem::replace(&mut *gone, true) {
            return;
        }
        self.off.store(true, Ordering::Release);
        self.store.send(Op::Remove {
            key: self.key.clone(),
            generation: self.generation,
        });
        self.mark.notify.notify_waiters();
    }

    pub fn is_forgotten(&self) -> bool {
        *crate::sys::lock(&self.forgotten)
    }
}

/// Lets every producer waiting on `mark` go: its entry is not written any more.
fn release(mark: &Arc<Mark>) {
    mark.written.store(u64::MAX, Ordering::Release);
    mark.notify.notify_waiters();
}

/// The writer's view of one entry.
struct KeyState {
    /// The generation whose ops are applied (0: recovered, not yet taken by a service).
    generation: u64,
    mark: Option<Arc<Mark>>,
    file: Option<File>,
    /// The log holds only stale records (a fresh entry of an old name): cut it at first use.
    truncate: bool,
    bytes: u64,
    records: u64,
    dirty: bool,
    pending: Vec<u8>,
    pending_n: u64,
    pending_last: u64,
    /// Written since the marks were last told.
    unannounced: Option<u64>,
}

impl KeyState {
    fn on_disk(bytes: u64, records: u64) -> Self {
        KeyState {
            generation: 0,
            mark: None,
            file: None,
            truncate: false,
            bytes,
            records,
            dirty: false,
            pending: Vec::new(),
            pending_n: 0,
            pending_last: 0,
            unannounced: None,
        }
    }
}

struct Writer {
    dir: PathBuf,
    keys: HashMap<Arc<str>, KeyState>,
    /// Bytes of every log on disk.
    total: u64,
    /// Bytes gathered but not yet written.
    pending_total: u64,
    total_cap: u64,
    retention: Retention,
    sync: StateSync,
    shared: Arc<Shared>,
    dirty_since: Option<Instant>,
    /// Held for the writer's life: released once the last record is written.
    _lock: dir::Lock,
}

impl Writer {
    fn run(mut self, rx: Receiver<Op>) {
        let mut batch = Vec::with_capacity(4096);
        loop {
            let wait = match (self.sync, self.dirty_since) {
                (StateSync::Batch(d), Some(t)) => d.saturating_sub(t.elapsed()),
                _ => Duration::from_secs(3600),
            };
            match rx.recv_timeout(wait) {
                Ok(op) => batch.push(op),
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => {
                    self.flush_pending();
                    self.sync_all();
                    self.announce();
                    return;
                }
            }
            // Group commit: everything that arrived meanwhile goes out together.
            while batch.len() < 65536 {
                match rx.try_recv() {
                    Ok(op) => batch.push(op),
                    Err(_) => break,
                }
            }
            let mut barriers = Vec::new();
            for op in batch.drain(..) {
                match op {
                    Op::Barrier(tx) => barriers.push(tx),
                    op if self.shared.durable.load(Ordering::Acquire) => {
                        if let Err(e) = self.apply(op) {
                            self.fail(&e);
                        }
                    }
                    _ => {}
                }
            }
            self.flush_pending();
            let due = match self.sync {
                StateSync::Every => true,
                StateSync::Batch(d) => self.dirty_since.is_some_and(|t| t.elapsed() >= d),
                StateSync::Os => false,
            };
            if due || !barriers.is_empty() {
                self.sync_all();
            }
            self.announce();
            for b in barriers {
                let _ = b.send(());
            }
        }
    }

    fn fail(&mut self, e: &StateError) {
        self.shared.degrade(&self.dir, e);
        for k in self.keys.values_mut() {
            k.pending.clear();
            k.pending_n = 0;
            if let Some(m) = &k.mark {
                m.notify.notify_waiters();
            }
        }
        self.pending_total = 0;
    }

    /// Tells every waiting producer how far its entry is written.
    fn announce(&mut self) {
        for k in self.keys.values_mut() {
            if let (Some(upto), Some(m)) = (k.unannounced.take(), &k.mark) {
                m.written.fetch_max(upto, Ordering::AcqRel);
                m.notify.notify_waiters();
            }
        }
    }

    fn flush_pending(&mut self) {
        let pending: Vec<Arc<str>> = self
            .keys
            .iter()
            .filter(|(_, k)| !k.pending.is_empty())
            .map(|(key, _)| key.clone())
            .collect();
        for key in pending {
            if !self.shared.durable.load(Ordering::Acquire) {
                return;
            }
            if let Err(e) = self.flush_key(&key) {
                self.fail(&e);
            }
        }
    }

    /// Writes `key`'s gathered records in one `write`, then compacts the log if it outgrew its
    /// window.
    fn flush_key(&mut self, key: &Arc<str>) -> Result<(), StateError> {
        let dir = self.dir.join(&**key);
        let Some(k) = self.keys.get_mut(key) else {
            return Ok(());
        };
        if k.pending.is_empty() {
            return Ok(());
        }
        let path = dir.join(LOG);
        if k.file.is_none() {
            dir::make_dir(&dir)?;
            if std::mem::take(&mut k.truncate) {
                dir::create_file(&path)?;
                self.total = self.total.saturating_sub(k.bytes);
                k.bytes = 0;
                k.records = 0;
            }
            k.file = Some(dir::open_append(&path)?);
        }
        let f = k.file.as_mut().expect("opened above");
        let len = k.pending.len() as u64;
        self.pending_total = self.pending_total.saturating_sub(len);
        if let Err(e) = f.write_all(&k.pending) {
            // Leave no half record behind for the next start to cut.
            let _ = f.set_len(k.bytes);
            k.pending.clear();
            return Err(io_err(&path)(e));
        }
        k.pending.clear();
        k.bytes += len;
        k.records += std::mem::take(&mut k.pending_n);
        k.dirty = true;
        k.unannounced = Some(k.pending_last);
        self.total += len;
        self.dirty_since.get_or_insert_with(Instant::now);
        let r = self.retention;
        if k.bytes > r.max_file || k.records > 2 * r.events as u64 {
            self.compact(key)?;
        }
        Ok(())
    }

    fn apply(&mut self, op: Op) -> Result<(), StateError> {
        match op {
            Op::Open {
                key,
                generation,
                mark,
                fresh,
            } => {
                let k = self
                    .keys
                    .entry(key)
                    .or_insert_with(|| KeyState::on_disk(0, 0));
                k.generation = generation;
                // A handle this one supersedes is written no more: its waiter must not hang.
                if let Some(old) = k.mark.replace(mark) {
                    release(&old);
                }
                k.file = None;
                k.pending.clear();
                k.pending_n = 0;
                // A fresh entry replaces whatever a forgotten one of the same name left.
                k.truncate = fresh;
            }
            Op::Meta {
                key,
                generation,
                json,
            } => {
                if self
                    .keys
                    .get(&key)
                    .is_none_or(|k| k.generation != generation)
                {
                    return Ok(());
                }
                let dir = self.dir.join(&*key);
                dir::make_dir(&dir)?;
                let tmp = dir.join("meta.json.tmp");
                let mut f = dir::create_file(&tmp)?;
                f.write_all(&json).map_err(io_err(&tmp))?;
                if self.sync != StateSync::Os {
                    f.sync_data().map_err(io_err(&tmp))?;
                }
                std::fs::rename(&tmp, dir.join(META)).map_err(io_err(&tmp))?;
            }
            Op::Append {
                key,
                generation,
                id,
                payload,
            } => {
                let need = (log::HEADER + payload.len()) as u64;
                if self.total + self.pending_total + need > self.total_cap {
                    return Err(StateError::TotalCap {
                        cap: self.total_cap,
                    });
                }
                let Some(k) = self
                    .keys
                    .get_mut(&key)
                    .filter(|k| k.generation == generation)
                else {
                    return Ok(());
                };
                log::encode(&mut k.pending, id, &payload);
                k.pending_n += 1;
                k.pending_last = id;
                self.pending_total += need;
                if k.pending.len() >= WRITE_CHUNK {
                    self.flush_key(&key)?;
                }
            }
            Op::Remove { key, generation } => {
                if self
                    .keys
                    .get(&key)
                    .is_none_or(|k| k.generation != generation)
                {
                    return Ok(());
                }
                if let Some(k) = self.keys.remove(&key) {
                    self.total = self.total.saturating_sub(k.bytes);
                    self.pending_total = self.pending_total.saturating_sub(k.pending.len() as u64);
                    k.mark.iter().for_each(release);
                }
                let dir = self.dir.join(&*key);
                match std::fs::remove_dir_all(&dir) {
                    Ok(()) => {}
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                    Err(e) => return Err(io_err(&dir)(e)),
                }
            }
            Op::Quarantine { key } => {
                if let Some(k) = self.keys.remove(&key) {
                    self.total = self.total.saturating_sub(k.bytes);
                    k.mark.iter().for_each(release);
                }
                set_aside(&self.dir, &key, "its service could not read it");
            }
            Op::Barrier(_) => {}
        }
        Ok(())
    }

    /// Rewrites `key`'s log with the newest records within the retention (the newest always).
    fn compact(&mut self, key: &Arc<str>) -> Result<(), StateError> {
        let path = self.dir.join(&**key).join(LOG);
        let Some(k) = self.keys.get_mut(key) else {
            return Ok(());
        };
        k.file = None;
        let read = log::read_and_repair(&path, self.retention.keep()).map_err(io_err(&path))?;
        let new_len = log::rewrite(&path, &read.records).map_err(io_err(&path))?;
        self.total = self.total.saturating_sub(k.bytes) + new_len;
        k.bytes = new_len;
        k.records = read.records.len() as u64;
        k.dirty = false;
        Ok(())
    }

    fn sync_all(&mut self) {
        let mut failed = None;
        for (key, k) in self.keys.iter_mut() {
            if k.dirty {
                k.dirty = false;
                if let Some(f) = &k.file
                    && let Err(e) = f.sync_data()
                {
                    failed = Some(io_err(&self.dir.join(&**key))(e));
                }
            }
        }
        self.dirty_since = None;
        if let Some(f) = failed {
            self.fail(&f);
        }
    }
}

impl Drop for Writer {
    /// Even a writer that panicked leaves no producer waiting.
    fn drop(&mut self) {
        self.shared.durable.store(false, Ordering::Release);
        for k in self.keys.values() {
            if let Some(m) = &k.mark {
                m.notify.notify_waiters();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn config(dir: &Path, events: usize, max_bytes: u64, total: u64) -> Config {
        let mut c = Config::defaults();
        c.state_dir = Some(dir.to_path_buf());
        c.data_dir = dir.parent().unwrap().join("data");
        std::fs::create_dir_all(&c.data_dir).unwrap();
        c.state_sync = StateSync::Every;
        c.event_buffer = events;
        c.state_max_bytes = max_bytes;
        c.state_total_bytes = total;
        c
    }

    fn open(c: &Config, dir: &Path) -> (Arc<StateStore>, Recovered) {
        StateStore::open(c, dir).unwrap()
    }

    /// Drops the store and waits for its writer to end (which releases the lock).
    fn close(store: Arc<StateStore>) {
        let dir = store.dir().to_path_buf();
        drop(store);
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::fs::File::open(dir.join(dir::LOCK)).is_ok_and(|f| {
            nix::fcntl::Flock::lock(f, nix::fcntl::FlockArg::LockExclusiveNonblock).is_err()
        }) {
            assert!(Instant::now() < deadline, "the writer did not end");
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// A log is compacted to the retained window (the newest events) once it outgrows twice
    /// that, and the start reads back only that window.
    #[test]
    fn compaction_keeps_the_newest_window() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("state");
        let c = config(&dir, 10, 1 << 20, 1 << 30);
        let (store, rec) = open(&c, &dir);
        assert!(rec.acp.is_empty());
        let d = store.entry("acp", "s1", true);
        d.meta(b"{\"agent\":\"mock\"}".to_vec());
        for id in 1..=105u64 {
            assert!(d.append(id, Bytes::from(format!("{{\"n\":{id}}}"))));
        }
        assert!(store.flush_blocking(Duration::from_secs(10)));
        let on_disk = log::read_and_repair(&dir.join("acp/s1/events.log"), log::Keep::ALL).unwrap();
        assert!(on_disk.records.len() <= 20, "{}", on_disk.records.len());
        assert_eq!(on_disk.records.last().unwrap().0, 105);
        drop(d);
        close(store);
        let (_store, rec) = open(&c, &dir);
        let r = &rec.acp[0];
        assert_eq!(r.name, "s1");
        assert_eq!(r.meta["agent"], "mock");
        assert_eq!(r.last_id, 105);
        assert!(r.records.len() <= 10);
        assert!(!r.incomplete);
    }

    /// Over `--state-total-bytes` the store turns memory-only, says why, and removes the
    /// durable flag: the next start knows records were lost.
    #[test]
    fn the_total_cap_turns_the_store_memory_only() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("state");
        let c = config(&dir, 4096, 1 << 20, 4096);
        let (store, _) = open(&c, &dir);
        let d = store.entry("acp", "big", true);
        d.meta(b"{}".to_vec());
        let line = Bytes::from(vec![b'x'; 1000]);
        for id in 1..=10u64 {
            d.append(id, line.clone());
        }
        store.flush_blocking(Duration::from_secs(10));
        assert!(!store.is_durable());
        assert!(store.problem().unwrap().contains("--state-total-bytes"));
        let size = std::fs::metadata(dir.join("acp/big/events.log")).map_or(0, |m| m.len());
        assert!(size <= 4096, "{size}");
        assert!(!d.append(11, line));
        assert!(!dir.join(dir::DURABLE).exists());
        drop(d);
        close(store);
        let (_s, rec) = open(&c, &dir);
        assert!(rec.acp[0].incomplete);
    }

    /// After `forget` nothing of the entry reaches the disk, even what its handle sends later;
    /// a fresh entry of the same name starts a new log.
    #[test]
    fn a_forgotten_entry_stays_gone() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("state");
        let c = config(&dir, 100, 1 << 20, 1 << 30);
        let (store, _) = open(&c, &dir);
        let d = store.entry("acp", "gone", true);
        d.meta(b"{}".to_vec());
        d.append(1, Bytes::from_static(b"{}"));
        store.flush_blocking(Duration::from_secs(10));
        assert!(dir.join("acp/gone/events.log").exists());
        d.forget();
        d.meta(b"{\"late\":true}".to_vec());
        d.append(2, Bytes::from_static(b"{}"));
        store.flush_blocking(Duration::from_secs(10));
        assert!(!dir.join("acp/gone").exists());
        let again = store.entry("acp", "gone", true);
        again.meta(b"{}".to_vec());
        again.append(1, Bytes::from_static(b"{\"new\":1}"));
        store.flush_blocking(Duration::from_secs(10));
        let r = log::read_and_repair(&dir.join("acp/gone/events.log"), log::Keep::ALL).unwrap();
        assert_eq!(r.records.len(), 1);
        assert_eq!(&r.records[0].1[..], b"{\"new\":1}");
    }

    /// A producer's wait returns once its records are written: the marks follow the writer.
    #[test]
    fn written_waits_for_the_writer() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("state");
        let c = config(&dir, 100_000, 1 << 30, 1 << 30);
        let (store, _) = open(&c, &dir);
        let d = store.entry("acp", "w", true);
        d.meta(b"{}".to_vec());
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        for id in 1..=20_000u64 {
            d.append(id, Bytes::from_static(b"{\"x\":1}"));
        }
        rt.block_on(d.written());
        assert_eq!(d.last_written(), 20_000);
        let r = log::read_and_repair(&dir.join("acp/w/events.log"), log::Keep::ALL).unwrap();
        assert_eq!(r.count, 20_000);
    }

    /// Files 0600, directories 0700 whatever the umask; unreadable entries and symlinks are
    /// moved aside, never deleted or followed.
    #[test]
    fn permissions_quarantine_and_symlinks() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("state");
        let c = config(&dir, 100, 1 << 20, 1 << 30);
        let old = nix::sys::stat::umask(nix::sys::stat::Mode::empty());
        let (store, _) = open(&c, &dir);
        let d = store.entry("acp", "p", true);
        d.meta(b"{}".to_vec());
        d.append(1, Bytes::from_static(b"{}"));
        store.flush_blocking(Duration::from_secs(10));
        nix::sys::stat::umask(old);
        let mode = |p: &Path| std::fs::symlink_metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&dir), 0o700);
        assert_eq!(mode(&dir.join("acp")), 0o700);
        assert_eq!(mode(&dir.join("acp/p")), 0o700);
        assert_eq!(mode(&dir.join("acp/p/meta.json")), 0o600);
        assert_eq!(mode(&dir.join("acp/p/events.log")), 0o600);
        assert_eq!(mode(&dir.join(dir::LOCK)), 0o600);
        drop(d);
        close(store);
        // An unreadable entry and a symlink to a tree outside.
        std::fs::create_dir_all(dir.join("acp/bad")).unwrap();
        std::fs::write(dir.join("acp/bad/meta.json"), b"not json").unwrap();
        let outside = tmp.path().join("outside");
        std::fs::create_dir_all(&outside).unwrap();
        std::fs::write(outside.join("keep.txt"), b"mine").unwrap();
        std::os::unix::fs::symlink(&outside, dir.join("acp/link")).unwrap();
        let (_s, rec) = open(&c, &dir);
        assert_eq!(rec.acp.len(), 1);
        assert!(!dir.join("acp/bad").exists() && !dir.join("acp/link").exists());
        let moved: Vec<String> = std::fs::read_dir(dir.join(dir::QUARANTINE))
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(moved.len(), 2, "{moved:?}");
        assert_eq!(std::fs::read(outside.join("keep.txt")).unwrap(), b"mine");
    }

    /// A second store on the same dir is refused while the first holds it; a dir that is not
    /// a state dir is refused before anything is written into it.
    #[test]
    fn one_dir_one_daemon_and_only_our_own_dir() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("state");
        let c = config(&dir, 100, 1 << 20, 1 << 30);
        let (store, _) = open(&c, &dir);
        let second = StateStore::open(&c, &dir).err().expect("refused");
        assert!(matches!(second, StateError::Locked { .. }), "{second}");
        assert!(second.to_string().contains(&std::process::id().to_string()));
        close(store);
        assert!(StateStore::open(&c, &dir).is_ok());

        let project = tmp.path().join("project");
        std::fs::create_dir_all(project.join("processes/billing/src")).unwrap();
        std::fs::write(project.join("processes/billing/src/main.py"), b"print(1)").unwrap();
        let e = StateStore::open(&c, &project).err().expect("refused");
        assert!(matches!(e, StateError::NotOurs { .. }), "{e}");
        assert!(project.join("processes/billing/src/main.py").exists());
        assert!(!project.join(dir::LOCK).exists() && !project.join(dir::MARKER).exists());

        let linked = tmp.path().join("linked");
        std::fs::create_dir_all(&linked).unwrap();
        std::os::unix::fs::symlink(tmp.path().join("project"), linked.join("acp")).unwrap();
        let e = StateStore::open(&c, &linked).err().expect("refused");
        assert!(matches!(e, StateError::NotOurs { .. }), "{e}");
    }
}
