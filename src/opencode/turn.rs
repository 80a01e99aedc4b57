//! One prompt turn: the user message, the ACP session made on first use (`initialize`,
//! `session/new`, the model's config option), the `session/prompt` posted through the proxy while
//! the instance's event log is read from just before it, each `session/update` turned into
//! OpenCode parts in stream order, each `session/request_permission` into a permission or a
//! question, and the end: `message.updated`, `session.error` for a failed turn, `session.status`
//! idle and exactly one `session.idle`.
//! One concern although over 800 lines: one turn from its prompt to its idle; turning each ACP
//! update into OpenCode's parts is that turn's inner loop, and its state is the turn's own.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::Ordering;

use serde_json::{Value, json};

use super::{
    AskKind, MAX_MESSAGES, MAX_PART_TEXT, MAX_PARTS, MAX_PENDING, Msg, OcError, OpenCode, Pending,
    Session,
};
use crate::acp::frames::LogItem;
use crate::acp::{AcpError, Delivered};
use crate::processes::now_ms;

/// What a prompt asks for, checked before the turn starts.
struct Prompt {
    provider: String,
    model: String,
    /// The user's parts as OpenCode shapes them (without ids).
    parts: Vec<Value>,
    /// The same as ACP content blocks.
    blocks: Vec<Value>,
    message_id: Option<String>,
}

/// How a turn ended.
enum End {
    Stop,
    Failed(TurnError),
}

/// Why a turn failed; its message is what OpenCode's client is shown (`session.error`).
#[derive(Debug, thiserror::Error)]
enum TurnError {
    #[error("the agent instance {0} is gone")]
    InstanceGone(String),
    /// The proxy refused or lost the request.
    #[error(transparent)]
    Acp(#[from] AcpError),
    /// The agent answered with a JSON-RPC error (its message, as `rpc_error_text` words it).
    #[error("{0}")]
    Agent(String),
    #[error("the agent's session/new answer has no sessionId")]
    NoSessionId,
}

/// The parts of the assistant message being built.
#[derive(Default)]
struct Parts {
    /// The open text or reasoning part (its index), closed by any other part.
    open: Option<(usize, &'static str)>,
    tools: HashMap<String, (usize, Value)>,
    edited: HashSet<String>,
    /// The newest `usage_update` of the turn: the context tokens in use, and the session's
    /// cumulative cost when the agent said one.
    used: Option<u64>,
    agent_cost: Option<f64>,
    /// The `usage` of the `session/prompt` answer, when the agent gave one.
    prompt_usage: Option<Value>,
}

impl OpenCode {
    /// `POST /session/{id}/message` (`wait`) and `/prompt_async`: checks the prompt, then runs
    /// the turn on a task of its own (a client that goes away does not cut a turn in half) and,
    /// with `wait`, answers the assistant message once it ends.
    pub async fn prompt(
        self: &Arc<Self>,
        id: &str,
        body: &Value,
        wait: bool,
    ) -> Result<Option<Msg>, OcError> {
        let s = self.get(id)?;
        let (provider, model) = super::model_choice(body);
        let provider = provider.or_else(|| {
            body.get("agent")
                .and_then(Value::as_str)
                .filter(|a| self.agents.is_known(a))
                .map(String::from)
        });
        let (provider, model) = self.choose_model(&s, provider.as_deref(), model.as_deref())?;
        let (parts, blocks) = user_parts(body)?;
        let prompt = Prompt {
            provider,
            model,
            parts,
            blocks,
            message_id: body
                .get("messageID")
                .and_then(Value::as_str)
                .filter(|m| m.len() <= 100)
                .map(String::from),
        };
        s.data().prompted = true;
        // Busy from here, not from when the turn's task starts: an abort right behind a
        // `prompt_async` (answered before that task runs) must find the turn.
        if !s.busy.swap(true, Ordering::AcqRel) {
            s.aborted.store(false, Ordering::Release);
        }
        let this = self.clone();
        let task = tokio::spawn(async move { this.run_turn(&s, prompt).await });
        if !wait {
            return Ok(None);
        }
        match task.await {
            Ok((msg, seq)) => {
                self.wait_delivered(seq).await;
                Ok(Some(msg))
            }
            Err(e) => Err(OcError::Busy(format!("the turn ended abnormally: {e}"))),
        }
    }

    async fn run_turn(self: &Arc<Self>, s: &Arc<Session>, p: Prompt) -> (Msg, u64) {
        let _turn = s.turn.lock().await;
        s.busy.store(true, Ordering::Release);
        self.emit(
            "session.status",
            json!({"sessionID": s.id, "status": {"type": "busy"}}),
        );
        let now = now_ms();
        let user_id = p.message_id.clone().unwrap_or_else(|| self.new_id("msg"));
        let model = json!({"providerID": p.provider, "modelID": p.model});
        let user_info = json!({"id": user_id, "sessionID": s.id, "role": "user",
            "time": {"created": now}, "agent": "build", "model": model});
        let user_parts: Vec<Value> = p
            .parts
            .iter()
            .map(|part| {
                let mut part = part.clone();
                part["id"] = json!(self.new_id("prt"));
                part["sessionID"] = json!(s.id);
                part["messageID"] = json!(user_id);
                part
            })
            .collect();
        self.push_message(
            s,
            Msg {
                info: user_info.clone(),
                parts: user_parts.clone(),
            },
        );
        self.emit(
            "message.updated",
            json!({"info": user_info, "sessionID": s.id}),
        );
        for part in &user_parts {
            self.emit(
                "message.part.updated",
                json!({"part": part, "sessionID": s.id, "messageID": user_id}),
            );
        }
        let asst_id = self.new_id("msg");
        let directory = s.data().directory.clone();
        let asst_info = json!({"id": asst_id, "sessionID": s.id, "role": "assistant",
            "time": {"created": now_ms()}, "parentID": user_id, "modelID": p.model,
            "providerID": p.provider, "mode": "build", "agent": "build",
            "path": {"cwd": directory, "root": directory}, "cost": 0,
            "tokens": {"input": 0, "output": 0, "reasoning": 0, "cache": {"read": 0, "write": 0}}});
        self.push_message(
            s,
            Msg {
                info: asst_info.clone(),
                parts: Vec::new(),
            },
        );
        self.emit(
            "message.updated",
            json!({"info": asst_info, "sessionID": s.id}),
        );
        *crate::sys::lock(&s.current) = Some(asst_id.clone());

        let mut parts = Parts::default();
        let end = match self.drive(s, &p, &asst_id, &mut parts).await {
            Ok(()) => End::Stop,
            Err(e) => End::Failed(e),
        };
        self.finish(s, &asst_id, &mut parts, end)
    }

    /// Ends the turn: closes open parts, completes the assistant message, and emits the end.
    fn finish(&self, s: &Arc<Session>, asst: &str, parts: &mut Parts, end: End) -> (Msg, u64) {
        let now = now_ms();
        if let Some((i, _)) = parts.open.take() {
            self.edit_part(s, asst, i, |part| part["time"]["end"] = json!(now));
        }
        let aborted = s.aborted.swap(false, Ordering::AcqRel);
        let error = match (&end, aborted) {
            (_, true) => Some(json!({"name": "MessageAbortedError",
                "data": {"message": "The turn was aborted"}})),
            (End::Failed(m), false) => {
                Some(json!({"name": "UnknownError", "data": {"message": m.to_string()}}))
            }
            (End::Stop, false) => None,
        };
        let tokens = turn_tokens(parts);
        let cost = s.data().usage.add_turn(&tokens, parts.agent_cost);
        let msg = self
            .with_message(s, asst, |m| {
                m.info["time"]["completed"] = json!(now);
                m.info["tokens"] = tokens.json();
                m.info["cost"] = json!(cost);
                m.info["finish"] = json!(if error.is_some() { "error" } else { "stop" });
                if let Some(e) = &error {
                    m.info["error"] = e.clone();
                }
                m.clone()
            })
            .unwrap_or_else(|| Msg {
                info: json!({"id": asst, "sessionID": s.id, "role": "assistant"}),
                parts: Vec::new(),
            });
        self.emit(
            "message.updated",
            json!({"info": msg.info, "sessionID": s.id}),
        );
        if let Some(e) = error {
            self.emit("session.error", json!({"sessionID": s.id, "error": e}));
        }
        {
            let mut d = s.data();
            d.updated = now;
        }
        *crate::sys::lock(&s.current) = None;
        s.busy.store(false, Ordering::Release);
        self.persist(s);
        self.emit(
            "session.status",
            json!({"sessionID": s.id, "status": {"type": "idle"}}),
        );
        let seq = self.emit("session.idle", json!({"sessionID": s.id}));
        (msg, seq)
    }

    /// The ACP side of a turn. `Err` is the message of a failed turn.
    async fn drive(
        self: &Arc<Self>,
        s: &Arc<Session>,
        p: &Prompt,
        asst: &str,
        parts: &mut Parts,
    ) -> Result<(), TurnError> {
        let sid = s.server_id.clone();
        let acp_session = match self.ensure_acp_session(s, p).await {
            Ok(a) => a,
            Err(e) => return Err(e),
        };
        let inst = self
            .acp
            .get(&sid)
            .ok_or_else(|| TurnError::InstanceGone(sid.clone()))?;
        let after = inst.events.last_id();
        drop(inst);
        let sub = self.acp.subscribe(&sid, Some(after))?;
        if s.aborted.load(Ordering::Acquire) {
            // Aborted while the ACP session was being made: nothing to prompt.
            return Ok(());
        }
        let line = json!({"jsonrpc": "2.0", "id": format!("oc-{}", self.new_id("req")),
            "method": "session/prompt",
            "params": {"sessionId": acp_session, "prompt": p.blocks}});
        let post = self.post_line(&sid, Some(&p.provider), &line, true);
        tokio::pin!(post);
        let mut answered: Option<Result<Delivered, AcpError>> = None;
        let mut seen = after;
        // Once aborted, `session/cancel` goes out at once and again every 500 ms until the turn
        // ends: a cancel that reached the agent before its prompt would otherwise be lost.
        let mut aborting = false;
        let mut resend = tokio::time::interval(std::time::Duration::from_millis(500));
        let cancel = json!({"jsonrpc": "2.0", "method": "session/cancel",
            "params": {"sessionId": acp_session}});
        loop {
            if let Some(r) = &answered {
                match r {
                    Ok(Delivered::Response { last_event_id, .. }) if seen < *last_event_id => {}
                    _ => break,
                }
            }
            tokio::select! {
                r = &mut post, if answered.is_none() => answered = Some(r),
                () = s.abort_wake.notified(), if !aborting => {
                    // A wake left over from an abort of an earlier turn is not this turn's.
                    aborting = s.aborted.load(Ordering::Acquire);
                    resend.reset_immediately();
                }
                _ = resend.tick(), if aborting && answered.is_none() => {
                    let _ = self.post_line(&sid, None, &cancel, false).await;
                }
                next = sub.next() => match next {
                    crate::acp::events::Next::Frames(chunk) => {
                        for item in crate::acp::frames::split(&chunk) {
                            match item {
                                LogItem::Message { id, json, .. } => {
                                    seen = seen.max(id);
                                    if let Ok(v) = serde_json::from_slice::<Value>(&json) {
                                        self.on_agent_line(s, asst, &acp_session, &v, parts).await;
                                    }
                                }
                                LogItem::Gap { to, .. } => seen = seen.max(to),
                            }
                        }
                    }
                    _ => {
                        // The log ended (the instance was retired) or this reader was cut off:
                        // the answer is all that is left to wait for.
                        if answered.is_none() {
                            answered = Some((&mut post).await);
                        }
                        break;
                    }
                },
            }
        }
        match answered {
            Some(Ok(Delivered::Response { line, .. })) => {
                let v: Value = serde_json::from_slice(&line).unwrap_or(Value::Null);
                parts.prompt_usage = v
                    .pointer("/result/usage")
                    .filter(|u| u.is_object())
                    .cloned();
                match v.get("error") {
                    Some(e) => Err(TurnError::Agent(rpc_error_text(e))),
                    None => Ok(()),
                }
            }
            Some(Ok(Delivered::Accepted)) | None => Ok(()),
            Some(Err(e)) => {
                self.forget_instance_if_gone(s, &e);
                Err(TurnError::Acp(e))
            }
        }
    }

    /// An agent that ended takes its session with it: the next turn starts a new instance.
    fn forget_instance_if_gone(&self, s: &Session, e: &AcpError) {
        if matches!(e, AcpError::AgentGone { .. } | AcpError::Gone { .. }) {
            self.acp.delete(&s.server_id);
            let mut d = s.data();
            d.initialized = false;
            d.acp_session = None;
        }
    }

    /// The session's ACP session, made on first use: `initialize` and `session/new` on its own
    /// instance, then the chosen model through the agent's `model` config option.
    async fn ensure_acp_session(&self, s: &Arc<Session>, p: &Prompt) -> Result<String, TurnError> {
        let sid = s.server_id.clone();
        // No instance (a restart without a state dir kept only this side, or it was deleted):
        // a new one, which loads the session when the agent can.
        let mut previous = None;
        if self.acp.get(&sid).is_none() {
            let mut d = s.data();
            d.initialized = false;
            previous = d.acp_session.take();
        }
        let (initialized, existing, directory) = {
            let d = s.data();
            (d.initialized, d.acp_session.clone(), d.directory.clone())
        };
        if let Some(a) = existing {
            return Ok(a);
        }
        let agent = Some(p.provider.as_str());
        if !initialized {
            self.acp.open(&sid, agent)?;
            let init = json!({"jsonrpc": "2.0", "id": "oc-init", "method": "initialize",
                "params": {"protocolVersion": 1,
                    "clientCapabilities": {"fs": {"readTextFile": false, "writeTextFile": false},
                        "terminal": false},
                    "clientInfo": {"name": "sandbox-agent-opencode",
                        "version": env!("CARGO_PKG_VERSION")}}});
            let answer = match self.request(&sid, agent, &init).await {
                Ok(a) => a,
                Err(e) => {
                    self.acp.delete(&sid);
                    return Err(e);
                }
            };
            s.data().initialized = true;
            let can_load = answer
                .pointer("/agentCapabilities/loadSession")
                .and_then(Value::as_bool)
                .unwrap_or(false);
            if let Some(old) = previous.filter(|_| can_load) {
                let load = json!({"jsonrpc": "2.0", "id": "oc-load", "method": "session/load",
                    "params": {"sessionId": old, "cwd": directory, "mcpServers": []}});
                if self.request(&sid, agent, &load).await.is_ok() {
                    s.data().acp_session = Some(old.clone());
                    self.persist(s);
                    return Ok(old);
                }
            }
        }
        let new = json!({"jsonrpc": "2.0", "id": "oc-new", "method": "session/new",
            "params": {"cwd": directory, "mcpServers": []}});
        let answer = self.request(&sid, agent, &new).await?;
        let acp_session = answer
            .get("sessionId")
            .and_then(Value::as_str)
            .ok_or(TurnError::NoSessionId)?
            .to_string();
        self.learn_models(&p.provider, &answer);
        // The chosen model, when the agent offers it and it is not already current.
        if let Some((models, current, config_id)) = super::models::models_and_option(&answer)
            && current.as_deref() != Some(p.model.as_str())
            && models.iter().any(|m| m.id == p.model)
        {
            let line = match config_id {
                Some(config) => json!({"jsonrpc": "2.0", "id": "oc-model",
                    "method": "session/set_config_option",
                    "params": {"sessionId": acp_session, "configId": config, "value": p.model}}),
                None => json!({"jsonrpc": "2.0", "id": "oc-model",
                    "method": "session/set_model",
                    "params": {"sessionId": acp_session, "modelId": p.model}}),
            };
            self.request(&sid, agent, &line).await?;
        }
        s.data().acp_session = Some(acp_session.clone());
        self.persist(s);
        Ok(acp_session)
    }

    /// A request to the agent and its result (its error's message as `Err`).
    async fn request(
        &self,
        sid: &str,
        agent: Option<&str>,
        line: &Value,
    ) -> Result<Value, TurnError> {
        match self.post_line(sid, agent, line, true).await {
            Ok(Delivered::Response { line, .. }) => {
                let v: Value = serde_json::from_slice(&line).unwrap_or(Value::Null);
                match v.get("error") {
                    Some(e) => Err(TurnError::Agent(rpc_error_text(e))),
                    None => Ok(v.get("result").cloned().unwrap_or(Value::Null)),
                }
            }
            Ok(Delivered::Accepted) => Ok(Value::Null),
            Err(e) => Err(TurnError::Acp(e)),
        }
    }

    fn push_message(&self, s: &Session, msg: Msg) {
        let mut d = s.data();
        d.messages.push(msg);
        if d.messages.len() > MAX_MESSAGES {
            let extra = d.messages.len() - MAX_MESSAGES;
            d.messages.drain(..extra);
        }
    }

    fn with_message<R>(&self, s: &Session, id: &str, f: impl FnOnce(&mut Msg) -> R) -> Option<R> {
        let mut d = s.data();
        d.messages
            .iter_mut()
            .rev()
            .find(|m| m.info["id"] == id)
            .map(f)
    }

    /// Changes part `i` of message `msg` and emits it.
    fn edit_part(&self, s: &Session, msg: &str, i: usize, f: impl FnOnce(&mut Value)) {
        let part = self.with_message(s, msg, |m| {
            m.parts.get_mut(i).map(|part| {
                f(part);
                part.clone()
            })
        });
        if let Some(Some(part)) = part {
            self.emit(
                "message.part.updated",
                json!({"part": part, "sessionID": s.id, "messageID": msg}),
            );
        }
    }

    /// Appends a part (`None` past `MAX_PARTS`) and emits it.
    fn add_part(&self, s: &Session, msg: &str, mut part: Value) -> Option<usize> {
        part["id"] = json!(self.new_id("prt"));
        part["sessionID"] = json!(s.id);
        part["messageID"] = json!(msg);
        let i = self.with_message(s, msg, |m| {
            if m.parts.len() >= MAX_PARTS {
                return None;
            }
            m.parts.push(part.clone());
            Some(m.parts.len() - 1)
        })??;
        self.emit(
            "message.part.updated",
            json!({"part": part, "sessionID": s.id, "messageID": msg}),
        );
        Some(i)
    }

    fn close_open(&self, s: &Session, msg: &str, parts: &mut Parts) {
        if let Some((i, _)) = parts.open.take() {
            let now = now_ms();
            self.edit_part(s, msg, i, |part| part["time"]["end"] = json!(now));
        }
    }

    /// Text of an agent or thought chunk, appended to the open part of that kind.
    fn on_text(&self, s: &Session, msg: &str, kind: &'static str, text: &str, parts: &mut Parts) {
        if text.is_empty() {
            return;
        }
        if let Some((i, k)) = parts.open
            && k == kind
        {
            let delta = text.to_string();
            let part = self.with_message(s, msg, |m| {
                m.parts.get_mut(i).map(|part| {
                    let cur = part["text"].as_str().unwrap_or_default();
                    if cur.len() + delta.len() <= MAX_PART_TEXT {
                        part["text"] = json!(format!("{cur}{delta}"));
                    }
                    part.clone()
                })
            });
            if let Some(Some(part)) = part {
                self.emit(
                    "message.part.updated",
                    json!({"part": part, "delta": delta, "sessionID": s.id, "messageID": msg}),
                );
            }
            return;
        }
        self.close_open(s, msg, parts);
        let text: String = text.chars().take(MAX_PART_TEXT).collect();
        let part = json!({"type": kind, "text": text, "time": {"start": now_ms()}});
        if let Some(i) = self.add_part(s, msg, part) {
            parts.open = Some((i, kind));
        }
    }

    /// One line of the agent, read from the instance's event log during the turn.
    async fn on_agent_line(
        self: &Arc<Self>,
        s: &Arc<Session>,
        msg: &str,
        acp_session: &str,
        v: &Value,
        parts: &mut Parts,
    ) {
        let Some(method) = v.get("method").and_then(Value::as_str) else {
            return;
        };
        let params = v.get("params").unwrap_or(&Value::Null);
        if method == "$/cancel_request" {
            // The agent withdrew one of its requests (it names no session: the id does).
            if let Some(id) = params.get("id") {
                self.withdraw_pending(&s.server_id, id);
            }
            return;
        }
        if params.get("sessionId").and_then(Value::as_str) != Some(acp_session) {
            return;
        }
        match (method, v.get("id")) {
            ("session/update", None) => {
                let u = params.get("update").unwrap_or(&Value::Null);
                let text = u.pointer("/content/text").and_then(Value::as_str);
                match u.get("sessionUpdate").and_then(Value::as_str) {
                    Some("agent_message_chunk") => {
                        self.on_text(s, msg, "text", text.unwrap_or_default(), parts)
                    }
                    Some("agent_thought_chunk") => {
                        self.on_text(s, msg, "reasoning", text.unwrap_or_default(), parts)
                    }
                    Some("tool_call") | Some("tool_call_update") => self.on_tool(s, msg, u, parts),
                    Some("usage_update") => {
                        parts.used = u.get("used").and_then(Value::as_u64).or(parts.used);
                        if let Some(c) = u.pointer("/cost/amount").and_then(Value::as_f64) {
                            parts.agent_cost = Some(c);
                        }
                    }
                    Some("config_option_update") => {
                        let agent = s.data().provider.clone().unwrap_or_default();
                        self.learn_models(&agent, u);
                    }
                    _ => {}
                }
            }
            ("session/request_permission", Some(rpc_id)) => {
                self.on_permission(s, msg, params, rpc_id.clone()).await;
            }
            (_, Some(rpc_id)) => {
                // A request this client did not offer (it declares no fs or terminal): refuse it
                // so the agent does not wait for an answer that never comes.
                let line = json!({"jsonrpc": "2.0", "id": rpc_id,
                    "error": {"code": -32601, "message": format!("Method not found: {method}")}});
                let _ = self.post_line(&s.server_id, None, &line, false).await;
            }
            _ => {}
        }
    }

    fn on_tool(&self, s: &Session, msg: &str, u: &Value, parts: &mut Parts) {
        let Some(call) = u.get("toolCallId").and_then(Value::as_str) else {
            return;
        };
        let call = call.chars().take(200).collect::<String>();
        let mut acc = parts
            .tools
            .get(&call)
            .map(|(_, a)| a.clone())
            .unwrap_or_else(|| json!({"start": now_ms()}));
        for key in [
            "title",
            "kind",
            "status",
            "rawInput",
            "rawOutput",
            "content",
            "locations",
        ] {
            if let Some(v) = u.get(key)
                && !v.is_null()
            {
                acc[key] = v.clone();
            }
        }
        // Diffs: a file part and `file.edited` per path, once per turn.
        let mut files = Vec::new();
        if let Some(content) = acc["content"].as_array() {
            for c in content {
                if c.get("type").and_then(Value::as_str) == Some("diff")
                    && let Some(path) = c.get("path").and_then(Value::as_str)
                    && parts.edited.len() < 1000
                    && parts.edited.insert(path.to_string())
                {
                    files.push(path.to_string());
                }
            }
        }
        let state = tool_state(&acc);
        let tool = tool_name(&acc);
        match parts.tools.get(&call).map(|(i, _)| *i) {
            Some(i) => self.edit_part(s, msg, i, |part| {
                part["tool"] = json!(tool);
                part["state"] = state;
            }),
            None => {
                self.close_open(s, msg, parts);
                let part = json!({"type": "tool", "callID": call, "tool": tool, "state": state});
                if let Some(i) = self.add_part(s, msg, part) {
                    parts.tools.insert(call.clone(), (i, Value::Null));
                }
            }
        }
        if let Some(entry) = parts.tools.get_mut(&call) {
            entry.1 = acc;
        }
        for path in files {
            let name = std::path::Path::new(&path)
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_else(|| path.clone());
            self.add_part(
                s,
                msg,
                json!({"type": "file", "mime": "text/plain", "filename": name,
                    "url": format!("file://{path}"),
                    "source": {"type": "file", "path": path,
                        "text": {"value": "", "start": 0, "end": 0}}}),
            );
            self.emit("file.edited", json!({"file": path}));
        }
    }

    async fn on_permission(
        self: &Arc<Self>,
        s: &Arc<Session>,
        msg: &str,
        params: &Value,
        rpc_id: Value,
    ) {
        let tc = params.get("toolCall").unwrap_or(&Value::Null);
        let call = tc
            .get("toolCallId")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .chars()
            .take(200)
            .collect::<String>();
        let options: Vec<(String, String)> = params
            .get("options")
            .and_then(Value::as_array)
            .map(|a| {
                a.iter()
                    .take(16)
                    .filter_map(|o| {
                        Some((
                            o.get("optionId")?.as_str()?.to_string(),
                            o.get("kind")?.as_str()?.to_string(),
                        ))
                    })
                    .collect()
            })
            .unwrap_or_default();
        let questions = tc.pointer("/rawInput/questions").and_then(Value::as_array);
        let is_question = questions.is_some()
            || tc.get("title").and_then(Value::as_str) == Some("AskUserQuestion");
        let tool = json!({"messageID": msg, "callID": call});
        let (kind, permission, patterns, id) = if is_question {
            (
                AskKind::Question,
                "question".to_string(),
                vec!["*".to_string()],
                self.new_id("que"),
            )
        } else {
            let acc = json!({"kind": tc.get("kind"), "title": tc.get("title"),
                "rawInput": tc.get("rawInput"), "locations": tc.get("locations")});
            (
                AskKind::Permission,
                tool_name(&acc),
                permission_patterns(tc),
                self.new_id("per"),
            )
        };
        let body = if is_question {
            let qs: Vec<Value> = questions
                .map(|q| q.iter().take(16).map(question_shape).collect())
                .unwrap_or_default();
            json!({"id": id, "sessionID": s.id, "questions": qs, "tool": tool})
        } else {
            let title = tc
                .get("title")
                .and_then(Value::as_str)
                .unwrap_or(&permission);
            json!({"id": id, "sessionID": s.id, "permission": permission, "patterns": patterns,
                "metadata": {"toolCall": tc}, "always": patterns, "tool": tool,
                "type": permission, "pattern": patterns, "messageID": msg, "callID": call,
                "title": title, "time": {"created": now_ms()}})
        };
        let pending = Pending {
            id: id.clone(),
            kind,
            session: s.id.clone(),
            server_id: s.server_id.clone(),
            rpc_id,
            options,
            permission: permission.clone(),
            patterns: patterns.clone(),
            body: body.clone(),
        };
        // Rules first: the bypass mode, the session's rules (those it was created with, and
        // every "always").
        let (mode, verdict) = {
            let d = s.data();
            (
                d.permission_mode.clone(),
                evaluate(&d.rules, &permission, &patterns),
            )
        };
        let bypass = mode.as_deref() == Some("bypass") && kind == AskKind::Permission;
        match (bypass, verdict) {
            (true, _) | (_, Some(true)) if kind == AskKind::Permission => {
                self.answer(&pending, super::Answer::Allow { always: true })
                    .await;
                self.emit_replied(&pending, "always");
                return;
            }
            (_, Some(false)) => {
                self.answer(&pending, super::Answer::Reject).await;
                match kind {
                    AskKind::Permission => self.emit_replied(&pending, "reject"),
                    AskKind::Question => {
                        self.emit(
                            "question.rejected",
                            json!({"sessionID": s.id, "requestID": id}),
                        );
                    }
                }
                return;
            }
            _ => {}
        }
        let full = {
            let mut map = crate::sys::lock(&self.pending);
            let full = map.len() >= MAX_PENDING;
            if !full {
                map.insert(id, pending.clone());
            }
            full
        };
        if full {
            tracing::warn!(
                limit = MAX_PENDING,
                "too many OpenCode requests wait for an answer: cancelled"
            );
            self.answer(&pending, super::Answer::Cancelled).await;
            return;
        }
        match kind {
            AskKind::Permission => {
                self.emit("permission.asked", body.clone());
                self.emit("permission.updated", body);
            }
            AskKind::Question => {
                self.emit("question.asked", body);
            }
        }
    }
}

/// The user's parts (text and file; others are refused) as OpenCode and ACP shapes.
fn user_parts(body: &Value) -> Result<(Vec<Value>, Vec<Value>), OcError> {
    let Some(input) = body.get("parts").and_then(Value::as_array) else {
        return Err(OcError::BadRequest(
            "`parts` must be an array of parts".into(),
        ));
    };
    if input.len() > 256 {
        return Err(OcError::BadRequest("at most 256 parts per prompt".into()));
    }
    let mut parts = Vec::new();
    let mut blocks = Vec::new();
    for p in input {
        match p.get("type").and_then(Value::as_str) {
            Some("text") => {
                let text = p.get("text").and_then(Value::as_str).unwrap_or_default();
                parts.push(json!({"type": "text", "text": text}));
                if !p.get("synthetic").and_then(Value::as_bool).unwrap_or(false) || !text.is_empty()
                {
                    blocks.push(json!({"type": "text", "text": text}));
                }
            }
            Some("file") => {
                let url = p.get("url").and_then(Value::as_str).unwrap_or_default();
                let mime = p
                    .get("mime")
                    .and_then(Value::as_str)
                    .unwrap_or("text/plain");
                let name = p.get("filename").and_then(Value::as_str).unwrap_or(url);
                parts.push(json!({"type": "file", "mime": mime, "url": url, "filename": name}));
                blocks.push(json!({"type": "resource_link", "uri": url, "name": name,
                    "mimeType": mime}));
            }
            Some("agent") | Some("subtask") => {}
            _ => {
                return Err(OcError::BadRequest(
                    "a part's `type` must be text or file".into(),
                ));
            }
        }
    }
    Ok((parts, blocks))
}

/// A turn's tokens, as OpenCode counts them: the `usage` of the `session/prompt` answer when
/// the agent gave one (input, output, thought, cached read and write tokens); else the context
/// size of the turn's last `usage_update` as its input (what OpenCode's clients show as the
/// context in use); else none.
fn turn_tokens(parts: &Parts) -> super::Tokens {
    let n = |u: &Value, k: &str| u.get(k).and_then(Value::as_u64).unwrap_or(0);
    match (&parts.prompt_usage, parts.used) {
        (Some(u), _) => super::Tokens {
            input: n(u, "inputTokens"),
            output: n(u, "outputTokens"),
            reasoning: n(u, "thoughtTokens"),
            cache_read: n(u, "cachedReadTokens"),
            cache_write: n(u, "cachedWriteTokens"),
        },
        (None, Some(used)) => super::Tokens {
            input: used,
            ..Default::default()
        },
        (None, None) => super::Tokens::default(),
    }
}

fn rpc_error_text(e: &Value) -> String {
    let m = e.get("message").and_then(Value::as_str).unwrap_or("error");
    match e.get("data") {
        Some(d) if !d.is_null() => format!(
            "{m}: {}",
            d.to_string().chars().take(2000).collect::<String>()
        ),
        _ => m.to_string(),
    }
}

/// OpenCode's tool name for an ACP tool call: by its kind, else its title.
fn tool_name(acc: &Value) -> String {
    match acc.get("kind").and_then(Value::as_str) {
        Some("execute") => "bash".into(),
        Some("edit") | Some("delete") | Some("move") => "edit".into(),
        Some("read") => "read".into(),
        Some("fetch") => "webfetch".into(),
        Some("search") => "grep".into(),
        _ => acc
            .get("title")
            .and_then(Value::as_str)
            .map(|t| t.chars().take(100).collect())
            .unwrap_or_else(|| "tool".into()),
    }
}

/// OpenCode's `ToolState` from what the updates of a call said so far.
fn tool_state(acc: &Value) -> Value {
    let input = match acc.get("rawInput") {
        Some(Value::Object(o)) => Value::Object(o.clone()),
        _ => json!({}),
    };
    let title = acc
        .get("title")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string();
    let start = acc
        .get("start")
        .and_then(Value::as_u64)
        .unwrap_or_else(now_ms);
    let mut output = String::new();
    if let Some(content) = acc.get("content").and_then(Value::as_array) {
        for c in content {
            if let Some(t) = c.pointer("/content/text").and_then(Value::as_str) {
                output.push_str(t);
            } else if let Some(p) = c.get("path").and_then(Value::as_str) {
                output.push_str(&format!("edited {p}\n"));
            }
        }
    }
    if output.is_empty()
        && let Some(raw) = acc.get("rawOutput")
    {
        output = match raw {
            Value::String(s) => s.clone(),
            Value::Null => String::new(),
            other => other.to_string(),
        };
    }
    let output: String = output.chars().take(MAX_PART_TEXT).collect();
    match acc.get("status").and_then(Value::as_str) {
        Some("completed") => json!({"status": "completed", "input": input, "output": output,
            "title": title, "metadata": {}, "time": {"start": start, "end": now_ms()}}),
        Some("failed") => json!({"status": "error", "input": input,
            "error": if output.is_empty() { "the tool call failed".to_string() } else { output },
            "metadata": {}, "time": {"start": start, "end": now_ms()}}),
        Some("in_progress") => json!({"status": "running", "input": input, "title": title,
            "metadata": {}, "time": {"start": start}}),
        _ => json!({"status": "pending", "input": input, "raw": ""}),
    }
}

/// The patterns a permission request covers: its paths, else its command, else `*`.
fn permission_patterns(tc: &Value) -> Vec<String> {
    let mut out: Vec<String> = tc
        .get("locations")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .take(32)
                .filter_map(|l| l.get("path").and_then(Value::as_str).map(String::from))
                .collect()
        })
        .unwrap_or_default();
    if out.is_empty()
        && let Some(c) = tc.pointer("/rawInput/command").and_then(Value::as_str)
    {
        out.push(c.chars().take(1000).collect());
    }
    if out.is_empty() {
        out.push("*".into());
    }
    out
}

/// The rules' verdict on a request: `Some(true)` allow, `Some(false)` deny, `None` ask. The
/// last rule that matches a pattern decides for it; every pattern must be allowed.
fn evaluate(rules: &[super::Rule], permission: &str, patterns: &[String]) -> Option<bool> {
    let mut all_allowed = true;
    for pat in patterns {
        let rule = rules
            .iter()
            .rev()
            .find(|r| glob(&r.permission, permission) && glob(&r.pattern, pat));
        match rule.map(|r| r.action.as_str()) {
            Some("deny") => return Some(false),
            Some("allow") => {}
            _ => all_allowed = false,
        }
    }
    all_allowed.then_some(true)
}

/// `*` matches any run of characters; everything else itself. Iterative (no recursion).
fn glob(pattern: &str, text: &str) -> bool {
    let (p, t) = (pattern.as_bytes(), text.as_bytes());
    let (mut pi, mut ti) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while ti < t.len() {
        if pi < p.len() && p[pi] == b'*' {
            star = Some((pi, ti));
            pi += 1;
        } else if pi < p.len() && p[pi] == t[ti] {
            pi += 1;
            ti += 1;
        } else if let Some((sp, st)) = star {
            pi = sp + 1;
            ti = st + 1;
            star = Some((sp, st + 1));
        } else {
            return false;
        }
    }
    while pi < p.len() && p[pi] == b'*' {
        pi += 1;
    }
    pi == p.len()
}

/// One question of an `AskUserQuestion`-style tool input, as OpenCode's `QuestionInfo`.
fn question_shape(q: &Value) -> Value {
    let s = |k: &str| {
        q.get(k)
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string()
    };
    let options: Vec<Value> = q
        .get("options")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .take(32)
                .map(|o| {
                    let label = o
                        .get("label")
                        .and_then(Value::as_str)
                        .or_else(|| o.as_str())
                        .unwrap_or_default();
                    json!({"label": label,
                        "description": o.get("description").and_then(Value::as_str).unwrap_or_default()})
                })
                .collect()
        })
        .unwrap_or_default();
    json!({"question": s("question"), "header": s("header"), "options": options,
        "multiple": q.get("multiSelect").and_then(Value::as_bool).unwrap_or(false),
        "custom": true})
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn globs() {
        assert!(glob("*", "anything"));
        assert!(glob("/src/*.rs", "/src/a.rs"));
        assert!(!glob("/src/*.rs", "/src/a.ts"));
        assert!(glob("a*b*c", "aXXbYYc"));
        assert!(!glob("abc", "abcd"));
        assert!(glob("", ""));
    }

    #[test]
    fn rules_last_match_decides() {
        let r = |p: &str, pat: &str, a: &str| super::super::Rule {
            permission: p.into(),
            pattern: pat.into(),
            action: a.into(),
        };
        let rules = vec![r("*", "*", "deny"), r("bash", "ls*", "allow")];
        assert_eq!(evaluate(&rules, "bash", &["ls -l".into()]), Some(true));
        assert_eq!(evaluate(&rules, "bash", &["rm".into()]), Some(false));
        assert_eq!(evaluate(&[], "bash", &["rm".into()]), None);
    }
}
