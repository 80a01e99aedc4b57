//! The connections of the ACP RFD transport (`/v1/agents/{agent}/acp`). Each connection is an
//! ordinary instance of the proxy — serverId `acp-conn-<connectionId>`, listed, supervised, limited
//! and stopped like any other — plus this bookkeeping: which request belongs to which session, and
//! one outbox per RFD stream (the connection stream and one per `Acp-Session-Id`) fed by a router
//! task that reads the instance's event log. **Invariant:** every event of the instance is routed
//! to exactly one outbox, in log order; an outbox never holds more than twice the log's bounds
//! (a stream that falls further behind is cut off, and what an unread outbox had to drop is told
//! to its next reader as a `gap`); each session outbox holds a share of the daemon-wide
//! subscriber budget (`--max-subscribers-total`, as an SSE subscriber of the same bounds does),
//! and keeps its frames in their own memory (never a slice of a larger chunk); a connection with no open stream or socket and
//! no POST in progress for `--acp-connection-idle` is deleted like `DELETE /v1/acp/{serverId}`.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use serde::Deserialize;
use serde_json::value::RawValue;
use tokio::sync::Notify;
use tokio::time::Instant;

use super::caps::{Budget, Reservation};
use super::events::{LogLimits, gap_frame};
use super::frames::{LogItem, split};
use super::jsonrpc::IdKey;
use super::{AcpError, AcpService, Next, Retirement, Subscription};
use crate::agents::Agents;
use crate::config::Config;

mod handoff;
pub use handoff::{ConnectionState, OutboxState};

/// The prefix of the serverId of an RFD connection; the rest is the connection id.
pub const SERVER_ID_PREFIX: &str = "acp-conn-";

/// At most this many session streams per connection (each holds an outbox).
pub const MAX_SESSIONS: usize = 256;

/// At most this many session-scoped requests remembered per connection; beyond it the oldest
/// routes are forgotten (their responses then go to the connection stream).
const MAX_ROUTES: usize = 65_536;

#[derive(Debug, Clone, thiserror::Error)]
pub enum ConnectionError {
    #[error("unknown agent `{agent}`")]
    UnknownAgent { agent: String },
    #[error("this request needs the Acp-Connection-Id header")]
    MissingConnectionId,
    #[error("the first message of a connection must be an `initialize` request")]
    NotInitialize,
    #[error("no connection `{connection_id}`")]
    UnknownConnection { connection_id: String },
    #[error("connection `{connection_id}` runs agent `{bound}`, not `{requested}`")]
    AgentMismatch {
        connection_id: String,
        bound: String,
        requested: String,
    },
    #[error("invalid Acp-Session-Id: use 1-256 visible ASCII characters")]
    InvalidSessionId,
    #[error("the {stream} of connection `{connection_id}` already has a reader")]
    StreamBusy {
        connection_id: String,
        stream: String,
    },
    #[error("connection `{connection_id}` already has {limit} session streams")]
    TooManySessions { connection_id: String, limit: usize },
    #[error("{0}")]
    Acp(#[from] AcpError),
}

/// Every RFD connection of the daemon.
pub struct Connections {
    acp: Arc<AcpService>,
    agents: Arc<Agents>,
    limits: LogLimits,
    idle: Duration,
    map: Mutex<HashMap<String, Arc<Connection>>>,
}

/// One RFD connection.
pub struct Connection {
    pub id: String,
    pub server_id: String,
    pub agent: String,
    limits: LogLimits,
    /// The daemon-wide subscriber budget: each session outbox holds one share.
    subscribers: Arc<Budget>,
    routes: Mutex<Routes>,
    /// Wakes the router when a reader attaches or leaves (the idle clock).
    readers_changed: Notify,
}

#[derive(Default)]
struct Routes {
    connection: Outbox,
    sessions: HashMap<String, Outbox>,
    /// Session-scoped requests in flight: id → sessionId (the response goes to that session).
    requests: HashMap<IdKey, String>,
    request_order: VecDeque<IdKey>,
    /// The id of the last event routed (a reload's new router reads on after it).
    routed_to: u64,
    /// The HTTP profile: a router fills the outboxes (false: the WebSocket profile).
    is_routed: bool,
    /// Open streams and sockets of this connection.
    readers: usize,
    idle_since: Option<Instant>,
    ended: bool,
}

/// The queue of one RFD stream.
#[derive(Default)]
struct Outbox {
    /// Event id and SSE frame of each queued message.
    frames: VecDeque<(u64, Bytes)>,
    bytes: usize,
    attached: bool,
    /// The attached reader fell behind: its stream ends; the next reader starts afresh.
    cut: bool,
    /// Events dropped from this outbox (`from..=to`) that no reader was told of yet: the next
    /// chunk starts with a `gap` frame for them.
    lost: Option<(u64, u64)>,
    notify: Arc<Notify>,
    /// A session outbox's share of the subscriber budget (the connection stream's is the
    /// router's subscription).
    _share: Option<Reservation>,
}

impl Outbox {
    fn new(share: Reservation) -> Outbox {
        Outbox {
            _share: Some(share),
            ..Outbox::default()
        }
    }

    fn offer(&mut self, id: u64, frame: &Bytes, limits: LogLimits, what: &dyn Fn() -> String) {
        if self.frames.len() >= limits.max_events.saturating_mul(2)
            || self.bytes + frame.len() > limits.max_bytes.saturating_mul(2)
        {
            tracing::warn!(stream = %what(), dropped = self.frames.len(),
                "an ACP stream fell behind; its queued messages were dropped and its reader cut off");
            let first = self.frames.front().map_or(id, |(i, _)| *i);
            self.frames.clear();
            self.bytes = 0;
            self.cut = self.attached;
            if self.cut {
                self.lost = Some((self.lost.map_or(first, |(f, _)| f), id));
                self.notify.notify_one();
                return;
            }
            if first < id {
                self.lost = Some((self.lost.map_or(first, |(f, _)| f), id - 1));
            }
        }
        self.bytes += frame.len();
        // Its own copy: the frame is a slice of the chunk the router read, which it would keep
        // alive whole for as long as the frame waits here.
        self.frames.push_back((id, Bytes::copy_from_slice(frame)));
        self.notify.notify_one();
    }
}

/// What the routing of one message needs to know about it.
#[derive(Deserialize)]
struct Probe<'a> {
    #[serde(borrow, default)]
    id: Option<&'a RawValue>,
    #[serde(default)]
    method: Option<serde::de::IgnoredAny>,
    #[serde(borrow, default)]
    params: Option<&'a RawValue>,
}

#[derive(Deserialize)]
struct SessionProbe {
    #[serde(rename = "sessionId", default)]
    session_id: Option<String>,
}

/// `params.sessionId` (or `result.sessionId`) when the member is an object with a string there.
pub fn session_of(raw: Option<&RawValue>) -> Option<String> {
    let raw = raw?;
    if !raw.get().starts_with('{') {
        return None;
    }
    serde_json::from_str::<SessionProbe>(raw.get())
        .ok()?
        .session_id
}

fn valid_session_id(s: &str) -> bool {
    !s.is_empty() && s.len() <= 256 && s.bytes().all(|b| (0x21..0x7f).contains(&b))
}

impl Connections {
    pub fn new(acp: Arc<AcpService>, agents: Arc<Agents>, config: &Config) -> Self {
        let limits = LogLimits {
            max_events: config.event_buffer.max(1),
            max_bytes: usize::try_from(config.event_buffer_bytes).unwrap_or(usize::MAX),
        };
        let idle = config.acp_connection_idle;
        Connections {
            acp,
            agents,
            limits,
            idle,
            map: Mutex::new(HashMap::new()),
        }
    }

    fn map(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<Connection>>> {
        crate::sys::lock(&self.map)
    }

    pub fn acp(&self) -> &Arc<AcpService> {
        &self.acp
    }

    /// A new connection running `agent`: its instance exists (the agent starts with the first
    /// message) and the router reads its log from the first event. `routed == false` (the
    /// WebSocket profile) leaves the log to the socket: no router, no outboxes.
    pub fn create(
        self: &Arc<Self>,
        agent: &str,
        routed: bool,
    ) -> Result<(Arc<Connection>, Option<Subscription>), ConnectionError> {
        if !self.agents.is_known(agent) {
            return Err(ConnectionError::UnknownAgent {
                agent: agent.to_string(),
            });
        }
        let id = new_connection_id();
        let server_id = format!("{SERVER_ID_PREFIX}{id}");
        self.acp.open_connection(&server_id, agent)?;
        let sub = match self.acp.subscribe(&server_id, None) {
            Ok(s) => s,
            Err(e) => {
                // Nothing else knows this instance yet: it must not stay in the map.
                self.acp.retire_id(&server_id, Retirement::ConnectFailed);
                return Err(e.into());
            }
        };
        let conn = Arc::new(Connection {
            id: id.clone(),
            server_id,
            agent: agent.to_string(),
            limits: self.limits,
            subscribers: self.acp.subscribers_budget().clone(),
            routes: Mutex::new(Routes {
                idle_since: Some(Instant::now()),
                is_routed: routed,
                ..Routes::default()
            }),
            readers_changed: Notify::new(),
        });
        self.map().insert(id, conn.clone());
        let sub = if routed {
            tokio::spawn(route_loop(Arc::downgrade(self), conn.clone(), sub));
            None
        } else {
            tokio::spawn(idle_loop(Arc::downgrade(self), conn.clone()));
            Some(sub)
        };
        Ok((conn, sub))
    }

    /// The connection named by an `Acp-Connection-Id` header, for `agent`.
    pub fn get(
        &self,
        connection_id: &str,
        agent: &str,
    ) -> Result<Arc<Connection>, ConnectionError> {
        let conn = self.map().get(connection_id).cloned().ok_or_else(|| {
            ConnectionError::UnknownConnection {
                connection_id: connection_id.chars().take(200).collect(),
            }
        })?;
        if conn.agent != agent {
            return Err(ConnectionError::AgentMismatch {
                connection_id: conn.id.clone(),
                bound: conn.agent.clone(),
                requested: agent.to_string(),
            });
        }
        Ok(conn)
    }

    /// Ends a connection: its instance is retired (stopped in the background) and its streams
    /// end.
    pub fn delete(&self, conn: &Connection) {
        self.end(conn, Retirement::Deleted);
    }

    fn end(&self, conn: &Connection, why: Retirement) {
        self.acp.retire_id(&conn.server_id, why);
        self.forget(conn);
    }

    fn forget(&self, conn: &Connection) {
        let mut map = self.map();
        if map.get(&conn.id).is_some_and(|c| std::ptr::eq(&**c, conn)) {
            map.remove(&conn.id);
        }
    }

    /// How many connections exist.
    pub fn count(&self) -> usize {
        self.map().len()
    }
}
impl Connection {
    fn routes(&self) -> std::sync::MutexGuard<'_, Routes> {
        crate::sys::lock(&self.routes)
    }

    /// Remembers that the request `key` belongs to `session`, so that its response goes to that
    /// session's stream. Called before the request is written to the agent.
    pub fn route_request(&self, key: IdKey, session: String) {
        let mut r = self.routes();
        if r.requests.insert(key.clone(), session).is_none() {
            r.request_order.push_back(key);
        }
        while r.request_order.len() > MAX_ROUTES {
            if let Some(old) = r.request_order.pop_front() {
                r.requests.remove(&old);
            }
        }
    }

    /// Forgets a route whose request could not be delivered.
    pub fn unroute_request(&self, key: &IdKey) {
        self.routes().requests.remove(key);
    }

    /// Attaches the one reader of the connection stream (`session == None`) or of a session's
    /// stream. A second reader of the same stream is refused (409).
    pub fn attach(
        self: &Arc<Self>,
        session: Option<&str>,
    ) -> Result<StreamReader, ConnectionError> {
        let mut r = self.routes();
        let busy = |stream: String| ConnectionError::StreamBusy {
            connection_id: self.id.clone(),
            stream,
        };
        if let Some(s) = session {
            if !valid_session_id(s) {
                return Err(ConnectionError::InvalidSessionId);
            }
            if !r.sessions.contains_key(s) {
                if r.sessions.len() >= MAX_SESSIONS {
                    return Err(ConnectionError::TooManySessions {
                        connection_id: self.id.clone(),
                        limit: MAX_SESSIONS,
                    });
                }
                let share = self
                    .subscribers
                    .try_reserve(1)
                    .ok_or_else(|| AcpError::Capacity {
                        what: "SSE subscribers of all serverIds",
                        limit: self.subscribers.limit(),
                        server_id: Some(self.server_id.clone()),
                    })?;
                r.sessions.insert(s.to_string(), Outbox::new(share));
            }
        }
        let outbox = match session {
            None => &mut r.connection,
            Some(s) => r.sessions.get_mut(s).expect("inserted above"),
        };
        if outbox.attached {
            return Err(busy(match session {
                None => "connection stream".to_string(),
                Some(s) => format!("stream of session `{s}`"),
            }));
        }
        outbox.attached = true;
        outbox.cut = false;
        let notify = outbox.notify.clone();
        r.readers += 1;
        r.idle_since = None;
        drop(r);
        self.readers_changed.notify_one();
        Ok(StreamReader {
            conn: self.clone(),
            session: session.map(str::to_string),
            notify,
        })
    }

    /// Counts a reader that is not an outbox's (the WebSocket profile's socket, a POST in
    /// progress): the idle clock starts again when the last one leaves.
    pub fn hold(self: &Arc<Self>) -> ReaderGuard {
        let mut r = self.routes();
        r.readers += 1;
        r.idle_since = None;
        drop(r);
        self.readers_changed.notify_one();
        ReaderGuard { conn: self.clone() }
    }

    fn reader_left(&self) {
        let mut r = self.routes();
        r.readers = r.readers.saturating_sub(1);
        if r.readers == 0 {
            r.idle_since = Some(Instant::now());
        }
        drop(r);
        self.readers_changed.notify_one();
    }

    /// Routes one event of the log: a response to a session-scoped request goes to that
    /// session; a message whose `params.sessionId` names a session goes to it (held until its
    /// reader attaches); everything else goes to the connection stream.
    fn route(&self, id: u64, json: &[u8], frame: &Bytes) {
        let probe: Option<Probe<'_>> = serde_json::from_slice(json).ok();
        let mut r = self.routes();
        r.routed_to = r.routed_to.max(id);
        let session = match &probe {
            Some(p) if p.method.is_none() => match p.id {
                Some(id) => r.requests.remove(&IdKey::from_raw(id)),
                None => None,
            },
            Some(p) => session_of(p.params),
            None => None,
        };
        let limits = self.limits;
        // A session without an outbox gets one while the per-connection count and the global
        // subscriber budget allow; its messages go to the connection stream otherwise.
        let outbox = match session {
            Some(s) if r.sessions.contains_key(&s) => Some(s),
            Some(s) if r.sessions.len() < MAX_SESSIONS => match self.subscribers.try_reserve(1) {
                Some(share) => {
                    r.sessions.insert(s.clone(), Outbox::new(share));
                    Some(s)
                }
                None => None,
            },
            _ => None,
        };
        let conn = &self.id;
        match outbox {
            Some(s) => {
                let what = || format!("{conn}/session {s}");
                let o = r.sessions.get_mut(&s).expect("present or inserted above");
                o.offer(id, frame, limits, &what);
            }
            None => {
                let what = || format!("{conn}/connection");
                r.connection.offer(id, frame, limits, &what);
            }
        }
    }

    /// The log ended (agent gone, deleted, shutdown): every stream ends once drained.
    fn end(&self) {
        let mut r = self.routes();
        r.ended = true;
        r.connection.notify.notify_one();
        for o in r.sessions.values() {
            o.notify.notify_one();
        }
    }
}

/// The reader of one RFD stream. Dropping it detaches it (the stream may be opened again).
pub struct StreamReader {
    conn: Arc<Connection>,
    session: Option<String>,
    notify: Arc<Notify>,
}

impl StreamReader {
    /// Waits for frames (several come back as one chunk); `End` when the connection ended and
    /// everything was delivered, `CutOff` when this reader fell behind.
    pub async fn next(&self) -> Next {
        loop {
            {
                let mut r = self.conn.routes();
                let ended = r.ended;
                let outbox = match &self.session {
                    None => Some(&mut r.connection),
                    Some(s) => r.sessions.get_mut(s),
                };
                let Some(outbox) = outbox else {
                    return Next::End;
                };
                if outbox.cut {
                    return Next::CutOff;
                }
                if !outbox.frames.is_empty() || outbox.lost.is_some() {
                    let mut chunk = BytesMut::new();
                    if let Some((from, to)) = outbox.lost.take() {
                        chunk.extend_from_slice(&gap_frame(from, to));
                    }
                    while let Some((_, f)) = outbox.frames.front() {
                        if !chunk.is_empty() && chunk.len() + f.len() > 64 * 1024 {
                            break;
                        }
                        let (_, f) = outbox.frames.pop_front().expect("front exists");
                        outbox.bytes -= f.len();
                        chunk.extend_from_slice(&f);
                    }
                    return Next::Frames(chunk.freeze());
                }
                if ended {
                    return Next::End;
                }
            }
            self.notify.notified().await;
        }
    }
}

impl Drop for StreamReader {
    fn drop(&mut self) {
        {
            let mut r = self.conn.routes();
            let outbox = match &self.session {
                None => Some(&mut r.connection),
                Some(s) => r.sessions.get_mut(s),
            };
            if let Some(o) = outbox {
                o.attached = false;
                o.cut = false;
            }
        }
        self.conn.reader_left();
    }
}

/// Keeps a connection counted as read (the WebSocket profile's socket).
pub struct ReaderGuard {
    conn: Arc<Connection>,
}

impl Drop for ReaderGuard {
    fn drop(&mut self) {
        self.conn.reader_left();
    }
}

/// Deletes the connection once it has had no reader for the idle time; returns when it ended.
async fn wait_idle(conns: &Weak<Connections>, conn: &Connection) -> bool {
    let Some(idle) = conns.upgrade().map(|c| c.idle) else {
        return true;
    };
    let since = conn.routes().idle_since;
    match since {
        Some(t) if t + idle <= Instant::now() => {
            if let Some(c) = conns.upgrade() {
                tracing::info!(connection_id = %conn.id, server_id = %conn.server_id,
                    "an ACP connection had no reader for {}; stopping it",
                    humantime::format_duration(idle));
                c.end(conn, Retirement::Idle);
            }
            true
        }
        Some(t) => {
            tokio::select! {
                _ = tokio::time::sleep_until(t + idle) => {}
                _ = conn.readers_changed.notified() => {}
            }
            false
        }
        None => {
            conn.readers_changed.notified().await;
            false
        }
    }
}

/// The WebSocket profile: no routing, only the idle clock.
async fn idle_loop(conns: Weak<Connections>, conn: Arc<Connection>) {
    while !wait_idle(&conns, &conn).await {}
}

/// Reads the instance's log and routes every event to its outbox, until the log ends.
async fn route_loop(conns: Weak<Connections>, conn: Arc<Connection>, sub: Subscription) {
    let mut idle_done = false;
    loop {
        tokio::select! {
            next = sub.next() => match next {
                Next::Frames(chunk) => {
                    for item in split(&chunk) {
                        match item {
                            LogItem::Message { id, json, frame } => conn.route(id, &json, &frame),
                            LogItem::Gap { from, to } => tracing::warn!(connection_id = %conn.id,
                                from, to, "ACP connection lost events before its router read them"),
                        }
                    }
                }
                Next::End => break,
                Next::CutOff => {
                    // Cannot happen (the router never waits), but if it did the streams could no
                    // longer be trusted: end the connection rather than lose messages silently.
                    tracing::warn!(connection_id = %conn.id, "ACP connection router fell behind");
                    if let Some(c) = conns.upgrade() {
                        c.delete(&conn);
                    }
                    break;
                }
            },
            done = wait_idle(&conns, &conn), if !idle_done => idle_done = done,
        }
    }
    conn.end();
    // The log ended: deleted (already forgotten), shut down, or the agent exited. In the last
    // case the connection stays until its readers are gone and the idle time passed, so that
    // POSTs meanwhile learn how the agent ended (502 with its exit) rather than 404.
    if !idle_done {
        while !wait_idle(&conns, &conn).await {}
    }
}

/// 128 random bits as 32 hex digits. The id is not a credential (the bearer token is), but an
/// unguessable id keeps one client from stumbling into another's connection.
fn new_connection_id() -> String {
    crate::sys::random_hex::<16>()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn connection() -> Connection {
        Connection {
            id: "c".to_string(),
            server_id: "acp-conn-c".to_string(),
            agent: "mock".to_string(),
            limits: LogLimits {
                max_events: 100,
                max_bytes: 1 << 20,
            },
            subscribers: Budget::new(1000),
            routes: Mutex::new(Routes::default()),
            readers_changed: Notify::new(),
        }
    }

    /// Routes each agent message (after registering `requests` as session-scoped) and checks
    /// which stream each one landed on (`""` for the connection stream).
    fn check(requests: &[(&str, &str)], messages: &[&str], expected: &[&str]) {
        let conn = connection();
        for (id, session) in requests {
            let raw = RawValue::from_string(id.to_string()).unwrap();
            conn.route_request(IdKey::from_raw(&raw), session.to_string());
        }
        for (i, m) in messages.iter().enumerate() {
            conn.route(i as u64 + 1, m.as_bytes(), &Bytes::from(m.to_string()));
        }
        let r = conn.routes();
        let mut got: Vec<(usize, &str)> = Vec::new();
        let position = |frame: &Bytes| messages.iter().position(|m| m.as_bytes() == &frame[..]);
        for (_, f) in &r.connection.frames {
            got.push((position(f).unwrap(), ""));
        }
        for (s, o) in &r.sessions {
            for (_, f) in &o.frames {
                got.push((position(f).unwrap(), s.as_str()));
            }
        }
        got.sort();
        let got: Vec<&str> = got.into_iter().map(|(_, s)| s).collect();
        assert_eq!(got, expected);
    }

    #[test]
    fn routing() {
        check(
            &[("2", "s1")],
            &[
                r#"{"id":1,"result":{"sessionId":"s1"}}"#,
                r#"{"method":"session/update","params":{"sessionId":"s1","update":{}}}"#,
                r#"{"id":7,"method":"session/request_permission","params":{"sessionId":"s1"}}"#,
                r#"{"id":2,"result":{"stopReason":"end_turn"}}"#,
                r#"{"id":2,"result":{"again":true}}"#,
                r#"{"method":"session/update","params":{"sessionId":"s2"}}"#,
                r#"{"method":"_x/notice","params":[1,2]}"#,
                r#"not json"#,
            ],
            &["", "s1", "s1", "s1", "", "s2", "", ""],
        );
        // Ids match by their canonical JSON text: "2" (a string) is not 2.
        check(&[("\"2\"", "s1")], &[r#"{"id":2,"result":{}}"#], &[""]);
    }

    #[test]
    fn session_ids() {
        assert!(valid_session_id("mock-1"));
        assert!(!valid_session_id(""));
        assert!(!valid_session_id("a b"));
        assert!(!valid_session_id(&"x".repeat(257)));
    }

    fn message(id: u64, session: &str) -> (u64, String, Bytes) {
        let json = format!(r#"{{"method":"session/update","params":{{"sessionId":"{session}"}}}}"#);
        let frame = Bytes::from(format!("event: message\nid: {id}\ndata: {json}\n\n"));
        (id, json, frame)
    }

    fn next_now(reader: &StreamReader) -> String {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        match rt
            .block_on(async { tokio::time::timeout(Duration::from_secs(1), reader.next()).await })
        {
            Ok(Next::Frames(f)) => String::from_utf8(f.to_vec()).unwrap(),
            _ => "<nothing>".to_string(),
        }
    }

    /// What an outbox with no reader had to drop is told to its next reader as a gap.
    #[test]
    fn an_unread_outbox_that_overflowed_tells_its_next_reader_the_gap() {
        let mut conn = connection();
        conn.limits = LogLimits {
            max_events: 2,
            max_bytes: 1 << 20,
        };
        let conn = Arc::new(conn);
        for id in 1..=6 {
            let (id, json, frame) = message(id, "s1");
            conn.route(id, json.as_bytes(), &frame);
        }
        let reader = conn.attach(Some("s1")).unwrap();
        let got = next_now(&reader);
        assert!(
            got.starts_with("event: gap\ndata: {\"from\":1,\"to\":4}\n\nevent: message\nid: 5\n"),
            "{got}"
        );
        assert!(got.contains("id: 6\n"), "{got}");
    }

    /// A frame waiting in an outbox does not keep the (large) chunk it was read in alive.
    #[test]
    fn an_outbox_keeps_its_own_copy_of_a_frame() {
        let conn = connection();
        let (id, json, frame) = message(1, "s1");
        let mut chunk = BytesMut::from(&frame[..]);
        chunk.extend_from_slice(&vec![b' '; 64 * 1024]);
        let chunk = chunk.freeze();
        let slice = chunk.slice(..frame.len());
        conn.route(id, json.as_bytes(), &slice);
        let r = conn.routes();
        let kept = &r.sessions["s1"].frames[0].1;
        assert_eq!(kept, &frame);
        let range = chunk.as_ptr_range();
        assert!(
            !range.contains(&kept.as_ptr()),
            "the outbox holds a slice of the whole chunk"
        );
    }

    /// Session outboxes take shares of the daemon-wide subscriber budget: when it is spent, a
    /// new session stream is refused and unread messages of a new session go to the
    /// connection stream.
    #[test]
    fn session_outboxes_count_against_the_subscriber_budget() {
        let mut conn = connection();
        conn.subscribers = Budget::new(1);
        let conn = Arc::new(conn);
        let reader = conn.attach(Some("s1")).unwrap();
        assert_eq!(conn.subscribers.used(), 1);
        let refused = conn.attach(Some("s2")).err().expect("no share left");
        assert!(matches!(
            refused,
            ConnectionError::Acp(AcpError::Capacity { .. })
        ));
        let (id, json, frame) = message(1, "s3");
        conn.route(id, json.as_bytes(), &frame);
        assert_eq!(conn.routes().connection.frames.len(), 1);
        drop(reader);
        // The outbox (and its share) stays for the session's next reader.
        assert_eq!(conn.subscribers.used(), 1);
    }
}
