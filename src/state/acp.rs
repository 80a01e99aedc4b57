//! The proxy's durable state: per serverId its meta (agent, creation time, the client's
//! `initialize` params, the agent's session capabilities, the sessions it answered) and its event
//! log; recovery at start; and the restore of the sessions on the first POST after a restart.
//!
//! The restore: the agent is started again (the same agent id, so the same program, environment,
//! working directory and limits as any start of it), sent the client's original `initialize`,
//! then for every recorded session `session/load` (or `session/resume` where the agent advertises
//! only that). The `session/update` notifications an agent sends while it loads (its replay of
//! the conversation) are swallowed: the event log already holds the originals. One
//! `_sandboxagent/restored` notification then names the sessions restored, and how, and those
//! that were not, and why. Each step is bounded by the request timeout (at most a minute).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use super::StateStore;
use crate::acp::jsonrpc::{AgentLine, Envelope, IdKey, Kind, classify_agent_line, parse_envelope};
use crate::acp::{AcpError, AcpInstance, Delivered};

/// Most sessions remembered per serverId (the oldest are forgotten first).
pub const MAX_SESSIONS: usize = 256;

/// Longest a restore step (the `initialize`, each `session/load`) may take.
const STEP_TIMEOUT: Duration = Duration::from_secs(60);

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AcpMeta {
    pub agent: String,
    pub created_at_ms: u64,
    /// Ids up to here may have been issued: the next start continues beyond.
    #[serde(default)]
    pub id_floor: u64,
    /// The client's `initialize` params, replayed to the restarted agent.
    #[serde(default)]
    pub initialize: Option<Value>,
    #[serde(default)]
    pub load_session: bool,
    #[serde(default)]
    pub resume_session: bool,
    #[serde(default)]
    pub sessions: Vec<SessionRecord>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SessionRecord {
    pub session_id: String,
    #[serde(default)]
    pub cwd: Value,
    #[serde(default)]
    pub mcp_servers: Value,
}

pub struct RecoveredInstance {
    pub server_id: String,
    pub meta: AcpMeta,
    pub events: Vec<(u64, Bytes)>,
    pub next_id: u64,
}

pub(super) fn recover(
    name: &str,
    meta: &Value,
    events: Vec<(u64, Bytes)>,
    out: &mut Vec<RecoveredInstance>,
) -> bool {
    if crate::acp::validate_server_id(name).is_err() {
        return false;
    }
    let Ok(meta) = serde_json::from_value::<AcpMeta>(meta.clone()) else {
        return false;
    };
    let last = events.last().map_or(0, |e| e.0).max(meta.id_floor);
    out.push(RecoveredInstance {
        server_id: name.to_string(),
        next_id: last + super::RESTART_ID_SKIP + 1,
        meta,
        events,
    });
    true
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
    store: Arc<StateStore>,
    key: Arc<str>,
    /// Memory-only from now on (its queue overflowed, or the store is off).
    off: AtomicBool,
    meta: Mutex<AcpMeta>,
    pending: Mutex<HashMap<IdKey, Pending>>,
    pending_count: AtomicUsize,
    /// Set while a restore runs: the agent's replay notifications are swallowed.
    muted: AtomicBool,
    /// For a recovered instance: the restore, run once by the first POST.
    restore: Option<tokio::sync::OnceCell<Restored>>,
}

impl Tracked {
    pub fn new(
        store: Arc<StateStore>,
        server_id: &str,
        meta: AcpMeta,
        recovered: bool,
    ) -> Arc<Self> {
        let t = Arc::new(Tracked {
            store,
            key: format!("acp/{server_id}").into(),
            off: AtomicBool::new(false),
            meta: Mutex::new(meta),
            pending: Mutex::new(HashMap::new()),
            pending_count: AtomicUsize::new(0),
            muted: AtomicBool::new(false),
            restore: recovered.then(tokio::sync::OnceCell::new),
        });
        t.write_meta();
        t
    }

    /// The same serverId's state for its instance carried live across a reload: the sessions
    /// and the client's `initialize` it recorded, and no restore to run (the agent never went).
    pub fn carried(&self) -> Arc<Self> {
        let meta = crate::sys::lock(&self.meta).clone();
        let server_id = self.key.strip_prefix("acp/").unwrap_or(&self.key);
        Tracked::new(self.store.clone(), server_id, meta, false)
    }

    fn write_meta(&self) {
        let json = serde_json::to_vec(&*crate::sys::lock(&self.meta)).unwrap_or_default();
        self.store.meta(&self.key, json);
    }

    /// The instance left the registry for good (DELETE, a failed start): its state goes.
    pub fn forget(&self) {
        self.off.store(true, Ordering::Release);
        self.store.remove(&self.key);
    }

    /// True for an event the log must not keep: an agent's replay of a session while it is
    /// being restored.
    pub fn swallows(&self, line: &[u8]) -> bool {
        self.muted.load(Ordering::Acquire)
            && memchr::memmem::find(line, b"\"session/update\"").is_some()
            && serde_json::from_slice::<MethodOnly>(line)
                .is_ok_and(|m| m.method.as_deref() == Some("session/update") && m.id.is_none())
    }

    /// Copies one event to disk (never blocks), and notes the answer to a watched request that
    /// went to the log rather than to a waiting POST.
    pub fn append(&self, id: u64, line: &[u8]) {
        if self.pending_count.load(Ordering::Acquire) > 0
            && let Ok(AgentLine::Response(key)) = classify_agent_line(line)
        {
            self.observe_response(&key, line);
        }
        if self.off.load(Ordering::Acquire) {
            return;
        }
        if !self
            .store
            .append(&self.key, id, Bytes::copy_from_slice(line))
        {
            self.off.store(true, Ordering::Release);
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
        let maybe = memchr::memmem::find(line, b"\"initialize\"").is_some()
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
                    let rec = SessionRecord {
                        session_id: id.to_string(),
                        cwd: pending.params.get("cwd").cloned().unwrap_or(Value::Null),
                        mcp_servers: pending
                            .params
                            .get("mcpServers")
                            .cloned()
                            .unwrap_or(Value::Array(Vec::new())),
                    };
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
                let how = if load {
                    Some("session/load")
                } else if resume {
                    Some("session/resume")
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
                    let params = json!({
                        "sessionId": s.session_id,
                        "cwd": s.cwd,
                        "mcpServers": s.mcp_servers,
                    });
                    let id = format!("_sandboxagent/restore-{i}");
                    match call(inst, &id, how, params, step).await {
                        Ok(_) => restored.push(json!({"sessionId": s.session_id, "how": how})),
                        Err(why) => {
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
                "reason": "daemon_restart",
                "sessions": restored,
                "failed": failed,
                "missingCapability": missing_cap,
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

/// Sends one request of our own to the agent and waits for its result (or says why not).
async fn call(
    inst: &AcpInstance,
    id: &str,
    method: &str,
    params: Value,
    timeout: Duration,
) -> Result<Value, String> {
    let line = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
    let env = parse_envelope(Bytes::from(serde_json::to_vec(&line).unwrap_or_default()))
        .map_err(|e| e.to_string())?;
    let Kind::Request { key, .. } = env.kind else {
        return Err("not a request".to_string());
    };
    match inst.deliver(env.line, Some(key), true, timeout).await {
        Ok(Delivered::Response { line, .. }) => {
            let resp: Full = serde_json::from_slice(&line).map_err(|e| e.to_string())?;
            match (resp.result, resp.error) {
                (Some(r), _) => Ok(r),
                (None, Some(e)) => Err(format!("{method} failed: {e}")),
                (None, None) => Ok(Value::Null),
            }
        }
        Ok(Delivered::Accepted) => Ok(Value::Null),
        Err(e) => Err(e.to_string()),
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
