//! The agents' permission and question requests waiting for an OpenCode client: listed, answered
//! (once, always, reject, the question's answers), withdrawn by the agent, and the events that say
//! so. `turn.rs` adds a request when the agent asks and answers it itself where an "always" rule
//! or the session's mode already decides.

use serde_json::{Value, json};

use super::{OcError, OpenCode, Rule};

/// What kind of request waits for an answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AskKind {
    Permission,
    Question,
}

/// A permission or question request of an agent, waiting for the client.
#[derive(Debug, Clone)]
pub struct Pending {
    pub id: String,
    pub kind: AskKind,
    pub session: String,
    pub server_id: String,
    /// The agent's JSON-RPC id, as it sent it.
    pub rpc_id: Value,
    /// `(optionId, kind)` of the agent's options.
    pub options: Vec<(String, String)>,
    pub permission: String,
    pub patterns: Vec<String>,
    /// The OpenCode shape (`PermissionRequest` or `QuestionRequest`).
    pub body: Value,
}

/// How the client answered a request.
pub(super) enum Answer {
    Allow { always: bool },
    Reject,
    Answers(Value),
    Cancelled,
}

impl OpenCode {
    pub fn list_pending(&self, kind: AskKind) -> Vec<Value> {
        crate::sys::lock(&self.pending)
            .values()
            .filter(|p| p.kind == kind)
            .map(|p| p.body.clone())
            .collect()
    }

    fn take_pending(&self, id: &str, kind: AskKind) -> Result<Pending, OcError> {
        let mut map = crate::sys::lock(&self.pending);
        match map.get(id) {
            Some(p) if p.kind == kind => Ok(map.remove(id).expect("present")),
            _ => Err(OcError::NotFound(format!("Request not found: {id}"))),
        }
    }

    /// `POST /permission/{id}/reply` (`reply`: once, always, reject) and the older
    /// `POST /session/{id}/permissions/{permissionID}` (`response`: the same, or allow/deny).
    pub async fn reply_permission(
        &self,
        id: &str,
        reply: &str,
        session: Option<&str>,
    ) -> Result<(), OcError> {
        let reply = match reply {
            "once" | "allow" | "allow_once" => "once",
            "always" | "allow_always" => "always",
            "reject" | "deny" | "reject_once" => "reject",
            other => {
                return Err(OcError::BadRequest(format!(
                    "reply must be once, always or reject, not `{}`",
                    other.chars().take(40).collect::<String>()
                )));
            }
        };
        if let Some(sid) = session {
            self.get(sid)?;
        }
        let p = self.take_pending(id, AskKind::Permission)?;
        if reply == "always"
            && let Ok(s) = self.get(&p.session)
        {
            let mut d = s.data();
            for pat in &p.patterns {
                if d.rules.len() < 512 {
                    d.rules.push(Rule {
                        permission: p.permission.clone(),
                        pattern: pat.clone(),
                        action: "allow".into(),
                    });
                }
            }
            drop(d);
            self.persist(&s);
        }
        let answer = match reply {
            "once" => Answer::Allow { always: false },
            "always" => Answer::Allow { always: true },
            _ => Answer::Reject,
        };
        self.answer(&p, answer).await;
        self.emit_replied(&p, reply);
        Ok(())
    }

    /// The agent withdrew its request `rpc_id` (`$/cancel_request`) on `server_id`: it leaves
    /// the pending list unanswered, and OpenCode's clients are told it is gone the way OpenCode
    /// ends a request nobody answered (a permission `permission.replied` with `reject`, a
    /// question `question.rejected`). Nothing for a request that is not pending.
    pub(crate) fn withdraw_pending(&self, server_id: &str, rpc_id: &Value) {
        let gone = {
            let mut map = crate::sys::lock(&self.pending);
            let key = map
                .iter()
                .find(|(_, p)| p.server_id == server_id && p.rpc_id == *rpc_id)
                .map(|(k, _)| k.clone());
            key.and_then(|k| map.remove(&k))
        };
        let Some(p) = gone else { return };
        match p.kind {
            AskKind::Permission => self.emit_replied(&p, "reject"),
            AskKind::Question => {
                self.emit(
                    "question.rejected",
                    json!({"sessionID": p.session, "requestID": p.id}),
                );
            }
        }
    }

    pub(super) fn emit_replied(&self, p: &Pending, reply: &str) {
        self.emit(
            "permission.replied",
            json!({"sessionID": p.session, "requestID": p.id, "reply": reply,
                "permissionID": p.id, "response": reply}),
        );
    }

    pub async fn reply_question(&self, id: &str, answers: Value) -> Result<(), OcError> {
        let p = self.take_pending(id, AskKind::Question)?;
        self.answer(&p, Answer::Answers(answers.clone())).await;
        self.emit(
            "question.replied",
            json!({"sessionID": p.session, "requestID": p.id, "answers": answers}),
        );
        Ok(())
    }

    pub async fn reject_question(&self, id: &str) -> Result<(), OcError> {
        let p = self.take_pending(id, AskKind::Question)?;
        self.answer(&p, Answer::Reject).await;
        self.emit(
            "question.rejected",
            json!({"sessionID": p.session, "requestID": p.id}),
        );
        Ok(())
    }

    /// Sends the agent its answer to a `session/request_permission`.
    pub(super) async fn answer(&self, p: &Pending, answer: Answer) {
        crate::sys::lock(&self.pending).remove(&p.id);
        let pick = |kinds: &[&str]| {
            kinds.iter().find_map(|k| {
                p.options
                    .iter()
                    .find(|(_, kind)| kind == k)
                    .map(|(id, _)| id.clone())
            })
        };
        let mut result = match &answer {
            Answer::Allow { always: true } => pick(&["allow_always", "allow_once"]),
            Answer::Allow { always: false } | Answer::Answers(_) => {
                pick(&["allow_once", "allow_always"])
            }
            Answer::Reject => pick(&["reject_once", "reject_always"]),
            Answer::Cancelled => None,
        }
        .map(|option| json!({"outcome": {"outcome": "selected", "optionId": option}}))
        .unwrap_or_else(|| json!({"outcome": {"outcome": "cancelled"}}));
        if let Answer::Answers(a) = answer {
            result["_meta"] = json!({"answers": a});
        }
        let line = json!({"jsonrpc": "2.0", "id": p.rpc_id, "result": result});
        if let Err(e) = self.post_line(&p.server_id, None, &line, false).await {
            tracing::debug!(server_id = %p.server_id, error = %e, "cannot answer the agent's request");
        }
    }
}
