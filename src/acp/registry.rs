//! serverId → instance, with lazy creation (the first POST names the agent; concurrent first
//! POSTs share one instance and one process) and retirement. **Invariant:** every removal from
//! the map goes through `AcpService::retire` (DELETE, a failed start, an idle or failed RFD
//! connection, shutdown): a retired instance is never reachable again, its event log is closed
//! (every subscriber gets its end), its stdin queue is dropped with its budget shares, and its
//! process is stopped on the service's `TaskTracker`, which `stop_all` closes (no instance is
//! created after that) and waits for.
//!
//! One concern although over 800 lines: the map and every way into and out of it (creation,
//! retirement, shutdown, a reload's export and adoption) share the instances lock and its
//! ordering rules, which is what splitting them would scatter.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::caps::Budget;
use super::events::{LogLimits, Subscribe, Subscription};
use super::instance::{AcpInstance, Delivered, Status};
use super::jsonrpc::{Envelope, IdKey, Kind, cancelled_id};
use super::{AcpError, Deps};
use crate::agents::{AgentError, Agents};
use crate::config::Config;
use crate::supervisor::{ChildHandle, ExitReason, GroupScan, ProcessStats, SpawnSpec, Supervisor};

/// Why an instance leaves the registry: every removal names one (see `AcpService::retire`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Retirement {
    /// `DELETE /v1/acp/{serverId}`, or the RFD transport's DELETE of its connection.
    Deleted,
    /// Its agent could not be prepared or started (the next first POST starts afresh).
    StartFailed,
    /// An RFD connection had no reader for `--acp-connection-idle`.
    Idle,
    /// An RFD connection whose setup failed after its instance was opened.
    ConnectFailed,
    /// The daemon stops (`stop_all`).
    Shutdown,
}

impl Retirement {
    fn as_str(self) -> &'static str {
        match self {
            Retirement::Deleted => "deleted",
            Retirement::StartFailed => "start failed",
            Retirement::Idle => "idle",
            Retirement::ConnectFailed => "connection failed",
            Retirement::Shutdown => "shutdown",
        }
    }
}

mod bundles;
pub(crate) use bundles::ImportReservation;

type Instances = BTreeMap<String, Arc<AcpInstance>>;

/// The last sample's process figures: serverId → (the pid they were read under, figures).
type Sampled = std::collections::HashMap<String, (u32, ProcessStats)>;

/// The proxy: every live serverId and the stops still running.
pub struct AcpService {
    deps: Deps,
    limits: LogLimits,
    /// Bytes queued for every agent's stdin together (`--stdin-queue-total`).
    stdin_total: Arc<Budget>,
    /// SSE subscribers of every instance together (`--max-subscribers-total`).
    subscribers_total: Arc<Budget>,
    /// Request body bytes of ACP POSTs being received (`--acp-inflight-bytes`).
    inflight: Arc<Budget>,
    instances: Mutex<Instances>,
    /// The process figures of the last `sample` (replaced whole; a listing clones the `Arc`).
    sampled: Mutex<Arc<Sampled>>,
    /// Every agent stop (every retirement of a started instance). Closed by `stop_all` under the instances lock:
    /// from then on no instance is created, and `wait` covers every stop spawned before.
    stops: TaskTracker,
    /// Cancelled when a reload begins: every instance's POSTs stop waiting (see
    /// `AcpInstance::with_handoff`).
    handoff: CancellationToken,
    /// `--state-dir`: where instances are kept across restarts (see `crate::state`).
    state: Option<Arc<crate::state::StateStore>>,
    /// serverIds being imported from a session bundle: not created by a POST meanwhile, nor
    /// imported twice at once (see `reserve_import`).
    importing: Mutex<std::collections::HashSet<String>>,
    /// Every session seen, across serverIds (`GET /v1/sessions`, `session/list`).
    inventory: Arc<super::inventory::Inventory>,
}

/// Sessions per `session/list` page the daemon answers itself.
pub const LIST_PAGE: usize = 100;

/// One session as ACP's `session/list` gives it (`updatedAt` RFC 3339).
fn list_item(e: &super::inventory::SessionEntry) -> serde_json::Value {
    let mut v = serde_json::json!({
        "sessionId": e.session_id,
        "cwd": e.cwd,
        "updatedAt": crate::acp::inventory::rfc3339(e.last_activity_ms),
    });
    if let Some(t) = &e.title {
        v["title"] = t.clone().into();
    }
    v
}

/// One instance as `GET /v1/acp` lists it (`http::wire::acp::ServerInfo` is its wire shape).
#[derive(Debug, Clone)]
pub struct ServerInfo {
    pub server_id: String,
    pub agent: String,
    pub created_at_ms: u64,
    pub status: Status,
    pub pid: Option<u32>,
    pub exit_code: Option<i32>,
    pub signal: Option<i32>,
    pub exit_reason: Option<ExitReason>,
    pub last_event_id: u64,
    pub subscribers: usize,
    pub pending_requests: usize,
    pub invalid_stdout_lines: u64,
    pub rss_bytes: Option<u64>,
    pub cpu_ms: Option<u64>,
    pub processes: Option<u64>,
    pub open_fds: Option<u64>,
}

impl AcpService {
    pub fn new(
        config: Arc<Config>,
        supervisor: Arc<Supervisor>,
        agents: Arc<Agents>,
        shutdown: CancellationToken,
    ) -> Self {
        let limits = LogLimits {
            max_events: config.event_buffer.max(1),
            max_bytes: usize::try_from(config.event_buffer_bytes).unwrap_or(usize::MAX),
        };
        let stdin_total = Budget::new(config.stdin_queue_total);
        let subscribers_total = Budget::new(config.max_subscribers_total as u64);
        let inflight = Budget::new(config.acp_inflight_bytes);
        AcpService {
            stdin_total,
            subscribers_total,
            inflight,
            deps: Deps {
                config,
                supervisor,
                agents,
                shutdown,
            },
            limits,
            instances: Mutex::new(BTreeMap::new()),
            sampled: Mutex::new(Arc::default()),
            stops: TaskTracker::new(),
            handoff: CancellationToken::new(),
            state: None,
            importing: Mutex::new(Default::default()),
            inventory: Arc::default(),
        }
    }

    /// The session inventory (`GET /v1/sessions`).
    pub fn inventory(&self) -> &Arc<super::inventory::Inventory> {
        &self.inventory
    }

    fn instances(&self) -> std::sync::MutexGuard<'_, Instances> {
        crate::sys::lock(&self.instances)
    }

    pub(crate) fn get(&self, server_id: &str) -> Option<Arc<AcpInstance>> {
        self.instances().get(server_id).cloned()
    }

    /// Finds the instance, or creates it when `agent` names a known agent.
    fn find_or_create(
        &self,
        server_id: &str,
        agent: Option<&str>,
    ) -> Result<Arc<AcpInstance>, AcpError> {
        self.find_or_create_with(server_id, agent, true)
    }

    /// `durable`: a new instance is kept in the state dir (when there is one); an RFD
    /// connection's is not (the connection does not outlive the daemon).
    fn find_or_create_with(
        &self,
        server_id: &str,
        agent: Option<&str>,
        durable: bool,
    ) -> Result<Arc<AcpInstance>, AcpError> {
        if let Some(inst) = self.get(server_id) {
            return check_agent(inst, agent);
        }
        let Some(agent) = agent else {
            return Err(AcpError::MissingAgent {
                server_id: server_id.to_string(),
            });
        };
        if !self.deps.agents.is_known(agent) {
            return Err(AcpError::UnknownAgent {
                agent: agent.to_string(),
            });
        }
        let mut map = self.instances();
        // Refused from the stop signal on; the closed tracker makes it airtight (see `stop_all`).
        if self.deps.shutdown.is_cancelled() || self.stops.is_closed() {
            return Err(AcpError::ShuttingDown);
        }
        // Another first POST may have created it since the lookup above.
        if let Some(inst) = map.get(server_id) {
            return check_agent(inst.clone(), Some(agent));
        }
        if crate::sys::lock(&self.importing).contains(server_id) {
            return Err(AcpError::Importing {
                server_id: server_id.to_string(),
            });
        }
        // Exited instances count until they are deleted: their event logs still hold memory.
        // Recovered ones count only once they are started again (their logs are bounded by the
        // state dir's retention, read back at start).
        if counted(&map) >= self.deps.config.max_agents {
            return Err(AcpError::Capacity {
                what: "agent instances",
                limit: self.deps.config.max_agents as u64,
                server_id: Some(server_id.to_string()),
            });
        }
        let inst = Arc::new(self.make_instance(server_id, agent));
        if durable {
            self.track_new(&inst);
        }
        map.insert(server_id.to_string(), inst.clone());
        Ok(inst)
    }

    /// A new instance of this service (answered 202 once a reload begins, see `handoff`).
    fn make_instance(&self, server_id: &str, agent: &str) -> AcpInstance {
        AcpInstance::new(
            server_id.to_string(),
            agent.to_string(),
            self.limits,
            self.deps.config.agent_grace,
            crate::logging::RateLimit::new(
                self.deps.config.agent_stderr_lines,
                self.deps.config.agent_stderr_bytes,
            ),
            super::instance::StdinCaps {
                per_instance: Budget::new(self.deps.config.stdin_queue),
                total: self.stdin_total.clone(),
            },
        )
        .with_handoff(self.handoff.clone())
        .with_inventory(self.inventory.clone())
    }

    /// Durable state (`--state-dir`): keeps the instances recovered from the state dir, each
    /// `exited` (`daemon_restart`) with its event log, until it is used or deleted.
    pub fn with_state(
        mut self,
        store: Arc<crate::state::StateStore>,
        recovered: Vec<crate::state::Entry>,
    ) -> Self {
        {
            let mut map = self.instances();
            for e in recovered {
                let name = e.name.clone();
                let Some(mut r) = super::durable::recover(e) else {
                    // Not a serverId of ours: moved aside, never deleted.
                    store.quarantine("acp", &name);
                    continue;
                };
                let events = std::mem::take(&mut r.events);
                let t =
                    super::durable::Tracked::new(&store, &r.server_id, r.meta.clone(), Some(&r));
                let base = self.make_instance(&r.server_id, &r.meta.agent);
                let log =
                    super::events::EventLog::recovered(self.limits, events, r.next_id, r.lost);
                let inst = AcpInstance::recovered(base, r.meta.created_at_ms, log);
                inst.events.set_durable(t);
                for s in &r.meta.sessions {
                    self.inventory.record(s.entry(&r.server_id, &r.meta));
                }
                if let Some(caps) = r.meta.session_caps() {
                    self.inventory.set_caps(&r.server_id, caps);
                }
                map.insert(r.server_id, Arc::new(inst));
            }
        }
        self.state = Some(store);
        self
    }

    /// Once the instances of a reload's hand-off (if any) are adopted: every serverId still as
    /// recovered from the state dir answers the requests a reload had promised an answer to
    /// (and a crash cut) with an error on its stream. Not before the adoption: a carried
    /// instance's promises are still running.
    pub fn answer_broken_promises(&self) {
        for inst in self.instances().values() {
            if let Some(t) = inst.events.durable() {
                t.break_promises(&inst.events);
            }
        }
    }

    /// Gives a new instance its durable state, when there is a state dir.
    fn track_new(&self, inst: &AcpInstance) {
        if let Some(store) = &self.state {
            let meta = super::durable::AcpMeta {
                agent: inst.agent.clone(),
                created_at_ms: inst.created_at_ms,
                ..Default::default()
            };
            let t = super::durable::Tracked::new(store, &inst.server_id, meta, None);
            inst.events.set_durable(t);
        }
    }

    /// Makes sure `server_id` exists (creating it for `agent`, as a first POST would) without
    /// starting its agent; the other faces (WebSocket, RFD transport) subscribe before they send.
    pub fn open(&self, server_id: &str, agent: Option<&str>) -> Result<(), AcpError> {
        self.find_or_create(server_id, agent).map(|_| ())
    }

    /// `open` for an RFD connection's instance, which is never kept in the state dir.
    pub fn open_connection(&self, server_id: &str, agent: &str) -> Result<(), AcpError> {
        self.find_or_create_with(server_id, Some(agent), false)
            .map(|_| ())
    }

    /// Delivers one envelope to `server_id`, starting its agent first if needed.
    /// `respond_async`: a request is answered `Accepted` once written; its response goes to SSE.
    pub async fn post(
        &self,
        server_id: &str,
        agent: Option<&str>,
        envelope: Envelope,
        respond_async: bool,
    ) -> Result<Delivered, AcpError> {
        let started = std::time::Instant::now();
        let inst = self.find_or_create(server_id, agent)?;
        if !inst.is_started() {
            self.check_wake(&inst)?;
            // Boxed: the start is rare and its future large; inline it would make every POST's
            // future (which axum moves into a box several times per request) that large too.
            Box::pin(self.start(&inst)).await?;
        }
        let timeout = self.deps.config.request_timeout;
        let durable = inst.events.durable();
        if let Some(t) = durable {
            t.before_post(&inst, Some(&envelope), timeout).await?;
            t.observe_request(&envelope);
        }
        let watched = match &envelope.kind {
            Kind::Request { .. } => super::inventory::watch(&envelope.line),
            _ => None,
        };
        if let Some(answer) = self.answer_list(&inst, &envelope, respond_async) {
            return Ok(answer);
        }
        if let (Some(w), Kind::Request { key, .. }) = (watched, &envelope.kind) {
            inst.watch_answer(key.clone(), w);
        }
        let cancels = match &envelope.kind {
            Kind::Notification => cancelled_id(&envelope.line),
            _ => None,
        };
        let (key, wait, method) = match envelope.kind {
            Kind::Request { key, method, .. } => (Some(key), !respond_async, Some(method)),
            Kind::Notification | Kind::Response => (None, false, None),
        };
        let delivered = inst
            .deliver(envelope.line, key.as_ref(), wait, timeout)
            .await;
        if let (Some(t), Some(key), Ok(Delivered::Response { line, .. })) =
            (durable, &key, &delivered)
        {
            t.observe_response(key, line);
        }
        if let (Some(raw), Ok(_)) = (&cancels, &delivered) {
            inst.cancel_waiter(&IdKey::from_raw(raw), raw);
        }
        // A request answered by the agent: POST to answer, by method.
        if let (Some(method), true, Ok(Delivered::Response { .. })) = (method, wait, &delivered) {
            crate::metrics::acp_request(method, started.elapsed());
        }
        delivered
    }

    /// `session/list` to an agent whose `initialize` answer did not advertise
    /// `sessionCapabilities.list`: answered by the daemon from its inventory (this serverId's
    /// sessions, `cwd` filter and `cursor` honoured, pages of [`LIST_PAGE`]). Relayed (`None`)
    /// when the agent advertises it, when its `initialize` has not been answered through this
    /// daemon yet, and with `Prefer: respond-async` (whose answer belongs on the stream).
    fn answer_list(
        &self,
        inst: &AcpInstance,
        envelope: &Envelope,
        respond_async: bool,
    ) -> Option<Delivered> {
        let Kind::Request { raw_id, .. } = &envelope.kind else {
            return None;
        };
        if respond_async || find_bytes!(&envelope.line, b"\"session/list\"").is_none() {
            return None;
        }
        if self.inventory.caps(&inst.server_id)?.list {
            return None;
        }
        #[derive(serde::Deserialize, Default)]
        struct Params {
            cwd: Option<String>,
            cursor: Option<String>,
        }
        #[derive(serde::Deserialize)]
        struct Msg {
            method: String,
            params: Option<Params>,
        }
        let msg = serde_json::from_slice::<Msg>(&envelope.line).ok()?;
        if msg.method != "session/list" {
            return None;
        }
        let params = msg.params.unwrap_or_default();
        let after = match params.cursor.as_deref() {
            None => None,
            Some(c) => match super::inventory::decode_cursor(c) {
                Some(k) if k.0 == inst.server_id => Some(k),
                _ => {
                    let line = serde_json::json!({"jsonrpc": "2.0", "id": raw_id,
                        "error": {"code": -32602, "message": "invalid cursor"}});
                    return Some(Delivered::Response {
                        line: serde_json::to_vec(&line).unwrap_or_default().into(),
                        last_event_id: inst.events.last_id(),
                    });
                }
            },
        };
        let mut sessions = Vec::new();
        let mut after = after;
        let mut next = None;
        // Filtering by cwd may skip entries: pages are read until one is full or none is left.
        'pages: loop {
            let (page, more) =
                self.inventory
                    .page(after.as_ref(), LIST_PAGE, Some(&inst.server_id));
            for (i, e) in page.iter().enumerate() {
                after = Some((e.server_id.clone(), e.session_id.clone()));
                if params.cwd.is_none() || e.cwd == params.cwd {
                    sessions.push(list_item(e));
                }
                if sessions.len() == LIST_PAGE {
                    if more || i + 1 < page.len() {
                        next = Some(super::inventory::encode_cursor(&e.server_id, &e.session_id));
                    }
                    break 'pages;
                }
            }
            if !more {
                break;
            }
        }
        let mut result = serde_json::json!({ "sessions": sessions });
        if let Some(c) = next {
            result["nextCursor"] = c.into();
        }
        let line = serde_json::json!({"jsonrpc": "2.0", "id": raw_id, "result": result});
        Some(Delivered::Response {
            line: serde_json::to_vec(&line).unwrap_or_default().into(),
            last_event_id: inst.events.last_id(),
        })
    }

    /// Delivers envelopes that arrived together (one WebSocket read) to `server_id`, in order,
    /// without waiting for responses, emptying `envelopes` (see `AcpInstance::deliver_batch`):
    /// the refused ones, with their request ids. When the instance cannot be found or started,
    /// the one error is returned instead (and `envelopes` is left as it was).
    pub async fn post_batch(
        &self,
        server_id: &str,
        envelopes: &mut Vec<Envelope>,
    ) -> Result<Vec<(Option<IdKey>, AcpError)>, AcpError> {
        let inst = self.find_or_create(server_id, None)?;
        if !inst.is_started() {
            self.check_wake(&inst)?;
            // Boxed: the start is rare and its future large; inline it would make every POST's
            // future (which axum moves into a box several times per request) that large too.
            Box::pin(self.start(&inst)).await?;
        }
        if let Some(t) = inst.events.durable() {
            t.before_post(&inst, None, self.deps.config.request_timeout)
                .await?;
            for env in envelopes.iter() {
                t.observe_request(env);
            }
        }
        for env in envelopes.iter() {
            if let Kind::Request { key, .. } = &env.kind
                && let Some(w) = super::inventory::watch(&env.line)
            {
                inst.watch_answer(key.clone(), w);
            }
        }
        let refused = inst.deliver_batch(envelopes).await;
        for (key, _) in &refused {
            if let Some(key) = key {
                inst.forget_answer_to(key);
            }
        }
        Ok(refused)
    }

    /// Calls `hook` with the agent's answer to request `key` of `server_id` (see
    /// `AcpInstance::on_answer_to`). False when there is no such instance or it holds its most
    /// observers.
    pub fn on_answer_to(
        &self,
        server_id: &str,
        key: IdKey,
        hook: super::instance::AnswerHook,
    ) -> bool {
        match self.get(server_id) {
            Some(inst) => inst.on_answer_to(key, hook),
            None => false,
        }
    }

    /// Forgets the observers of request `key` of `server_id` (its request was not delivered).
    pub fn forget_answer_to(&self, server_id: &str, key: &IdKey) {
        if let Some(inst) = self.get(server_id) {
            inst.forget_answer_to(key);
        }
    }

    async fn start(&self, inst: &Arc<AcpInstance>) -> Result<(), AcpError> {
        let agents: &Agents = &self.deps.agents;
        let supervisor: &Arc<Supervisor> = &self.deps.supervisor;
        let work_dir = self.deps.config.work_dir.clone();
        let (server_id, agent) = (inst.server_id.clone(), inst.agent.clone());
        let prepare = async {
            self.ready_for_restore(inst).await;
            let launch = agents.prepare_launch(&agent).await.map_err(|e| match e {
                AgentError::Unknown { agent } => AcpError::UnknownAgent { agent },
                other => AcpError::Launch {
                    server_id: server_id.clone(),
                    agent: agent.clone(),
                    source: Arc::new(other),
                },
            })?;
            Ok(SpawnSpec {
                program: launch.program,
                args: launch.args,
                env: launch.env,
                cwd: work_dir,
                name: server_id.clone(),
                agent: agent.clone(),
            })
        };
        let spawn = |spec: SpawnSpec| async {
            supervisor.start(spec).await.map_err(|e| AcpError::Spawn {
                server_id: server_id.clone(),
                agent: agent.clone(),
                source: Arc::new(e),
            })
        };
        let max_line = usize::try_from(self.deps.config.max_line).unwrap_or(usize::MAX);
        let result = tracing::Instrument::instrument(
            inst.ensure_started(prepare, spawn, max_line),
            crate::telemetry::task_span("agent start", &inst.agent),
        )
        .await;
        if let Err(e) = &result {
            if !inst.is_retired() {
                tracing::warn!(server_id = %inst.server_id, agent = %inst.agent, error = %e,
                    "cannot start the agent");
            }
            // A failed start leaves nothing behind (its subscribers get their end): the next
            // first POST starts afresh.
            let mut map = self.instances();
            self.retire(&mut map, inst, Retirement::StartFailed, Duration::ZERO);
        }
        // "agent started" is logged once by the supervisor (with program, pid and cgroup).
        result
    }

    /// A new SSE subscription: retained events after `last_event_id` (all when `None`), then live.
    pub fn subscribe(
        &self,
        server_id: &str,
        last_event_id: Option<u64>,
    ) -> Result<Subscription, AcpError> {
        let inst = self.get(server_id).ok_or_else(|| AcpError::NotFound {
            server_id: server_id.to_string(),
        })?;
        let full = |what, limit: usize| AcpError::Capacity {
            what,
            limit: limit as u64,
            server_id: Some(server_id.to_string()),
        };
        let total = self.deps.config.max_subscribers_total;
        let share = self
            .subscribers_total
            .try_reserve(1)
            .ok_or_else(|| full("SSE subscribers of all serverIds", total))?;
        let per = self.deps.config.max_subscribers;
        match inst.events.subscribe(last_event_id.unwrap_or(0), per) {
            Subscribe::Live(mut s) => {
                s.hold(share);
                Ok(s)
            }
            Subscribe::Full => Err(full("SSE subscribers of this serverId", per)),
            Subscribe::NothingLeft => Err(AcpError::Gone {
                server_id: server_id.to_string(),
            }),
            Subscribe::Ahead { last } => Err(AcpError::EventIdAhead {
                server_id: server_id.to_string(),
                last_event_id: last_event_id.unwrap_or(0),
                last_id: last,
            }),
        }
    }

    /// Retires `server_id` (idempotent: nothing when it does not exist) and stops its agent in
    /// the background.
    pub fn delete(&self, server_id: &str) {
        self.retire_id(server_id, Retirement::Deleted);
    }

    /// Retires `server_id`, for `why`, if it exists.
    pub fn retire_id(&self, server_id: &str, why: Retirement) {
        let mut map = self.instances();
        if let Some(inst) = map.get(server_id).cloned() {
            let grace = self.deps.config.agent_grace;
            self.retire(&mut map, &inst, why, grace);
        }
    }

    /// The one way out of the map. Removes `inst` (if it is still the one under its serverId),
    /// marks it retired — a start in progress then kills its process instead of publishing it,
    /// and its writer drops what is queued for stdin —, closes its event log (every subscriber
    /// gets its end, which gives its share of the subscriber budget back) and stops its process,
    /// if one runs, on the tracker (TERM, `grace`, KILL). Nothing here waits, so it runs under
    /// the instances lock: the stop joins the tracker while the lock is held, and a `stop_all`
    /// that takes the lock next sees it.
    ///
    /// A reload does not come through here for what it carries: `export` writes the running
    /// instances down and leaves them in the map (the old image ends with them); only what
    /// cannot be carried is retired, as at shutdown. Durable state forgets each removal here (a
    /// shutdown keeps the entry for the next start).
    fn retire(
        &self,
        map: &mut Instances,
        inst: &Arc<AcpInstance>,
        why: Retirement,
        grace: Duration,
    ) {
        if map
            .get(&inst.server_id)
            .is_some_and(|cur| Arc::ptr_eq(cur, inst))
        {
            map.remove(&inst.server_id);
        }
        // Durable state is forgotten by a client's DELETE only. A failed start of a serverId
        // with history (recovered, or with events or sessions) keeps it listed as it was, its
        // log and sessions with it, for the next POST to try again; one without any leaves
        // nothing to keep. A shutdown keeps everything for the next start.
        let mut keep = None;
        if let Some(t) = inst.events.durable() {
            match why {
                Retirement::Deleted => {
                    t.forget();
                }
                Retirement::StartFailed if t.has_history() => keep = Some(t.clone()),
                Retirement::Shutdown => {}
                _ => t.forget(),
            }
        }
        // The inventory follows the map: a serverId gone for good takes its sessions along.
        if !matches!(why, Retirement::Shutdown) && keep.is_none() {
            self.inventory.forget_server(&inst.server_id);
        }
        let handle = inst.retire();
        if let Some(t) = keep
            && !map.contains_key(&inst.server_id)
        {
            let base = self.make_instance(&inst.server_id, &inst.agent);
            let log = inst.events.reopened();
            let again = AcpInstance::recovered(base, inst.created_at_ms, log);
            again.events.set_durable(t);
            map.insert(inst.server_id.clone(), Arc::new(again));
        }
        let Some(handle) = handle else {
            crate::sys::trim_soon();
            return;
        };
        // DEBUG: the stop it starts is logged once, as "agent ended" with the exit's reason.
        tracing::debug!(server_id = %inst.server_id, agent = %inst.agent, cause = why.as_str(),
            "ACP server retired");
        self.stops.spawn(stop_instance(inst.clone(), handle, grace));
    }

    /// Reads the process figures of every running instance from procfs (a few files per
    /// process, one `/proc` scan for the agents without a cgroup) on the blocking pool, keeps
    /// them as the figures listings report, and returns every instance with them. The sampler
    /// calls it every `metrics::SAMPLE_EVERY`; no request does.
    pub async fn sample(&self) -> Vec<ServerInfo> {
        let all: Vec<Arc<AcpInstance>> = self.instances().values().cloned().collect();
        if all.is_empty() {
            *crate::sys::lock(&self.sampled) = Arc::default();
            return Vec::new();
        }
        let rows: Vec<ServerInfo> = crate::sys::blocking(move || {
            let mut scan = GroupScan::default();
            all.iter().map(|i| info(i, Some(&mut scan), None)).collect()
        })
        .await;
        let figures: Sampled = rows
            .iter()
            .filter_map(|r| Some((r.server_id.clone(), (r.pid?, stats_of(r)?))))
            .collect();
        *crate::sys::lock(&self.sampled) = Arc::new(figures);
        rows
    }

    /// Every instance, sorted by serverId; see `page`.
    pub async fn list(&self) -> Vec<ServerInfo> {
        self.page(None, usize::MAX).await
    }

    /// At most `limit` instances whose serverId sorts after `after`, sorted by serverId. Their
    /// process figures are the last sample's (at most `metrics::SAMPLE_EVERY` old), so a listing
    /// costs the same whatever the number of agents; only an instance started since the last
    /// sample has its figures read from procfs here (on the blocking pool).
    pub async fn page(&self, after: Option<&str>, limit: usize) -> Vec<ServerInfo> {
        use std::ops::Bound;
        let page: Vec<Arc<AcpInstance>> = {
            let map = self.instances();
            let lower = match after {
                Some(a) => Bound::Excluded(a),
                None => Bound::Unbounded,
            };
            map.range::<str, _>((lower, Bound::Unbounded))
                .take(limit)
                .map(|(_, i)| i.clone())
                .collect()
        };
        let sampled = crate::sys::lock(&self.sampled).clone();
        let mut rows: Vec<ServerInfo> =
            page.iter().map(|i| info(i, None, Some(&sampled))).collect();
        // Running, yet not sampled under its current pid: started since the last sample.
        let fresh: Vec<(usize, Arc<AcpInstance>)> = rows
            .iter()
            .enumerate()
            .filter(|(_, r)| r.status == Status::Running && r.rss_bytes.is_none())
            .map(|(n, _)| (n, page[n].clone()))
            .collect();
        if !fresh.is_empty() {
            let read: Vec<(usize, ServerInfo)> = crate::sys::blocking(move || {
                let mut scan = GroupScan::default();
                fresh
                    .into_iter()
                    .map(|(n, i)| (n, info(&i, Some(&mut scan), None)))
                    .collect()
            })
            .await;
            for (n, row) in read {
                rows[n] = row;
            }
        }
        rows
    }

    /// Instances per state (starting, running, exited), for the metrics.
    pub fn status_counts(&self) -> [u64; 3] {
        let mut n = [0u64; 3];
        for i in self.instances().values() {
            n[match i.status() {
                Status::Starting => 0,
                Status::Running => 1,
                Status::Exited => 2,
            }] += 1;
        }
        n
    }

    /// Each serverId's state as the session inventory shows it, from what is in memory (no
    /// procfs): `live` (starting or running), `restored` (recovered from the state dir, its
    /// sessions to be restored by the next POST) or `exited`.
    pub fn session_states(&self) -> HashMap<String, &'static str> {
        self.instances()
            .iter()
            .map(|(id, i)| {
                let state = match i.status() {
                    Status::Starting | Status::Running => "live",
                    Status::Exited if i.events.durable().is_some_and(|t| t.awaits_restore()) => {
                        "restored"
                    }
                    Status::Exited => "exited",
                };
                (id.clone(), state)
            })
            .collect()
    }

    /// Every serverId, sorted.
    pub fn server_ids(&self) -> Vec<String> {
        let mut ids: Vec<String> = self.instances().keys().cloned().collect();
        ids.sort_unstable();
        ids
    }

    /// The budget of SSE subscribers of every instance (`--max-subscribers-total`), which the
    /// RFD transport's session outboxes share.
    pub fn subscribers_budget(&self) -> &Arc<Budget> {
        &self.subscribers_total
    }

    /// The budget of ACP request bodies being received; a POST reserves its bytes as they arrive.
    pub fn inflight_budget(&self) -> &Arc<Budget> {
        &self.inflight
    }

    /// How many instances of `agent` have a live process.
    pub fn running_count(&self, agent: &str) -> usize {
        self.instances()
            .values()
            .filter(|i| i.agent == agent && i.status() == Status::Running)
            .count()
    }

    /// Refuses new instances, stops every agent (TERM, grace, KILL) and waits for every stop,
    /// DELETEs before included, until `deadline`.
    pub async fn stop_all(&self, deadline: tokio::time::Instant) {
        // Leave a fifth of the remaining time for the KILL and the reaping after the grace.
        let remaining = deadline.saturating_duration_since(tokio::time::Instant::now());
        let grace = self.deps.config.agent_grace.min(remaining * 4 / 5);
        {
            let mut map = self.instances();
            // Under the lock: a first POST either inserted before this or sees the tracker
            // closed and is refused.
            self.stops.close();
            let all: Vec<Arc<AcpInstance>> = map.values().cloned().collect();
            for inst in all {
                self.retire(&mut map, &inst, Retirement::Shutdown, grace);
            }
        }
        if tokio::time::timeout_at(deadline, self.stops.wait())
            .await
            .is_err()
        {
            tracing::warn!(
                stopping = self.stops.len(),
                "some agents were still stopping at the end of the shutdown grace"
            );
        }
    }
}

/// The proxy in a reload's hand-off: every running instance.
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize, PartialEq)]
pub struct AcpState {
    pub instances: Vec<super::instance::InstanceState>,
    /// Instances whose agent had ended, kept for their status and log (version 2).
    #[serde(default)]
    pub exited: Vec<super::instance::ExitedState>,
}

impl AcpService {
    /// What a reload's hand-off would carry of the event logs, in bytes (checked against the
    /// memory the daemon may use before the reload begins).
    pub fn handoff_bytes(&self) -> u64 {
        let logs: Vec<Arc<AcpInstance>> = self.instances().values().cloned().collect();
        logs.iter()
            .map(|i| i.events.retained_bytes() as u64 + 16 * 1024)
            .sum()
    }

    /// A reload begins: a POST waiting for its agent's answer is answered 202 from now on, its
    /// answer going to the event log (as with `Prefer: respond-async`).
    pub fn begin_handoff(&self) {
        self.handoff.cancel();
    }

    /// Writes down every running instance for the new image (their readers stop, nothing more
    /// is written to their stdin) and refuses new instances from now on. What cannot be carried
    /// is retired as at shutdown (its agent stopped within the agent grace): an instance still
    /// starting or whose start failed, one whose agent is still being stopped. An instance whose
    /// agent ended (its tree gone) is carried as exited, with its log. An RFD connection's running
    /// instance is carried like any other (`Connections::export` adds its routes); an ended one
    /// is not. `keep` receives the descriptors that must survive the exec.
    pub async fn export(&self, keep: &mut Vec<std::os::fd::OwnedFd>) -> AcpState {
        let all: Vec<Arc<AcpInstance>> = {
            let map = self.instances();
            self.stops.close();
            map.values().cloned().collect()
        };
        let mut state = AcpState::default();
        for inst in all {
            let carried = match inst.export(keep).await {
                Ok(s) => s,
                Err(e) => {
                    tracing::warn!(server_id = %inst.server_id, error = %e,
                        "cannot carry this instance across the reload; stopping it");
                    None
                }
            };
            match carried {
                Some(s) => state.instances.push(s),
                // An RFD connection's ended instance goes with its connection (not carried).
                None if !inst
                    .server_id
                    .starts_with(super::connection::SERVER_ID_PREFIX)
                    && let Some(e) = inst.export_exited() =>
                {
                    state.exited.push(e)
                }
                None => {
                    let mut map = self.instances();
                    self.retire(
                        &mut map,
                        &inst,
                        Retirement::Shutdown,
                        self.deps.config.agent_grace,
                    );
                }
            }
        }
        let bound = self.deps.config.agent_grace + Duration::from_secs(1);
        let _ = tokio::time::timeout(bound, self.stops.wait()).await;
        state
    }

    /// Rebuilds the instances of a hand-off in the new image, each on its adopted process.
    /// `take` turns a descriptor number of the hand-off into its descriptor.
    pub fn adopt(
        &self,
        state: &AcpState,
        take: &mut dyn FnMut(i32) -> std::io::Result<std::os::fd::OwnedFd>,
    ) {
        for e in &state.exited {
            let mut inst = self.make_instance(&e.server_id, &e.agent);
            inst.created_at_ms = e.created_at_ms;
            let inst = Arc::new(inst);
            inst.adopt_exited(e);
            // One still waiting for its restore after a restart keeps waiting for it.
            let restore = e
                .exit
                .as_ref()
                .is_some_and(|x| x.reason == ExitReason::DaemonRestart);
            self.carry_durable(&inst, restore);
            self.instances().insert(e.server_id.clone(), inst);
        }
        for s in &state.instances {
            let adopted = (|| -> std::io::Result<Arc<AcpInstance>> {
                let hook = crate::config::test_hooks::fail_adoption(&s.server_id);
                let failed = || std::io::Error::other("failed by SANDBOX_AGENT_TEST_FAIL_ADOPTION");
                if hook == Some(false) {
                    return Err(failed());
                }
                let stderr = s.child.stderr_fd.map(&mut *take).transpose()?;
                let stdin = take(s.stdin_fd)?;
                let stdout = take(s.stdout_fd)?;
                let handle = self.deps.supervisor.adopt(&s.child, stderr)?;
                let mut inst = self.make_instance(&s.server_id, &s.agent);
                inst.created_at_ms = s.created_at_ms;
                let inst = Arc::new(inst);
                let max_line = usize::try_from(self.deps.config.max_line).unwrap_or(usize::MAX);
                let taken = match hook {
                    Some(true) => Err(failed()),
                    _ => inst.adopt(s, handle.clone(), stdin, stdout, max_line),
                };
                if let Err(e) = taken {
                    // Adopted by the supervisor but not by the proxy: stopped through its handle.
                    tokio::spawn(async move { handle.kill().await });
                    return Err(e);
                }
                Ok(inst)
            })();
            match adopted {
                Ok(inst) => {
                    self.carry_durable(&inst, false);
                    if let Some(t) = inst.events.durable() {
                        t.promise(&s.pending);
                    }
                    tracing::info!(server_id = %s.server_id, agent = %s.agent, pid = s.child.pid,
                        last_event_id = inst.events.last_id(), "agent carried across the reload");
                    self.instances().insert(s.server_id.clone(), inst);
                }
                Err(e) => {
                    tracing::error!(server_id = %s.server_id, pid = s.child.pid, error = %e,
                        "cannot take over an agent after the reload; stopping it");
                    if !self.deps.supervisor.is_live(s.child.pid) {
                        self.deps.supervisor.discard_unadopted(&s.child);
                    }
                }
            }
        }
    }
}

impl AcpService {
    /// With a state dir, the serverId's durable state goes on with an instance carried across a
    /// reload (the new image read it back from the disk as a restarted one).
    fn carry_durable(&self, inst: &AcpInstance, restore: bool) {
        let Some(store) = &self.state else { return };
        let earlier = self
            .instances()
            .get(&inst.server_id)
            .and_then(|i| i.events.durable().map(|t| t.carried(restore)));
        let tracked = earlier.unwrap_or_else(|| {
            let meta = super::durable::AcpMeta {
                agent: inst.agent.clone(),
                created_at_ms: inst.created_at_ms,
                ..Default::default()
            };
            super::durable::Tracked::new(store, &inst.server_id, meta, None)
        });
        // What the carried log holds that the disk does not (pushed after the previous image's
        // last write): every adopt path catches up.
        tracked.catch_up(&inst.events, tracked.disk_last());
        inst.events.set_durable(tracked);
    }
}

/// A serverId recovered from the state dir and not started since: it does not count against
/// `--max-agents`.
fn dormant(inst: &AcpInstance) -> bool {
    !inst.is_started() && inst.events.durable().is_some_and(|t| t.awaits_restore())
}

/// Instances that count against `--max-agents`.
fn counted(map: &Instances) -> usize {
    map.values().filter(|i| !dormant(i)).count()
}

impl AcpService {
    /// A dormant serverId is started again only within `--max-agents`.
    fn check_wake(&self, inst: &AcpInstance) -> Result<(), AcpError> {
        if !dormant(inst) {
            return Ok(());
        }
        let max = self.deps.config.max_agents;
        if counted(&self.instances()) >= max {
            return Err(AcpError::Capacity {
                what: "agent instances",
                limit: max as u64,
                server_id: Some(inst.server_id.clone()),
            });
        }
        Ok(())
    }
}

fn check_agent(inst: Arc<AcpInstance>, agent: Option<&str>) -> Result<Arc<AcpInstance>, AcpError> {
    match agent {
        Some(a) if a != inst.agent => Err(AcpError::AgentMismatch {
            server_id: inst.server_id.clone(),
            bound: inst.agent.clone(),
            requested: a.to_string(),
        }),
        _ => Ok(inst),
    }
}

async fn stop_instance(inst: Arc<AcpInstance>, handle: ChildHandle, grace: Duration) {
    // The supervisor logs the end once ("agent ended", with its reason and status).
    let _exit = handle.stop(grace).await;
    // The reader records the exit and fails whatever still waited.
    inst.wait_for(|s| s.ended && s.exited).await;
    drop(inst);
    // What the instance held (buffers, its event log) goes back to the system, not only to the
    // allocator: after deleting many instances the daemon's RSS returns to near where it was.
    crate::sys::trim_soon();
}

/// The figures of a listed row, when it has them.
fn stats_of(r: &ServerInfo) -> Option<ProcessStats> {
    Some(ProcessStats {
        rss_bytes: r.rss_bytes?,
        cpu_ms: r.cpu_ms?,
        processes: r.processes?,
        open_fds: r.open_fds?,
    })
}

/// One instance's row: its process figures read from procfs when `scan` is given, otherwise
/// taken from `sampled` when it holds them for the instance's current pid.
fn info(i: &AcpInstance, scan: Option<&mut GroupScan>, sampled: Option<&Sampled>) -> ServerInfo {
    // Status and exit come from one reading of the instance's state, so they always agree.
    let snap = i.snapshot();
    let status = snap.status;
    let exit = snap.exit;
    let stats = match (status, &snap.handle, scan) {
        (Status::Running, Some(h), Some(scan)) => Some(h.stats_in(scan)),
        (Status::Running, Some(h), None) => sampled
            .and_then(|m| m.get(&i.server_id))
            .filter(|(pid, _)| *pid == h.pid())
            .map(|(_, s)| s.clone()),
        _ => None,
    };
    ServerInfo {
        server_id: i.server_id.clone(),
        agent: i.agent.clone(),
        created_at_ms: i.created_at_ms,
        status,
        pid: snap.handle.as_ref().map(|h| h.pid()),
        exit_code: exit.as_ref().and_then(|e| e.code),
        signal: exit.as_ref().and_then(|e| e.signal),
        exit_reason: exit.as_ref().map(|e| e.reason),
        last_event_id: i.events.last_id(),
        subscribers: i.events.subscriber_count(),
        pending_requests: snap.pending_requests,
        invalid_stdout_lines: i.invalid_lines(),
        rss_bytes: stats.as_ref().map(|s| s.rss_bytes),
        cpu_ms: stats.as_ref().map(|s| s.cpu_ms),
        processes: stats.as_ref().map(|s| s.processes),
        open_fds: stats.as_ref().map(|s| s.open_fds),
    }
}
