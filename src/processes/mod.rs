//! The process API's service: programs a client starts next to the agents (`/v1/processes`),
//! either synchronously (`run`: output captured up to a limit, a timeout) or in the background
//! (an output log with byte offsets, optional stdin, optional terminal). Every process is started,
//! signalled and reaped by the supervisor exactly as agents are (own session, process group and
//! cgroup, the agents' clean environment and user); this module only keeps the records, the logs
//! and the limits. The service is this file; its types are `types.rs`, its errors `error.rs`,
//! the pumps and the monitor `io.rs`, a reload's part `handoff.rs`.
//!
//! **Invariants:** a process counts against `maxConcurrentProcesses` from admission until its
//! tree is gone and its output drained; every background process reserves its log cap from the
//! total log budget while it runs and keeps only the bytes it holds once it has exited, until it
//! is deleted; a `run` whose caller goes away is killed.
//!
//! This file is long (~950 lines) because `ProcessService` is one state machine (admission,
//! slots, budgets, the record's life, deletion) whose invariants above span all its methods;
//! everything separable already lives beside it.

pub mod durable;
mod error;
mod handoff;
mod io;
pub mod log;
mod pty;
#[cfg(test)]
mod tests;
mod types;

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tracing::Instrument;

use tokio::process::ChildStdin;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::config::Config;
use crate::supervisor::{
    ChildHandle, ChildStdio, ExitInfo, GroupScan, ProcessStats, SpawnSpec, Supervisor,
};

pub use error::ProcessError;
pub use handoff::ProcessesState;
use io::{capture, monitor, pump, pump_pty};
pub use io::{resize, write_input};
pub use log::{Chunk, LogStream, OutputLog, StreamFilter};
pub use types::{CreateRequest, ProcessConfig, ProcessInfo, RunRequest, RunResponse};

/// Exited records kept (the oldest beyond this are forgotten when a new process starts).
pub const MAX_EXITED_RECORDS: usize = 1024;
/// Log followers and terminal sockets per process.
pub const MAX_READERS_PER_PROCESS: usize = 16;
/// How long one input request may wait for the process to take its bytes.
pub const INPUT_TIMEOUT: Duration = Duration::from_secs(10);
/// Longest `waitMs` of stop and kill.
pub const MAX_WAIT: Duration = Duration::from_secs(60);
/// After the tree is gone, how long its output pipes get to drain (a process that escaped every
/// cgroup could hold them open for ever).
const DRAIN_TIMEOUT: Duration = Duration::from_secs(2);
/// Hard ceilings of the runtime settings (`POST /v1/processes/config`).
const CEIL_CONCURRENT: usize = 1024;
const CEIL_OUTPUT_BYTES: u64 = 64 << 20;
const CEIL_INPUT_BYTES: u64 = 16 << 20;
const CEIL_RUN_TIMEOUT_MS: u64 = 24 * 3600 * 1000;

/// One background process.
pub struct ManagedProcess {
    pub id: String,
    command: String,
    args: Vec<String>,
    cwd: Option<String>,
    pub tty: bool,
    interactive: bool,
    created_at_ms: u64,
    /// `None` for a process recovered from the state dir (it did not survive the restart).
    handle: Option<ChildHandle>,
    pub log: Arc<OutputLog>,
    stdin: tokio::sync::Mutex<Option<ChildStdin>>,
    pty: Option<Arc<pty::Pty>>,
    /// Set once the tree is gone and the output drained: how it ended and when.
    ended: watch::Sender<Option<(ExitInfo, u64)>>,
    readers: AtomicUsize,
    /// Cancelled by a reload's export: the output pumps and the monitor stop (the output waits
    /// in the pipes for the new image).
    freeze: CancellationToken,
    /// Set by the monitor once every pump has stopped after the freeze: the hand-back barrier a
    /// reload's export waits on before it takes the log (a pump in the middle of an append would
    /// otherwise add to a log already written down).
    pumps_stopped: watch::Sender<bool>,
    /// Duplicates of the output pipes' read ends (the pumps own the pipes), for the hand-off.
    pipes: Vec<(LogStream, std::os::fd::OwnedFd)>,
    /// Its number (the `n` of `proc_n`).
    n: u64,
}

impl ManagedProcess {
    /// How it ended, once its tree is gone and its output is all in the log.
    pub fn ended(&self) -> Option<(ExitInfo, u64)> {
        self.ended.borrow().clone()
    }

    /// Resolves when `ended` is set.
    pub async fn wait_ended(&self) -> (ExitInfo, u64) {
        let mut rx = self.ended.subscribe();
        loop {
            if let Some(e) = rx.borrow_and_update().clone() {
                return e;
            }
            // The sender lives in `self`: `changed` cannot fail while we are borrowed.
            if rx.changed().await.is_err()
                && let Some(h) = &self.handle
            {
                return (h.wait().await, now_ms());
            }
        }
    }

    /// The record, with a running process's figures read from `/proc` on the blocking pool.
    pub async fn info(self: &Arc<Self>) -> ProcessInfo {
        let me = self.clone();
        crate::sys::blocking(move || me.info_in(&mut GroupScan::default())).await
    }

    /// The record; blocking (a running process's figures come from `/proc`; its process group,
    /// without a cgroup, from `scan`).
    pub fn info_in(&self, scan: &mut GroupScan) -> ProcessInfo {
        let mut info = self.info_without_stats();
        if info.pid.is_some() {
            info.stats = self.handle.as_ref().map(|h| h.stats_in(scan));
        }
        info
    }

    /// The record without its process figures (`stats` is `None`); reads nothing from procfs.
    pub fn info_without_stats(&self) -> ProcessInfo {
        let ended = self.ended();
        let exit = ended.as_ref().map(|(e, _)| e);
        ProcessInfo {
            id: self.id.clone(),
            command: self.command.clone(),
            args: self.args.clone(),
            cwd: self.cwd.clone(),
            tty: self.tty,
            interactive: self.interactive,
            owner: "user",
            status: if ended.is_some() { "exited" } else { "running" },
            pid: self
                .handle
                .as_ref()
                .filter(|_| ended.is_none())
                .map(|h| h.pid()),
            exit_code: exit.and_then(|e| e.code),
            exit_signal: exit.and_then(|e| e.signal),
            exit_reason: exit.map(|e| e.reason),
            created_at_ms: self.created_at_ms,
            exited_at_ms: ended.as_ref().map(|(_, at)| *at),
            log_end: self.log.end(),
            stats: None,
        }
    }
}

/// A reader's place among a process's bounded readers; released on drop.
pub struct ReaderSlot {
    pub process: Arc<ManagedProcess>,
}

impl Drop for ReaderSlot {
    fn drop(&mut self) {
        self.process.readers.fetch_sub(1, Ordering::AcqRel);
    }
}

/// The result of `GET …/logs` without `follow`.
pub struct Logs {
    pub chunks: Vec<Chunk>,
    pub gap: Option<(u64, u64)>,
    pub stream: StreamFilter,
    pub end: u64,
}

/// The bytes reserved for output logs over all records.
struct Budget {
    total: u64,
    reserved: AtomicU64,
}

impl Budget {
    fn reserve(&self, n: u64) -> bool {
        self.reserved
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |r| {
                r.checked_add(n).filter(|&t| t <= self.total)
            })
            .is_ok()
    }

    fn release(&self, n: u64) {
        let _ = self
            .reserved
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |r| {
                Some(r.saturating_sub(n))
            });
    }
}

/// The last sample's figures: record number → (the pid they were read under, figures).
type SampledStats = std::collections::HashMap<u64, (u32, ProcessStats)>;

pub struct ProcessService {
    supervisor: Arc<Supervisor>,
    work_dir: PathBuf,
    grace: Duration,
    settings: Mutex<ProcessConfig>,
    records: Mutex<BTreeMap<u64, Arc<ManagedProcess>>>,
    /// The figures of the last `sample` (replaced whole; a listing clones the `Arc`).
    sampled: Mutex<Arc<SampledStats>>,
    next_id: AtomicU64,
    /// Runs are labelled apart, so that background ids stay dense.
    next_run: AtomicU64,
    running: Arc<AtomicUsize>,
    budget: Arc<Budget>,
    shutdown: CancellationToken,
    /// Cancelled when a reload's drain ends: every `run` still going is stopped and answered
    /// `CutByReload` (`processes/handoff.rs`).
    pub(crate) runs_cut: CancellationToken,
    /// `--state-dir`: records and output kept across restarts (see `durable`).
    state: Option<Arc<crate::state::StateStore>>,
}

/// A slot among the running processes; released on drop.
struct RunningSlot(Arc<AtomicUsize>);

impl Drop for RunningSlot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Kills a `run`'s process if the request goes away before it ended.
struct KillOnDrop(Option<ChildHandle>);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        if let Some(h) = self.0.take()
            && h.exit().is_none()
        {
            h.kill_detached();
        }
    }
}

pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

impl ProcessService {
    pub fn new(config: &Config, supervisor: Arc<Supervisor>, shutdown: CancellationToken) -> Self {
        let settings = ProcessConfig {
            max_concurrent_processes: config.process_max_concurrent,
            default_run_timeout_ms: config.process_run_timeout.as_millis() as u64,
            max_run_timeout_ms: config.process_max_run_timeout.as_millis() as u64,
            max_output_bytes: config.process_max_output_bytes,
            max_log_bytes_per_process: config.process_max_log_bytes,
            max_input_bytes_per_request: config.process_max_input_bytes,
        };
        ProcessService {
            supervisor,
            work_dir: config.work_dir.clone(),
            grace: config.agent_grace,
            settings: Mutex::new(clamp(settings)),
            records: Mutex::new(BTreeMap::new()),
            sampled: Mutex::new(Arc::default()),
            next_id: AtomicU64::new(1),
            next_run: AtomicU64::new(1),
            running: Arc::new(AtomicUsize::new(0)),
            budget: Arc::new(Budget {
                total: config.process_max_total_log_bytes,
                reserved: AtomicU64::new(0),
            }),
            shutdown,
            runs_cut: CancellationToken::new(),
            state: None,
        }
    }

    /// Durable state: lists the processes recovered from the state dir (exited; the ones that
    /// still ran with `daemon_restart`), each with its output within the log cap, and keeps
    /// every new one on disk.
    pub fn with_state(
        mut self,
        store: Arc<crate::state::StateStore>,
        recovered: Vec<crate::state::Entry>,
    ) -> Self {
        let cap = self
            .config()
            .max_log_bytes_per_process
            .max(log::CHUNK_OVERHEAD + 1);
        self.state = Some(store);
        let mut records = crate::sys::lock(&self.records);
        for e in recovered {
            let name = e.name.clone();
            let r = durable::recover(e);
            let Some((n, r)) = r.and_then(|r| {
                let n = r.meta.id.strip_prefix("proc_")?.parse().ok()?;
                Some((n, r))
            }) else {
                // Not a record of ours: moved aside, never deleted.
                if let Some(store) = &self.state {
                    store.quarantine("processes", &name);
                }
                continue;
            };
            let log = OutputLog::recovered(cap, r.chunks);
            let on_disk = log.end();
            if let Some(p) = self.exited_record(n, r.meta, r.exit, log, on_disk) {
                records.insert(n, p);
                self.next_id.fetch_max(n + 1, Ordering::Relaxed);
            }
        }
        self.forget_oldest_exited(&mut records);
        drop(records);
        self
    }

    /// An exited record rebuilt from the state dir or from a reload's hand-off: its log (closed)
    /// takes what it holds from the total budget, and with a state dir its durable state goes on
    /// (the chunks from offset `on_disk` on are written, for what the disk does not have yet).
    /// `None` when the budget is full.
    fn exited_record(
        &self,
        n: u64,
        meta: durable::ProcMeta,
        exit: (ExitInfo, u64),
        log: OutputLog,
        on_disk: u64,
    ) -> Option<Arc<ManagedProcess>> {
        if !self.budget.reserve(log.held()) {
            tracing::warn!(id = %meta.id,
                "an exited process record is dropped: the total log budget is full");
            return None;
        }
        log.close();
        let log = Arc::new(log);
        if let Some(store) = &self.state {
            let track = durable::ProcTrack::new(store, meta.clone(), false);
            track.catch_up(&log, on_disk);
            if meta.exit.is_none() {
                track.ended(&exit.0, exit.1);
            }
            log.set_durable(track);
        }
        Some(Arc::new(ManagedProcess {
            id: meta.id,
            command: meta.command,
            args: meta.args,
            cwd: meta.cwd,
            tty: meta.tty,
            interactive: meta.interactive,
            created_at_ms: meta.created_at_ms,
            handle: None,
            log,
            stdin: tokio::sync::Mutex::new(None),
            pty: None,
            ended: watch::channel(Some(exit)).0,
            readers: AtomicUsize::new(0),
            pumps_stopped: watch::channel(false).0,
            freeze: CancellationToken::new(),
            pipes: Vec::new(),
            n,
        }))
    }

    pub fn config(&self) -> ProcessConfig {
        *crate::sys::lock(&self.settings)
    }

    /// Replaces the runtime settings: every value must be positive and within the hard
    /// ceilings; the default run timeout is clamped to the maximum.
    pub fn set_config(&self, new: ProcessConfig) -> Result<ProcessConfig, ProcessError> {
        let checks: [(&str, u64, u64); 6] = [
            (
                "maxConcurrentProcesses",
                new.max_concurrent_processes as u64,
                CEIL_CONCURRENT as u64,
            ),
            (
                "defaultRunTimeoutMs",
                new.default_run_timeout_ms,
                CEIL_RUN_TIMEOUT_MS,
            ),
            (
                "maxRunTimeoutMs",
                new.max_run_timeout_ms,
                CEIL_RUN_TIMEOUT_MS,
            ),
            ("maxOutputBytes", new.max_output_bytes, CEIL_OUTPUT_BYTES),
            (
                "maxLogBytesPerProcess",
                new.max_log_bytes_per_process,
                self.budget.total,
            ),
            (
                "maxInputBytesPerRequest",
                new.max_input_bytes_per_request,
                CEIL_INPUT_BYTES,
            ),
        ];
        for (name, value, ceil) in checks {
            if value == 0 {
                return Err(ProcessError::Invalid(format!(
                    "{name} must be greater than 0"
                )));
            }
            if value > ceil {
                return Err(ProcessError::Invalid(format!(
                    "{name} must be at most {ceil}"
                )));
            }
        }
        let new = clamp(new);
        *crate::sys::lock(&self.settings) = new;
        Ok(new)
    }

    /// Takes `bytes` from the total output budget (503 when it does not fit).
    fn reserve(&self, bytes: u64) -> Result<ReservationGuard, ProcessError> {
        if !self.budget.reserve(bytes) {
            return Err(ProcessError::LogBudget {
                total: self.budget.total,
            });
        }
        Ok(ReservationGuard {
            budget: self.budget.clone(),
            bytes,
        })
    }

    fn admit(&self) -> Result<RunningSlot, ProcessError> {
        if self.shutdown.is_cancelled() {
            return Err(ProcessError::ShuttingDown);
        }
        let limit = self.config().max_concurrent_processes;
        self.running
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < limit).then_some(n + 1)
            })
            .map_err(|_| ProcessError::TooManyProcesses { limit })?;
        Ok(RunningSlot(self.running.clone()))
    }

    fn spec(
        &self,
        id: &str,
        command: &str,
        args: &[String],
        cwd: Option<&str>,
        env: &BTreeMap<String, String>,
        tty: bool,
    ) -> Result<SpawnSpec, ProcessError> {
        if command.is_empty() {
            return Err(ProcessError::Invalid("command must not be empty".into()));
        }
        if command.contains('\0') || args.iter().any(|a| a.contains('\0')) {
            return Err(ProcessError::Invalid(
                "command and args must not contain NUL".into(),
            ));
        }
        for (k, v) in env {
            if k.is_empty() || k.contains('=') || k.contains('\0') || v.contains('\0') {
                return Err(ProcessError::Invalid(format!(
                    "`{k}` is not a valid environment variable name (or its value has a NUL)"
                )));
            }
        }
        let cwd = match cwd {
            Some(c) if c.contains('\0') => {
                return Err(ProcessError::Invalid("cwd must not contain NUL".into()));
            }
            Some(c) if !c.is_empty() => self.work_dir.join(c),
            _ => self.work_dir.clone(),
        };
        let mut env: Vec<(OsString, OsString)> = env
            .iter()
            .map(|(k, v)| (OsString::from(k), OsString::from(v)))
            .collect();
        if tty && !env.iter().any(|(k, _)| k == "TERM") {
            env.push(("TERM".into(), "xterm-256color".into()));
        }
        Ok(SpawnSpec {
            program: PathBuf::from(command),
            args: args.iter().map(OsString::from).collect(),
            env,
            cwd,
            name: id.to_string(),
            agent: format!("process:{}", basename(command)),
        })
    }

    /// Starts a background process.
    pub async fn create(&self, req: CreateRequest) -> Result<Arc<ManagedProcess>, ProcessError> {
        let n = self.next_id.fetch_add(1, Ordering::Relaxed);
        let id = format!("proc_{n}");
        let spec = self.spec(
            &id,
            &req.command,
            &req.args,
            req.cwd.as_deref(),
            &req.env,
            req.tty,
        )?;
        let (cols, rows) = (req.cols.unwrap_or(80), req.rows.unwrap_or(24));
        if req.tty && (cols == 0 || rows == 0) {
            return Err(ProcessError::Invalid(
                "cols and rows must be positive".into(),
            ));
        }
        let slot = self.admit()?;
        // The log's own floor (room for one byte), so that what it holds never exceeds what
        // was reserved.
        let cap = self
            .config()
            .max_log_bytes_per_process
            .max(log::CHUNK_OVERHEAD + 1);
        let reservation = self.reserve(cap)?;
        let (pty, stdio) = if req.tty {
            let (pty, slave) =
                pty::open(cols, rows).map_err(|e| ProcessError::Io(format!("openpty: {e}")))?;
            (Some(Arc::new(pty)), ChildStdio::Terminal(slave))
        } else {
            (None, ChildStdio::AllPipes)
        };
        let spawned = self
            .supervisor
            .start_with(spec, stdio)
            .instrument(crate::telemetry::task_span("process start", &req.command))
            .await
            .map_err(|source| ProcessError::Spawn {
                command: req.command.clone(),
                source,
            })?;
        let log = Arc::new(OutputLog::new(cap));
        let freeze = CancellationToken::new();
        if let Some(store) = &self.state {
            log.set_durable(durable::ProcTrack::new(
                store,
                durable::ProcMeta {
                    id: id.clone(),
                    command: req.command.clone(),
                    args: req.args.clone(),
                    cwd: req.cwd.clone(),
                    tty: req.tty,
                    interactive: req.interactive,
                    created_at_ms: now_ms(),
                    exit: None,
                },
                true,
            ));
        }
        let mut readers = Vec::new();
        let mut pipes = Vec::new();
        if let Some(out) = spawned.stdout {
            if let Ok(dup) = std::os::fd::AsFd::as_fd(&out).try_clone_to_owned() {
                pipes.push((LogStream::Stdout, dup));
            }
            readers.push(tokio::spawn(pump(
                out,
                LogStream::Stdout,
                log.clone(),
                freeze.clone(),
            )));
        }
        if let Some(err) = spawned.stderr {
            if let Ok(dup) = std::os::fd::AsFd::as_fd(&err).try_clone_to_owned() {
                pipes.push((LogStream::Stderr, dup));
            }
            readers.push(tokio::spawn(pump(
                err,
                LogStream::Stderr,
                log.clone(),
                freeze.clone(),
            )));
        }
        if let Some(p) = &pty {
            readers.push(tokio::spawn(pump_pty(
                p.clone(),
                log.clone(),
                freeze.clone(),
            )));
        }
        // Without `interactive` the child sees end of input at once.
        let stdin = if req.interactive { spawned.stdin } else { None };
        let process = Arc::new(ManagedProcess {
            id: id.clone(),
            command: req.command,
            args: req.args,
            cwd: req.cwd,
            tty: req.tty,
            interactive: req.interactive,
            created_at_ms: now_ms(),
            handle: Some(spawned.handle),
            log,
            stdin: tokio::sync::Mutex::new(stdin),
            pty,
            ended: watch::channel(None).0,
            readers: AtomicUsize::new(0),
            pumps_stopped: watch::channel(false).0,
            freeze,
            pipes,
            n,
        });
        reservation.keep();
        tokio::spawn(monitor(process.clone(), readers, slot, self.budget.clone()));
        let mut records = crate::sys::lock(&self.records);
        records.insert(n, process.clone());
        self.forget_oldest_exited(&mut records);
        Ok(process)
    }

    fn forget_oldest_exited(&self, records: &mut BTreeMap<u64, Arc<ManagedProcess>>) {
        let exited: Vec<u64> = records
            .iter()
            .filter(|(_, p)| p.ended().is_some())
            .map(|(k, _)| *k)
            .collect();
        if exited.len() > MAX_EXITED_RECORDS {
            for k in &exited[..exited.len() - MAX_EXITED_RECORDS] {
                if let Some(p) = records.remove(k) {
                    self.budget.release(p.log.held());
                    if let Some(t) = p.log.durable() {
                        t.forget();
                    }
                }
            }
        }
    }

    /// Whether each record is running (true) or exited, for the metrics; no `/proc` read.
    pub fn states(&self) -> Vec<bool> {
        self.records
            .lock()
            .expect("records lock")
            .values()
            .map(|p| p.ended().is_none())
            .collect()
    }

    /// Every record, read on the blocking pool with one `/proc` scan for all of them.
    /// Every record, oldest first; see `page`.
    pub async fn list(&self) -> Vec<ProcessInfo> {
        self.page(None, usize::MAX).await
    }

    /// Reads the figures of every running process from procfs on the blocking pool and keeps
    /// them for listings. The sampler calls it every `metrics::SAMPLE_EVERY`; no request does.
    pub async fn sample(&self) {
        let running: Vec<(u64, Arc<ManagedProcess>)> = crate::sys::lock(&self.records)
            .iter()
            .filter(|(_, p)| p.ended().is_none())
            .map(|(n, p)| (*n, p.clone()))
            .collect();
        if running.is_empty() {
            *crate::sys::lock(&self.sampled) = Arc::default();
            return;
        }
        let figures: SampledStats = crate::sys::blocking(move || {
            let mut scan = GroupScan::default();
            running
                .iter()
                .filter_map(|(n, p)| {
                    let info = p.info_in(&mut scan);
                    Some((*n, (info.pid?, info.stats?)))
                })
                .collect()
        })
        .await;
        *crate::sys::lock(&self.sampled) = Arc::new(figures);
    }

    /// At most `limit` records with an id number above `after`, oldest first. A running
    /// process's figures are the last sample's (at most `metrics::SAMPLE_EVERY` old), so a
    /// listing costs the same whatever the number of processes; only a process started since
    /// the last sample has its figures read from procfs here (on the blocking pool).
    pub async fn page(&self, after: Option<u64>, limit: usize) -> Vec<ProcessInfo> {
        let start = after.map_or(0, |a| a.saturating_add(1));
        let page: Vec<(u64, Arc<ManagedProcess>)> = crate::sys::lock(&self.records)
            .range(start..)
            .take(limit)
            .map(|(n, p)| (*n, p.clone()))
            .collect();
        let sampled = crate::sys::lock(&self.sampled).clone();
        let mut rows = Vec::with_capacity(page.len());
        let mut fresh = Vec::new();
        for (k, (n, p)) in page.iter().enumerate() {
            let mut info = p.info_without_stats();
            if let Some(pid) = info.pid {
                match sampled.get(n).filter(|(at, _)| *at == pid) {
                    Some((_, stats)) => info.stats = Some(stats.clone()),
                    None => fresh.push((k, p.clone())),
                }
            }
            rows.push(info);
        }
        if !fresh.is_empty() {
            let read: Vec<(usize, ProcessInfo)> = crate::sys::blocking(move || {
                let mut scan = GroupScan::default();
                fresh
                    .into_iter()
                    .map(|(k, p)| (k, p.info_in(&mut scan)))
                    .collect()
            })
            .await;
            for (k, info) in read {
                rows[k] = info;
            }
        }
        rows
    }

    pub fn get(&self, id: &str) -> Result<Arc<ManagedProcess>, ProcessError> {
        let n = id.strip_prefix("proc_").and_then(|n| n.parse::<u64>().ok());
        n.and_then(|n| crate::sys::lock(&self.records).get(&n).cloned())
            .ok_or_else(|| ProcessError::NotFound { id: id.to_string() })
    }

    /// Removes an exited process's record and its log.
    pub fn delete(&self, id: &str) -> Result<(), ProcessError> {
        let p = self.get(id)?;
        if p.ended().is_none() {
            return Err(ProcessError::Conflict {
                id: id.to_string(),
                reason: "the process is still running; stop or kill it first",
            });
        }
        let mut records = crate::sys::lock(&self.records);
        if let Some(n) = id.strip_prefix("proc_").and_then(|n| n.parse::<u64>().ok())
            && records.remove(&n).is_some()
        {
            self.budget.release(p.log.held());
            if let Some(t) = p.log.durable() {
                t.forget();
            }
        }
        Ok(())
    }

    /// TERM to the tree, the grace period, then KILL; waits up to `wait` for the end.
    pub async fn stop(&self, id: &str, wait: Duration) -> Result<ProcessInfo, ProcessError> {
        let p = self.get(id)?;
        let grace = self.grace;
        self.end(p, wait, move |h| async move { h.stop(grace).await })
            .await
    }

    /// KILL to the whole tree at once; waits up to `wait` for the end.
    pub async fn kill(&self, id: &str, wait: Duration) -> Result<ProcessInfo, ProcessError> {
        let p = self.get(id)?;
        self.end(p, wait, |h| async move { h.kill().await }).await
    }

    async fn end<F, Fut>(
        &self,
        p: Arc<ManagedProcess>,
        wait: Duration,
        how: F,
    ) -> Result<ProcessInfo, ProcessError>
    where
        F: FnOnce(ChildHandle) -> Fut,
        Fut: std::future::Future<Output = ExitInfo> + Send + 'static,
    {
        let wait = wait.min(MAX_WAIT);
        let Some(handle) = p.handle.clone() else {
            // Recovered from the state dir: it ended with the daemon's last run.
            return Ok(p.info().await);
        };
        // The supervisor runs the stop in its own task; the first poll starts it.
        let stopping = tokio::spawn(how(handle));
        let _ = tokio::time::timeout(wait, async {
            let _ = stopping.await;
            p.wait_ended().await;
        })
        .await;
        Ok(p.info().await)
    }

    pub fn logs(
        &self,
        id: &str,
        since: Option<u64>,
        tail: Option<usize>,
        stream: Option<StreamFilter>,
    ) -> Result<Logs, ProcessError> {
        let p = self.get(id)?;
        let stream = stream.unwrap_or(default_filter(&p));
        let since = since.unwrap_or(0);
        let (chunks, gap) = match tail {
            Some(n) => (p.log.tail(since, stream, n), None),
            None => {
                let r = p.log.read_after(since, stream, usize::MAX);
                (r.chunks, r.gap)
            }
        };
        Ok(Logs {
            chunks,
            gap,
            stream,
            end: p.log.end(),
        })
    }

    /// A place among the process's readers (log followers, terminal sockets).
    pub fn reader(&self, id: &str) -> Result<ReaderSlot, ProcessError> {
        let p = self.get(id)?;
        p.readers
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < MAX_READERS_PER_PROCESS).then_some(n + 1)
            })
            .map_err(|_| ProcessError::TooManyReaders {
                id: id.to_string(),
                limit: MAX_READERS_PER_PROCESS,
            })?;
        Ok(ReaderSlot { process: p })
    }

    /// The limit on one input request's decoded bytes.
    pub fn max_input_bytes(&self) -> u64 {
        self.config().max_input_bytes_per_request
    }

    /// Writes to the process's stdin (or its terminal); returns the bytes written.
    pub async fn input(&self, id: &str, data: &[u8]) -> Result<usize, ProcessError> {
        let p = self.get(id)?;
        write_input(&p, data, self.max_input_bytes()).await
    }

    /// Sets a terminal's size (TIOCSWINSZ) and signals SIGWINCH to its process group.
    pub fn resize(&self, id: &str, cols: u32, rows: u32) -> Result<(u16, u16), ProcessError> {
        let p = self.get(id)?;
        resize(&p, cols, rows)?;
        Ok((cols as u16, rows as u16))
    }

    /// Runs a program to completion (or its timeout) and returns its output.
    pub async fn run(&self, req: RunRequest) -> Result<RunResponse, ProcessError> {
        let n = self.next_run.fetch_add(1, Ordering::Relaxed);
        let spec = self.spec(
            &format!("run_{n}"),
            &req.command,
            &req.args,
            req.cwd.as_deref(),
            &req.env,
            false,
        )?;
        let settings = self.config();
        let timeout = Duration::from_millis(
            req.timeout_ms
                .unwrap_or(settings.default_run_timeout_ms)
                .min(settings.max_run_timeout_ms),
        );
        let limit = req
            .max_output_bytes
            .unwrap_or(settings.max_output_bytes)
            .min(settings.max_output_bytes) as usize;
        let _slot = self.admit()?;
        // What the capture may hold (both streams) comes out of the same budget as the logs,
        // for the run's duration.
        let _reservation = self.reserve(2 * limit as u64)?;
        let started = Instant::now();
        let spawned = self
            .supervisor
            .start_with(spec, ChildStdio::AllPipes)
            .instrument(crate::telemetry::task_span("process run", &req.command))
            .await
            .map_err(|source| ProcessError::Spawn {
                command: req.command.clone(),
                source,
            })?;
        drop(spawned.stdin);
        let handle = spawned.handle;
        let guard = KillOnDrop(Some(handle.clone()));
        let out = tokio::spawn(capture(spawned.stdout, limit));
        let err = tokio::spawn(capture(spawned.stderr, limit));
        let (exit, timed_out) = tokio::select! {
            waited = tokio::time::timeout(timeout, handle.wait()) => match waited {
                Ok(exit) => (exit, false),
                Err(_) => (handle.kill().await, true),
            },
            _ = self.runs_cut.cancelled() => {
                // Never answered as if the program had died of a signal: it was stopped for the
                // reload, and the client is told so.
                handle.kill().await;
                return Err(ProcessError::CutByReload { command: req.command.clone() });
            }
        };
        drop(guard);
        let drained = tokio::time::timeout(DRAIN_TIMEOUT, async {
            (out.await.unwrap_or_default(), err.await.unwrap_or_default())
        })
        .await;
        let ((stdout, stdout_truncated), (stderr, stderr_truncated)) = drained.unwrap_or_default();
        Ok(RunResponse {
            exit_code: if timed_out { None } else { exit.code },
            exit_signal: if timed_out { None } else { exit.signal },
            timed_out,
            stdout: String::from_utf8_lossy(&stdout).into_owned(),
            stderr: String::from_utf8_lossy(&stderr).into_owned(),
            stdout_truncated,
            stderr_truncated,
            duration_ms: started.elapsed().as_millis() as u64,
        })
    }
}

/// Undoes a log reservation unless `create` got far enough to hand it to the monitor.
struct ReservationGuard {
    budget: Arc<Budget>,
    bytes: u64,
}

impl ReservationGuard {
    /// The reservation now belongs to the process (its monitor and its deletion give it back).
    fn keep(mut self) {
        self.bytes = 0;
    }
}

impl Drop for ReservationGuard {
    fn drop(&mut self) {
        self.budget.release(self.bytes);
    }
}

/// The stream a process's logs show by default: its terminal, or everything.
pub fn default_filter(p: &ManagedProcess) -> StreamFilter {
    if p.tty {
        StreamFilter::Pty
    } else {
        StreamFilter::Combined
    }
}

fn clamp(mut c: ProcessConfig) -> ProcessConfig {
    c.default_run_timeout_ms = c.default_run_timeout_ms.min(c.max_run_timeout_ms);
    c
}

fn basename(command: &str) -> &str {
    Path::new(command)
        .file_name()
        .and_then(|s| s.to_str())
        .unwrap_or(command)
}
