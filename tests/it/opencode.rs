//! The OpenCode bridge (`/opencode/*`) against the real binary and the mock agent: sessions and
//! their auth (basic password and bearer), the turn's event order with two sessions prompting at
//! once (one `session.idle` per turn), tool and file parts, failed turns, permissions answered
//! once, always (remembered) and rejected, questions, the model lock, a restart on a state dir in
//! the middle of a session, and the `opencode` CLI's `run --attach` (tests/opencode; the
//! `@opencode-ai/sdk` suites run from `opencode_sdk_suites_pass`).

use std::collections::HashMap;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use base64::Engine as _;
use futures_util::StreamExt;
use serde_json::{Value, json};

use crate::support::{BIN, Daemon, on_path, skip};

pub(crate) const TOKEN: &str = "oc-secret-token";
pub(crate) const WAIT: Duration = Duration::from_secs(20);

pub(crate) fn daemon() -> Daemon {
    Daemon::builder().token(TOKEN).start()
}

pub(crate) fn basic(password: &str) -> String {
    let creds = base64::engine::general_purpose::STANDARD.encode(format!("opencode:{password}"));
    format!("Basic {creds}")
}

/// One OpenCode call with the token as a basic password (as OpenCode's clients send it):
/// (status, JSON body or Null).
pub(crate) async fn call(
    d: &Daemon,
    method: &str,
    path: &str,
    body: Option<Value>,
) -> (u16, Value) {
    let client = crate::support::http();
    let mut req = client
        .request(method.parse().unwrap(), d.url(&format!("/opencode{path}")))
        .header("authorization", basic(TOKEN));
    if let Some(b) = body {
        req = req
            .header("content-type", "application/json")
            .body(b.to_string());
    }
    let resp = req.send().await.expect("request");
    let status = resp.status().as_u16();
    let text = resp.text().await.unwrap_or_default();
    (status, serde_json::from_str(&text).unwrap_or(Value::Null))
}

/// The `/event` stream, read by a task into a channel.
pub(crate) struct Events {
    rx: tokio::sync::mpsc::UnboundedReceiver<Value>,
    pub(crate) seen: Vec<Value>,
}

impl Events {
    pub(crate) async fn open(d: &Daemon, path: &str) -> Events {
        let resp = crate::support::http()
            .get(d.url(&format!("/opencode{path}")))
            .header("authorization", format!("Bearer {TOKEN}"))
            .send()
            .await
            .expect("event stream");
        assert_eq!(resp.status(), 200);
        assert_eq!(resp.headers()["content-type"], "text/event-stream");
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        tokio::spawn(async move {
            let mut body = resp.bytes_stream();
            let mut buf = Vec::new();
            while let Some(Ok(chunk)) = body.next().await {
                buf.extend_from_slice(&chunk);
                while let Some(end) = buf.windows(2).position(|w| w == b"\n\n") {
                    let frame: Vec<u8> = buf.drain(..end + 2).collect();
                    let text = String::from_utf8_lossy(&frame);
                    for line in text.lines() {
                        if let Some(data) = line.strip_prefix("data: ")
                            && let Ok(v) = serde_json::from_str::<Value>(data)
                            && tx.send(v).is_err()
                        {
                            return;
                        }
                    }
                }
            }
        });
        let mut ev = Events {
            rx,
            seen: Vec::new(),
        };
        // The stream is live once its first event arrived.
        let first = ev
            .until(|e| {
                e["type"] == "server.connected" || e["payload"]["type"] == "server.connected"
            })
            .await;
        assert!(first.is_object());
        ev
    }

    /// Reads until an event matches; every event read is kept in `seen`.
    pub(crate) async fn until(&mut self, pred: impl Fn(&Value) -> bool) -> Value {
        self.until_for(WAIT, pred).await
    }

    /// Reads what arrives until the stream has been quiet for `quiet`, into `seen`.
    pub(crate) async fn settle(&mut self, quiet: Duration) {
        while let Ok(Some(e)) = tokio::time::timeout(quiet, self.rx.recv()).await {
            self.seen.push(e);
        }
    }

    /// `until` with its own time limit (a real agent is slower than the mock).
    pub(crate) async fn until_for(
        &mut self,
        limit: Duration,
        pred: impl Fn(&Value) -> bool,
    ) -> Value {
        let deadline = Instant::now() + limit;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match tokio::time::timeout(left, self.rx.recv()).await {
                Ok(Some(e)) => {
                    self.seen.push(e.clone());
                    if pred(&e) {
                        return e;
                    }
                }
                _ => panic!(
                    "no matching event within {limit:?}; seen: {}",
                    serde_json::to_string_pretty(&self.seen).unwrap()
                ),
            }
        }
    }

    /// The events seen so far about `session`, as their types.
    fn of(&self, session: &str) -> Vec<&Value> {
        self.seen
            .iter()
            .filter(|e| session_of(e) == Some(session))
            .collect()
    }
}

pub(crate) fn session_of(e: &Value) -> Option<&str> {
    let p = &e["properties"];
    p["sessionID"]
        .as_str()
        .or_else(|| p["info"]["sessionID"].as_str())
        .or_else(|| p["part"]["sessionID"].as_str())
        .or_else(|| {
            p["info"]["id"].as_str().filter(|_| {
                e["type"]
                    .as_str()
                    .is_some_and(|t| t.starts_with("session."))
            })
        })
}

pub(crate) async fn create(d: &Daemon, body: Value) -> String {
    let (s, b) = call(d, "POST", "/session", Some(body)).await;
    assert_eq!(s, 200, "{b}");
    b["id"].as_str().expect("an id").to_string()
}

pub(crate) fn prompt_body(text: &str) -> Value {
    json!({"model": {"providerID": "mock", "modelID": "mock"},
        "parts": [{"type": "text", "text": text}]})
}

/// The text of a message's text parts, joined.
pub(crate) fn text_of(msg: &Value) -> String {
    msg["parts"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|p| p["type"] == "text")
        .filter_map(|p| p["text"].as_str())
        .collect::<Vec<_>>()
        .join("")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn opencode_sessions_crud_auth_and_the_backing_instance() {
    let d = daemon();
    // Auth: the token as basic password or bearer; nothing else.
    let url = d.url("/opencode/session");
    let http = crate::support::http();
    for (header, want) in [
        (None, 401),
        (Some(basic("wrong")), 401),
        (Some(format!("Bearer {TOKEN}")), 200),
        (Some(basic(TOKEN)), 200),
    ] {
        let mut req = http.get(&url);
        if let Some(h) = header {
            req = req.header("authorization", h);
        }
        let resp = req.send().await.unwrap();
        assert_eq!(resp.status().as_u16(), want);
        if want == 401 {
            assert_eq!(resp.headers()["content-type"], "application/problem+json");
        }
    }

    let (_, list) = call(&d, "GET", "/session", None).await;
    assert_eq!(list, json!([]));
    let a = create(&d, json!({"title": "First"})).await;
    let b = create(&d, json!({})).await;
    assert!(
        a.starts_with("ses_") && b > a,
        "ids sort in creation order: {a} {b}"
    );
    let (_, list) = call(&d, "GET", "/session", None).await;
    assert_eq!(list.as_array().unwrap().len(), 2);
    let (s, got) = call(&d, "GET", &format!("/session/{a}"), None).await;
    assert_eq!((s, &got["title"]), (200, &json!("First")));

    let (s, upd) = call(
        &d,
        "PATCH",
        &format!("/session/{a}"),
        Some(json!({"title": "Renamed"})),
    )
    .await;
    assert_eq!((s, &upd["title"]), (200, &json!("Renamed")));
    // A model change is refused in OpenCode's error shape, with what to do instead.
    let (s, err) = call(
        &d,
        "PATCH",
        &format!("/session/{a}"),
        Some(json!({"providerID": "codex", "modelID": "gpt-5"})),
    )
    .await;
    assert_eq!(s, 400);
    assert!(
        err["errors"][0]["message"]
            .as_str()
            .unwrap()
            .contains("new session"),
        "{err}"
    );
    // Bodies that are not JSON objects: 400, not a panic.
    for bad in ["[1]", "{", "\"x\"", "null"] {
        let resp = http
            .post(d.url("/opencode/session"))
            .header("authorization", basic(TOKEN))
            .header("content-type", "application/json")
            .body(bad)
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 400, "{bad}");
    }

    // A prompt makes the session's ACP instance, listed like any other.
    let (s, msg) = call(
        &d,
        "POST",
        &format!("/session/{a}/message"),
        Some(prompt_body("hello bridge")),
    )
    .await;
    assert_eq!(s, 200, "{msg}");
    assert_eq!(text_of(&msg), "hello bridge");
    assert_eq!(msg["info"]["role"], "assistant");
    assert_eq!(msg["info"]["providerID"], "mock");
    let servers = d.servers().await;
    let row = servers
        .iter()
        .find(|r| r["serverId"] == format!("opencode-{a}"))
        .unwrap_or_else(|| panic!("no instance for {a}: {servers:?}"));
    assert_eq!(row["agent"], "mock");
    assert_eq!(row["status"], "running");
    // The model is locked after the first prompt.
    let (s, err) = call(
        &d,
        "POST",
        &format!("/session/{a}/message"),
        Some(
            json!({"model": {"providerID": "mock", "modelID": "mock-fast"},
            "parts": [{"type": "text", "text": "x"}]}),
        ),
    )
    .await;
    assert_eq!(s, 400, "{err}");
    let (_, msgs) = call(&d, "GET", &format!("/session/{a}/message"), None).await;
    let msgs = msgs.as_array().unwrap();
    assert_eq!(msgs.len(), 2);
    let id = msgs[1]["info"]["id"].as_str().unwrap();
    let (s, one) = call(&d, "GET", &format!("/session/{a}/message/{id}"), None).await;
    assert_eq!((s, text_of(&one)), (200, "hello bridge".to_string()));

    let (s, _) = call(&d, "DELETE", &format!("/session/{a}"), None).await;
    assert_eq!(s, 200);
    let (s, err) = call(&d, "GET", &format!("/session/{a}"), None).await;
    assert_eq!((s, &err["name"]), (404, &json!("NotFoundError")));
    crate::support::eventually_async(WAIT, "the deleted session's instance is gone", || async {
        let gone = !d
            .servers()
            .await
            .iter()
            .any(|r| r["serverId"] == format!("opencode-{a}"));
        gone.then_some(())
    })
    .await;
    let (s, got) = call(&d, "GET", &format!("/session/{b}"), None).await;
    assert_eq!((s, &got["id"]), (200, &json!(b)));
}

/// Two sessions prompting at once: each turn's events come in order (busy, the user message,
/// the assistant message, its parts, completed, idle) with exactly one `session.idle` each.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn opencode_turns_of_two_concurrent_sessions_keep_their_event_order() {
    let d = daemon();
    let mut ev = Events::open(&d, "/event").await;
    let a = create(&d, json!({"title": "A"})).await;
    let b = create(&d, json!({"title": "B"})).await;
    let (pa, pb) = (
        format!("/session/{a}/message"),
        format!("/session/{b}/message"),
    );
    let (ra, rb) = tokio::join!(
        call(&d, "POST", &pa, Some(prompt_body("/stream 5"))),
        call(&d, "POST", &pb, Some(prompt_body("tool"))),
    );
    assert_eq!(ra.0, 200, "{}", ra.1);
    assert_eq!(rb.0, 200, "{}", rb.1);
    assert_eq!(
        text_of(&ra.1),
        (1..=5)
            .map(|i| format!("chunk {i} of 5"))
            .collect::<String>()
    );
    // A marker after both turns: everything of theirs was published before it.
    let c = create(&d, json!({"title": "marker"})).await;
    ev.until(|e| e["type"] == "session.created" && e["properties"]["info"]["id"] == c)
        .await;

    for (sid, msg) in [(&a, &ra.1), (&b, &rb.1)] {
        let events = ev.of(sid);
        let types: Vec<&str> = events.iter().map(|e| e["type"].as_str().unwrap()).collect();
        assert_eq!(
            types.iter().filter(|t| **t == "session.idle").count(),
            1,
            "{types:?}"
        );
        assert_eq!(types.last(), Some(&"session.idle"), "{types:?}");
        let busy = types.iter().position(|t| *t == "session.status").unwrap();
        assert_eq!(events[busy]["properties"]["status"]["type"], "busy");
        let idle_status = types.len() - 2;
        assert_eq!(types[idle_status], "session.status");
        assert_eq!(events[idle_status]["properties"]["status"]["type"], "idle");
        assert!(!types.contains(&"session.error"), "{types:?}");
        // Every part update is between busy and idle, and the parts' first appearance is the
        // order of the answered message's parts.
        let mut first_seen: Vec<String> = Vec::new();
        for (i, e) in events.iter().enumerate() {
            if e["type"] == "message.part.updated"
                && e["properties"]["part"]["messageID"] == msg["info"]["id"]
            {
                assert!(i > busy && i < idle_status, "{types:?}");
                let pid = e["properties"]["part"]["id"].as_str().unwrap().to_string();
                if !first_seen.contains(&pid) {
                    first_seen.push(pid);
                }
            }
        }
        let answered: Vec<String> = msg["parts"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p["id"].as_str().unwrap().to_string())
            .collect();
        assert_eq!(first_seen, answered);
        // The last message.updated of the turn is the completed assistant message.
        let done = events
            .iter()
            .rev()
            .find(|e| e["type"] == "message.updated")
            .unwrap();
        assert_eq!(done["properties"]["info"]["id"], msg["info"]["id"]);
        assert!(done["properties"]["info"]["time"]["completed"].is_u64());
    }
    // The tool turn: a tool part (completed), a file part, and file.edited for its path.
    let parts = rb.1["parts"].as_array().unwrap();
    let tool = parts
        .iter()
        .find(|p| p["type"] == "tool")
        .expect("a tool part");
    assert_eq!(tool["state"]["status"], "completed", "{tool}");
    assert_eq!(tool["tool"], "edit");
    let file = parts
        .iter()
        .find(|p| p["type"] == "file")
        .expect("a file part");
    assert_eq!(file["filename"], "mock-edit.txt");
    let edited = ev
        .seen
        .iter()
        .find(|e| e["type"] == "file.edited")
        .expect("file.edited");
    assert!(
        edited["properties"]["file"]
            .as_str()
            .unwrap()
            .ends_with("/mock-edit.txt")
    );
    let kinds: Vec<&str> = parts.iter().map(|p| p["type"].as_str().unwrap()).collect();
    assert_eq!(kinds, ["text", "tool", "file", "text"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn opencode_failed_turns_say_so_and_end_idle_once() {
    let d = daemon();
    let mut ev = Events::open(&d, "/global/event").await;
    let s = create(&d, json!({})).await;
    let (st, msg) = call(
        &d,
        "POST",
        &format!("/session/{s}/message"),
        Some(prompt_body("error")),
    )
    .await;
    assert_eq!(st, 200);
    assert_eq!(msg["info"]["error"]["name"], "UnknownError", "{msg}");
    assert!(
        msg["info"]["error"]["data"]["message"]
            .as_str()
            .unwrap()
            .contains("failed")
    );
    ev.until(|e| e["payload"]["type"] == "session.idle").await;
    let errors: Vec<&Value> = ev
        .seen
        .iter()
        .filter(|e| e["payload"]["type"] == "session.error")
        .collect();
    assert_eq!(errors.len(), 1);
    assert_eq!(errors[0]["payload"]["properties"]["sessionID"], s);
    assert!(ev.seen.iter().all(|e| e["directory"].is_string()));
    let (_, status) = call(&d, "GET", "/session/status", None).await;
    assert_eq!(status[&s]["type"], "idle");
    // The session goes on after a failed turn.
    let (st, msg) = call(
        &d,
        "POST",
        &format!("/session/{s}/message"),
        Some(prompt_body("again")),
    )
    .await;
    assert_eq!((st, text_of(&msg)), (200, "again".to_string()));
    // An unknown provider is refused before any turn.
    let t = create(&d, json!({})).await;
    let (st, err) = call(&d, "POST", &format!("/session/{t}/message"),
        Some(json!({"model": {"providerID": "nope", "modelID": "x"}, "parts": [{"type": "text", "text": "x"}]}))).await;
    assert_eq!(st, 400, "{err}");
}

/// "once", "always" (remembered: the next matching request is answered without asking) and
/// "reject", on both reply routes; and a question answered, then one rejected.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn opencode_permissions_always_is_remembered_and_questions_are_answered() {
    let d = daemon();
    let mut ev = Events::open(&d, "/event").await;
    let s = create(&d, json!({})).await;
    let (_, pending) = call(&d, "GET", "/permission", None).await;
    assert_eq!(pending, json!([]));

    // once, through the older per-session route.
    let turn = prompt(&d, &s, "/permission");
    let asked = ev.until(|e| e["type"] == "permission.asked").await;
    let id = asked["properties"]["id"].as_str().unwrap().to_string();
    assert_eq!(asked["properties"]["sessionID"], s);
    let (_, list) = call(&d, "GET", "/permission", None).await;
    assert_eq!(list[0]["id"], id);
    let (st, _) = call(
        &d,
        "POST",
        &format!("/session/{s}/permissions/{id}"),
        Some(json!({"response": "once"})),
    )
    .await;
    assert_eq!(st, 200);
    assert_eq!(text_of(&turn.await), "permission: allow-once");
    // A request answered already is gone.
    let (st, _) = call(
        &d,
        "POST",
        &format!("/permission/{id}/reply"),
        Some(json!({"reply": "once"})),
    )
    .await;
    assert_eq!(st, 404);

    // reject.
    let turn = prompt(&d, &s, "/permission");
    let asked = ev
        .until(|e| e["type"] == "permission.asked" && e["properties"]["id"] != id)
        .await;
    let id2 = asked["properties"]["id"].as_str().unwrap().to_string();
    let (st, _) = call(
        &d,
        "POST",
        &format!("/permission/{id2}/reply"),
        Some(json!({"reply": "reject"})),
    )
    .await;
    assert_eq!(st, 200);
    assert_eq!(text_of(&turn.await), "permission: reject-once");

    // always: answered, then remembered.
    let turn = prompt(&d, &s, "/permission");
    let asked = ev
        .until(|e| {
            e["type"] == "permission.asked"
                && e["properties"]["id"] != id
                && e["properties"]["id"] != id2
        })
        .await;
    let id3 = asked["properties"]["id"].as_str().unwrap().to_string();
    let (st, _) = call(
        &d,
        "POST",
        &format!("/permission/{id3}/reply"),
        Some(json!({"reply": "always"})),
    )
    .await;
    assert_eq!(st, 200);
    assert_eq!(text_of(&turn.await), "permission: allow-always");
    let replied = ev
        .until(|e| e["type"] == "permission.replied" && e["properties"]["requestID"] == id3)
        .await;
    assert_eq!(replied["properties"]["reply"], "always");
    let asked_before = ev
        .seen
        .iter()
        .filter(|e| e["type"] == "permission.asked")
        .count();
    let (st, msg) = call(
        &d,
        "POST",
        &format!("/session/{s}/message"),
        Some(prompt_body("/permission")),
    )
    .await;
    assert_eq!(
        (st, text_of(&msg)),
        (200, "permission: allow-always".to_string())
    );
    let auto = ev
        .until(|e| {
            e["type"] == "permission.replied"
                && e["properties"]["requestID"] != id3
                && e["properties"]["reply"] == "always"
        })
        .await;
    assert_eq!(auto["properties"]["sessionID"], s);
    assert_eq!(
        ev.seen
            .iter()
            .filter(|e| e["type"] == "permission.asked")
            .count(),
        asked_before
    );
    let (_, list) = call(&d, "GET", "/permission", None).await;
    assert_eq!(list, json!([]));
    // Another session does not inherit the rule.
    let other = create(&d, json!({})).await;
    let turn = prompt(&d, &other, "/permission");
    let asked = ev
        .until(|e| e["type"] == "permission.asked" && e["properties"]["sessionID"] == other)
        .await;
    let oid = asked["properties"]["id"].as_str().unwrap().to_string();
    call(
        &d,
        "POST",
        &format!("/permission/{oid}/reply"),
        Some(json!({"reply": "once"})),
    )
    .await;
    assert_eq!(text_of(&turn.await), "permission: allow-once");

    // A question, answered.
    let turn = prompt(&d, &s, "/question");
    let asked = ev.until(|e| e["type"] == "question.asked").await;
    let q = asked["properties"]["id"].as_str().unwrap().to_string();
    assert_eq!(
        asked["properties"]["questions"][0]["options"][0]["label"],
        "Yes"
    );
    let (_, list) = call(&d, "GET", "/question", None).await;
    assert_eq!(list[0]["id"], q);
    let (st, _) = call(
        &d,
        "POST",
        &format!("/question/{q}/reply"),
        Some(json!({"answers": [["Yes"]]})),
    )
    .await;
    assert_eq!(st, 200);
    assert_eq!(text_of(&turn.await), r#"answer: [["Yes"]]"#);
    ev.until(|e| e["type"] == "question.replied" && e["properties"]["requestID"] == q)
        .await;
    // A question, rejected.
    let turn = prompt(&d, &s, "/question");
    let asked = ev
        .until(|e| e["type"] == "question.asked" && e["properties"]["id"] != q)
        .await;
    let q2 = asked["properties"]["id"].as_str().unwrap().to_string();
    let (st, _) = call(&d, "POST", &format!("/question/{q2}/reject"), None).await;
    assert_eq!(st, 200);
    assert_eq!(text_of(&turn.await), "permission: reject-once");
    ev.until(|e| e["type"] == "question.rejected" && e["properties"]["requestID"] == q2)
        .await;
    // Bad replies.
    let (st, _) = call(
        &d,
        "POST",
        "/permission/per_nope/reply",
        Some(json!({"reply": "sometimes"})),
    )
    .await;
    assert_eq!(st, 400);
    let (st, _) = call(
        &d,
        "POST",
        "/question/que_nope/reply",
        Some(json!({"answers": "Yes"})),
    )
    .await;
    assert_eq!(st, 400);
}

/// A prompt sent with `prompt_async` (answered 204 at once); the future resolves to the turn's
/// assistant message once the session is idle again.
pub(crate) fn prompt(
    d: &Daemon,
    session: &str,
    text: &str,
) -> impl std::future::Future<Output = Value> + use<> {
    let url = d.url(&format!("/opencode/session/{session}/prompt_async"));
    let list = d.url(&format!("/opencode/session/{session}/message"));
    let status = d.url("/opencode/session/status");
    let session = session.to_string();
    let body = prompt_body(text);
    let http = crate::support::http();
    let sent = {
        let http = http.clone();
        async move {
            let resp = http
                .post(url)
                .header("authorization", basic(TOKEN))
                .header("content-type", "application/json")
                .body(body.to_string())
                .send()
                .await
                .unwrap();
            assert_eq!(resp.status(), 204);
        }
    };
    let handle = tokio::spawn(sent);
    async move {
        handle.await.unwrap();
        crate::support::eventually_async(WAIT, "the turn ends", || {
            let (http, status, list, session) =
                (http.clone(), status.clone(), list.clone(), session.clone());
            async move {
                let st: Value = http
                    .get(status)
                    .header("authorization", basic(TOKEN))
                    .send()
                    .await
                    .ok()?
                    .json()
                    .await
                    .ok()?;
                if st[&session]["type"] != "idle" {
                    return None;
                }
                let msgs: Value = http
                    .get(list)
                    .header("authorization", basic(TOKEN))
                    .send()
                    .await
                    .ok()?
                    .json()
                    .await
                    .ok()?;
                let last = msgs.as_array()?.last()?.clone();
                (last["info"]["role"] == "assistant" && last["info"]["time"]["completed"].is_u64())
                    .then_some(last)
            }
        })
        .await
    }
}

/// A restart on the same state dir in the middle of a session: the session, its title and
/// messages are back, and its next prompt reaches the same ACP session (restored with
/// `session/load`: the mock remembers the earlier prompt).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn opencode_session_goes_on_prompting_after_a_restart_with_a_state_dir() {
    let tmp = tempfile::tempdir().unwrap();
    let state = tmp.path().join("state");
    let work = tmp.path().join("work");
    std::fs::create_dir_all(&work).unwrap();
    let start = || {
        Daemon::builder()
            .token(TOKEN)
            .work_dir(&work)
            .arg("--state-dir")
            .arg(&state)
            .start()
    };
    let mut a = start();
    let s = create(&a, json!({"title": "Kept"})).await;
    let (st, _) = call(
        &a,
        "POST",
        &format!("/session/{s}/message"),
        Some(prompt_body("before the restart")),
    )
    .await;
    assert_eq!(st, 200);
    assert_eq!(a.stop(Duration::from_secs(10)), 0);

    let b = start();
    let (st, got) = call(&b, "GET", &format!("/session/{s}"), None).await;
    assert_eq!((st, &got["title"]), (200, &json!("Kept")), "{got}");
    let rows = b.servers().await;
    assert!(
        rows.iter()
            .any(|r| r["serverId"] == format!("opencode-{s}")),
        "{rows:?}"
    );
    let (st, msg) = call(
        &b,
        "POST",
        &format!("/session/{s}/message"),
        Some(prompt_body("/history")),
    )
    .await;
    assert_eq!(st, 200, "{msg}");
    assert_eq!(text_of(&msg), "history: before the restart");
    let (_, msgs) = call(&b, "GET", &format!("/session/{s}/message"), None).await;
    assert_eq!(msgs.as_array().unwrap().len(), 4);
}

/// The npm packages of tests/opencode (`.ci/install-opencode.sh` runs `npm ci`).
pub(crate) fn opencode_dir() -> Option<std::path::PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/opencode");
    for tool in ["node", "npm"] {
        if !on_path(tool) {
            skip(&format!(
                "`{tool}` is not installed (.ci/install-opencode.sh)"
            ));
            return None;
        }
    }
    if !dir
        .join("node_modules/opencode-linux-x64/bin/opencode")
        .exists()
    {
        skip("tests/opencode has no node_modules (.ci/install-opencode.sh runs npm ci)");
        return None;
    }
    Some(dir)
}

/// Runs `opencode run --attach URL -p TOKEN -m MODEL ARGS…` with `home` as its HOME and XDG
/// directories; answers its exit status, stdout and stderr.
pub(crate) fn cli_run(
    dir: &Path,
    home: &Path,
    url: &str,
    model: &str,
    args: &[&str],
) -> (std::process::ExitStatus, String, String) {
    // Its stdout goes to a file: into a pipe, the CLI's last write is asynchronous and may be
    // cut by its own exit right after the turn's end (a terminal or a file is written at once).
    let log = home.join("stdout.txt");
    let file = std::fs::File::create(&log).expect("stdout file");
    let out = Command::new(dir.join("node_modules/opencode-linux-x64/bin/opencode"))
        .arg("run")
        .arg("--attach")
        .arg(url)
        .args(["-p", TOKEN, "-m", model])
        .args(args)
        .current_dir(home)
        .env("HOME", home)
        .env("XDG_CONFIG_HOME", home.join(".config"))
        .env("XDG_DATA_HOME", home.join(".data"))
        .env("XDG_CACHE_HOME", home.join(".cache"))
        .env("XDG_STATE_HOME", home.join(".state"))
        .stdin(Stdio::null())
        .stdout(file)
        .output()
        .expect("opencode runs");
    let stdout = std::fs::read_to_string(&log).unwrap_or_default();
    (
        out.status,
        stdout,
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// OpenCode's own CLI attaches with the token as its server password and completes a turn: it
/// prints the mock's echo of the prompt.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn opencode_cli_run_attach_completes_a_turn_with_the_mock() {
    let Some(dir) = opencode_dir() else { return };
    let d = daemon();
    let home = std::sync::Arc::new(tempfile::tempdir().unwrap());
    let url = d.url("/opencode");
    let run = move |args: &[&str]| cli_run(&dir, home.path(), &url, "mock/mock", args);
    let (status, out, err) = tokio::task::spawn_blocking({
        let run = run.clone();
        move || run(&["echo-from-the-cli"])
    })
    .await
    .unwrap();
    assert!(status.success(), "{status}\nstdout:\n{out}\nstderr:\n{err}");
    assert!(
        out.contains("echo-from-the-cli"),
        "stdout:\n{out}\nstderr:\n{err}"
    );
    // The session it made is one of ours, on a mock instance.
    let (_, list) = call(&d, "GET", "/session", None).await;
    let list = list.as_array().unwrap();
    assert_eq!(list.len(), 1);
    assert_eq!(list[0]["agent"], "mock");
    // Its JSON output: the text part and nothing about an error.
    let (status, out, err) =
        tokio::task::spawn_blocking(move || run(&["--format", "json", "second turn"]))
            .await
            .unwrap();
    assert!(status.success(), "{status}\nstdout:\n{out}\nstderr:\n{err}");
    let lines: Vec<Value> = out
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    assert!(
        lines.iter().any(|l| l["type"] == "text"
            && l["part"]["text"]
                .as_str()
                .is_some_and(|t| t.contains("second turn"))),
        "{out}"
    );
    assert!(!lines.iter().any(|l| l["type"] == "error"), "{out}");
}

/// The `@opencode-ai/sdk` suites of tests/opencode (1.1.x and the current 1.19.x), run with
/// `node --test` against this build's binary.
#[test]
fn opencode_sdk_suites_pass() {
    let Some(dir) = opencode_dir() else { return };
    let out = Command::new("npm")
        .arg("test")
        .current_dir(&dir)
        .env("SANDBOX_AGENT_BIN", BIN)
        .stdin(Stdio::null())
        .output()
        .expect("npm test starts");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "npm test failed:\n{text}");
    let counts: HashMap<&str, u64> = text
        .lines()
        .filter_map(|l| l.strip_prefix("# "))
        .filter_map(|l| l.split_once(' '))
        .filter_map(|(k, v)| Some((k, v.trim().parse().ok()?)))
        .collect();
    assert!(counts.get("pass").copied().unwrap_or(0) >= 4, "{text}");
    assert_eq!(counts.get("fail").copied(), Some(0), "{text}");
}

/// A reload (SIGHUP) in the middle of a session with a state dir: the session, its messages and
/// its running instance carry over, and its next prompt reaches the same ACP session.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn opencode_session_goes_on_prompting_after_a_reload() {
    let tmp = tempfile::tempdir().unwrap();
    let mut d = Daemon::builder()
        .token(TOKEN)
        .arg("--state-dir")
        .arg(tmp.path().join("state"))
        .start();
    let s = create(&d, json!({"title": "Reloaded"})).await;
    let (st, _) = call(
        &d,
        "POST",
        &format!("/session/{s}/message"),
        Some(prompt_body("before the reload")),
    )
    .await;
    assert_eq!(st, 200);
    let pid_before: Vec<Value> = d
        .servers()
        .await
        .into_iter()
        .filter(|r| r["serverId"] == format!("opencode-{s}"))
        .map(|r| r["pid"].clone())
        .collect();
    crate::reload::reload(&mut d);
    let (st, got) = call(&d, "GET", &format!("/session/{s}"), None).await;
    assert_eq!((st, &got["title"]), (200, &json!("Reloaded")), "{got}");
    let pid_after: Vec<Value> = d
        .servers()
        .await
        .into_iter()
        .filter(|r| r["serverId"] == format!("opencode-{s}"))
        .map(|r| r["pid"].clone())
        .collect();
    assert_eq!(pid_before, pid_after, "the agent runs on across the reload");
    let (st, msg) = call(
        &d,
        "POST",
        &format!("/session/{s}/message"),
        Some(prompt_body("/history")),
    )
    .await;
    assert_eq!(st, 200, "{msg}");
    assert_eq!(text_of(&msg), "history: before the reload");
    let (_, msgs) = call(&d, "GET", &format!("/session/{s}/message"), None).await;
    assert_eq!(msgs.as_array().unwrap().len(), 4);
}

/// ACP's `usage_update` becomes OpenCode's accounting: the context tokens in use are the
/// assistant message's input tokens, the agent's cumulative cost is split per message (each
/// message the cost of its turn), and the session carries the totals.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn opencode_messages_and_sessions_carry_the_agents_tokens_and_cost() {
    let d = daemon();
    let mut ev = Events::open(&d, "/event").await;
    let s = create(&d, json!({})).await;
    let turn = |text: &'static str| {
        let d = &d;
        let s = s.clone();
        async move {
            let (st, msg) = call(
                d,
                "POST",
                &format!("/session/{s}/message"),
                Some(prompt_body(text)),
            )
            .await;
            assert_eq!(st, 200, "{msg}");
            msg
        }
    };
    let first = turn("/usage 1200 200000 0.25").await;
    assert_eq!(first["info"]["tokens"]["input"], 1200, "{first}");
    assert_eq!(first["info"]["tokens"]["output"], 0);
    assert_eq!(first["info"]["tokens"]["cache"]["read"], 0);
    assert_eq!(first["info"]["cost"], 0.25);
    let second = turn("/usage 1500 200000 0.40").await;
    assert_eq!(second["info"]["tokens"]["input"], 1500, "{second}");
    let cost = second["info"]["cost"].as_f64().unwrap();
    assert!((cost - 0.15).abs() < 1e-9, "{second}");
    // A turn without a usage_update costs nothing and counts no tokens.
    let third = turn("plain").await;
    assert_eq!(third["info"]["tokens"]["input"], 0, "{third}");
    assert_eq!(third["info"]["cost"], 0.0);
    // The final message.updated of a turn carries the same numbers as the answer.
    let updated = ev
        .until(|e| {
            e["type"] == "message.updated"
                && e["properties"]["info"]["id"] == second["info"]["id"]
                && e["properties"]["info"]["time"]["completed"].is_number()
        })
        .await;
    assert_eq!(updated["properties"]["info"]["tokens"]["input"], 1500);
    // The session's totals, and the stored messages agree.
    let (_, info) = call(&d, "GET", &format!("/session/{s}"), None).await;
    assert_eq!(info["tokens"]["input"], 2700, "{info}");
    assert!(
        (info["cost"].as_f64().unwrap() - 0.40).abs() < 1e-9,
        "{info}"
    );
    let (_, msgs) = call(&d, "GET", &format!("/session/{s}/message"), None).await;
    let costs: Vec<f64> = msgs
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["info"]["role"] == "assistant")
        .map(|m| m["info"]["cost"].as_f64().unwrap())
        .collect();
    assert_eq!(costs.len(), 3);
    assert!((costs.iter().sum::<f64>() - 0.40).abs() < 1e-9, "{costs:?}");
}

/// A permission request and a question the agent withdraws (`$/cancel_request`) leave the
/// pending lists, and the event stream says they are gone: `permission.replied` with `reject`,
/// `question.rejected`. The turn goes on to its end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn opencode_requests_the_agent_withdraws_leave_the_pending_lists() {
    let d = daemon();
    let mut ev = Events::open(&d, "/event").await;
    let s = create(&d, json!({})).await;
    for (text, list, asked_type, gone) in [
        (
            "/withdraw",
            "/permission",
            "permission.asked",
            "permission.replied",
        ),
        (
            "/withdraw question",
            "/question",
            "question.asked",
            "question.rejected",
        ),
    ] {
        let turn = prompt(&d, &s, text);
        let asked = ev.until(|e| e["type"] == asked_type).await;
        let id = asked["properties"]["id"].as_str().unwrap().to_string();
        let ended = ev
            .until(|e| e["type"] == gone && e["properties"]["requestID"] == id.as_str())
            .await;
        assert_eq!(ended["properties"]["sessionID"], s, "{ended}");
        if gone == "permission.replied" {
            assert_eq!(ended["properties"]["reply"], "reject", "{ended}");
        }
        assert_eq!(text_of(&turn.await), "withdrawn");
        let (st, pending) = call(&d, "GET", list, None).await;
        assert_eq!(st, 200);
        assert_eq!(pending, json!([]), "{text}: still pending");
        // Answering it now finds nothing to answer.
        let (st, _) = match gone {
            "permission.replied" => {
                call(
                    &d,
                    "POST",
                    &format!("/permission/{id}/reply"),
                    Some(json!({"reply": "once"})),
                )
                .await
            }
            _ => call(&d, "POST", &format!("/question/{id}/reject"), None).await,
        };
        assert_eq!(st, 404, "{text}");
    }
}
