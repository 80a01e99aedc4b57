//! The session inventory behind `GET /v1/sessions` and the daemon's own answer to `session/list`:
//! every ACP session the daemon has seen an agent create, load, resume or fork, across all
//! serverIds, with its agent, `cwd`, the title the agent gave it (`session_info_update`), and its
//! creation and last-activity times. Fed by the proxy as messages pass (a substring scan per
//! line, a parse only for a candidate), never by reading `/proc` or the disk on a request.
//! **Invariant:** bounded by [`MAX_SESSIONS`] entries (the least recently active are forgotten
//! first) and an agent-given title by [`MAX_TITLE`] bytes.

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;

use serde_json::Value;

/// Most sessions the inventory holds, every serverId together.
pub const MAX_SESSIONS: usize = 4096;
/// Longest title kept (bytes; cut at a character boundary).
pub const MAX_TITLE: usize = 512;

/// One session as the inventory knows it.
#[derive(Debug, Clone, PartialEq)]
pub struct SessionEntry {
    pub server_id: String,
    pub session_id: String,
    pub agent: String,
    pub cwd: Option<String>,
    pub title: Option<String>,
    pub created_at_ms: u64,
    pub last_activity_ms: u64,
    /// Answered `session/close` (the agent let it go; it may be loaded again).
    pub closed: bool,
}

/// What an agent advertised in its `initialize` answer that the daemon acts on.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct SessionCaps {
    pub list: bool,
    pub resume: bool,
    pub load: bool,
}

type Key = (String, String);

#[derive(Default)]
struct Inner {
    sessions: BTreeMap<Key, SessionEntry>,
    caps: HashMap<String, SessionCaps>,
}

#[derive(Default)]
pub struct Inventory {
    inner: Mutex<Inner>,
}

pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// Milliseconds since the epoch as RFC 3339 (UTC, milliseconds).
pub fn rfc3339(ms: u64) -> String {
    let t = std::time::UNIX_EPOCH + std::time::Duration::from_millis(ms);
    humantime::format_rfc3339_millis(t).to_string()
}

/// A client request the inventory follows: what it is and the params it needs from it.
#[derive(Debug, Clone)]
pub enum Watched {
    /// `session/new` or `session/fork`: the session id comes in the answer.
    Create {
        cwd: Option<String>,
    },
    /// `session/load` or `session/resume`: the session named in the params.
    Open {
        session_id: String,
        cwd: Option<String>,
    },
    Close {
        session_id: String,
    },
    Delete {
        session_id: String,
    },
    Prompt {
        session_id: String,
    },
    Initialize,
}

/// Whether a client request is one the inventory follows. Substring scans first; a parse only
/// for a candidate.
pub fn watch(line: &[u8]) -> Option<Watched> {
    let initialize = find_bytes!(line, b"\"initialize\"").is_some();
    if !initialize && find_bytes!(line, b"\"session/").is_none() {
        return None;
    }
    #[derive(serde::Deserialize)]
    struct Params {
        cwd: Option<String>,
        #[serde(rename = "sessionId")]
        session_id: Option<String>,
    }
    #[derive(serde::Deserialize)]
    struct Msg {
        method: String,
        params: Option<Params>,
    }
    let m: Msg = serde_json::from_slice(line).ok()?;
    let (cwd, sid) = match m.params {
        Some(p) => (p.cwd, p.session_id),
        None => (None, None),
    };
    Some(match (m.method.as_str(), sid) {
        ("initialize", _) => Watched::Initialize,
        ("session/new" | "session/fork", _) => Watched::Create { cwd },
        ("session/load" | "session/resume", Some(session_id)) => Watched::Open { session_id, cwd },
        ("session/close", Some(session_id)) => Watched::Close { session_id },
        ("session/delete", Some(session_id)) => Watched::Delete { session_id },
        ("session/prompt", Some(session_id)) => Watched::Prompt { session_id },
        _ => return None,
    })
}

/// The title a `session_info_update` gives, if the update is one and gives one.
pub fn title_of(update: &Value) -> Option<&str> {
    match update.get("sessionUpdate").and_then(Value::as_str) {
        Some("session_info_update") => update.get("title").and_then(Value::as_str),
        _ => None,
    }
}

fn result_of(response: &[u8]) -> Option<Value> {
    #[derive(serde::Deserialize)]
    struct M {
        result: Option<Value>,
    }
    serde_json::from_slice::<M>(response).ok()?.result
}

pub fn clip(mut s: String) -> String {
    if s.len() > MAX_TITLE {
        let mut cut = MAX_TITLE;
        while !s.is_char_boundary(cut) {
            cut -= 1;
        }
        s.truncate(cut);
    }
    s
}

impl Inventory {
    fn inner(&self) -> std::sync::MutexGuard<'_, Inner> {
        crate::sys::lock(&self.inner)
    }

    /// Records (or refreshes) one session.
    pub fn record(&self, entry: SessionEntry) {
        let mut inner = self.inner();
        let key = (entry.server_id.clone(), entry.session_id.clone());
        match inner.sessions.get_mut(&key) {
            Some(old) => {
                old.agent = entry.agent;
                if entry.cwd.is_some() {
                    old.cwd = entry.cwd;
                }
                if entry.title.is_some() {
                    old.title = entry.title;
                }
                old.created_at_ms = old.created_at_ms.min(entry.created_at_ms);
                old.last_activity_ms = old.last_activity_ms.max(entry.last_activity_ms);
                old.closed = entry.closed;
            }
            None => {
                inner.sessions.insert(key, entry);
                if inner.sessions.len() > MAX_SESSIONS {
                    // Rare (only past the cap): one scan for the least recently active.
                    let oldest = inner
                        .sessions
                        .iter()
                        .min_by_key(|(_, e)| e.last_activity_ms)
                        .map(|(k, _)| k.clone());
                    if let Some(k) = oldest {
                        inner.sessions.remove(&k);
                    }
                }
            }
        }
    }

    /// A client request `watched` to `server_id` was answered with `response`: records what
    /// it tells (only a successful answer counts). `created`: when the durable state first
    /// recorded a session, if it did (so that both agree across a restart).
    pub fn on_answer(
        &self,
        server_id: &str,
        agent: &str,
        watched: Watched,
        response: &[u8],
        created: impl Fn(&str) -> Option<u64>,
    ) {
        let Some(result) = result_of(response) else {
            return;
        };
        let now = now_ms();
        let entry = |session_id: String, cwd: Option<String>| SessionEntry {
            created_at_ms: created(&session_id).unwrap_or(now),
            server_id: server_id.to_string(),
            session_id,
            agent: agent.to_string(),
            cwd,
            title: None,
            last_activity_ms: now,
            closed: false,
        };
        match watched {
            Watched::Initialize => {
                let caps = result.get("agentCapabilities");
                let sc = caps.and_then(|c| c.get("sessionCapabilities"));
                let has = |name: &str| sc.and_then(|s| s.get(name)).is_some_and(|v| !v.is_null());
                let c = SessionCaps {
                    list: has("list"),
                    resume: has("resume"),
                    load: caps
                        .and_then(|c| c.get("loadSession"))
                        .and_then(Value::as_bool)
                        .unwrap_or(false),
                };
                self.inner().caps.insert(server_id.to_string(), c);
            }
            Watched::Create { cwd } => {
                if let Some(id) = result.get("sessionId").and_then(Value::as_str) {
                    self.record(entry(id.to_string(), cwd));
                }
            }
            Watched::Open { session_id, cwd } => self.record(entry(session_id, cwd)),
            Watched::Close { session_id } => {
                if let Some(e) = self
                    .inner()
                    .sessions
                    .get_mut(&(server_id.to_string(), session_id))
                {
                    e.closed = true;
                    e.last_activity_ms = now;
                }
            }
            Watched::Delete { session_id } => {
                self.inner()
                    .sessions
                    .remove(&(server_id.to_string(), session_id));
            }
            Watched::Prompt { session_id } => self.touch(server_id, &session_id, None),
        }
    }

    /// Activity on a session (a prompt, an update), with the title the agent gave it, if any.
    pub fn touch(&self, server_id: &str, session_id: &str, title: Option<String>) {
        let mut inner = self.inner();
        if let Some(e) = inner
            .sessions
            .get_mut(&(server_id.to_string(), session_id.to_string()))
        {
            e.last_activity_ms = now_ms();
            if let Some(t) = title {
                e.title = Some(clip(t));
            }
        }
    }

    /// An agent's notification or request: a `session_info_update` sets the title, any
    /// `session/update` is activity. One substring scan for every line; a parse only for an
    /// update (the update object itself only when it is one of those two kinds, which is then
    /// returned with its session id).
    pub fn on_agent_message(&self, server_id: &str, line: &[u8]) -> Option<(String, Value)> {
        find_bytes!(line, b"\"session/update\"")?;
        #[derive(serde::Deserialize)]
        struct Params<'a> {
            #[serde(rename = "sessionId")]
            session_id: std::borrow::Cow<'a, str>,
            #[serde(borrow)]
            update: &'a serde_json::value::RawValue,
        }
        #[derive(serde::Deserialize)]
        struct Msg<'a> {
            method: std::borrow::Cow<'a, str>,
            #[serde(borrow)]
            params: Params<'a>,
        }
        let m: Msg = serde_json::from_slice(line).ok()?;
        if m.method != "session/update" {
            return None;
        }
        // Only the two kinds the daemon reads are parsed whole; a chunk is only activity.
        let raw = m.params.update.get().as_bytes();
        let wanted = find_bytes!(raw, b"session_info_update").is_some()
            || find_bytes!(raw, b"usage_update").is_some();
        if !wanted {
            self.touch(server_id, &m.params.session_id, None);
            return None;
        }
        let update: Value = serde_json::from_slice(raw).ok()?;
        let title = title_of(&update).map(str::to_string);
        self.touch(server_id, &m.params.session_id, title);
        Some((m.params.session_id.into_owned(), update))
    }

    /// What `server_id`'s agent advertised, as recorded in its durable state (after a restart
    /// or an import, before any client's `initialize` reaches the new agent).
    pub fn set_caps(&self, server_id: &str, caps: SessionCaps) {
        self.inner().caps.insert(server_id.to_string(), caps);
    }

    /// What `server_id`'s agent advertised, once its `initialize` was answered.
    pub fn caps(&self, server_id: &str) -> Option<SessionCaps> {
        self.inner().caps.get(server_id).copied()
    }

    /// A serverId DELETEd: its sessions are forgotten.
    pub fn forget_server(&self, server_id: &str) {
        let mut inner = self.inner();
        inner.caps.remove(server_id);
        let keys: Vec<Key> = inner
            .sessions
            .range((server_id.to_string(), String::new())..)
            .take_while(|(k, _)| k.0 == server_id)
            .map(|(k, _)| k.clone())
            .collect();
        for k in keys {
            inner.sessions.remove(&k);
        }
    }

    /// Up to `limit` sessions after `after` (serverId, sessionId), in that order, and whether
    /// more follow. `server` narrows to one serverId.
    pub fn page(
        &self,
        after: Option<&(String, String)>,
        limit: usize,
        server: Option<&str>,
    ) -> (Vec<SessionEntry>, bool) {
        use std::ops::Bound;
        let inner = self.inner();
        let start = match (after, server) {
            (Some(k), _) => Bound::Excluded(k.clone()),
            (None, Some(s)) => Bound::Included((s.to_string(), String::new())),
            (None, None) => Bound::Unbounded,
        };
        let mut it = inner
            .sessions
            .range((start, Bound::Unbounded))
            .take_while(|(k, _)| server.is_none_or(|s| k.0 == s))
            .map(|(_, e)| e);
        let page: Vec<SessionEntry> = it.by_ref().take(limit).cloned().collect();
        let more = it.next().is_some();
        (page, more)
    }

    pub fn len(&self) -> usize {
        self.inner().sessions.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The opaque paging cursor: the last (serverId, sessionId) of a page, hex-encoded.
pub fn encode_cursor(server_id: &str, session_id: &str) -> String {
    let mut s = String::with_capacity(2 * (server_id.len() + session_id.len() + 1));
    for b in server_id
        .bytes()
        .chain(std::iter::once(0))
        .chain(session_id.bytes())
    {
        s.push_str(&format!("{b:02x}"));
    }
    s
}

/// A cursor back into (serverId, sessionId), or `None` when it is not one this daemon made.
pub fn decode_cursor(cursor: &str) -> Option<(String, String)> {
    if !cursor.len().is_multiple_of(2) || cursor.len() > 4096 {
        return None;
    }
    let bytes: Vec<u8> = (0..cursor.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(cursor.get(i..i + 2)?, 16).ok())
        .collect::<Option<_>>()?;
    let nul = bytes.iter().position(|&b| b == 0)?;
    let server = String::from_utf8(bytes[..nul].to_vec()).ok()?;
    let session = String::from_utf8(bytes[nul + 1..].to_vec()).ok()?;
    Some((server, session))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cursor_round_trips_and_refuses_foreign_text() {
        let c = encode_cursor("s1", "mock-1");
        assert_eq!(decode_cursor(&c), Some(("s1".into(), "mock-1".into())));
        assert_eq!(decode_cursor("zz"), None);
        assert_eq!(decode_cursor("abc"), None);
        assert_eq!(decode_cursor("6162"), None); // no separator
    }

    #[test]
    fn the_cap_forgets_the_least_recently_active() {
        let inv = Inventory::default();
        for i in 0..=MAX_SESSIONS as u64 {
            inv.record(SessionEntry {
                server_id: "s".into(),
                session_id: format!("{i:05}"),
                agent: "mock".into(),
                cwd: None,
                title: None,
                created_at_ms: i,
                last_activity_ms: if i == 0 { u64::MAX } else { i },
                closed: false,
            });
        }
        assert_eq!(inv.len(), MAX_SESSIONS);
        let (page, _) = inv.page(None, 2, None);
        // 00000 was the most recently active; 00001 the least and is gone.
        assert_eq!(page[0].session_id, "00000");
        assert_eq!(page[1].session_id, "00002");
    }
}
