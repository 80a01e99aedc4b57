//! The proxy's durable state (stored through `crate::state`): per serverId its meta (agent, creation time, the client's
//! `initialize` params, the agent's session capabilities, the sessions it answered) and its event
//! log; recovery at start; and the restore of the sessions on the first POST after a restart.
//! One concern although over 800 lines: what the proxy keeps on disk and brings back from it.
//!
//! The restore: the agent is started again (the same agent id, so the same program, environment,
//! working directory and limits as any start of it), sent the client's original `initialize`,
//! then for every recorded session `session/resume` where the agent advertises it (it reattaches
//! without a replay), else `session/load`. The `session/update` notifications an agent sends while it loads (its replay of
//! the conversation) are swallowed: the event log already holds the originals. One
//! `_sandboxagent/restored` notification then names the sessions restored, and how, and those
//! that were not, and why. Each step is bounded by the request timeout (at most a minute).
//!
//! Secrets: the values of a session's `mcpServers[].env` and `headers` are sealed
//! (`state::seal`) before the meta is written, and put back only for the restore's
//! `session/load`.
//!
//! One long file on purpose: every path that writes a serverId's durable state (meta,
//! log, forget, catch-up after a reload, the promise of unanswered requests, the restore) goes
//! through `Tracked`, and keeping them side by side is what lets one read that no write escapes
//! the `forget()` gate; the parts that are not that handle (secrets, recovery) are short.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::acp::jsonrpc::{AgentLine, Envelope, IdKey, Kind, classify_agent_line, parse_envelope};
use crate::acp::{AcpError, AcpInstance, Delivered};
use crate::state::{Durable, Entry, RESTART_ID_SKIP, StateStore};

/// Most sessions remembered per serverId (the oldest are forgotten first).
pub const MAX_SESSIONS: usize = 256;

/// Longest a restore step (the `initialize`, each `session/load`) may take.
const STEP_TIMEOUT: Duration = Duration::from_secs(60);

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AcpMeta {
    pub agent: String,
    pub created_at_ms: u64,
    /// Ids up to here may have been issued: the next start continues beyond. Written when a
    /// recovered log issues its first id past the restart's skip, never otherwise.
    #[serde(default)]
    pub id_floor: u64,
    /// The client's `initialize` params, replayed to the restarted agent.
    #[serde(default)]
    pub initialize: Option<Value>,
    #[serde(default)]
    pub load_session: bool,
    #[serde(default)]
    pub resume_session: bool,
    /// The agent advertised `sessionCapabilities.list` (known once `initialize` is set).
    #[serde(default)]
    pub list_sessions: bool,
    #[serde(default)]
    pub sessions: Vec<SessionRecord>,
    /// Ids (canonical JSON) of requests a reload answered 202 whose answer has not come yet: a
    /// restart answers each with an error on the stream.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub promised: Vec<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SessionRecord {
    pub session_id: String,
    #[serde(default)]
    pub cwd: Value,
    /// The servers as the client sent them, every env and header value blanked.
    #[serde(default)]
    pub mcp_servers: Value,
    /// The blanked values, sealed (`state::seal`), in the order `strip_secrets` walks them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sealed: Option<String>,
    /// How many values were blanked (0: the servers need none).
    #[serde(default)]
    pub secrets: usize,
    /// When the daemon first saw the session (0: recorded by an older build).
    #[serde(default)]
    pub created_at_ms: u64,
    /// The title the agent last gave it (`session_info_update`), cut to the inventory's cap.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub title: Option<String>,
}

impl AcpMeta {
    /// What the agent advertised in its `initialize` answer, once one was recorded.
    pub fn session_caps(&self) -> Option<super::inventory::SessionCaps> {
        self.initialize
            .as_ref()
            .map(|_| super::inventory::SessionCaps {
                list: self.list_sessions,
                resume: self.resume_session,
                load: self.load_session,
            })
    }
}

impl SessionRecord {
    /// A record of `mcp_servers` as sent, its secrets sealed (or dropped without a sealer).
    fn new(
        session_id: String,
        cwd: Value,
        mut mcp_servers: Value,
        seal: Option<&crate::state::seal::Sealer>,
    ) -> Self {
        let values = strip_secrets(&mut mcp_servers);
        let sealed = match (values.is_empty(), seal) {
            (false, Some(s)) => s.seal(&serde_json::to_vec(&values).unwrap_or_default()),
            _ => None,
        };
        SessionRecord {
            session_id,
            cwd,
            mcp_servers,
            sealed,
            secrets: values.len(),
            created_at_ms: super::inventory::now_ms(),
            title: None,
        }
    }

    /// The session as the inventory lists it after a restart (its last activity unknown: the
    /// time it was recorded).
    pub fn entry(&self, server_id: &str, meta: &AcpMeta) -> super::inventory::SessionEntry {
        let at = if self.created_at_ms > 0 {
            self.created_at_ms
        } else {
            meta.created_at_ms
        };
        super::inventory::SessionEntry {
            server_id: server_id.to_string(),
            session_id: self.session_id.clone(),
            agent: meta.agent.clone(),
            cwd: self.cwd.as_str().map(str::to_string),
            title: self.title.clone(),
            created_at_ms: at,
            last_activity_ms: at,
            closed: false,
        }
    }

    /// The servers with their secrets back, or why not.
    fn servers(&self, seal: Option<&crate::state::seal::Sealer>) -> Result<Value, RestoreError> {
        let mut servers = self.mcp_servers.clone();
        if self.secrets == 0 {
            return Ok(servers);
        }
        let values: Option<Vec<String>> = self
            .sealed
            .as_deref()
            .zip(seal)
            .and_then(|(s, k)| k.open(s))
            .and_then(|v| serde_json::from_slice(&v).ok());
        match values {
            Some(v) if v.len() == self.secrets => {
                put_secrets(&mut servers, &v);
                Ok(servers)
            }
            _ => Err(RestoreError::SecretsLost),
        }
    }
}

/// The value strings of every `env` and `headers` of every server, in walk order, each
/// replaced by "".
fn strip_secrets(servers: &mut Value) -> Vec<String> {
    let mut out = Vec::new();
    walk_secrets(servers, &mut |v| out.push(std::mem::take(v)));
    out
}

fn put_secrets(servers: &mut Value, values: &[String]) {
    let mut it = values.iter();
    walk_secrets(servers, &mut |v| {
        if let Some(x) = it.next() {
            *v = x.clone();
        }
    });
}

/// Calls `f` on each secret value: `env`/`headers` given as `[{name, value}]` or as a map.
fn walk_secrets(servers: &mut Value, f: &mut dyn FnMut(&mut String)) {
    let Some(list) = servers.as_array_mut() else {
        return;
    };
    for server in list.iter_mut().filter_map(Value::as_object_mut) {
        for field in ["env", "headers"] {
            match server.get_mut(field) {
                Some(Value::Array(items)) => {
                    for item in items.iter_mut() {
                        if let Some(Value::String(v)) = item.get_mut("value") {
                            f(v);
                        }
                    }
                }
                Some(Value::Object(map)) => {
                    for v in map.values_mut() {
                        if let Value::String(v) = v {
                            f(v);
                        }
                    }
                }
                _ => {}
            }
        }
    }
}

pub struct RecoveredInstance {
    pub server_id: String,
    pub meta: AcpMeta,
    pub events: Vec<(u64, Bytes)>,
    pub next_id: u64,
    /// The last id on disk.
    pub last_id: u64,
    /// Ids that were issued but not written (the previous run stopped being durable): a reader
    /// crossing them gets a `gap`.
    pub lost: Option<(u64, u64)>,
}

/// Reads one serverId back; `None` when it is not one (the caller moves it aside).
pub fn recover(e: Entry) -> Option<RecoveredInstance> {
    crate::acp::validate_server_id(&e.name).ok()?;
    let meta = serde_json::from_value::<AcpMeta>(e.meta).ok()?;
    let floor = e.last_id.max(meta.id_floor);
    let next_id = floor + RESTART_ID_SKIP + 1;
    Some(RecoveredInstance {
        server_id: e.name,
        lost: e.incomplete.then_some((e.last_id + 1, next_id - 1)),
        next_id,
        last_id: e.last_id,
        meta,
        events: e.records,
    })
}

/// Which method a request the proxy watches is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Watched {
    Initialize,
    New,
    Load,
    Resume,
    Fork,
}

struct Pending {
    what: Watched,
    params: Value,
}

/// What the restore on the first POST after a restart achieved.
#[derive(Debug, Default)]
pub struct Restored {
    /// Session ids not restored, with why, and the missing capability if that is why.
    pub missing: HashMap<String, (String, Option<&'static str>)>,
}

/// One serverId's durable state, tied to its event log.
pub struct Tracked {
    d: Durable,
    server_id: String,
    meta: Mutex<AcpMeta>,
    /// A recovered log's skip (its first id minus one): recorded as the floor before the first
    /// id past it is written; 0 once recorded, or for a log that was not recovered.
    floor_due: AtomicU64,
    /// The last id on disk when this state was read back (0 for a new one).
    disk_last: u64,
    /// For carried state: the last id on disk of the state it was carried from.
    carried_last: AtomicU64,
    pending: Mutex<HashMap<IdKey, Pending>>,
    pending_count: AtomicUsize,
    /// `meta.promised.len()`: the appends look for those answers only while it is not 0.
    promised_count: AtomicUsize,
    /// For a recovered serverId: the promised requests a restart broke (for the restore's note).
    broken: Mutex<Vec<String>>,
    /// `break_promises` ran.
    answered: AtomicBool,
    /// Set while a restore runs: the agent's replay notifications are swallowed.
    muted: AtomicBool,
    /// For a recovered instance: the restore, run once by the first POST.
    restore: Option<tokio::sync::OnceCell<Restored>>,
    /// Imported from a session bundle (the restore's note says `import`).
    imported: AtomicBool,
}

impl Tracked {
    /// The one constructor. A new serverId (`recovered` is `None`) starts an entry afresh and
    /// writes its meta; a recovered one goes on with its files, its restore to run on the first
    /// POST, and its meta rewritten only if an older build left secrets in clear.
    pub fn new(
        store: &Arc<StateStore>,
        server_id: &str,
        meta: AcpMeta,
        recovered: Option<&RecoveredInstance>,
    ) -> Arc<Self> {
        let fresh = recovered.is_none();
        Self::build(store, server_id, meta, recovered, fresh, !fresh)
    }

    fn build(
        store: &Arc<StateStore>,
        server_id: &str,
        mut meta: AcpMeta,
        recovered: Option<&RecoveredInstance>,
        fresh: bool,
        restore: bool,
    ) -> Arc<Self> {
        let d = store.entry("acp", server_id, fresh);
        // Sessions recorded in clear by an older build are sealed now.
        let mut rewrite = fresh;
        for s in meta.sessions.iter_mut().filter(|s| s.secrets == 0) {
            let created = s.created_at_ms;
            let mut fresh = SessionRecord::new(
                std::mem::take(&mut s.session_id),
                std::mem::take(&mut s.cwd),
                std::mem::take(&mut s.mcp_servers),
                store.sealer(),
            );
            rewrite |= fresh.secrets > 0;
            fresh.created_at_ms = created;
            fresh.title = s.title.take();
            *s = fresh;
        }
        let broken = if recovered.is_some() {
            rewrite |= !meta.promised.is_empty();
            std::mem::take(&mut meta.promised)
        } else {
            Vec::new()
        };
        let promised = meta.promised.len();
        let t = Arc::new(Tracked {
            d,
            server_id: server_id.to_string(),
            promised_count: AtomicUsize::new(promised),
            broken: Mutex::new(broken),
            answered: AtomicBool::new(false),
            meta: Mutex::new(meta),
            floor_due: AtomicU64::new(recovered.map_or(0, |r| r.next_id - 1)),
            disk_last: recovered.map_or(0, |r| r.last_id),
            carried_last: AtomicU64::new(0),
            pending: Mutex::new(HashMap::new()),
            pending_count: AtomicUsize::new(0),
            muted: AtomicBool::new(false),
            restore: restore.then(tokio::sync::OnceCell::new),
            imported: AtomicBool::new(false),
        });
        if rewrite {
            t.write_meta();
        }
        t
    }

    /// A serverId imported from a session bundle: a new entry (its meta written now, its events
    /// by `append_imported`) whose sessions the first POST restores, as after a restart.
    pub fn imported(store: &Arc<StateStore>, server_id: &str, meta: AcpMeta) -> Arc<Self> {
        let t = Self::build(store, server_id, meta, None, true, true);
        t.imported.store(true, Ordering::Release);
        t
    }

    /// Writes one event of an imported log with its original id (never blocks).
    pub fn append_imported(&self, id: u64, line: Bytes) {
        self.d.append(id, line);
    }

    /// A copy of the meta (agent, `initialize`, sessions with their secrets blanked).
    pub fn meta(&self) -> AcpMeta {
        crate::sys::lock(&self.meta).clone()
    }

    /// The same serverId's state for its instance carried live across a reload: the sessions
    /// and the client's `initialize` it recorded, and no restore to run (the agent never went).
    /// Its files go on; what the carried log holds past them is written by `catch_up`.
    /// `restore`: an exited serverId still waiting for its restore after a restart keeps it.
    pub fn carried(&self, restore: bool) -> Arc<Self> {
        let meta = crate::sys::lock(&self.meta).clone();
        let t = Self::build(self.d.store(), &self.server_id, meta, None, false, restore);
        t.write_meta();
        t.carried_last.store(self.disk_last, Ordering::Release);
        t
    }

    /// The last id on disk that this state knows of (read back at start, or by the state it
    /// was carried from).
    pub fn disk_last(&self) -> u64 {
        self.disk_last
            .max(self.carried_last.load(Ordering::Acquire))
    }

    /// Writes what `log` holds past `from` (events the disk does not have: pushed after the
    /// previous image's last write, before its readers froze). Called on every adopt path.
    pub fn catch_up(&self, log: &super::events::EventLog, from: u64) {
        for (id, line) in log.lines_after(from) {
            self.d.append(id, line);
        }
    }

    fn write_meta(&self) {
        let meta = crate::sys::lock(&self.meta);
        let json = serde_json::to_vec(&*meta).unwrap_or_default();
        self.d.meta(json);
    }

    /// The serverId was deleted by a client: its state goes, and nothing more is written.
    pub fn forget(&self) {
        self.d.forget();
    }

    /// Waits until every event appended so far is written (see `Durable::written`).
    pub async fn written(&self) {
        self.d.written().await
    }

    /// The id of the last event appended.
    pub fn last_sent(&self) -> u64 {
        self.d.last_sent()
    }

    /// The agent gave `session_id` a title: kept in the meta (written only when it changed), so
    /// that it survives a restart and goes into a bundle.
    pub fn set_title(&self, session_id: &str, title: &str) {
        {
            let mut meta = crate::sys::lock(&self.meta);
            let Some(s) = meta
                .sessions
                .iter_mut()
                .find(|s| s.session_id == session_id)
            else {
                return;
            };
            let title = super::inventory::clip(title.to_string());
            if s.title.as_deref() == Some(title.as_str()) {
                return;
            }
            s.title = Some(title);
        }
        self.write_meta();
    }

    /// When the record of `session_id` was first made (the inventory shows the same time).
    pub fn session_created(&self, session_id: &str) -> Option<u64> {
        crate::sys::lock(&self.meta)
            .sessions
            .iter()
            .find(|s| s.session_id == session_id)
            .map(|s| s.created_at_ms)
            .filter(|&t| t > 0)
    }

    /// A recovered serverId whose restore has not run yet (not started since the restart).
    pub fn awaits_restore(&self) -> bool {
        self.restore.as_ref().is_some_and(|c| !c.initialized())
    }

    /// True once any event or session was recorded (state worth keeping after a failed start).
    pub fn has_history(&self) -> bool {
        self.disk_last > 0
            || self.d.last_sent() > 0
            || !crate::sys::lock(&self.meta).sessions.is_empty()
    }

    /// True for an event the log must not keep: an agent's replay of a session while it is
    /// being restored.
    pub fn swallows(&self, line: &[u8]) -> bool {
        self.muted.load(Ordering::Acquire)
            && find_bytes!(line, b"\"session/update\"").is_some()
            && serde_json::from_slice::<MethodOnly>(line)
                .is_ok_and(|m| m.method.as_deref() == Some("session/update") && m.id.is_none())
    }

    /// Copies one event to disk (never blocks), and notes the answer to a watched request that
    /// went to the log rather than to a waiting POST.
    pub fn append(&self, id: u64, line: &[u8]) {
        if (self.pending_count.load(Ordering::Acquire) > 0
            || self.promised_count.load(Ordering::Acquire) > 0)
            && let Ok(AgentLine::Response(key)) = classify_agent_line(line)
        {
            self.observe_response(&key, line);
            self.kept_promise(&key);
        }
        let due = self.floor_due.load(Ordering::Acquire);
        if due != 0 && id > due && self.floor_due.swap(0, Ordering::AcqRel) != 0 {
            // The first id past the restart's skip: the skip is recorded before it is written,
            // so the next restart skips on from there.
            crate::sys::lock(&self.meta).id_floor = due;
            self.write_meta();
        }
        self.d.append(id, Bytes::copy_from_slice(line));
    }

    /// The requests a reload answered 202 (carried as pending): kept in the meta until their
    /// answers are written, so that a crash before then is answered out loud after the restart.
    /// The proxy's own restore requests are not the client's and are left out.
    pub fn promise(&self, ids: &[String]) {
        let ids: Vec<String> = ids
            .iter()
            .filter(|k| !k.starts_with("\"_sandboxagent/"))
            .cloned()
            .collect();
        if ids.is_empty() {
            return;
        }
        {
            let mut meta = crate::sys::lock(&self.meta);
            meta.promised = ids;
            self.promised_count
                .store(meta.promised.len(), Ordering::Release);
        }
        self.write_meta();
    }

    fn kept_promise(&self, key: &IdKey) {
        if self.promised_count.load(Ordering::Acquire) == 0 {
            return;
        }
        let changed = {
            let mut meta = crate::sys::lock(&self.meta);
            let before = meta.promised.len();
            meta.promised.retain(|k| **k != *key.0);
            self.promised_count
                .store(meta.promised.len(), Ordering::Release);
            before != meta.promised.len()
        };
        if changed {
            self.write_meta();
        }
    }

    /// After a restart: answers every request a reload had promised an answer to (and the
    /// crash cut) with a JSON-RPC error on `log`'s stream. Called once, at recovery.
    pub fn break_promises(&self, log: &super::events::EventLog) {
        if self.answered.swap(true, Ordering::AcqRel) {
            return;
        }
        let broken = crate::sys::lock(&self.broken).clone();
        for k in &broken {
            let id: Value = serde_json::from_str(k).unwrap_or(Value::String(k.clone()));
            let line = json!({
                "jsonrpc": "2.0",
                "id": id,
                "error": {
                    "code": -32603,
                    "message": "the daemon restarted before the agent answered",
                    "data": {"reason": "daemon_restart"},
                },
            });
            log.push(&serde_json::to_vec(&line).unwrap_or_default());
        }
        if !broken.is_empty() {
            log.wake();
        }
    }

    /// Notes a client request whose answer the restore will need (`initialize`, `session/new`,
    /// `session/load`, `session/resume`, `session/fork`). Two substring scans for every other
    /// line; a full parse only for a line that may be one of these.
    pub fn observe_request(&self, env: &Envelope) {
        let Kind::Request { key, .. } = &env.kind else {
            return;
        };
        let line = &env.line[..];
        let maybe = find_bytes!(line, b"\"initialize\"").is_some()
            || memchr::memmem::find_iter(line, b"session/").any(|i| {
                let rest = &line[i + 8..];
                ["new\"", "load\"", "resume\"", "fork\""]
                    .iter()
                    .any(|m| rest.starts_with(m.as_bytes()))
            });
        if !maybe {
            return;
        }
        let Ok(msg) = serde_json::from_slice::<Full>(line) else {
            return;
        };
        let what = match msg.method.as_deref() {
            Some("initialize") => Watched::Initialize,
            Some("session/new") => Watched::New,
            Some("session/load") => Watched::Load,
            Some("session/resume") => Watched::Resume,
            Some("session/fork") => Watched::Fork,
            _ => return,
        };
        let mut p = crate::sys::lock(&self.pending);
        // Bounded: ids whose answer never comes are dropped beyond a few.
        if p.len() >= 64 {
            p.clear();
        }
        p.insert(
            key.clone(),
            Pending {
                what,
                params: msg.params.unwrap_or(Value::Null),
            },
        );
        self.pending_count.store(p.len(), Ordering::Release);
    }

    /// The answer to request `key` (a response line): records what it tells, when the request
    /// was one `observe_request` noted.
    pub fn observe_response(&self, key: &IdKey, line: &[u8]) {
        if self.pending_count.load(Ordering::Acquire) == 0 {
            return;
        }
        let pending = {
            let mut p = crate::sys::lock(&self.pending);
            let got = p.remove(key);
            self.pending_count.store(p.len(), Ordering::Release);
            got
        };
        let Some(pending) = pending else { return };
        let Ok(resp) = serde_json::from_slice::<Full>(line) else {
            return;
        };
        let Some(result) = resp.result else { return };
        {
            let mut meta = crate::sys::lock(&self.meta);
            match pending.what {
                Watched::Initialize => {
                    let caps = result.get("agentCapabilities");
                    meta.load_session = caps
                        .and_then(|c| c.get("loadSession"))
                        .and_then(Value::as_bool)
                        .unwrap_or(false);
                    meta.resume_session = caps
                        .and_then(|c| c.get("sessionCapabilities"))
                        .and_then(|c| c.get("resume"))
                        .is_some_and(|r| !r.is_null());
                    meta.list_sessions = caps
                        .and_then(|c| c.get("sessionCapabilities"))
                        .and_then(|c| c.get("list"))
                        .is_some_and(|r| !r.is_null());
                    meta.initialize = Some(pending.params);
                }
                Watched::New | Watched::Fork | Watched::Load | Watched::Resume => {
                    let id = match pending.what {
                        Watched::New | Watched::Fork => result.get("sessionId"),
                        _ => pending.params.get("sessionId"),
                    };
                    let Some(id) = id.and_then(Value::as_str) else {
                        return;
                    };
                    let mut rec = SessionRecord::new(
                        id.to_string(),
                        pending.params.get("cwd").cloned().unwrap_or(Value::Null),
                        pending
                            .params
                            .get("mcpServers")
                            .cloned()
                            .unwrap_or(Value::Array(Vec::new())),
                        self.d.store().sealer(),
                    );
                    if let Some(old) = meta
                        .sessions
                        .iter()
                        .find(|s| s.session_id == rec.session_id)
                    {
                        rec.created_at_ms = old.created_at_ms;
                        rec.title = old.title.clone();
                    }
                    meta.sessions.retain(|s| s.session_id != rec.session_id);
                    meta.sessions.push(rec);
                    if meta.sessions.len() > MAX_SESSIONS {
                        meta.sessions.remove(0);
                    }
                }
            }
        }
        self.write_meta();
    }

    /// For a recovered instance: restores its sessions once (the first caller runs it, the
    /// others wait for it), then refuses a request naming a session that could not be restored.
    /// Nothing for an instance that was not recovered.
    pub async fn before_post(
        &self,
        inst: &AcpInstance,
        env: Option<&Envelope>,
        timeout: Duration,
    ) -> Result<(), AcpError> {
        let Some(cell) = &self.restore else {
            return Ok(());
        };
        let restored = cell.get_or_init(|| self.restore(inst, timeout)).await;
        if restored.missing.is_empty() {
            return Ok(());
        }
        let Some(env) = env else { return Ok(()) };
        let named = restored
            .missing
            .keys()
            .any(|s| memchr::memmem::find(&env.line, s.as_bytes()).is_some());
        if !named {
            return Ok(());
        }
        let Ok(msg) = serde_json::from_slice::<Full>(&env.line) else {
            return Ok(());
        };
        let sid = msg
            .params
            .as_ref()
            .and_then(|p| p.get("sessionId"))
            .and_then(Value::as_str);
        match sid.and_then(|s| restored.missing.get_key_value(s)) {
            // A client that loads the session itself may try.
            Some(_)
                if matches!(
                    msg.method.as_deref(),
                    Some("session/load" | "session/resume")
                ) =>
            {
                Ok(())
            }
            Some((sid, (reason, cap))) => Err(AcpError::SessionNotRestored {
                server_id: inst.server_id.clone(),
                session_id: sid.clone(),
                reason: reason.clone(),
                missing_capability: *cap,
            }),
            None => Ok(()),
        }
    }

    async fn restore(&self, inst: &AcpInstance, timeout: Duration) -> Restored {
        let meta = crate::sys::lock(&self.meta).clone();
        let mut out = Restored::default();
        let Some(init) = meta.initialize.clone() else {
            return out;
        };
        let step = timeout.min(STEP_TIMEOUT);
        self.muted.store(true, Ordering::Release);
        let mut restored = Vec::new();
        let mut failed = Vec::new();
        let mut missing_cap = None;
        match call(inst, "_sandboxagent/restore-init", "initialize", init, step).await {
            Ok(result) => {
                let caps = result.get("agentCapabilities");
                let load = caps
                    .and_then(|c| c.get("loadSession"))
                    .and_then(Value::as_bool)
                    .unwrap_or(false);
                let resume = caps
                    .and_then(|c| c.get("sessionCapabilities"))
                    .and_then(|c| c.get("resume"))
                    .is_some_and(|r| !r.is_null());
                // Resume where the agent advertises it: it reattaches without replaying the
                // conversation, which the event log already holds.
                let how = if resume {
                    Some("session/resume")
                } else if load {
                    Some("session/load")
                } else {
                    None
                };
                for (i, s) in meta.sessions.iter().enumerate() {
                    let Some(how) = how else {
                        missing_cap = Some("loadSession");
                        let why = "the agent does not advertise the loadSession capability (nor session resume)".to_string();
                        failed.push(json!({"sessionId": s.session_id, "reason": why}));
                        out.missing
                            .insert(s.session_id.clone(), (why, Some("loadSession")));
                        continue;
                    };
                    let servers = match s.servers(self.d.store().sealer()) {
                        Ok(v) => v,
                        Err(why) => {
                            let why = why.to_string();
                            failed.push(json!({"sessionId": s.session_id, "reason": why}));
                            out.missing.insert(s.session_id.clone(), (why, None));
                            continue;
                        }
                    };
                    let params = json!({
                        "sessionId": s.session_id,
                        "cwd": s.cwd,
                        "mcpServers": servers,
                    });
                    let id = format!("_sandboxagent/restore-{i}");
                    match call(inst, &id, how, params, step).await {
                        Ok(_) => restored.push(json!({"sessionId": s.session_id, "how": how})),
                        Err(why) => {
                            let why = why.to_string();
                            failed.push(json!({"sessionId": s.session_id, "reason": why}));
                            out.missing.insert(s.session_id.clone(), (why, None));
                        }
                    }
                }
            }
            Err(why) => {
                let why = format!("the restarted agent did not initialize: {why}");
                for s in &meta.sessions {
                    failed.push(json!({"sessionId": s.session_id, "reason": why}));
                    out.missing
                        .insert(s.session_id.clone(), (why.clone(), None));
                }
            }
        }
        self.muted.store(false, Ordering::Release);
        let note = json!({
            "jsonrpc": "2.0",
            "method": "_sandboxagent/restored",
            "params": {
                "reason": if self.imported.load(Ordering::Acquire) { "import" } else { "daemon_restart" },
                "sessions": restored,
                "failed": failed,
                "missingCapability": missing_cap,
                "unanswered": crate::sys::lock(&self.broken)
                    .iter()
                    .map(|k| serde_json::from_str::<Value>(k).unwrap_or(Value::String(k.clone())))
                    .collect::<Vec<_>>(),
            },
        });
        inst.events
            .push(&serde_json::to_vec(&note).unwrap_or_default());
        inst.events.wake();
        tracing::info!(server_id = %inst.server_id, agent = %inst.agent,
            restored = restored.len(), failed = failed.len(),
            "sessions restored after a daemon restart");
        out
    }
}

/// Why a session could not be restored in a restarted agent (the text is the `reason` of
/// `_sandboxagent/restored`'s `failed` entries).
#[derive(Debug, thiserror::Error)]
enum RestoreError {
    #[error(
        "its MCP servers' credentials (env and header values) were not kept: the key in the data dir is missing or another one"
    )]
    SecretsLost,
    #[error("{0}")]
    Envelope(#[from] crate::acp::jsonrpc::EnvelopeError),
    #[error("not a request")]
    NotARequest,
    #[error("{0}")]
    Answer(#[from] serde_json::Error),
    #[error("{method} failed: {error}")]
    Failed { method: String, error: Value },
    #[error("{0}")]
    Deliver(#[from] AcpError),
}

/// Sends one request of our own to the agent and waits for its result (or says why not).
async fn call(
    inst: &AcpInstance,
    id: &str,
    method: &str,
    params: Value,
    timeout: Duration,
) -> Result<Value, RestoreError> {
    let line = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
    let env = parse_envelope(Bytes::from(serde_json::to_vec(&line).unwrap_or_default()))?;
    let Kind::Request { key, .. } = env.kind else {
        return Err(RestoreError::NotARequest);
    };
    match inst.deliver(env.line, Some(&key), true, timeout).await? {
        Delivered::Response { line, .. } => {
            let resp: Full = serde_json::from_slice(&line)?;
            match (resp.result, resp.error) {
                (Some(r), _) => Ok(r),
                (None, Some(error)) => Err(RestoreError::Failed {
                    method: method.to_string(),
                    error,
                }),
                (None, None) => Ok(Value::Null),
            }
        }
        Delivered::Accepted => Ok(Value::Null),
    }
}

#[derive(Deserialize)]
struct MethodOnly {
    #[serde(default)]
    method: Option<String>,
    #[serde(default)]
    id: Option<serde::de::IgnoredAny>,
}

#[derive(Deserialize)]
struct Full {
    #[serde(default)]
    method: Option<String>,
    #[serde(default)]
    params: Option<Value>,
    #[serde(default)]
    result: Option<Value>,
    #[serde(default)]
    error: Option<Value>,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A `session/new` whose answer arrives after the DELETE forgot the serverId writes nothing:
    /// the serverId does not come back after a restart.
    #[test]
    fn an_answer_after_forget_writes_no_meta() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("state");
        let mut c = crate::config::Config::defaults();
        c.data_dir = tmp.path().join("data");
        std::fs::create_dir_all(&c.data_dir).unwrap();
        let (store, _) = StateStore::open(&c, &dir).unwrap();
        let t = Tracked::new(&store, "late", AcpMeta::default(), None);
        let req = parse_envelope(Bytes::from_static(
            br#"{"jsonrpc":"2.0","id":1,"method":"session/new","params":{"cwd":"/","mcpServers":[]}}"#,
        ))
        .unwrap();
        t.observe_request(&req);
        assert!(store.flush_blocking(Duration::from_secs(10)));
        assert!(dir.join("acp/late/meta.json").exists());
        t.forget();
        let Kind::Request { key, .. } = &req.kind else {
            unreachable!()
        };
        t.observe_response(
            key,
            br#"{"jsonrpc":"2.0","id":1,"result":{"sessionId":"s-1"}}"#,
        );
        t.append(1, br#"{"jsonrpc":"2.0","method":"x"}"#);
        assert!(store.flush_blocking(Duration::from_secs(10)));
        assert!(!dir.join("acp/late").exists());
    }
}
