//! A reload's hand-off of the RFD connections: what each one carries (its routes, the requests
//! in flight, what its outboxes hold) and how the new image rebuilds it on its adopted instance.
//! **Invariant:** a carried connection instance ends up either with its connection rebuilt or
//! stopped, never half there.

use std::sync::{Arc, Mutex};

use tokio::sync::Notify;
use tokio::time::Instant;

use super::{Connection, Connections, Outbox, Routes, SERVER_ID_PREFIX, idle_loop, route_loop};
use crate::acp::jsonrpc::IdKey;
use crate::acp::{AcpState, Retirement};

impl Connections {
    /// A reload's hand-off: every connection whose instance `acp` carries, with its routes and
    /// what its outboxes hold (no stream is open any more: the drain ended them). Call after
    /// the instances were frozen; what the router had not routed yet is routed again by the new
    /// image's router, from the carried event log.
    pub fn export(&self, acp: &AcpState) -> Vec<ConnectionState> {
        let carried: std::collections::HashSet<&str> =
            acp.instances.iter().map(|i| i.server_id.as_str()).collect();
        let map = self.map();
        let mut out: Vec<ConnectionState> = map
            .values()
            .filter(|c| carried.contains(c.server_id.as_str()))
            .map(|c| c.export())
            .collect();
        out.sort_by(|a, b| a.id.cmp(&b.id));
        out
    }

    /// Rebuilds the connections of a hand-off in the new image, on their adopted instances: the
    /// routes and queued messages as they were, the router reading on after the last event it
    /// routed, the idle clock started afresh. A carried connection instance without its
    /// connection (or whose connection cannot be rebuilt) is stopped, never left half there.
    pub fn adopt(self: &Arc<Self>, states: &[ConnectionState], acp: &AcpState) {
        let mut rebuilt = std::collections::HashSet::new();
        for st in states {
            let server_id = format!("{SERVER_ID_PREFIX}{}", st.id);
            if self.acp.get(&server_id).is_none() {
                continue;
            }
            let sub = if st.routed {
                match self.acp.subscribe(&server_id, Some(st.routed_to)) {
                    Ok(s) => Some(s),
                    Err(e) => {
                        tracing::warn!(connection_id = %st.id, error = %e,
                            "cannot resume an ACP connection after the reload; stopping it");
                        continue;
                    }
                }
            } else {
                None
            };
            let conn = Arc::new(Connection {
                id: st.id.clone(),
                server_id,
                agent: st.agent.clone(),
                limits: self.limits,
                subscribers: self.acp.subscribers_budget().clone(),
                routes: Mutex::new(Routes::default()),
                readers_changed: Notify::new(),
            });
            conn.restore(st);
            self.map().insert(st.id.clone(), conn.clone());
            rebuilt.insert(conn.server_id.clone());
            match sub {
                Some(sub) => {
                    tokio::spawn(route_loop(Arc::downgrade(self), conn, sub));
                }
                None => {
                    tokio::spawn(idle_loop(Arc::downgrade(self), conn));
                }
            }
            tracing::info!(connection_id = %st.id, sessions = st.sessions.len(),
                "ACP connection carried across the reload");
        }
        for i in &acp.instances {
            if i.server_id.starts_with(SERVER_ID_PREFIX) && !rebuilt.contains(&i.server_id) {
                self.acp.retire_id(&i.server_id, Retirement::Shutdown);
            }
        }
    }
}

/// One RFD connection in a reload's hand-off.
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize, PartialEq)]
pub struct ConnectionState {
    pub id: String,
    pub agent: String,
    /// The HTTP profile (a router and outboxes); the WebSocket profile has neither.
    pub routed: bool,
    pub routed_to: u64,
    /// Session-scoped requests in flight, oldest first: (canonical id, sessionId).
    pub requests: Vec<(String, String)>,
    pub connection: OutboxState,
    pub sessions: Vec<(String, OutboxState)>,
}

/// What one RFD stream's outbox holds in a hand-off.
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize, PartialEq)]
pub struct OutboxState {
    /// Event id and SSE frame of each queued message.
    pub frames: Vec<(u64, crate::carried::Payload)>,
    pub lost: Option<(u64, u64)>,
}

impl OutboxState {
    fn of(o: &Outbox) -> OutboxState {
        OutboxState {
            frames: o
                .frames
                .iter()
                .map(|(id, f)| (*id, crate::carried::Payload(f.clone())))
                .collect(),
            lost: o.lost,
        }
    }

    fn fill(&self, o: &mut Outbox) {
        for (id, f) in &self.frames {
            o.bytes += f.0.len();
            o.frames.push_back((*id, f.0.clone()));
        }
        o.lost = self.lost;
    }
}

impl Connection {
    fn export(&self) -> ConnectionState {
        let r = self.routes();
        ConnectionState {
            id: self.id.clone(),
            agent: self.agent.clone(),
            routed: r.is_routed,
            routed_to: r.routed_to,
            requests: r
                .request_order
                .iter()
                .filter_map(|k| r.requests.get(k).map(|s| (k.0.to_string(), s.clone())))
                .collect(),
            connection: OutboxState::of(&r.connection),
            sessions: {
                let mut v: Vec<(String, OutboxState)> = r
                    .sessions
                    .iter()
                    .map(|(s, o)| (s.clone(), OutboxState::of(o)))
                    .collect();
                v.sort_by(|a, b| a.0.cmp(&b.0));
                v
            },
        }
    }

    /// Fills a new connection's routes from a hand-off. A session whose outbox finds no share
    /// of the subscriber budget left gives its queued messages to the connection stream.
    fn restore(&self, st: &ConnectionState) {
        let mut r = self.routes();
        r.routed_to = st.routed_to;
        r.is_routed = st.routed;
        for (k, s) in &st.requests {
            let key = IdKey(k.as_str().into());
            if r.requests.insert(key.clone(), s.clone()).is_none() {
                r.request_order.push_back(key);
            }
        }
        st.connection.fill(&mut r.connection);
        for (s, o) in &st.sessions {
            match self.subscribers.try_reserve(1) {
                Some(share) => {
                    let mut outbox = Outbox::new(share);
                    o.fill(&mut outbox);
                    r.sessions.insert(s.clone(), outbox);
                }
                None => {
                    tracing::warn!(connection_id = %self.id, session = %s,
                        "no subscriber share left for a carried session stream; its messages go to the connection stream");
                    o.fill(&mut r.connection);
                }
            }
        }
        r.idle_since = Some(Instant::now());
    }
}
