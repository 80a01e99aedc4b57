//! One serverId: its lifecycle (this file), its agent process, the way to its stdin
//! (`instance/stdin.rs`), the requests on their way to the agent and their pending entries
//! (`instance/deliver.rs`), its part of a reload (`instance/handoff.rs`) and its event log. The
//! stdout side (the reader task and its bounded line reader) is `instance/stdout.rs`.
//! One concern although just over 800 lines: the [`Life`] state machine and the operations that
//! move it, which share its one lock; what could stand apart already does (the files above).
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

mod deliver;
mod handoff;
mod stdin;
mod stdout;

pub use deliver::Delivered;

pub(super) use handoff::FrozenStdout;
pub use handoff::{ExitedState, InstanceState};
pub use stdin::StdinCaps;
use stdin::{Stdin, WriteJob, lock_stdin, write_loop};

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::{mpsc, oneshot, watch};

use super::events::{EventLog, LogLimits};
use super::jsonrpc::{AgentLine, BadLine, IdKey};
use super::{AcpError, Ended};
use crate::logging::RateLimit;
use crate::supervisor::{AgentProcess, ChildHandle, ExitInfo, SpawnSpec};

/// What `GET /v1/acp` says of the process: `starting` until it runs, `exited` once its whole
/// tree is gone (or it never started), `running` in between — also while an agent that closed
/// its stdout is being stopped (it can no longer answer, but it still exists).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    Starting,
    Running,
    Exited,
}

/// The live process and the way to its stdin.
struct Running {
    handle: ChildHandle,
    writer: mpsc::Sender<WriteJob>,
    stdin: Arc<Mutex<Stdin>>,
}

/// How much of the agent's stderr a 502 carries ("the last few KiB").
const STDERR_EXCERPT: usize = 4096;

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

/// Where an instance's process comes from (`AcpInstance::attach`).
pub(super) enum Origin<'a> {
    /// Just started by `ensure_started`.
    Fresh,
    /// Adopted from a reload's previous image: the requests it had written and not seen
    /// answered, and what its stdout reader had read and not yet split into lines.
    Adopted {
        pending: &'a [String],
        carry: Vec<u8>,
        skipping: bool,
    },
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
    /// The service's session inventory, told of each `session/update` the agent sends.
    inventory: Option<Arc<super::inventory::Inventory>>,
    /// Client requests the inventory follows (`session/new`, `initialize`, …) whose answer has
    /// not come yet, by id: noted whichever face sent them (POST, WebSocket, RFD), read when
    /// the agent's answer passes `on_line`. **Invariant:** at most [`MAX_WATCHED`] entries.
    watched: Mutex<HashMap<IdKey, super::inventory::Watched>>,
    /// The agent's requests a client answers (`session/request_permission`,
    /// `elicitation/create`): their id → the event id, so that the agent's `$/cancel_request`
    /// withdraws the event from the replay. **Invariant:** at most
    /// [`MAX_ASKED`](super::events::withdrawn::MAX_ASKED) entries.
    asked: Mutex<HashMap<IdKey, u64>>,
    /// One-shot observers of the agent's answer to a request (see `on_answer_to`): how the
    /// transports that do not wait for the answer (WebSocket, RFD) learn what a `session/new`
    /// created. At most [`MAX_ANSWER_HOOKS`]; dropped when the agent ends.
    answer_hooks: Mutex<Vec<(IdKey, AnswerHook)>>,
}

/// Most unanswered inventory-followed requests an instance remembers (past it they are
/// forgotten and their answers not recorded: only a client flooding `session/*` requests
/// the agent never answers gets there).
const MAX_WATCHED: usize = 256;

/// Called with the agent's answer line to one request.
pub type AnswerHook = Box<dyn FnOnce(&[u8]) + Send>;

/// Most answer observers an instance holds at once (more are not registered).
pub const MAX_ANSWER_HOOKS: usize = 256;

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
            inventory: None,
            watched: Mutex::new(HashMap::new()),
            asked: Mutex::new(HashMap::new()),
            answer_hooks: Mutex::new(Vec::new()),
        }
    }

    /// Calls `hook` with the agent's answer to request `key`, whoever receives it (a waiting
    /// POST or the event stream). False (and `hook` dropped) past [`MAX_ANSWER_HOOKS`].
    pub fn on_answer_to(&self, key: IdKey, hook: AnswerHook) -> bool {
        let mut hooks = crate::sys::lock(&self.answer_hooks);
        if hooks.len() >= MAX_ANSWER_HOOKS {
            return false;
        }
        hooks.push((key, hook));
        true
    }

    /// Forgets the observers of `key` (its request was not delivered).
    pub fn forget_answer_to(&self, key: &IdKey) {
        crate::sys::lock(&self.answer_hooks).retain(|(k, _)| k != key);
    }

    fn run_answer_hooks(&self, key: &IdKey, line: &[u8]) {
        let due: Vec<AnswerHook> = {
            let mut hooks = crate::sys::lock(&self.answer_hooks);
            if hooks.is_empty() {
                return;
            }
            let mut due = Vec::new();
            let mut i = 0;
            while i < hooks.len() {
                if &hooks[i].0 == key {
                    due.push(hooks.swap_remove(i).1);
                } else {
                    i += 1;
                }
            }
            due
        };
        for hook in due {
            hook(line);
        }
    }

    /// The inventory this instance's updates feed (title, activity, usage).
    pub fn with_inventory(mut self, inventory: Arc<super::inventory::Inventory>) -> Self {
        self.inventory = Some(inventory);
        self
    }

    /// Notes a client request the inventory follows, before it is written to the agent.
    pub(super) fn watch_answer(&self, key: IdKey, what: super::inventory::Watched) {
        if self.inventory.is_none() {
            return;
        }
        let mut w = crate::sys::lock(&self.watched);
        if w.len() >= MAX_WATCHED {
            w.clear();
        }
        w.insert(key, what);
    }

    /// The agent answered request `key`: the durable meta, then the inventory, record what the
    /// answer tells, if the request was one they follow. The meta first: the inventory takes a
    /// new session's creation time from its record, so that both say the same time (the POST's
    /// own `observe_response` later finds the answer recorded already).
    fn answered(&self, key: &IdKey, line: &[u8]) {
        if let Some(t) = self.events.durable() {
            t.observe_response(key, line);
        }
        let Some(inv) = &self.inventory else { return };
        let what = {
            let mut w = crate::sys::lock(&self.watched);
            if w.is_empty() {
                return;
            }
            w.remove(key)
        };
        if let Some(what) = what {
            let durable = self.events.durable();
            inv.on_answer(&self.server_id, &self.agent, what, line, |sid| {
                durable.and_then(|t| t.session_created(sid))
            });
        }
    }

    /// An agent message logged as event `id`: a request a client answers is noted; the agent's
    /// `$/cancel_request` naming one withdraws both from the replay. Substring scans for every
    /// other line.
    fn note_asked(&self, line: &[u8], id: u64) {
        use super::events::withdrawn::{Asked, MAX_ASKED, classify};
        if id == 0 {
            return;
        }
        match classify(line) {
            Some(Asked::Cancel(key)) => {
                let asked = crate::sys::lock(&self.asked).remove(&key);
                if let Some(request) = asked {
                    self.events.withdraw(&[request, id]);
                }
            }
            Some(Asked::Request(key)) => {
                let mut asked = crate::sys::lock(&self.asked);
                if asked.len() >= MAX_ASKED {
                    asked.clear();
                }
                asked.insert(key, id);
            }
            None => {}
        }
    }

    /// The agent's requests still waiting for an answer when its log was carried over (a
    /// reload): a withdrawal of one after the adoption is seen like any other.
    pub(super) fn note_asked_before(&self, open: HashMap<IdKey, u64>) {
        let mut asked = crate::sys::lock(&self.asked);
        for (key, id) in open {
            if asked.len() >= super::events::withdrawn::MAX_ASKED {
                break;
            }
            asked.insert(key, id);
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
        let handle = process.handle.clone();
        if !self.attach(
            handle,
            process.stdin,
            process.stdout,
            max_line,
            Origin::Fresh,
        ) {
            // Retired while it started: nobody else will stop it.
            process.handle.kill_detached();
            return Err(self.not_found());
        }
        Ok(())
    }

    /// The one place a process becomes this instance's, whether it was just started or adopted
    /// from a reload's previous image: its stdin writer and channel, its phase, its reader and
    /// writer tasks. False, with nothing published or spawned, when the instance was retired
    /// meanwhile (the caller then stops the process: nobody else will).
    pub(super) fn attach(
        self: &Arc<Self>,
        handle: ChildHandle,
        stdin: tokio::process::ChildStdin,
        stdout: tokio::process::ChildStdout,
        max_line: usize,
        origin: Origin<'_>,
    ) -> bool {
        let (tx, rx) = mpsc::channel(1024);
        let stdin = Arc::new(Mutex::new(Stdin {
            pipe: stdin,
            backlog: false,
            broken: false,
            scratch: Vec::new(),
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
            // Requests the previous image wrote and the agent has not answered yet: their
            // answers go to the event log.
            if let Origin::Adopted { pending, .. } = &origin {
                for k in *pending {
                    life.waiters.insert(IdKey(k.as_str().into()), None);
                }
            }
            true
        });
        if !published {
            return false;
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
        let (carry, skipping) = match origin {
            Origin::Fresh => (Vec::new(), false),
            Origin::Adopted {
                carry, skipping, ..
            } => (carry, skipping),
        };
        tokio::spawn(stdout::read_loop(
            self.clone(),
            stdout,
            handle,
            max_line,
            carry,
            skipping,
        ));
        true
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

    /// One stdout line, already classified (see `classify`).
    pub(super) fn on_line(&self, line: Bytes, class: Result<AgentLine, BadLine>) {
        if class.is_ok() {
            crate::metrics::acp_from_agent();
        }
        match class {
            Ok(AgentLine::Response(key)) => {
                self.answered(&key, &line);
                self.run_answer_hooks(&key, &line);
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
                if let Some(inv) = &self.inventory
                    && let Some((sid, update)) = inv.on_agent_message(&self.server_id, &line)
                {
                    crate::metrics::usage_update(&self.agent, &update);
                    if let Some(title) = super::inventory::title_of(&update)
                        && let Some(t) = self.events.durable()
                    {
                        t.set_title(&sid, title);
                    }
                }
                let id = self.events.push(&line);
                self.note_asked(&line, id);
            }
            Err(why) => self.invalid_line(&line, &why.to_string()),
        }
    }

    /// A client's `$/cancel_request` for request `key` (already relayed to the agent): the POST
    /// waiting for that request is answered at once with the JSON-RPC error -32800 (request
    /// cancelled); the agent's own answer, when it comes, goes to the event stream as any answer
    /// whose POST is gone. False when no POST waits for `key`.
    pub fn cancel_waiter(&self, key: &IdKey, raw_id: &serde_json::value::RawValue) -> bool {
        let tx = {
            let mut life = self.life();
            match life.waiters.get_mut(key) {
                Some(slot @ Some(_)) => {
                    let tx = slot.take();
                    life.waiters.remove(key);
                    tx
                }
                _ => None,
            }
        };
        let Some(tx) = tx else { return false };
        let line = format!(
            r#"{{"jsonrpc":"2.0","id":{},"error":{{"code":-32800,"message":"request cancelled by the client ($/cancel_request)"}}}}"#,
            raw_id.get()
        );
        self.events.wake();
        let _ = tx.send((Bytes::from(line), self.events.last_id()));
        true
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
        crate::sys::lock(&self.answer_hooks).clear();
        // Dropping the senders wakes every waiting POST, which then reads `ended`.
        drop(waiters);
        self.events.close();
    }
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
                per_instance: crate::acp::caps::Budget::new(1 << 20),
                total: crate::acp::caps::Budget::new(1 << 20),
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
}
