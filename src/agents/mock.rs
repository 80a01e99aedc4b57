//! The built-in deterministic ACP agent (`sandbox-agent mock-agent`): JSON-RPC 2.0 lines on
//! stdin/stdout, with prompt commands that misbehave on purpose for tests and benchmarks.
//! Shares no code with `acp/` (a shared codec would hide a bug on both sides of the pipe); every
//! message goes out as one line with one write and one flush under a lock, so lines never interleave.
//! One concern although over 800 lines: one program, whose commands are one table of behaviours
//! that tests name (`sandbox-agent mock-agent --help` lists them); split, a command would be read
//! in one file and done in another.

use std::collections::HashMap;
use std::io::{BufRead, Write};
use std::process::{Child, Command, ExitCode, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{Value, json};

/// What a running prompt can be told while it waits.
enum Event {
    Cancel,
    /// The client's response to a request the prompt sent (`/permission`).
    Response(Value),
}

struct Running {
    session: String,
    tx: Sender<Event>,
}

#[derive(Default)]
struct Mock {
    out: Mutex<()>,
    next_session: AtomicU64,
    next_prompt: AtomicU64,
    next_request: AtomicU64,
    prompts: Mutex<HashMap<u64, Running>>,
    /// Our outgoing request id → the prompt waiting for its response.
    waiting: Mutex<HashMap<u64, Sender<Event>>>,
    /// Requests of `/permission-later` and `/question-later` (id → session, is a question):
    /// no turn waits for them; their answers are reported at the session's next prompt.
    later: Mutex<HashMap<u64, (String, bool)>>,
    /// Per session, the reports of those answers not yet told (at most `LATER_MAX`).
    told_later: Mutex<HashMap<String, Vec<String>>>,
    /// Children of `/fork` and memory of `/alloc`, held so they stay alive and counted.
    children: Mutex<Vec<Child>>,
    hoard: Mutex<Vec<Vec<u8>>>,
    /// Each known session's prompts, oldest first; also kept on disk (`SESSIONS_DIR`) so that a
    /// `session/load` in a later process (after a restart) has something to load.
    sessions: Mutex<HashMap<String, Vec<String>>>,
    load_session: bool,
    list_sessions: bool,
    resume_session: bool,
}

/// What the mock advertises and answers beyond its defaults.
#[derive(Debug, Clone, Copy)]
pub struct Options {
    /// Advertise and answer `session/load` (`--no-load-session` turns it off).
    pub load_session: bool,
    /// Advertise `sessionCapabilities.list` and answer `session/list` (`--list-sessions`).
    pub list_sessions: bool,
    /// Advertise `sessionCapabilities.resume` and answer `session/resume` (`--resume-session`).
    pub resume_session: bool,
}

/// Where the mock keeps its sessions, under its working directory: one JSON file per session.
const SESSIONS_DIR: &str = ".mock-agent-sessions";

/// Answers of `/permission-later` requests kept per session until its next prompt.
const LATER_MAX: usize = 16;

/// Prompts remembered per session, and bytes of each.
const HISTORY_MAX: usize = 100;
const PROMPT_MAX: usize = 4096;

/// A session id that can name a file: 1-128 of `[A-Za-z0-9._-]`, not starting with a dot.
fn session_file(id: &str) -> Option<std::path::PathBuf> {
    let ok = !id.is_empty()
        && id.len() <= 128
        && !id.starts_with('.')
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
    ok.then(|| std::path::Path::new(SESSIONS_DIR).join(format!("{id}.json")))
}

impl Mock {
    /// Writes a session's history to its file (through a temporary and a rename).
    fn save(&self, id: &str, history: &[String]) {
        let Some(path) = session_file(id) else { return };
        let _ = std::fs::create_dir_all(SESSIONS_DIR);
        let tmp = path.with_extension(format!("tmp{}", std::process::id()));
        let body = serde_json::to_vec(history).unwrap_or_default();
        if std::fs::write(&tmp, body).is_ok() {
            let _ = std::fs::rename(&tmp, &path);
        }
    }

    fn record_prompt(&self, id: &str, text: &str) {
        let mut sessions = crate::sys::lock(&self.sessions);
        let Some(h) = sessions.get_mut(id) else {
            return;
        };
        let mut t = text.to_string();
        if t.len() > PROMPT_MAX {
            let mut cut = PROMPT_MAX;
            while !t.is_char_boundary(cut) {
                cut -= 1;
            }
            t.truncate(cut);
        }
        h.push(t);
        if h.len() > HISTORY_MAX {
            h.remove(0);
        }
        let h = h.clone();
        drop(sessions);
        self.save(id, &h);
    }

    /// `session/load` (`replay`): the session's history from its file, replayed as updates,
    /// then the answer; `session/resume` the same without the replay.
    fn load(&self, id: &Value, params: &Value, replay: bool) {
        let sid = params
            .get("sessionId")
            .and_then(Value::as_str)
            .unwrap_or_default();
        let history = session_file(sid)
            .and_then(|p| std::fs::read(p).ok())
            .and_then(|b| serde_json::from_slice::<Vec<String>>(&b).ok());
        let Some(history) = history else {
            return self.error(id, -32602, &format!("unknown session `{sid}`"));
        };
        // What the client (or the daemon's restore) passed as MCP servers, for tests to read
        // (`<sessions dir>/<id>.mcp.json`).
        if let Some(p) = session_file(sid) {
            let servers = params.get("mcpServers").cloned().unwrap_or(Value::Null);
            let _ = std::fs::write(p.with_extension("mcp.json"), servers.to_string());
        }
        for text in history.iter().filter(|_| replay) {
            self.update(sid, "user_message_chunk", text);
            self.update(sid, "agent_message_chunk", text);
        }
        // New sessions of this process must not take the loaded one's id.
        if let Some(n) = sid
            .strip_prefix("mock-")
            .and_then(|n| n.parse::<u64>().ok())
        {
            self.next_session.fetch_max(n, Ordering::Relaxed);
        }
        crate::sys::lock(&self.sessions).insert(sid.to_string(), history);
        self.result(id, json!({}));
    }

    fn update(&self, session: &str, kind: &str, text: &str) {
        self.send(&json!({
            "jsonrpc": "2.0",
            "method": "session/update",
            "params": {
                "sessionId": session,
                "update": {"sessionUpdate": kind, "content": {"type": "text", "text": text}},
            },
        }));
    }
}

impl Mock {
    /// Writes one message as one line; the lock keeps concurrent prompts from interleaving.
    fn send(&self, msg: &Value) {
        let mut line = serde_json::to_vec(msg).unwrap_or_default();
        line.push(b'\n');
        self.send_raw(&line);
    }

    fn send_raw(&self, line: &[u8]) {
        let _guard = crate::sys::lock(&self.out);
        let mut out = std::io::stdout().lock();
        // A closed stdout means the client is gone; the read loop ends on stdin EOF soon after.
        let _ = out.write_all(line).and_then(|()| out.flush());
    }

    fn result(&self, id: &Value, result: Value) {
        self.send(&json!({"jsonrpc": "2.0", "id": id, "result": result}));
    }

    fn error(&self, id: &Value, code: i64, message: &str) {
        self.send(
            &json!({"jsonrpc": "2.0", "id": id, "error": {"code": code, "message": message}}),
        );
    }

    fn chunk(&self, session: &str, text: &str) {
        self.send(&json!({
            "jsonrpc": "2.0",
            "method": "session/update",
            "params": {
                "sessionId": session,
                "update": {
                    "sessionUpdate": "agent_message_chunk",
                    "content": {"type": "text", "text": text},
                },
            },
        }));
    }
}

pub fn run(options: Options) -> ExitCode {
    let mock = Arc::new(Mock {
        load_session: options.load_session,
        list_sessions: options.list_sessions,
        resume_session: options.resume_session,
        ..Mock::default()
    });
    let stdin = std::io::stdin();
    let mut input = stdin.lock();
    let mut line = String::new();
    loop {
        line.clear();
        match input.read_line(&mut line) {
            Ok(0) | Err(_) => return ExitCode::SUCCESS,
            Ok(_) => {}
        }
        let text = line.trim();
        if text.is_empty() {
            continue;
        }
        match serde_json::from_str::<Value>(text) {
            Ok(Value::Object(msg)) => handle(&mock, msg),
            _ => mock.error(&Value::Null, -32700, "Parse error"),
        }
    }
}

fn handle(mock: &Arc<Mock>, mut msg: serde_json::Map<String, Value>) {
    let id = msg.remove("id");
    let params = msg.remove("params").unwrap_or(Value::Null);
    let method = match msg.remove("method") {
        Some(Value::String(m)) => m,
        // A response from the client to one of our requests.
        _ => {
            let Some(n) = id.as_ref().and_then(Value::as_u64) else {
                return;
            };
            if let Some(tx) = crate::sys::lock(&mock.waiting).remove(&n) {
                let _ = tx.send(Event::Response(Value::Object(msg)));
            } else if let Some((session, question)) = crate::sys::lock(&mock.later).remove(&n) {
                let report = answer_report(&Value::Object(msg), question);
                let mut told = crate::sys::lock(&mock.told_later);
                let reports = told.entry(session).or_default();
                if reports.len() < LATER_MAX {
                    reports.push(report);
                }
            }
            return;
        }
    };
    let Some(id) = id else {
        if method == "session/cancel" {
            let session = params.get("sessionId").and_then(Value::as_str);
            for run in crate::sys::lock(&mock.prompts).values() {
                if session.is_none_or(|s| s == run.session) {
                    let _ = run.tx.send(Event::Cancel);
                }
            }
        }
        return;
    };
    match method.as_str() {
        "_mock/echo" => mock.result(&id, params),
        "initialize" => mock.result(
            &id,
            json!({
                "protocolVersion": 1,
                "agentCapabilities": {
                    "loadSession": mock.load_session,
                    "promptCapabilities": {"image": false, "audio": false, "embeddedContext": false},
                    "sessionCapabilities": session_capabilities(mock),
                },
                "agentInfo": {"name": "mock", "title": "Mock agent", "version": env!("CARGO_PKG_VERSION")},
                "authMethods": [],
            }),
        ),
        "session/new" => {
            let n = mock.next_session.fetch_add(1, Ordering::Relaxed) + 1;
            let sid = format!("mock-{n}");
            crate::sys::lock(&mock.sessions).insert(sid.clone(), Vec::new());
            mock.save(&sid, &[]);
            mock.result(&id, json!({"sessionId": sid, "configOptions": model_options(MODELS[0])}));
        }
        "session/set_config_option" => {
            let value = params.get("value").and_then(Value::as_str);
            let known = params.get("configId").and_then(Value::as_str) == Some("model");
            match value.filter(|v| known && MODELS.contains(v)) {
                Some(v) => mock.result(&id, json!({"configOptions": model_options(v)})),
                None => mock.error(&id, -32602, "unknown config option or value"),
            }
        }
        "session/load" if mock.load_session => mock.load(&id, &params, true),
        "session/resume" if mock.resume_session => mock.load(&id, &params, false),
        "session/list" if mock.list_sessions => {
            let mut ids: Vec<String> = crate::sys::lock(&mock.sessions).keys().cloned().collect();
            ids.sort();
            let cwd = std::env::current_dir()
                .map(|d| d.display().to_string())
                .unwrap_or_default();
            let sessions: Vec<Value> = ids
                .iter()
                .map(|s| json!({"sessionId": s, "cwd": cwd, "title": "listed by the mock"}))
                .collect();
            mock.result(&id, json!({"sessions": sessions}));
        }
        "session/close" | "session/delete" => {
            let sid = params.get("sessionId").and_then(Value::as_str).unwrap_or("");
            let known = crate::sys::lock(&mock.sessions).remove(sid).is_some();
            if method == "session/delete"
                && let Some(p) = session_file(sid)
            {
                let _ = std::fs::remove_file(p);
            }
            if known {
                mock.result(&id, json!({}));
            } else {
                mock.error(&id, -32602, &format!("unknown session `{sid}`"));
            }
        }
        "session/prompt" => start_prompt(mock, id, &params),
        _ => mock.error(&id, -32601, &format!("Method not found: {method}")),
    }
}

/// The `sessionCapabilities` the mock advertises (each an empty object when on).
fn session_capabilities(mock: &Mock) -> Value {
    let mut caps = serde_json::Map::new();
    if mock.list_sessions {
        caps.insert("list".into(), json!({}));
    }
    if mock.resume_session {
        caps.insert("resume".into(), json!({}));
    }
    Value::Object(caps)
}

/// The models the mock offers (its `model` config option); the first is the default.
const MODELS: [&str; 2] = ["mock", "mock-fast"];

/// The `configOptions` of a session whose model is `current`.
fn model_options(current: &str) -> Value {
    json!([{
        "id": "model",
        "name": "Model",
        "category": "model",
        "type": "select",
        "currentValue": current,
        "options": MODELS.iter().map(|m| json!({"value": m, "name": m})).collect::<Vec<_>>(),
    }])
}

/// Registers the prompt (so a `session/cancel` right behind it is seen) and runs it on its own
/// thread, so a sleeping or hanging prompt never blocks other requests.
fn start_prompt(mock: &Arc<Mock>, id: Value, params: &Value) {
    let session = params
        .get("sessionId")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string();
    let text = prompt_text(params.get("prompt"));
    // The request's `_meta` (e.g. the daemon's `traceparent`) is echoed back in the result's
    // `_meta.received`, so a test can see what reached the agent.
    let received_meta = params.get("_meta").cloned();
    let token = mock.next_prompt.fetch_add(1, Ordering::Relaxed);
    let (tx, rx) = mpsc::channel();
    crate::sys::lock(&mock.prompts).insert(
        token,
        Running {
            session: session.clone(),
            tx,
        },
    );
    let m = mock.clone();
    let spawned = std::thread::Builder::new()
        .name("prompt".into())
        .spawn(move || {
            let stop = run_prompt(&m, &session, &text, &rx);
            m.record_prompt(&session, &text);
            crate::sys::lock(&m.prompts).remove(&token);
            if stop == FAIL {
                return m.error(&id, -32603, "mock: the turn failed (/error)");
            }
            let mut result = json!({"stopReason": stop});
            if let Some(meta) = received_meta {
                result["_meta"] = json!({"received": meta});
            }
            m.result(&id, result);
        });
    if let Err(e) = spawned {
        crate::sys::lock(&mock.prompts).remove(&token);
        eprintln!("mock: cannot start a prompt thread: {e}");
    }
}

/// The prompt's text: its text blocks joined (a bare string is accepted too).
fn prompt_text(prompt: Option<&Value>) -> String {
    match prompt {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Array(blocks)) => blocks
            .iter()
            .filter_map(|b| b.get("text").and_then(Value::as_str))
            .collect::<Vec<_>>()
            .join(""),
        _ => String::new(),
    }
}

/// The stop reason `run_prompt` gives for a turn that must end with a JSON-RPC error.
const FAIL: &str = "\0fail";

/// Runs one prompt and returns its stop reason (or `FAIL`).
fn run_prompt(mock: &Mock, session: &str, text: &str, rx: &Receiver<Event>) -> &'static str {
    let (command, arg) = match text.trim_start().split_once(char::is_whitespace) {
        Some((c, a)) => (c, a.trim()),
        None => (text.trim(), ""),
    };
    // A whole prompt of one of these bare words acts as the command (what OpenCode
    // compatibility suites send: they expect the prompt to come back while the request waits).
    let command = match command {
        "tool" | "error" | "permission" | "question" if arg.is_empty() => match command {
            "tool" => "/tool",
            "error" => "/error",
            "permission" => "/permission-later",
            _ => "/question-later",
        },
        c => c,
    };
    // What the client answered to this session's earlier `-later` requests.
    let told = crate::sys::lock(&mock.told_later).remove(session);
    for report in told.unwrap_or_default() {
        mock.chunk(session, &format!("earlier {report}"));
    }
    let cancelled = |r: Result<Event, RecvTimeoutError>| matches!(r, Ok(Event::Cancel));
    match command {
        "/stream" => {
            let n: u64 = arg.parse().unwrap_or(1);
            for i in 1..=n {
                if matches!(rx.try_recv(), Ok(Event::Cancel)) {
                    return "cancelled";
                }
                mock.chunk(session, &format!("chunk {i} of {n}"));
            }
        }
        "/sleep" => {
            let ms = arg.parse().unwrap_or(0);
            if cancelled(rx.recv_timeout(Duration::from_millis(ms))) {
                return "cancelled";
            }
        }
        "/hang" => loop {
            match rx.recv() {
                Ok(Event::Cancel) | Err(_) => return "cancelled",
                Ok(Event::Response(_)) => {}
            }
        },
        "/crash" => {
            let code = arg.parse().unwrap_or(1);
            // Hold the output lock so no half-written line is left behind.
            let _guard = crate::sys::lock(&mock.out);
            std::process::exit(code);
        }
        "/stderr" => {
            let mut err = std::io::stderr().lock();
            let _ = writeln!(err, "{arg}").and_then(|()| err.flush());
        }
        "/garbage" => mock.send_raw(b"this line is not JSON {\n"),
        // The session's earlier prompts (what a `session/load` brought back, after a restart).
        "/title" => mock.send(&json!({
            "jsonrpc": "2.0",
            "method": "session/update",
            "params": {
                "sessionId": session,
                "update": {"sessionUpdate": "session_info_update", "title": arg},
            },
        })),
        "/usage" => {
            let mut words = arg.split_whitespace();
            let mut int = || {
                words
                    .next()
                    .and_then(|w| w.parse::<u64>().ok())
                    .unwrap_or(0)
            };
            let (used, size) = (int(), int());
            let cost = words.next().and_then(|w| w.parse::<f64>().ok());
            let mut update = json!({"sessionUpdate": "usage_update", "used": used, "size": size});
            if let Some(c) = cost {
                update["cost"] = json!({"amount": c, "currency": "USD"});
            }
            mock.send(&json!({
                "jsonrpc": "2.0",
                "method": "session/update",
                "params": {"sessionId": session, "update": update},
            }));
        }
        "/history" => {
            let h = crate::sys::lock(&mock.sessions).get(session).cloned();
            let text = match h {
                Some(h) => format!("history: {}", h.join(" | ")),
                None => format!("unknown session `{session}`"),
            };
            mock.chunk(session, &text);
        }
        "/permission" => return permission(mock, session, rx, false),
        "/elicit" => return elicit(mock, session, rx),
        "/withdraw" => {
            let n = mock.next_request.fetch_add(1, Ordering::Relaxed) + 1;
            let tool_call = if arg == "question" {
                question_call(n)
            } else {
                json!({"toolCallId": format!("mock-tool-{n}"), "title": "Withdrawn tool call", "kind": "execute"})
            };
            mock.send(&json!({
                "jsonrpc": "2.0",
                "id": n,
                "method": "session/request_permission",
                "params": {
                    "sessionId": session,
                    "toolCall": tool_call,
                    "options": [{"optionId": "allow-once", "name": "Allow once", "kind": "allow_once"}],
                },
            }));
            let on_cancel = arg == "on-cancel";
            // `on-cancel`: withdrawn only once the turn is cancelled (`session/cancel`).
            if on_cancel {
                while let Ok(Event::Response(_)) = rx.recv() {}
            }
            mock.send(
                &json!({"jsonrpc": "2.0", "method": "$/cancel_request", "params": {"id": n}}),
            );
            mock.chunk(session, "withdrawn");
            if on_cancel {
                return "cancelled";
            }
        }
        "/question" => return permission(mock, session, rx, true),
        "/permission-later" | "/question-later" => {
            let question = command == "/question-later";
            ask(mock, session, question);
            let what = if question { "question" } else { "permission" };
            mock.chunk(
                session,
                &format!("asked for {what}; the answer comes later"),
            );
        }
        "/error" => return FAIL,
        "/tool" => tool(mock, session, arg),
        "/spawn-orphan" => match spawn_orphan() {
            Ok(pid) => {
                eprintln!("mock: orphan pid {pid}");
                mock.chunk(session, &format!("orphan pid {pid}"));
            }
            Err(e) => mock.chunk(session, &format!("orphan failed: {e}")),
        },
        "/ignore-term" => match crate::sys::ignore_sigterm() {
            Ok(()) => mock.chunk(session, "ignoring SIGTERM"),
            Err(e) => mock.chunk(session, &format!("cannot ignore SIGTERM: {e}")),
        },
        "/fork" => {
            let n: u64 = arg.parse().unwrap_or(1);
            let mut started = 0;
            let mut failure = None;
            for _ in 0..n {
                match sleeper().spawn() {
                    Ok(child) => {
                        crate::sys::lock(&mock.children).push(child);
                        started += 1;
                    }
                    Err(e) => {
                        failure = Some(e);
                        break;
                    }
                }
            }
            let text = match failure {
                Some(e) => format!("forked {started} of {n}: {e}"),
                None => format!("forked {started} of {n}"),
            };
            eprintln!("mock: {text}");
            mock.chunk(session, &text);
        }
        "/alloc" => {
            let mb: usize = arg.parse().unwrap_or(0);
            let mut block = vec![0u8; mb * 1024 * 1024];
            // Touch every page so the memory is really resident, not just reserved.
            for i in (0..block.len()).step_by(4096) {
                block[i] = 1;
            }
            crate::sys::lock(&mock.hoard).push(block);
            mock.chunk(session, &format!("allocated {mb} MiB"));
        }
        _ => mock.chunk(session, text),
    }
    "end_turn"
}

/// A tool call that edits a file: `tool_call` (pending), `tool_call_update` (in progress), then
/// `tool_call_update` (completed) whose content is a diff of `PATH` (default `mock-edit.txt`
/// under the working directory). Nothing is written to disk.
fn tool(mock: &Mock, session: &str, arg: &str) {
    let n = mock.next_request.fetch_add(1, Ordering::Relaxed) + 1;
    let call = format!("mock-edit-{n}");
    let name = if arg.is_empty() { "mock-edit.txt" } else { arg };
    let path = std::env::current_dir()
        .map(|d| d.join(name))
        .unwrap_or_else(|_| std::path::PathBuf::from(name))
        .to_string_lossy()
        .into_owned();
    let update = |u: Value| {
        mock.send(&json!({
            "jsonrpc": "2.0",
            "method": "session/update",
            "params": {"sessionId": session, "update": u},
        }));
    };
    mock.chunk(session, "editing a file");
    update(json!({
        "sessionUpdate": "tool_call",
        "toolCallId": call,
        "title": format!("Edit {name}"),
        "kind": "edit",
        "status": "pending",
        "rawInput": {"path": path},
        "locations": [{"path": path}],
    }));
    update(
        json!({"sessionUpdate": "tool_call_update", "toolCallId": call, "status": "in_progress"}),
    );
    update(json!({
        "sessionUpdate": "tool_call_update",
        "toolCallId": call,
        "status": "completed",
        "content": [{"type": "diff", "path": path, "oldText": "old\n", "newText": "new\n"}],
    }));
    mock.chunk(session, &format!("edited {name}"));
}

/// Asks the client for permission and reports the option it chose. `question`: the request is
/// a question (a `toolCall` titled `AskUserQuestion` whose `rawInput.questions` lists them); the
/// chunk then reports `answer: …` from the result's `_meta.answers` when there is one.
/// `/elicit`: the request `elicitation/create` (a message and a schema of one string field) to
/// the client; the chunk `elicitation: ACTION VALUE` reports the answer.
fn elicit(mock: &Mock, session: &str, rx: &Receiver<Event>) -> &'static str {
    let n = mock.next_request.fetch_add(1, Ordering::Relaxed) + 1;
    let (tx, answer) = mpsc::channel();
    crate::sys::lock(&mock.waiting).insert(n, tx);
    mock.send(&json!({
        "jsonrpc": "2.0",
        "id": n,
        "method": "elicitation/create",
        "params": {
            "sessionId": session,
            "message": "Which branch should I use?",
            "requestedSchema": {
                "type": "object",
                "properties": {"branch": {"type": "string", "title": "Branch"}},
                "required": ["branch"],
            },
        },
    }));
    let response = loop {
        match answer.recv_timeout(Duration::from_millis(20)) {
            Ok(Event::Response(r)) => break r,
            Ok(Event::Cancel) | Err(RecvTimeoutError::Disconnected) => break Value::Null,
            Err(RecvTimeoutError::Timeout) => {}
        }
        if matches!(rx.try_recv(), Ok(Event::Cancel)) {
            crate::sys::lock(&mock.waiting).remove(&n);
            return "cancelled";
        }
    };
    let result = &response["result"];
    let action = result["action"].as_str().unwrap_or("none");
    let value = result["content"]["branch"].as_str().unwrap_or("");
    mock.chunk(session, &format!("elicitation: {action} {value}"));
    "end_turn"
}

/// The tool call of the mock's question (`/question`): one question, Yes or No.
fn question_call(n: u64) -> Value {
    json!({
        "toolCallId": format!("mock-question-{n}"),
        "title": "AskUserQuestion",
        "kind": "other",
        "rawInput": {"questions": [{
            "question": "Proceed?",
            "header": "Confirm",
            "options": [
                {"label": "Yes", "description": "Go on"},
                {"label": "No", "description": "Stop here"},
            ],
            "multiSelect": false,
        }]},
    })
}

fn permission(mock: &Mock, session: &str, rx: &Receiver<Event>, question: bool) -> &'static str {
    let (tx, answer) = mpsc::channel();
    // Registered before the request goes out, so its answer cannot come first.
    let n = mock.next_request.fetch_add(1, Ordering::Relaxed) + 1;
    crate::sys::lock(&mock.waiting).insert(n, tx);
    send_ask(mock, session, question, n);
    // Wait on both channels: the response comes through `answer`, a cancel through `rx`.
    let response = loop {
        match answer.recv_timeout(Duration::from_millis(20)) {
            Ok(Event::Response(r)) => break r,
            Ok(Event::Cancel) | Err(RecvTimeoutError::Disconnected) => break Value::Null,
            Err(RecvTimeoutError::Timeout) => {}
        }
        if matches!(rx.try_recv(), Ok(Event::Cancel)) {
            crate::sys::lock(&mock.waiting).remove(&n);
            return "cancelled";
        }
    };
    mock.chunk(session, &answer_report(&response, question));
    "end_turn"
}

/// Sends a request no turn waits for (`/permission-later`); its answer is kept for the
/// session's next prompt (of at most 1024 unanswered ones; beyond, it is not reported).
fn ask(mock: &Mock, session: &str, question: bool) {
    let n = mock.next_request.fetch_add(1, Ordering::Relaxed) + 1;
    {
        let mut later = crate::sys::lock(&mock.later);
        if later.len() < 1024 {
            later.insert(n, (session.to_string(), question));
        }
    }
    send_ask(mock, session, question, n);
}

/// The `session/request_permission` of `/permission` (a question's: titled `AskUserQuestion`).
fn send_ask(mock: &Mock, session: &str, question: bool, n: u64) {
    let tool_call = if question {
        question_call(n)
    } else {
        json!({"toolCallId": format!("mock-tool-{n}"), "title": "Mock tool call", "kind": "execute"})
    };
    mock.send(&json!({
        "jsonrpc": "2.0",
        "id": n,
        "method": "session/request_permission",
        "params": {
            "sessionId": session,
            "toolCall": tool_call,
            "options": [
                {"optionId": "allow-once", "name": "Allow once", "kind": "allow_once"},
                {"optionId": "allow-always", "name": "Always allow", "kind": "allow_always"},
                {"optionId": "reject-once", "name": "Reject", "kind": "reject_once"},
            ],
        },
    }));
}

/// What the client answered, as the mock reports it: `permission: OPTION` (or the outcome, or
/// `error`), for a question with answers `answer: […]`.
fn answer_report(response: &Value, question: bool) -> String {
    let outcome = response.pointer("/result/outcome");
    let chosen = match outcome
        .and_then(|o| o.get("optionId"))
        .and_then(Value::as_str)
    {
        Some(option) => option.to_string(),
        None => match outcome
            .and_then(|o| o.get("outcome"))
            .and_then(Value::as_str)
        {
            Some(other) => other.to_string(),
            None => "error".to_string(),
        },
    };
    let answers = response
        .pointer("/result/_meta/answers")
        .filter(|_| question);
    match answers {
        Some(a) => format!("answer: {a}"),
        None => format!("permission: {chosen}"),
    }
}

/// A child that sleeps until killed, with no pipes of ours (it must not hold stdout open).
fn sleeper() -> Command {
    let mut cmd = Command::new(if std::path::Path::new("/bin/sleep").exists() {
        "/bin/sleep"
    } else {
        "sleep"
    });
    cmd.arg("100000")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    cmd
}

/// Starts a sleeper in a new session (setsid), out of our process group; returns its pid.
fn spawn_orphan() -> std::io::Result<u32> {
    let mut cmd = sleeper();
    crate::sys::new_session_on_exec(&mut cmd);
    let child = cmd.spawn()?;
    let pid = child.id();
    // Reap it in the background if it ever ends while we live; otherwise it outlives us.
    std::thread::spawn(move || {
        let mut child = child;
        let _ = child.wait();
    });
    Ok(pid)
}
