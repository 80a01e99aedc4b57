//! The OpenCode bridge (`/opencode/*`, docs/opencode.md): OpenCode's server API over the ACP
//! agents the daemon already supervises. Not a second engine: each OpenCode session is one ACP
//! session on its own instance of `AcpService` (serverId `opencode-<sessionID>`), started,
//! limited, logged, listed in `GET /v1/acp` and kept across restarts like any other. This module
//! keeps what OpenCode has and ACP has not: the session's title and model choice, its messages
//! and parts (built from the agent's `session/update` notifications, in stream order), the
//! pending permission and question requests, the "always" rules, and the event bus behind
//! `/event` and `/global/event`.
//!
//! `turn.rs` drives one prompt turn; `ask.rs` keeps the permission and question requests waiting
//! for a client; `models.rs` the providers and the models learnt from the agents; `store.rs`
//! keeps sessions in `--state-dir`.
//! **Invariant:** every map here is capped (sessions, messages per session, parts per message,
//! text per part, pending requests, event streams) and nothing reachable from a request panics.

mod ask;
mod models;
mod store;
mod turn;

use ask::Answer;
pub use ask::{AskKind, Pending};
pub use models::ModelInfo;
use models::Offered;

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use tokio::sync::broadcast;

use crate::acp::AcpService;
use crate::agents::Agents;
use crate::config::Config;

/// Most OpenCode sessions kept (each may hold one agent instance).
pub const MAX_SESSIONS: usize = 256;
/// Most messages kept per session (the oldest are dropped).
pub const MAX_MESSAGES: usize = 1000;
/// Most parts per message; later updates of new parts are dropped (counted in the log).
pub const MAX_PARTS: usize = 2000;
/// Most bytes of text kept per text or reasoning part; the rest is cut.
pub const MAX_PART_TEXT: usize = 1024 * 1024;
/// Most permission and question requests waiting for an answer, all sessions together.
pub const MAX_PENDING: usize = 1024;
/// Longest a turn's answer waits for the open event streams to carry the turn's events.
pub const DELIVERY_WAIT: std::time::Duration = std::time::Duration::from_secs(2);
/// Most `/event` and `/global/event` streams open at once.
pub const MAX_STREAMS: usize = 64;
/// Events queued per stream; a stream that falls further behind skips what it missed.
pub const STREAM_QUEUE: usize = 1024;

/// The message every refused model change carries.
pub const MODEL_LOCKED: &str = "OpenCode compatibility currently does not support changing the \
     model after creating a session. Export with /export and load in to a new session.";

/// What a call on the bridge can fail with; `http/opencode.rs` maps it to OpenCode's shapes.
#[derive(Debug, thiserror::Error)]
pub enum OcError {
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    BadRequest(String),
    #[error("{0}")]
    Busy(String),
    #[error("{0}")]
    Capacity(String),
}

/// One message: OpenCode's `info` and its parts, as OpenCode shapes them.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Msg {
    pub info: Value,
    pub parts: Vec<Value>,
}

/// An allow/deny rule: OpenCode's `{permission, pattern, action}`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Rule {
    pub permission: String,
    pub pattern: String,
    pub action: String,
}

/// What is kept of a session (in memory, and in the state dir).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SessionData {
    pub id: String,
    pub title: String,
    pub created: u64,
    pub updated: u64,
    pub directory: String,
    #[serde(default)]
    pub parent_id: Option<String>,
    /// The provider (an agent id) and model, once chosen.
    #[serde(default)]
    pub provider: Option<String>,
    #[serde(default)]
    pub model: Option<String>,
    /// The ACP session on the instance, once `session/new` answered.
    #[serde(default)]
    pub acp_session: Option<String>,
    /// Whether the instance got its `initialize`.
    #[serde(default)]
    pub initialized: bool,
    #[serde(default)]
    pub prompted: bool,
    #[serde(default)]
    pub permission_mode: Option<String>,
    #[serde(default)]
    pub rules: Vec<Rule>,
    #[serde(default)]
    pub messages: Vec<Msg>,
    /// Token and cost totals of the session's turns (OpenCode's session `tokens` and `cost`).
    #[serde(default)]
    pub usage: Usage,
}

/// Tokens as OpenCode counts them (`tokens` of an assistant message or a session).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Tokens {
    pub input: u64,
    pub output: u64,
    pub reasoning: u64,
    pub cache_read: u64,
    pub cache_write: u64,
}

impl Tokens {
    pub fn json(&self) -> Value {
        json!({"input": self.input, "output": self.output, "reasoning": self.reasoning,
            "cache": {"read": self.cache_read, "write": self.cache_write}})
    }

    fn add(&mut self, o: &Tokens) {
        self.input = self.input.saturating_add(o.input);
        self.output = self.output.saturating_add(o.output);
        self.reasoning = self.reasoning.saturating_add(o.reasoning);
        self.cache_read = self.cache_read.saturating_add(o.cache_read);
        self.cache_write = self.cache_write.saturating_add(o.cache_write);
    }
}

/// The session's running totals, and the agent's last cumulative cost (ACP's `usage_update`
/// reports the session's cost so far; a message's cost is the difference).
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Usage {
    pub tokens: Tokens,
    pub cost: f64,
    pub agent_cost: f64,
}

impl Usage {
    /// Adds one turn: its tokens, and the agent's cumulative cost after it (if it said one).
    /// Returns the turn's cost.
    pub fn add_turn(&mut self, tokens: &Tokens, agent_cost: Option<f64>) -> f64 {
        self.tokens.add(tokens);
        let Some(now) = agent_cost.filter(|c| c.is_finite() && *c >= 0.0) else {
            return 0.0;
        };
        // A cumulative cost lower than the last one means the agent started counting anew
        // (a new ACP session after its instance ended): all of it is this turn's.
        let turn = if now >= self.agent_cost {
            now - self.agent_cost
        } else {
            now
        };
        self.agent_cost = now;
        self.cost += turn;
        turn
    }
}

pub struct Session {
    pub id: String,
    pub server_id: String,
    data: Mutex<SessionData>,
    /// One turn at a time.
    turn: tokio::sync::Mutex<()>,
    busy: AtomicBool,
    aborted: AtomicBool,
    /// Woken by `abort`, so the running turn sends (and repeats) the agent's `session/cancel`.
    abort_wake: tokio::sync::Notify,
    /// The turn's assistant message id while one runs.
    current: Mutex<Option<String>>,
}

impl Session {
    fn new(data: SessionData) -> Arc<Session> {
        Arc::new(Session {
            id: data.id.clone(),
            server_id: server_id_of(&data.id),
            data: Mutex::new(data),
            turn: tokio::sync::Mutex::new(()),
            busy: AtomicBool::new(false),
            aborted: AtomicBool::new(false),
            abort_wake: tokio::sync::Notify::new(),
            current: Mutex::new(None),
        })
    }

    fn data(&self) -> std::sync::MutexGuard<'_, SessionData> {
        crate::sys::lock(&self.data)
    }

    pub fn is_busy(&self) -> bool {
        self.busy.load(Ordering::Acquire)
    }
}

/// The ACP serverId of a session.
pub fn server_id_of(session: &str) -> String {
    format!("opencode-{session}")
}

/// A session id a client may choose (`init` of an unknown id creates it): what a serverId allows.
fn valid_session_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= 100
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-'))
}

pub struct OpenCode {
    acp: Arc<AcpService>,
    agents: Arc<Agents>,
    sessions: Mutex<BTreeMap<String, Arc<Session>>>,
    events: broadcast::Sender<Arc<Event>>,
    /// The last event's number; the lock keeps numbers and bus order the same.
    seq: Mutex<u64>,
    /// Each open stream's last event handed to its connection (see `wait_delivered`).
    delivered: Mutex<Vec<std::sync::Weak<AtomicU64>>>,
    delivered_changed: tokio::sync::Notify,
    pending: Mutex<BTreeMap<String, Pending>>,
    /// Models each agent offered in its `session/new` answer (the newest answer wins).
    models: Mutex<HashMap<String, Offered>>,
    store: Option<store::Store>,
    last_id: AtomicU64,
    streams: Arc<tokio::sync::Semaphore>,
    directory: String,
}

impl OpenCode {
    /// Builds the bridge; with a state dir, the sessions kept there are read back (blocking:
    /// call on the blocking pool).
    pub fn new(
        config: Arc<Config>,
        acp: Arc<AcpService>,
        agents: Arc<Agents>,
        store_dir: Option<&std::path::Path>,
    ) -> OpenCode {
        let (events, _) = broadcast::channel(STREAM_QUEUE);
        let directory = config.work_dir.to_string_lossy().into_owned();
        let (store, recovered) = match store_dir {
            Some(dir) => match store::Store::open(dir) {
                Ok((s, r)) => (Some(s), r),
                Err(e) => {
                    tracing::warn!(error = %e, "cannot keep OpenCode sessions in the state dir");
                    (None, Vec::new())
                }
            },
            None => (None, Vec::new()),
        };
        let mut sessions = BTreeMap::new();
        for d in recovered.into_iter().take(MAX_SESSIONS) {
            sessions.insert(d.id.clone(), Session::new(d));
        }
        OpenCode {
            acp,
            agents,
            sessions: Mutex::new(sessions),
            events,
            seq: Mutex::new(0),
            delivered: Mutex::new(Vec::new()),
            delivered_changed: tokio::sync::Notify::new(),
            pending: Mutex::new(BTreeMap::new()),
            models: Mutex::new(HashMap::new()),
            store,
            last_id: AtomicU64::new(0),
            streams: Arc::new(tokio::sync::Semaphore::new(MAX_STREAMS)),
            directory,
        }
    }

    /// Waits (at most `timeout`) until every session change made so far is on disk (before a
    /// reload's exec and at shutdown). Blocking.
    pub fn flush_blocking(&self, timeout: std::time::Duration) {
        if let Some(store) = &self.store {
            store.flush_blocking(timeout);
        }
    }

    pub fn directory(&self) -> &str {
        &self.directory
    }

    /// A new id with OpenCode's prefix (`ses`, `msg`, `prt`, `per`, `que`): ids sort in the
    /// order they were made (OpenCode's clients rely on it), across restarts too.
    pub fn new_id(&self, prefix: &str) -> String {
        let now = crate::processes::now_ms() << 16;
        let mut last = self.last_id.load(Ordering::Relaxed);
        loop {
            let next = now.max(last + 1);
            match self
                .last_id
                .compare_exchange(last, next, Ordering::AcqRel, Ordering::Relaxed)
            {
                Ok(_) => {
                    return format!("{prefix}_{next:014x}{}", crate::sys::random_hex::<3>());
                }
                Err(actual) => last = actual,
            }
        }
    }

    // ---- events ----

    /// Publishes one event (`{type, properties}`) to every `/event` and `/global/event` stream;
    /// its number.
    pub fn emit(&self, kind: &str, properties: Value) -> u64 {
        let json = json!({"type": kind, "properties": properties}).to_string();
        let mut seq = crate::sys::lock(&self.seq);
        *seq += 1;
        let _ = self.events.send(Arc::new(Event { seq: *seq, json }));
        *seq
    }

    /// A new event stream: a permit of `MAX_STREAMS`, the bus, and the counter the stream sets
    /// to the number of each event it hands to its connection.
    pub fn subscribe(&self) -> Result<Stream, OcError> {
        let permit = self.streams.clone().try_acquire_owned().map_err(|_| {
            OcError::Capacity(format!(
                "at most {MAX_STREAMS} OpenCode event streams may be open at once"
            ))
        })?;
        let seq = crate::sys::lock(&self.seq);
        let rx = self.events.subscribe();
        let delivered = Arc::new(AtomicU64::new(*seq));
        drop(seq);
        let mut all = crate::sys::lock(&self.delivered);
        all.retain(|w| w.strong_count() > 0);
        all.push(Arc::downgrade(&delivered));
        Ok(Stream {
            permit,
            rx,
            delivered,
        })
    }

    /// A stream handed events up to `seq` to its connection.
    pub fn mark_delivered(&self, counter: &AtomicU64, seq: u64) {
        counter.fetch_max(seq, Ordering::AcqRel);
        self.delivered_changed.notify_waiters();
    }

    /// Waits until every open stream has handed event `seq` to its connection, at most
    /// `DELIVERY_WAIT`: a turn's answer then reaches a client after the turn's events, as it
    /// would from OpenCode (whose CLI stops reading events once the answer is in).
    pub async fn wait_delivered(&self, seq: u64) {
        let deadline = tokio::time::Instant::now() + DELIVERY_WAIT;
        loop {
            let notified = self.delivered_changed.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let behind = crate::sys::lock(&self.delivered)
                .iter()
                .filter_map(std::sync::Weak::upgrade)
                .any(|c| c.load(Ordering::Acquire) < seq);
            if !behind || tokio::time::timeout_at(deadline, notified).await.is_err() {
                return;
            }
        }
    }

    // ---- sessions ----

    fn get(&self, id: &str) -> Result<Arc<Session>, OcError> {
        crate::sys::lock(&self.sessions)
            .get(id)
            .cloned()
            .ok_or_else(|| OcError::NotFound(format!("Session not found: {id}")))
    }

    fn persist(&self, s: &Session) {
        if let Some(store) = &self.store {
            store.save(&s.data());
        }
    }

    /// OpenCode's `Session` shape (plus the backing agent, model and ACP instance).
    pub fn session_info(&self, s: &Session) -> Value {
        let d = s.data();
        let mut v = json!({
            "id": d.id,
            "slug": d.id,
            "projectID": "global",
            "directory": d.directory,
            "title": d.title,
            "version": env!("CARGO_PKG_VERSION"),
            "time": {"created": d.created, "updated": d.updated},
            "acpServerId": s.server_id,
            "cost": d.usage.cost,
            "tokens": d.usage.tokens.json(),
        });
        if let Some(p) = &d.parent_id {
            v["parentID"] = json!(p);
        }
        if let Some(p) = &d.provider {
            v["agent"] = json!(p);
            v["providerID"] = json!(p);
        }
        if let Some(m) = &d.model {
            v["model"] = json!(m);
            v["modelID"] = json!(m);
        }
        if let Some(m) = &d.permission_mode {
            v["permissionMode"] = json!(m);
        }
        if let Some(a) = &d.acp_session {
            v["acpSessionId"] = json!(a);
        }
        v
    }

    /// `POST /session`.
    pub fn create_session(&self, body: &Value, id: Option<String>) -> Result<Value, OcError> {
        let now = crate::processes::now_ms();
        let id = id.unwrap_or_else(|| self.new_id("ses"));
        let title = body
            .get("title")
            .and_then(Value::as_str)
            .map(|t| t.chars().take(1000).collect::<String>())
            .unwrap_or_else(|| {
                format!(
                    "New session - {}",
                    httpdate::fmt_http_date(std::time::SystemTime::now())
                )
            });
        let (provider, model) = model_choice(body);
        let provider = provider
            .or_else(|| {
                body.get("agent")
                    .and_then(Value::as_str)
                    .filter(|a| self.agents.is_known(a))
                    .map(String::from)
            })
            .filter(|p| self.agents.is_known(p));
        let permission_mode = ["permissionMode", "permission_mode"]
            .iter()
            .find_map(|k| body.get(*k).and_then(Value::as_str))
            .map(|m| m.chars().take(64).collect());
        let rules = body
            .get("permission")
            .and_then(Value::as_array)
            .map(|a| {
                a.iter()
                    .take(256)
                    .filter_map(|r| serde_json::from_value::<Rule>(r.clone()).ok())
                    .collect()
            })
            .unwrap_or_default();
        let data = SessionData {
            id: id.clone(),
            title,
            created: now,
            updated: now,
            directory: self.directory.clone(),
            parent_id: body
                .get("parentID")
                .and_then(Value::as_str)
                .map(String::from),
            model: model.filter(|_| provider.is_some()),
            provider,
            acp_session: None,
            initialized: false,
            prompted: false,
            permission_mode,
            rules,
            messages: Vec::new(),
            usage: Usage::default(),
        };
        let s = Session::new(data);
        {
            let mut map = crate::sys::lock(&self.sessions);
            if map.len() >= MAX_SESSIONS {
                return Err(OcError::Capacity(format!(
                    "at most {MAX_SESSIONS} OpenCode sessions may exist; delete one first"
                )));
            }
            if map.contains_key(&id) {
                return Err(OcError::BadRequest(format!("session {id} exists")));
            }
            map.insert(id, s.clone());
        }
        self.persist(&s);
        let info = self.session_info(&s);
        self.emit("session.created", json!({"info": info}));
        self.emit("session.updated", json!({"info": info}));
        Ok(info)
    }

    pub fn list_sessions(&self) -> Vec<Value> {
        let all: Vec<Arc<Session>> = crate::sys::lock(&self.sessions).values().cloned().collect();
        let mut out: Vec<Value> = all.iter().map(|s| self.session_info(s)).collect();
        // Newest first, as OpenCode lists them.
        out.reverse();
        out
    }

    /// The OpenCode session an ACP instance backs (its id and title), for `GET /v1/acp`.
    pub fn session_of_server(&self, server_id: &str) -> Option<(String, String)> {
        let id = server_id.strip_prefix("opencode-")?;
        let s = crate::sys::lock(&self.sessions).get(id).cloned()?;
        // A client may have named an unrelated instance `opencode-…`: only the session's own.
        (s.server_id == server_id).then(|| (s.id.clone(), s.data().title.clone()))
    }

    pub fn get_session(&self, id: &str) -> Result<Value, OcError> {
        let s = self.get(id)?;
        Ok(self.session_info(&s))
    }

    /// `PATCH /session/{id}`: the title; a model change is refused with `MODEL_LOCKED`.
    pub fn update_session(&self, id: &str, body: &Value) -> Result<Value, OcError> {
        let s = self.get(id)?;
        let (provider, model) = model_choice(body);
        if provider.is_some() || model.is_some() {
            return Err(OcError::BadRequest(MODEL_LOCKED.into()));
        }
        {
            let mut d = s.data();
            if let Some(t) = body.get("title").and_then(Value::as_str) {
                d.title = t.chars().take(1000).collect();
            }
            d.updated = crate::processes::now_ms();
        }
        self.persist(&s);
        let info = self.session_info(&s);
        self.emit("session.updated", json!({"info": info}));
        Ok(info)
    }

    /// `DELETE /session/{id}`: the session, its instance and its pending requests.
    pub fn delete_session(&self, id: &str) -> Result<(), OcError> {
        let s = crate::sys::lock(&self.sessions)
            .remove(id)
            .ok_or_else(|| OcError::NotFound(format!("Session not found: {id}")))?;
        crate::sys::lock(&self.pending).retain(|_, p| p.session != id);
        self.acp.delete(&s.server_id);
        if let Some(store) = &self.store {
            store.remove(id);
        }
        let info = self.session_info(&s);
        self.emit("session.deleted", json!({"info": info}));
        Ok(())
    }

    /// `POST /session/{id}/init`: creates an unknown session under that id, and records the
    /// model choice (refused once the session has prompted with another model).
    pub fn init_session(&self, id: &str, body: &Value) -> Result<(), OcError> {
        let s = match self.get(id) {
            Ok(s) => s,
            Err(_) if valid_session_id(id) => {
                self.create_session(&json!({}), Some(id.to_string()))?;
                self.get(id)?
            }
            Err(e) => return Err(e),
        };
        let (provider, model) = model_choice(body);
        if let Some(p) = provider {
            self.choose_model(&s, Some(&p), model.as_deref())?;
            self.persist(&s);
        }
        Ok(())
    }

    /// Sets or checks the session's provider and model: free until the first prompt, then a
    /// different choice is `MODEL_LOCKED`.
    fn choose_model(
        &self,
        s: &Session,
        provider: Option<&str>,
        model: Option<&str>,
    ) -> Result<(String, String), OcError> {
        if let Some(p) = provider
            && !self.agents.is_known(p)
        {
            return Err(OcError::BadRequest(format!(
                "unknown provider `{p}`: the providers are the daemon's agents (GET /opencode/provider)"
            )));
        }
        let mut d = s.data();
        if d.prompted || d.acp_session.is_some() {
            let cur_p = d.provider.clone().unwrap_or_default();
            let cur_m = d.model.clone().unwrap_or_default();
            if provider.is_some_and(|p| p != cur_p) || model.is_some_and(|m| m != cur_m) {
                return Err(OcError::BadRequest(MODEL_LOCKED.into()));
            }
            return Ok((cur_p, cur_m));
        }
        let p = provider
            .map(String::from)
            .or_else(|| d.provider.clone())
            .unwrap_or_else(|| self.default_provider());
        let m = match model {
            Some(m) => m.to_string(),
            None if Some(&p) == d.provider.as_ref() && d.model.is_some() => {
                d.model.clone().unwrap_or_default()
            }
            None => self.default_model(&p),
        };
        d.provider = Some(p.clone());
        d.model = Some(m.clone());
        Ok((p, m))
    }

    pub fn status(&self) -> Value {
        let all: Vec<Arc<Session>> = crate::sys::lock(&self.sessions).values().cloned().collect();
        let mut out = serde_json::Map::new();
        for s in all {
            let t = if s.is_busy() { "busy" } else { "idle" };
            out.insert(s.id.clone(), json!({"type": t}));
        }
        Value::Object(out)
    }

    pub fn messages(&self, id: &str, limit: Option<usize>) -> Result<Vec<Msg>, OcError> {
        let s = self.get(id)?;
        let d = s.data();
        let n = limit.unwrap_or(usize::MAX).min(d.messages.len());
        Ok(d.messages[d.messages.len() - n..].to_vec())
    }

    pub fn message(&self, id: &str, message: &str) -> Result<Msg, OcError> {
        let s = self.get(id)?;
        let d = s.data();
        d.messages
            .iter()
            .find(|m| m.info["id"] == message)
            .cloned()
            .ok_or_else(|| OcError::NotFound(format!("Message not found: {message}")))
    }

    /// `POST /session/{id}/abort`: cancels the running turn (true), or nothing (true as well).
    pub async fn abort(&self, id: &str) -> Result<bool, OcError> {
        let s = self.get(id)?;
        if !s.is_busy() {
            return Ok(true);
        }
        s.aborted.store(true, Ordering::Release);
        let acp_session = s.data().acp_session.clone();
        // Requests of the turn can no longer be answered by the client.
        let waiting: Vec<Pending> = crate::sys::lock(&self.pending)
            .values()
            .filter(|p| p.session == id)
            .cloned()
            .collect();
        for p in waiting {
            let _ = self.answer(&p, Answer::Cancelled).await;
        }
        if let Some(acp_session) = acp_session {
            let line = json!({"jsonrpc": "2.0", "method": "session/cancel",
                "params": {"sessionId": acp_session}});
            let _ = self.post_line(&s.server_id, None, &line, false).await;
        }
        // The turn may not have sent its prompt yet (a cancel before it would be lost): the turn
        // itself skips the prompt, or repeats the cancel until the agent ends it.
        s.abort_wake.notify_one();
        Ok(true)
    }

    /// Posts one JSON-RPC line to an instance through the proxy, as any client would.
    async fn post_line(
        &self,
        server_id: &str,
        agent: Option<&str>,
        line: &Value,
        wait: bool,
    ) -> Result<crate::acp::Delivered, crate::acp::AcpError> {
        let env = crate::acp::jsonrpc::parse_envelope(bytes::Bytes::from(line.to_string()))?;
        self.acp.post(server_id, agent, env, !wait).await
    }
}

/// One event on the bus: its number and its JSON.
pub struct Event {
    pub seq: u64,
    pub json: String,
}

/// One open event stream.
pub struct Stream {
    pub permit: tokio::sync::OwnedSemaphorePermit,
    pub rx: broadcast::Receiver<Arc<Event>>,
    pub delivered: Arc<AtomicU64>,
}

/// The provider and model a body names, in any of the spellings clients use (`model:
/// {providerID, modelID}`, `providerID`/`modelID`, `provider_id`/`model_id`,
/// `providerId`/`modelId`, or `model: "provider/model"`).
fn model_choice(body: &Value) -> (Option<String>, Option<String>) {
    let s = |v: &Value, keys: &[&str]| {
        keys.iter()
            .find_map(|k| v.get(*k).and_then(Value::as_str))
            .map(|x| x.chars().take(200).collect::<String>())
    };
    if let Some(m) = body.get("model") {
        if let Some(text) = m.as_str() {
            return match text.split_once('/') {
                Some((p, m)) => (Some(p.to_string()), Some(m.to_string())),
                None => (None, Some(text.to_string())),
            };
        }
        let p = s(m, &["providerID", "provider_id", "providerId"]);
        let id = s(m, &["modelID", "model_id", "modelId", "id"]);
        if p.is_some() || id.is_some() {
            return (p, id);
        }
    }
    (
        s(body, &["providerID", "provider_id", "providerId"]),
        s(body, &["modelID", "model_id", "modelId"]),
    )
}
