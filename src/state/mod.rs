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
mod writer;

use writer::{KeyState, Writer};

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

#[cfg(test)]
mod tests;
