//! One serverId: its lifecycle, its agent process, the way to its stdin (a POST writes directly
//! when nothing is queued, a WebSocket batch its lines packed into atomic writes of at most
//! `PIPE_BUF`, else a writer task keeps order), the stdout reader task, the pending requests and
//! the event log. The stdout side (the reader task and its bounded line reader) is `stdout.rs`.
//!
//! The whole life of an instance is one state machine, [`Life`], behind one lock, with one watch
//! ([`Seen`]) that tasks wait on:
//!
//! ```text
//! Starting ──start──▶ Running ──stdout ends / exit──▶ Ended
//!    │                                                  (process exit recorded when known)
//!    └──start fails──▶ Failed
//! retired: set at any point by `AcpService::retire`, never cleared
//! ```
//!
//! **Invariant:** every line the agent writes is either handed to the one POST waiting for it or
//! appended to the event log (nothing is lost), in the order written; once the agent is gone every
//! waiting POST learns it at once; a request's pending entry exists only while its line is on its
//! way to (or reached) the agent's stdin; `Status::Exited` is reported only once the process tree
//! is gone, and then always (never "running" with an exit).

mod handoff;

pub(super) use handoff::FrozenStdout;
pub use handoff::{ExitedState, InstanceState};

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use tokio::process::ChildStdin;
use tokio::sync::{mpsc, oneshot, watch};

use super::caps::{Budget, Reservation};
use super::events::{EventLog, LogLimits};
use super::jsonrpc::{AgentLine, BadLine, Envelope, IdKey, Kind};
use super::{AcpError, Ended};
use crate::logging::RateLimit;
use crate::supervisor::{AgentProcess, ChildHandle, ExitInfo, SpawnSpec};

/// What `GET /v1/acp` says of the process: `starting` until it runs, `exited` once its whole
/// tree is gone (or it never started), `running` in between — also while an agent that closed
/// its stdout is being stopped (it can no longer answer, but it still exists).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
#[schema(as = ServerStatus)]
pub enum Status {
    Starting,
    Running,
    Exited,
}

/// A line for the agent's stdin and what to tell when it was written (or could not be).
struct WriteJob {
    line: Bytes,
    done: Done,
    /// Its bytes in the stdin budgets, given back when the job is written or dropped.
    _queued: Reservation,
}

/// The budgets of bytes queued for stdin: this instance's and every instance's together.
pub struct StdinCaps {
    pub per_instance: Arc<Budget>,
    pub total: Arc<Budget>,
}

/// Why a line could not be handed to the agent.
enum SendFail {
    Gone,
    Full { what: &'static str, limit: u64 },
}

enum Done {
    /// A request: on failure its pending entry is dropped, which wakes its POST.
    Request(IdKey),
    /// A notification or response: the POST waits for this acknowledgement.
    Ack(oneshot::Sender<()>),
    /// Several lines written as one (a WebSocket read batch): on failure the pending entries of
    /// its requests are dropped; the acknowledgement, when asked for, follows the write.
    Batch {
        keys: Vec<IdKey>,
        ack: Option<oneshot::Sender<()>>,
    },
}

/// The live process and the way to its stdin.
struct Running {
    handle: ChildHandle,
    writer: mpsc::Sender<WriteJob>,
    stdin: Arc<Mutex<Stdin>>,
}

/// The agent's stdin, shared by the POSTs' fast path and the writer task.
struct Stdin {
    pipe: ChildStdin,
    /// Lines are queued to (or being written by) the writer task: later lines must queue too,
    /// so that they stay in order.
    backlog: bool,
    broken: bool,
    scratch: Vec<u8>,
}

/// How much of the agent's stderr a 502 carries ("the last few KiB").
const STDERR_EXCERPT: usize = 4096;

/// Writes of at most this many bytes to a pipe are atomic: all or nothing (POSIX `PIPE_BUF`).
const PIPE_BUF: usize = 4096;

fn lock_stdin(m: &Mutex<Stdin>) -> std::sync::MutexGuard<'_, Stdin> {
    crate::sys::lock(m)
}

/// Where the instance is in its life.
enum Phase {
    /// No process yet (the agent may be installing).
    Starting,
    /// The start failed; concurrent first POSTs share this error. Terminal.
    Failed(AcpError),
    /// The process runs and can be written to.
    Running(Arc<Running>),
    /// The agent can no longer answer (its stdout ended, or it exited): every waiter was failed,
    /// the log is closed. The process may still be being stopped; `Life::exit` says when it is
    /// gone. Terminal.
    Ended {
        /// `None` for an ended instance carried across a reload (its process was long gone).
        running: Option<Arc<Running>>,
        ended: Arc<Ended>,
    },
}

/// The one state of an instance (see the module doc).
struct Life {
    phase: Phase,
    /// Taken out of the registry (`AcpService::retire`): unreachable by serverId, its log
    /// closed; a start in progress does not publish its process (it kills it), and nothing more
    /// is written to its stdin.
    retired: bool,
    /// How the process ended, once its whole tree is gone.
    exit: Option<ExitInfo>,
    /// Requests written (or being written) and not yet answered. `None`: nobody waits
    /// (respond-async, WebSocket), the answer goes to the event log; the entry still counts
    /// (duplicate ids, `pendingRequests`). Emptied when the phase becomes `Ended`.
    waiters: HashMap<IdKey, Option<oneshot::Sender<(Bytes, u64)>>>,
}

/// What the watch tells the instance's tasks (and `AcpService`'s stops) about `Life`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Seen {
    /// The phase is `Ended` or `Failed`: nothing more will be read from or written to the agent.
    pub ended: bool,
    pub retired: bool,
    /// The process tree is gone (or never existed).
    pub exited: bool,
}

impl Life {
    fn seen(&self) -> Seen {
        Seen {
            ended: matches!(self.phase, Phase::Ended { .. } | Phase::Failed(_)),
            retired: self.retired,
            exited: self.exit.is_some() || matches!(self.phase, Phase::Failed(_)),
        }
    }

    fn status(&self) -> Status {
        match &self.phase {
            _ if self.exit.is_some() => Status::Exited,
            Phase::Starting => Status::Starting,
            Phase::Failed(_) => Status::Exited,
            Phase::Running(_) | Phase::Ended { .. } => Status::Running,
        }
    }

    fn running(&self) -> Option<&Arc<Running>> {
        match &self.phase {
            Phase::Running(r)
            | Phase::Ended {
                running: Some(r), ..
            } => Some(r),
            Phase::Starting | Phase::Failed(_) | Phase::Ended { running: None, .. } => None,
        }
    }
}

/// What `GET /v1/acp` shows of an instance, read under its lock at once so that the fields agree.
pub struct Snapshot {
    pub status: Status,
    pub handle: Option<ChildHandle>,
    /// How the process ended (only with `Status::Exited`).
    pub exit: Option<ExitInfo>,
    pub pending_requests: usize,
}

pub struct AcpInstance {
    pub server_id: String,
    pub agent: String,
    pub created_at_ms: u64,
    pub events: Arc<EventLog>,
    /// How long an agent that closed its stdout gets to exit after SIGTERM.
    pub(super) grace: Duration,
    life: Mutex<Life>,
    /// Follows `life` (sent under its lock).
    seen: watch::Sender<Seen>,
    stdin_caps: StdinCaps,
    /// Serializes the start so that concurrent first POSTs start one process.
    start_lock: tokio::sync::Mutex<()>,
    invalid_lines: AtomicU64,
    /// Budget of the "dropped an agent stdout line" warnings: an agent writing garbage in a loop
    /// must not flood the log (the count above still sees every line).
    invalid_log: Mutex<RateLimit>,
    /// Cancelled by a reload (the service's token): a POST waiting for its answer is answered
    /// `Accepted` (the answer goes to the event log).
    handoff: tokio_util::sync::CancellationToken,
    /// Cancelled by `export`: the stdout reader stops and hands its pipe to `frozen`.
    pub(super) freeze: tokio_util::sync::CancellationToken,
    frozen: Mutex<Option<oneshot::Sender<FrozenStdout>>>,
}

/// What a POST of one envelope produced.
pub enum Delivered {
    /// The agent's response line, and the id of the last event logged before it: everything the
    /// agent wrote before the answer (its updates) is in the log at or below that id.
    Response { line: Bytes, last_event_id: u64 },
    /// Written; nothing to wait for (or the caller asked not to wait).
    Accepted,
}

/// The pending entries of requests on their way to the agent's stdin: dropped before `reached`
/// (the send failed, or its future was dropped while it waited for room in the stdin queue, say
/// because the client went away), it removes them, so an id is never left "in flight" for a line
/// the agent never got.
struct PendingGuard<'a> {
    inst: &'a AcpInstance,
    keys: Vec<IdKey>,
}

impl PendingGuard<'_> {
    /// The lines reached the agent's stdin (or the writer task, which answers for them now).
    fn reached(mut self) {
        self.keys.clear();
    }

    /// Lines `from..` of the keys did not reach the agent (the first ones did).
    fn keep_first(&mut self, n: usize) {
        self.keys.drain(..n.min(self.keys.len()));
    }
}

impl Drop for PendingGuard<'_> {
    fn drop(&mut self) {
        if self.keys.is_empty() {
            return;
        }
        let mut life = self.inst.life();
        for k in &self.keys {
            life.waiters.remove(k);
        }
    }
}

impl AcpInstance {
    pub fn new(
        server_id: String,
        agent: String,
        limits: LogLimits,
        grace: Duration,
        log_budget: RateLimit,
        stdin_caps: StdinCaps,
    ) -> Self {
        let created_at_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_millis() as u64)
            .unwrap_or(0);
        let life = Life {
            phase: Phase::Starting,
            retired: false,
            exit: None,
            waiters: HashMap::new(),
        };
        let (seen, _) = watch::channel(life.seen());
        AcpInstance {
            server_id,
            agent,
            created_at_ms,
            events: Arc::new(EventLog::new(limits)),
            grace,
            life: Mutex::new(life),
            seen,
            stdin_caps,
            start_lock: tokio::sync::Mutex::new(()),
            invalid_lines: AtomicU64::new(0),
            invalid_log: Mutex::new(log_budget),
            handoff: tokio_util::sync::CancellationToken::new(),
            freeze: tokio_util::sync::CancellationToken::new(),
            frozen: Mutex::new(None),
        }
    }

    /// The token a reload cancels (see the `handoff` field).
    pub fn with_handoff(mut self, token: tokio_util::sync::CancellationToken) -> Self {
        self.handoff = token;
        self
    }

    /// An instance recovered from the state dir (`--state-dir`): `exited` with the reason
    /// `daemon_restart` and its recovered event log (open) until the next POST starts its agent
    /// again. Its numbering continues where the log's left off.
    pub fn recovered(base: AcpInstance, created_at_ms: u64, events: EventLog) -> Self {
        let mut inst = base;
        inst.created_at_ms = created_at_ms;
        inst.events = Arc::new(events);
        let life = inst.life.get_mut().unwrap_or_else(|e| e.into_inner());
        life.exit = Some(ExitInfo {
            reason: crate::supervisor::ExitReason::DaemonRestart,
            code: None,
            signal: None,
        });
        let seen = life.seen();
        inst.seen.send_replace(seen);
        inst
    }

    fn life(&self) -> std::sync::MutexGuard<'_, Life> {
        crate::sys::lock(&self.life)
    }

    /// Changes `life` under its lock and tells the watchers when what they see changed.
    fn change<T>(&self, f: impl FnOnce(&mut Life) -> T) -> T {
        let mut life = self.life();
        let out = f(&mut life);
        let now = life.seen();
        self.seen.send_if_modified(|s| {
            let changed = *s != now;
            *s = now;
            changed
        });
        out
    }

    pub fn status(&self) -> Status {
        self.life().status()
    }

    pub fn snapshot(&self) -> Snapshot {
        let life = self.life();
        let status = life.status();
        Snapshot {
            status,
            handle: life.running().map(|r| r.handle.clone()),
            exit: life.exit.clone().filter(|_| status == Status::Exited),
            pending_requests: life.waiters.len(),
        }
    }

    fn handle(&self) -> Option<ChildHandle> {
        self.life().running().map(|r| r.handle.clone())
    }

    pub fn invalid_lines(&self) -> u64 {
        self.invalid_lines.load(Ordering::Relaxed)
    }

    /// True once a process was started (whatever became of it since).
    pub fn is_started(&self) -> bool {
        self.life().running().is_some()
    }

    pub fn is_retired(&self) -> bool {
        self.life().retired
    }

    /// Waits until `done` holds for what the watch shows.
    pub async fn wait_for(&self, done: impl Fn(&Seen) -> bool) {
        let mut rx = self.seen.subscribe();
        let _ = rx.wait_for(done).await;
    }

    /// Starts the process once; concurrent callers wait for the first and share its outcome.
    /// `prepare` runs at most once per instance (it may install the agent, which takes long).
    /// The process is published under the life lock, so a retirement either sees it (and stops
    /// it) or came first, and then the process just started is killed here.
    pub async fn ensure_started<P, S>(
        self: &Arc<Self>,
        prepare: P,
        spawn: impl FnOnce(SpawnSpec) -> S,
        max_line: usize,
    ) -> Result<(), AcpError>
    where
        P: std::future::Future<Output = Result<SpawnSpec, AcpError>>,
        S: std::future::Future<Output = Result<AgentProcess, AcpError>>,
    {
        let _start = self.start_lock.lock().await;
        match &self.life().phase {
            Phase::Starting => {}
            Phase::Failed(e) => return Err(e.clone()),
            Phase::Running(_) | Phase::Ended { .. } => return Ok(()),
        }
        // `prepare` may be cancelled at any await (client gone); nothing has been spawned yet
        // then, and the next POST prepares again.
        let spec = match prepare.await {
            Ok(s) => s,
            Err(e) => return Err(self.start_failed(e)),
        };
        if self.is_retired() {
            return Err(self.not_found());
        }
        // Cancel-safe too: a process whose start completes after this future was dropped is
        // killed by the supervisor.
        let process = match spawn(spec).await {
            Ok(p) => p,
            Err(e) => return Err(self.start_failed(e)),
        };
        let (tx, rx) = mpsc::channel(1024);
        let handle = process.handle.clone();
        let stdin = Arc::new(Mutex::new(Stdin {
            pipe: process.stdin,
            backlog: false,
            broken: false,
            scratch: Vec::with_capacity(PIPE_BUF),
        }));
        let running = Arc::new(Running {
            handle: handle.clone(),
            writer: tx,
            stdin: stdin.clone(),
        });
        let published = self.change(|life| {
            if life.retired {
                return false;
            }
            life.phase = Phase::Running(running);
            // A recovered instance's "exited (daemon_restart)" ends with its new process.
            if life
                .exit
                .as_ref()
                .is_some_and(|e| e.reason == crate::supervisor::ExitReason::DaemonRestart)
            {
                life.exit = None;
            }
            true
        });
        if !published {
            // Retired while it started: nobody else will stop it.
            process.handle.kill_detached();
            return Err(self.not_found());
        }
        // The tasks are registered right after the publication, with no await in between, so a
        // published process never exists without its reader and writer. The writer holds only a
        // weak reference and watches for the end, so that neither an ended nor a retired instance
        // is kept alive by its own writer (which owns the channel's receiver while the instance
        // owns the sender).
        tokio::spawn(write_loop(
            Arc::downgrade(self),
            self.seen.subscribe(),
            stdin,
            rx,
        ));
        tokio::spawn(super::stdout::read_loop(
            self.clone(),
            process.stdout,
            handle,
            max_line,
        ));
        Ok(())
    }

    fn start_failed(&self, e: AcpError) -> AcpError {
        self.change(|life| {
            if matches!(life.phase, Phase::Starting) {
                life.phase = Phase::Failed(e.clone());
            }
        });
        e
    }

    fn not_found(&self) -> AcpError {
        AcpError::NotFound {
            server_id: self.server_id.clone(),
        }
    }

    /// Marks the instance retired (see `AcpService::retire`, its only caller) and closes its log:
    /// every subscriber gets its end. Returns the process to dispose of, if one was published and
    /// is not known to be gone. Idempotent: only the first call returns the process.
    pub(super) fn retire(&self) -> Option<ChildHandle> {
        let handle = self.change(|life| {
            if life.retired {
                return None;
            }
            life.retired = true;
            if life.exit.is_some() {
                return None;
            }
            life.running().map(|r| r.handle.clone())
        });
        self.events.close();
        handle
    }

    /// The process to write to, or why there is none. A retired instance takes no more lines.
    fn writable(&self) -> Result<Arc<Running>, AcpError> {
        let life = self.life();
        if life.retired {
            return Err(self.not_found());
        }
        match &life.phase {
            Phase::Running(r) => Ok(r.clone()),
            Phase::Ended { ended, .. } => Err(self.gone(ended.clone())),
            Phase::Starting | Phase::Failed(_) => {
                drop(life);
                Err(self.gone_error())
            }
        }
    }

    /// Writes one envelope and, for a request, waits for its response up to `timeout`.
    /// With `wait == false` a request is written and answered `Accepted`; its response then
    /// goes to the event log.
    pub async fn deliver(
        &self,
        line: Bytes,
        request: Option<IdKey>,
        wait: bool,
        timeout: Duration,
    ) -> Result<Delivered, AcpError> {
        let running = self.writable()?;
        let lines = std::slice::from_ref(&line);
        match request {
            Some(key) => {
                let rx = {
                    let mut life = self.life();
                    if let Phase::Ended { ended, .. } = &life.phase {
                        return Err(self.gone(ended.clone()));
                    }
                    if life.waiters.contains_key(&key) {
                        return Err(AcpError::DuplicateId {
                            server_id: self.server_id.clone(),
                            id: key.0.to_string(),
                        });
                    }
                    if wait {
                        let (tx, rx) = oneshot::channel();
                        life.waiters.insert(key.clone(), Some(tx));
                        Some(rx)
                    } else {
                        // Nobody waits: the response goes to the event log.
                        life.waiters.insert(key.clone(), None);
                        None
                    }
                };
                let guard = PendingGuard {
                    inst: self,
                    keys: vec![key.clone()],
                };
                let sent = send_line(&running, &self.stdin_caps, lines, |_| {
                    Done::Request(key.clone())
                })
                .await;
                match sent {
                    Ok(_) => {
                        crate::metrics::acp_to_agent(1);
                        guard.reached()
                    }
                    Err(f) => return Err(self.send_error(f.fail)),
                }
                let Some(rx) = rx else {
                    return Ok(Delivered::Accepted);
                };
                let mut rx = rx;
                let answer = tokio::select! {
                    a = tokio::time::timeout(timeout, &mut rx) => a,
                    _ = self.handoff.cancelled() => {
                        // A reload: nobody waits any more, the answer goes to the event log
                        // (as with respond-async). Unless the answer is already on its way
                        // here (its entry taken): then it is waited for.
                        let waiting = match self.life().waiters.get_mut(&key) {
                            Some(w) => {
                                *w = None;
                                true
                            }
                            None => false,
                        };
                        if waiting {
                            return Ok(Delivered::Accepted);
                        }
                        Ok(rx.await)
                    }
                };
                match answer {
                    Ok(Ok((line, last_event_id))) => Ok(Delivered::Response {
                        line,
                        last_event_id,
                    }),
                    Ok(Err(_)) => Err(self.gone_error()),
                    Err(_) => Err(AcpError::Timeout {
                        server_id: self.server_id.clone(),
                        timeout,
                    }),
                }
            }
            None => {
                let (tx, rx) = oneshot::channel();
                let sent = send_line(&running, &self.stdin_caps, lines, |_| Done::Ack(tx)).await;
                if sent.is_ok() {
                    crate::metrics::acp_to_agent(1);
                }
                match sent {
                    Err(f) => Err(self.send_error(f.fail)),
                    Ok(Sent::Written) => Ok(Delivered::Accepted),
                    Ok(Sent::Queued) => match rx.await {
                        Ok(()) => Ok(Delivered::Accepted),
                        Err(_) => Err(self.gone_error()),
                    },
                }
            }
        }
    }

    /// Writes envelopes that arrived together (one read of a WebSocket), in order, with as few
    /// writes to the agent's stdin as the pipe allows; nobody waits for the responses (they go to
    /// the event log). `envelopes` is emptied (its capacity kept for the next batch, so that a
    /// batch allocates nothing when all goes well). Returns the envelopes that were refused, as
    /// the request id (if any) and why: a request whose id is already pending is refused alone; a
    /// send that fails refuses the lines it did not write. Like `deliver`, waits for the write
    /// only when a notification or response had to be queued.
    pub async fn deliver_batch(
        &self,
        envelopes: &mut Vec<Envelope>,
    ) -> Vec<(Option<IdKey>, AcpError)> {
        let mut refused = Vec::new();
        let running = match self.writable() {
            Ok(r) => r,
            Err(e) => {
                refused.extend(envelopes.drain(..).map(|env| (request_key(env), e.clone())));
                return refused;
            }
        };
        let mut acked = false;
        let mut keys = Vec::new();
        {
            let mut life = self.life();
            if let Phase::Ended { ended, .. } = &life.phase {
                let e = self.gone(ended.clone());
                drop(life);
                refused.extend(envelopes.drain(..).map(|env| (request_key(env), e.clone())));
                return refused;
            }
            envelopes.retain(|env| match &env.kind {
                Kind::Request { key, .. } if life.waiters.contains_key(key) => {
                    refused.push((
                        Some(key.clone()),
                        AcpError::DuplicateId {
                            server_id: self.server_id.clone(),
                            id: key.0.to_string(),
                        },
                    ));
                    false
                }
                Kind::Request { key, .. } => {
                    life.waiters.insert(key.clone(), None);
                    keys.push(key.clone());
                    true
                }
                Kind::Notification | Kind::Response => {
                    acked = true;
                    true
                }
            });
        }
        if envelopes.is_empty() {
            return refused;
        }
        let mut guard = PendingGuard { inst: self, keys };
        let (ack, acked) = if acked {
            let (tx, rx) = oneshot::channel();
            (Some(tx), Some(rx))
        } else {
            (None, None)
        };
        // Only a queued rest needs the ids (to forget them if the write fails later).
        let done = |from: usize| Done::Batch {
            keys: envelopes[from..]
                .iter()
                .filter_map(|e| match &e.kind {
                    Kind::Request { key, .. } => Some(key.clone()),
                    _ => None,
                })
                .collect(),
            ack,
        };
        let sent = send_line(&running, &self.stdin_caps, envelopes.as_slice(), done).await;
        crate::metrics::acp_to_agent(match &sent {
            Ok(_) => envelopes.len(),
            Err(f) => f.written,
        } as u64);
        match sent {
            Ok(Sent::Written) => guard.reached(),
            Ok(Sent::Queued) => {
                guard.reached();
                if let Some(rx) = acked
                    && rx.await.is_err()
                {
                    let e = self.gone_error();
                    refused.extend(envelopes.drain(..).map(|env| (request_key(env), e.clone())));
                }
            }
            Err(f) => {
                // The first `written` lines reached the agent; the rest did not (the guard
                // forgets their pending entries).
                let e = self.send_error(f.fail);
                let reached = envelopes[..f.written]
                    .iter()
                    .filter(|e| matches!(e.kind, Kind::Request { .. }))
                    .count();
                guard.keep_first(reached);
                drop(guard);
                refused.extend(
                    envelopes
                        .drain(f.written..)
                        .map(|env| (request_key(env), e.clone())),
                );
            }
        }
        envelopes.clear();
        refused
    }

    fn send_error(&self, fail: SendFail) -> AcpError {
        match fail {
            SendFail::Gone => self.gone_error(),
            SendFail::Full { what, limit } => AcpError::Capacity {
                what,
                limit,
                server_id: Some(self.server_id.clone()),
            },
        }
    }

    fn gone(&self, ended: Arc<Ended>) -> AcpError {
        AcpError::AgentGone {
            server_id: self.server_id.clone(),
            agent: self.agent.clone(),
            ended,
        }
    }

    /// The error for a POST whose agent can no longer answer: how it ended when that is known,
    /// else that its stdin is closed.
    fn gone_error(&self) -> AcpError {
        let (ended, handle) = {
            let life = self.life();
            let ended = match &life.phase {
                Phase::Ended { ended, .. } => Some(ended.clone()),
                _ => None,
            };
            (ended, life.running().map(|r| r.handle.clone()))
        };
        match ended {
            Some(e) => self.gone(e),
            None => self.gone(Arc::new(Ended {
                exit: None,
                stderr_tail: handle
                    .map(|h| h.stderr_excerpt(STDERR_EXCERPT))
                    .unwrap_or_default(),
                detail: "the agent's stdin is closed".to_string(),
            })),
        }
    }

    /// One stdout line, already classified (see `classify`).
    pub(super) fn on_line(&self, line: Bytes, class: Result<AgentLine, BadLine>) {
        if class.is_ok() {
            crate::metrics::acp_from_agent();
        }
        match class {
            Ok(AgentLine::Response(key)) => {
                let waiter = self.life().waiters.remove(&key).flatten();
                match waiter {
                    Some(tx) => {
                        // Whatever the agent said before this answer reaches the streams first.
                        self.events.wake();
                        if let Err((line, _)) = tx.send((line, self.events.last_id())) {
                            // Its POST is gone (timeout, client disconnect, respond-async):
                            // the answer is not lost, it goes to the stream.
                            self.events.push(&line);
                        }
                    }
                    None => {
                        self.events.push(&line);
                    }
                }
            }
            Ok(AgentLine::Message) => {
                self.events.push(&line);
            }
            Err(why) => self.invalid_line(&line, &why.to_string()),
        }
    }

    pub(super) fn invalid_line(&self, line: &[u8], why: &str) {
        self.invalid_lines.fetch_add(1, Ordering::Relaxed);
        let (admit, report) = {
            let mut budget = crate::sys::lock(&self.invalid_log);
            let admit = budget.admit(line.len().min(200));
            (admit, budget.take_report(false))
        };
        if let Some((lines, _)) = report {
            tracing::warn!(server_id = %self.server_id, agent = %self.agent,
                dropped_lines = lines, "{lines} more invalid agent stdout lines were dropped without a log line each");
        }
        if !admit {
            return;
        }
        let shown = String::from_utf8_lossy(&line[..line.len().min(200)]).into_owned();
        tracing::warn!(
            server_id = %self.server_id,
            agent = %self.agent,
            pid = self.handle().map(|h| h.pid()),
            bytes = line.len(),
            line = %shown,
            "dropped an agent stdout line: {why}"
        );
    }

    /// The process tree is gone: from now on the instance is `exited`, with this exit.
    pub(super) fn exited(&self, exit: ExitInfo) {
        self.change(|life| {
            life.exit.get_or_insert(exit);
        });
    }

    /// Records how the agent ended for the proxy (`Ended`), fails every waiting POST, ends the
    /// streams.
    pub(super) fn finish(&self, exit: Option<ExitInfo>, detail: String) {
        let ended = Arc::new(Ended {
            exit,
            stderr_tail: self
                .handle()
                .map(|h| h.stderr_excerpt(STDERR_EXCERPT))
                .unwrap_or_default(),
            detail,
        });
        let waiters = self.change(|life| {
            if let Phase::Running(running) = &life.phase {
                life.phase = Phase::Ended {
                    running: Some(running.clone()),
                    ended,
                };
            }
            std::mem::take(&mut life.waiters)
        });
        // Dropping the senders wakes every waiting POST, which then reads `ended`.
        drop(waiters);
        self.events.close();
    }
}

/// What `send_line` writes: a bare line, or an envelope's.
trait ToStdin {
    fn line(&self) -> &Bytes;
}

impl ToStdin for Bytes {
    fn line(&self) -> &Bytes {
        self
    }
}

impl ToStdin for Envelope {
    fn line(&self) -> &Bytes {
        &self.line
    }
}

fn request_key(env: Envelope) -> Option<IdKey> {
    match env.kind {
        Kind::Request { key, .. } => Some(key),
        Kind::Notification | Kind::Response => None,
    }
}

enum Sent {
    Written,
    /// Handed to the writer task, which reports through the job's `Done`.
    Queued,
}

/// A send that failed after its first `written` lines had reached the pipe.
struct Failed {
    fail: SendFail,
    written: usize,
}

fn failed(fail: SendFail, written: usize) -> Failed {
    Failed { fail, written }
}

/// Writes lines, in order. The fast path writes them from the caller's task at once when nothing
/// is queued: whole lines packed into writes of at most `PIPE_BUF` bytes, each of which is atomic
/// (a cancelled caller can never leave half a line), so a batch that arrived together costs one
/// `write` per 4 KiB instead of one per message. What the pipe does not take at once (and any line
/// of `PIPE_BUF` bytes or more) goes to the writer task, as one job, which waits for room.
async fn send_line<L: ToStdin>(
    running: &Running,
    caps: &StdinCaps,
    lines: &[L],
    done: impl FnOnce(usize) -> Done,
) -> Result<Sent, Failed> {
    let job = {
        let mut st = lock_stdin(&running.stdin);
        if st.broken {
            return Err(failed(SendFail::Gone, 0));
        }
        // Lines before `next` are in the pipe; `cut` is the unwritten tail of line `next - 1`
        // after a short write.
        let mut next = 0;
        let mut cut: Option<Bytes> = None;
        if !st.backlog {
            let st = &mut *st;
            while next < lines.len() {
                st.scratch.clear();
                let mut end = next;
                while end < lines.len() && st.scratch.len() + lines[end].line().len() < PIPE_BUF {
                    st.scratch.extend_from_slice(lines[end].line());
                    st.scratch.push(b'\n');
                    end += 1;
                }
                if end == next {
                    break;
                }
                match nix::unistd::write(&st.pipe, &st.scratch) {
                    Ok(n) if n == st.scratch.len() => next = end,
                    // Not expected below PIPE_BUF; queue the rest (a cut line's newline is added
                    // back by the writer).
                    Ok(n) => {
                        let lens = lines[next..end].iter().map(|l| l.line().len());
                        let (whole, part) = split_written(lens, n);
                        next += whole;
                        if let Some(k) = part {
                            cut = Some(lines[next].line().slice(k..));
                            next += 1;
                        }
                        break;
                    }
                    Err(nix::errno::Errno::EAGAIN) => break,
                    Err(_) => {
                        st.broken = true;
                        return Err(failed(SendFail::Gone, next));
                    }
                }
            }
            if next == lines.len() && cut.is_none() {
                return Ok(Sent::Written);
            }
        }
        // The job covers the cut line too (its request is in flight either way).
        let first = next - usize::from(cut.is_some());
        let rest = &lines[next..];
        let line = match (cut, rest) {
            (None, [one]) => one.line().clone(),
            (cut, rest) => {
                let size = cut.as_ref().map_or(0, |c| c.len() + 1)
                    + rest.iter().map(|l| l.line().len() + 1).sum::<usize>();
                let mut joined = BytesMut::with_capacity(size);
                for l in cut.iter().chain(rest.iter().map(ToStdin::line)) {
                    joined.extend_from_slice(l);
                    joined.extend_from_slice(b"\n");
                }
                // The writer adds the last newline.
                joined.truncate(size.saturating_sub(1));
                joined.freeze()
            }
        };
        // What waits for the agent is bounded in bytes, per instance and in total; lines that
        // do not fit are refused at once rather than held.
        let n = line.len() as u64 + 1;
        let Some(mut queued) = caps.per_instance.try_reserve(n) else {
            let limit = caps.per_instance.limit();
            let what = "bytes queued for this agent's stdin";
            crate::metrics::refused(crate::metrics::Limit::StdinQueue);
            return Err(failed(SendFail::Full { what, limit }, next));
        };
        if !queued.grow(&caps.total, n) {
            let limit = caps.total.limit();
            let what = "bytes queued for every agent's stdin";
            crate::metrics::refused(crate::metrics::Limit::StdinQueueTotal);
            return Err(failed(SendFail::Full { what, limit }, next));
        }
        let job = WriteJob {
            line,
            done: done(first),
            _queued: queued,
        };
        // Queued under the lock, so the writer cannot declare the backlog empty in between.
        st.backlog = true;
        match running.writer.try_send(job) {
            Ok(()) => return Ok(Sent::Queued),
            Err(mpsc::error::TrySendError::Closed(_)) => {
                return Err(failed(SendFail::Gone, next));
            }
            Err(mpsc::error::TrySendError::Full(job)) => (job, next),
        }
    };
    // The queue is full (the agent reads slowly): wait for room, outside the lock.
    let (job, next) = job;
    running
        .writer
        .send(job)
        .await
        .map_err(|_| failed(SendFail::Gone, next))?;
    Ok(Sent::Queued)
}

/// After a short write of `n` bytes of lines (each followed by its newline) of these lengths:
/// how many lines went whole, and how many bytes of the next one (its newline not included)
/// went too, if any did — that line is cut, and its rest must follow before anything else.
fn split_written(lens: impl IntoIterator<Item = usize>, n: usize) -> (usize, Option<usize>) {
    let mut off = 0;
    let mut whole = 0;
    for len in lens {
        if off + len < n {
            off += len + 1;
            whole += 1;
            continue;
        }
        return (whole, (n > off).then(|| (n - off).min(len)));
    }
    (whole, None)
}

/// Writes all of `buf`, taking the stdin lock only for each attempt (never across an await).
async fn write_all_shared(stdin: &Mutex<Stdin>, buf: &[u8]) -> std::io::Result<()> {
    use tokio::io::AsyncWrite;
    let mut off = 0;
    while off < buf.len() {
        let n = std::future::poll_fn(|cx| {
            let mut st = lock_stdin(stdin);
            std::pin::Pin::new(&mut st.pipe).poll_write(cx, &buf[off..])
        })
        .await?;
        if n == 0 {
            return Err(std::io::ErrorKind::WriteZero.into());
        }
        off += n;
    }
    Ok(())
}

async fn write_loop(
    inst: std::sync::Weak<AcpInstance>,
    mut seen: watch::Receiver<Seen>,
    stdin: Arc<Mutex<Stdin>>,
    mut rx: mpsc::Receiver<WriteJob>,
) {
    let mut jobs = Vec::with_capacity(64);
    let mut buf = Vec::with_capacity(64 * 1024);
    loop {
        let n = tokio::select! {
            n = rx.recv_many(&mut jobs, 64) => n,
            // Ended or retired: nothing more is written; the queued jobs (and their budget
            // shares) are dropped with the receiver.
            _ = seen.wait_for(|s| s.ended || s.retired) => 0,
        };
        if n == 0 {
            break;
        }
        buf.clear();
        for j in &jobs {
            buf.extend_from_slice(&j.line);
            buf.push(b'\n');
        }
        match write_all_shared(&stdin, &buf).await {
            Ok(()) => {
                for j in jobs.drain(..) {
                    match j.done {
                        Done::Ack(tx) | Done::Batch { ack: Some(tx), .. } => {
                            let _ = tx.send(());
                        }
                        Done::Request(_) | Done::Batch { ack: None, .. } => {}
                    }
                }
                let mut st = lock_stdin(&stdin);
                if rx.is_empty() {
                    st.backlog = false;
                }
            }
            Err(e) => {
                lock_stdin(&stdin).broken = true;
                let Some(inst) = inst.upgrade() else { break };
                tracing::warn!(server_id = %inst.server_id, agent = %inst.agent, error = %e,
                    "cannot write to the agent's stdin");
                let mut life = inst.life();
                for j in jobs.drain(..) {
                    match j.done {
                        Done::Request(key) => {
                            life.waiters.remove(&key);
                        }
                        Done::Batch { keys, .. } => {
                            for key in keys {
                                life.waiters.remove(&key);
                            }
                        }
                        Done::Ack(_) => {}
                    }
                }
                break;
            }
        }
        if buf.capacity() > 1 << 20 {
            buf = Vec::with_capacity(64 * 1024);
        }
    }
    lock_stdin(&stdin).broken = true;
    // Dropping the receiver makes every later send fail, which its POST answers with 502.
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A DELETE that lands while the process is being started (it finds nothing to stop yet)
    /// must not leave that process running: the start sees the mark and kills it.
    #[tokio::test]
    async fn a_delete_during_the_start_kills_the_process_just_started() {
        let mut config = crate::config::Config::defaults();
        config.agent_base_env = vec![("PATH".into(), "/usr/bin:/bin".into())];
        config.warm_spawns = 0;
        let sup = Arc::new(crate::supervisor::Supervisor::new(&config));
        let inst = Arc::new(AcpInstance::new(
            "s1".into(),
            "sh".into(),
            LogLimits {
                max_events: 100,
                max_bytes: 1 << 20,
            },
            Duration::from_secs(1),
            RateLimit::new(10, 10_000),
            StdinCaps {
                per_instance: Budget::new(1 << 20),
                total: Budget::new(1 << 20),
            },
        ));
        let spec = SpawnSpec {
            program: "/bin/sh".into(),
            args: vec!["-c".into(), "exec sleep 1000".into()],
            env: Vec::new(),
            cwd: std::env::temp_dir(),
            name: "s1".into(),
            agent: "sh".into(),
        };
        let deleting = inst.clone();
        let starting = sup.clone();
        let result = inst
            .ensure_started(
                async { Ok(spec) },
                |spec| async move {
                    let p = starting.start(spec).await.map_err(|e| AcpError::Spawn {
                        server_id: "s1".into(),
                        agent: "sh".into(),
                        source: Arc::new(e),
                    })?;
                    // DELETE now: the process exists but is not published yet.
                    assert!(deleting.retire().is_none());
                    Ok(p)
                },
                1 << 20,
            )
            .await;
        assert!(
            matches!(result, Err(AcpError::NotFound { .. })),
            "a deleted instance started anyway"
        );
        assert!(!inst.is_started());
        let left = sup.live_after(Duration::from_secs(5)).await;
        assert!(
            left.is_empty(),
            "the process of a deleted instance runs on: {left:?}"
        );
    }

    /// Where a short write leaves a batch of lines (lengths, bytes written): whole lines, and
    /// the bytes of the cut line that went.
    #[test]
    fn short_write_split() {
        let check = |lens: &[usize], n, expected| {
            assert_eq!(
                split_written(lens.iter().copied(), n),
                expected,
                "{lens:?} {n}"
            )
        };
        check(&[3, 3], 0, (0, None));
        check(&[3, 3], 2, (0, Some(2)));
        // The line went but not its newline: an empty rest (its newline) must still follow.
        check(&[3, 3], 3, (0, Some(3)));
        check(&[3, 3], 4, (1, None));
        check(&[3, 3], 5, (1, Some(1)));
        check(&[3, 3], 7, (1, Some(3)));
        check(&[3, 3], 8, (2, None));
        check(&[0, 2], 1, (1, None));
        check(&[0, 2], 2, (1, Some(1)));
    }
}
