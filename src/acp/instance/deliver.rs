//! Requests and notifications on their way to the agent: `deliver` (one envelope, a POST) and
//! `deliver_batch` (a WebSocket read batch), each request's pending entry guarded until its line
//! reached the agent's stdin, and the errors a POST gets when the agent cannot take it.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::oneshot;

use super::stdin::{Done, SendFail, Sent, request_key, send_line};
use super::{AcpInstance, Phase, Running, STDERR_EXCERPT};
use crate::acp::jsonrpc::{Envelope, IdKey, Kind};
use crate::acp::{AcpError, Ended};

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
/// A POST's one key is borrowed (no allocation per request); a batch's keys are owned.
pub(super) struct PendingGuard<'a> {
    inst: &'a AcpInstance,
    keys: std::borrow::Cow<'a, [IdKey]>,
}

impl PendingGuard<'_> {
    /// The lines reached the agent's stdin (or the writer task, which answers for them now).
    fn reached(mut self) {
        self.keys = std::borrow::Cow::Borrowed(&[]);
    }

    /// Lines `from..` of the keys did not reach the agent (the first ones did).
    fn keep_first(&mut self, n: usize) {
        let keys = self.keys.to_mut();
        keys.drain(..n.min(keys.len()));
    }
}

impl Drop for PendingGuard<'_> {
    fn drop(&mut self) {
        if self.keys.is_empty() {
            return;
        }
        let mut life = self.inst.life();
        for k in self.keys.iter() {
            life.waiters.remove(k);
        }
    }
}

impl AcpInstance {
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
        request: Option<&IdKey>,
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
                    if life.waiters.contains_key(key) {
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
                    keys: std::borrow::Cow::Borrowed(std::slice::from_ref(key)),
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
                        let waiting = match self.life().waiters.get_mut(key) {
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
        let mut guard = PendingGuard {
            inst: self,
            keys: std::borrow::Cow::Owned(keys),
        };
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
}
