//! `gitBase`: the HEAD of the repository a session's `cwd` was in when the session was created
//! or loaded, so that "what did this session change" is a diff against it even after the agent
//! committed. Kept per serverId in memory, bounded ([`MAX_SESSIONS`] per instance,
//! [`MAX_SERVERS`] instances); an instance no longer listed is forgotten.

use std::collections::HashMap;
use std::sync::Mutex;

pub const MAX_SESSIONS: usize = 256;
pub const MAX_SERVERS: usize = 4096;

#[derive(Debug, Clone)]
pub struct SessionBase {
    pub session_id: String,
    pub cwd: String,
    pub git_base: String,
}

#[derive(Default)]
pub struct SessionBases {
    by_server: Mutex<HashMap<String, Vec<SessionBase>>>,
}

/// What a POSTed envelope says of a session, when it is a `session/new` or `session/load`
/// request: its `cwd`, and for a load the session id.
pub struct Watched {
    pub cwd: String,
    pub session_id: Option<String>,
}

/// Two substring scans for every request; a parse only for a candidate.
pub fn watch(line: &[u8]) -> Option<Watched> {
    let candidate = find_bytes!(line, b"\"session/new\"").is_some()
        || find_bytes!(line, b"\"session/load\"").is_some();
    if !candidate {
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
    if m.method != "session/new" && m.method != "session/load" {
        return None;
    }
    let p = m.params?;
    Some(Watched {
        cwd: p.cwd?,
        session_id: if m.method == "session/load" {
            p.session_id
        } else {
            None
        },
    })
}

/// The `sessionId` of a `session/new` answer.
pub fn new_session_id(response: &[u8]) -> Option<String> {
    #[derive(serde::Deserialize)]
    struct R {
        #[serde(rename = "sessionId")]
        session_id: String,
    }
    #[derive(serde::Deserialize)]
    struct M {
        result: R,
    }
    serde_json::from_slice::<M>(response)
        .ok()
        .map(|m| m.result.session_id)
}

/// The session a `session/new` or `session/load` request `w` opened, from the agent's answer
/// `line` (a load that failed answers an error, not a result).
pub fn answered_session(w: Watched, line: &[u8]) -> Option<(String, String)> {
    let id = match w.session_id {
        Some(id) => find_bytes!(line, b"\"result\"").map(|_| id),
        None => new_session_id(line),
    };
    id.map(|id| (id, w.cwd))
}

/// For the transports that do not wait for an answer (WebSocket, RFD; a POST with
/// `Prefer: respond-async` uses [`record_on_answer`]): when `line` (request
/// `key` to `server_id`) is a `session/new` or `session/load` whose cwd is in a repository, its
/// HEAD is taken now, before the agent can change anything, and recorded as the session's
/// `gitBase` when the agent answers.
pub async fn watch_answer(
    workspace: &std::sync::Arc<super::Workspace>,
    acp: &crate::acp::AcpService,
    server_id: &str,
    key: &crate::acp::jsonrpc::IdKey,
    line: &[u8],
) {
    let Some(w) = watch(line) else { return };
    let Some(head) = workspace.git.head_of(&w.cwd).await else {
        return;
    };
    record_on_answer(workspace, acp, server_id, key, w, head);
}

/// Records `head` as the `gitBase` of the session request `key` (watched as `w`) opens, when
/// the agent answers it, whoever receives the answer. False when no observer could be
/// registered (no such instance, or it holds its most observers).
pub fn record_on_answer(
    workspace: &std::sync::Arc<super::Workspace>,
    acp: &crate::acp::AcpService,
    server_id: &str,
    key: &crate::acp::jsonrpc::IdKey,
    w: Watched,
    head: String,
) -> bool {
    let weak = std::sync::Arc::downgrade(workspace);
    let server = server_id.to_string();
    acp.on_answer_to(
        server_id,
        key.clone(),
        Box::new(move |answer| {
            if let (Some(ws), Some((session_id, cwd))) =
                (weak.upgrade(), answered_session(w, answer))
            {
                ws.sessions.record(
                    &server,
                    SessionBase {
                        session_id,
                        cwd,
                        git_base: head,
                    },
                );
            }
        }),
    )
}

impl SessionBases {
    pub fn record(&self, server_id: &str, base: SessionBase) {
        let mut m = crate::sys::lock(&self.by_server);
        if !m.contains_key(server_id) && m.len() >= MAX_SERVERS {
            return;
        }
        let list = m.entry(server_id.to_string()).or_default();
        list.retain(|s| s.session_id != base.session_id);
        if list.len() >= MAX_SESSIONS {
            list.remove(0);
        }
        list.push(base);
    }

    /// The sessions of each listed server; servers not listed are forgotten.
    pub fn of_listed<'a>(
        &self,
        listed: impl Iterator<Item = &'a str>,
    ) -> HashMap<String, Vec<SessionBase>> {
        let mut m = crate::sys::lock(&self.by_server);
        let listed: std::collections::HashSet<&str> = listed.collect();
        m.retain(|k, _| listed.contains(k.as_str()));
        m.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_session_requests_with_a_cwd_are_watched() {
        let w = watch(br#"{"jsonrpc":"2.0","id":1,"method":"session/new","params":{"cwd":"/w","mcpServers":[]}}"#).unwrap();
        assert_eq!((w.cwd.as_str(), w.session_id), ("/w", None));
        let w = watch(br#"{"jsonrpc":"2.0","id":1,"method":"session/load","params":{"cwd":"/w","sessionId":"s1"}}"#).unwrap();
        assert_eq!(w.session_id.as_deref(), Some("s1"));
        assert!(watch(br#"{"jsonrpc":"2.0","id":1,"method":"session/prompt","params":{"text":"\"session/new\""}}"#).is_none());
        assert!(watch(br#"{"jsonrpc":"2.0","id":1,"method":"session/new","params":{}}"#).is_none());
        assert_eq!(
            new_session_id(br#"{"jsonrpc":"2.0","id":1,"result":{"sessionId":"mock-1"}}"#)
                .as_deref(),
            Some("mock-1")
        );
    }
}
