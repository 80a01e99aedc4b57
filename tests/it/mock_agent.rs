//! The built-in mock agent (`sandbox-agent mock-agent`) driven directly over its stdio, as the
//! daemon drives it: every behaviour `design/contract.md` promises, one JSON-RPC line at a time.

use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use serde_json::{Value, json};

use crate::support::BIN;

struct Mock {
    child: Child,
    /// `None` once closed (EOF for the mock).
    stdin: Option<ChildStdin>,
    lines: mpsc::Receiver<String>,
}

impl Mock {
    fn start() -> Mock {
        let mut child = Command::new(BIN)
            .arg("mock-agent")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start mock-agent");
        let stdin = child.stdin.take().expect("stdin");
        let stdout: ChildStdout = child.stdout.take().expect("stdout");
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { return };
                if tx.send(line).is_err() {
                    return;
                }
            }
        });
        Mock {
            child,
            stdin: Some(stdin),
            lines,
        }
    }

    fn send(&mut self, msg: Value) {
        let stdin = self.stdin.as_mut().expect("stdin open");
        writeln!(stdin, "{msg}").expect("write to the mock");
        stdin.flush().expect("flush");
    }

    fn request(&mut self, id: u64, method: &str, params: Value) {
        self.send(json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}));
    }

    fn prompt(&mut self, id: u64, text: &str) {
        self.request(
            id,
            "session/prompt",
            json!({"sessionId": "mock-1", "prompt": [{"type": "text", "text": text}]}),
        );
    }

    /// The next stdout line, raw.
    fn raw(&mut self) -> String {
        self.lines
            .recv_timeout(Duration::from_secs(10))
            .expect("the mock answers in time")
    }

    fn next(&mut self) -> Value {
        let line = self.raw();
        serde_json::from_str(&line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}"))
    }

    /// The text of an `agent_message_chunk` update.
    fn chunk(&mut self) -> String {
        let msg = self.next();
        assert_eq!(msg["method"], "session/update", "{msg}");
        assert_eq!(msg["params"]["sessionId"], "mock-1", "{msg}");
        let update = &msg["params"]["update"];
        assert_eq!(update["sessionUpdate"], "agent_message_chunk", "{msg}");
        assert_eq!(update["content"]["type"], "text", "{msg}");
        update["content"]["text"]
            .as_str()
            .expect("text")
            .to_string()
    }

    fn stop_reason(&mut self, id: u64) -> String {
        let msg = self.next();
        assert_eq!(msg["id"], id, "{msg}");
        msg["result"]["stopReason"]
            .as_str()
            .unwrap_or_else(|| panic!("no stopReason: {msg}"))
            .to_string()
    }
}

impl Drop for Mock {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn mock_agent_answers_the_protocol_basics() {
    let mut m = Mock::start();
    m.request(0, "initialize", json!({"protocolVersion": 1}));
    let init = m.next();
    assert_eq!(init["id"], 0);
    assert_eq!(init["result"]["protocolVersion"], 1);
    assert_eq!(init["result"]["agentInfo"]["name"], "mock");
    assert_eq!(init["result"]["authMethods"], json!([]));
    m.send(json!({"jsonrpc": "2.0", "id": "s", "method": "session/new", "params": {}}));
    let new = m.next();
    assert_eq!(new["id"], "s");
    assert_eq!(new["result"]["sessionId"], "mock-1");
    assert_eq!(new["result"]["configOptions"][0]["currentValue"], "mock");
    m.request(2, "session/new", json!({}));
    assert_eq!(m.next()["result"]["sessionId"], "mock-2");
    m.request(3, "no/such/method", json!({}));
    let err = m.next();
    assert_eq!(
        (&err["id"], &err["error"]["code"]),
        (&json!(3), &json!(-32601))
    );
    let params = json!({"nested": [1, "two", {"three": null}], "n": 1.5});
    m.request(4, "_mock/echo", params.clone());
    assert_eq!(
        m.next(),
        json!({"jsonrpc": "2.0", "id": 4, "result": params})
    );
    m.prompt(5, "hello mock");
    assert_eq!(m.chunk(), "hello mock");
    assert_eq!(m.stop_reason(5), "end_turn");
    m.prompt(6, "/stream 3");
    for i in 1..=3 {
        assert_eq!(m.chunk(), format!("chunk {i} of 3"));
    }
    assert_eq!(m.stop_reason(6), "end_turn");
    m.prompt(7, "/garbage");
    assert!(serde_json::from_str::<Value>(&m.raw()).is_err());
    assert_eq!(m.stop_reason(7), "end_turn");
}

#[test]
fn mock_agent_runs_slow_prompts_concurrently_and_cancels_them() {
    let mut m = Mock::start();
    m.prompt(1, "/sleep 60000");
    m.prompt(2, "/hang");
    // Neither blocks other requests.
    m.request(3, "_mock/echo", json!("quick"));
    assert_eq!(m.next()["id"], 3);
    m.send(
        json!({"jsonrpc": "2.0", "method": "session/cancel", "params": {"sessionId": "mock-1"}}),
    );
    let mut ended = [m.next(), m.next()];
    ended.sort_by_key(|v| v["id"].as_u64());
    for (msg, id) in ended.iter().zip([1, 2]) {
        assert_eq!(msg["id"], id);
        assert_eq!(msg["result"]["stopReason"], "cancelled", "{msg}");
    }
    m.prompt(4, "/sleep 10");
    assert_eq!(m.stop_reason(4), "end_turn");
}

#[test]
fn mock_agent_asks_for_permission_and_reports_the_choice() {
    let mut m = Mock::start();
    m.prompt(1, "/permission");
    let ask = m.next();
    assert_eq!(ask["method"], "session/request_permission", "{ask}");
    assert_eq!(ask["params"]["sessionId"], "mock-1");
    assert!(ask["params"]["toolCall"]["toolCallId"].is_string());
    assert!(ask["params"]["toolCall"]["title"].is_string());
    let kinds: Vec<&str> = ask["params"]["options"]
        .as_array()
        .expect("options")
        .iter()
        .map(|o| o["kind"].as_str().expect("kind"))
        .collect();
    assert_eq!(kinds, ["allow_once", "allow_always", "reject_once"]);
    let chosen = ask["params"]["options"][1]["optionId"].clone();
    m.send(json!({"jsonrpc": "2.0", "id": ask["id"],
        "result": {"outcome": {"outcome": "selected", "optionId": chosen}}}));
    assert_eq!(
        m.chunk(),
        format!("permission: {}", chosen.as_str().expect("id"))
    );
    assert_eq!(m.stop_reason(1), "end_turn");
}

/// The bare word `permission` (`/permission-later`): the request goes out and the turn ends
/// without waiting; the answer given afterwards is told at the start of the next prompt.
#[test]
fn mock_agent_asks_without_waiting_and_tells_the_answer_at_the_next_prompt() {
    let mut m = Mock::start();
    m.prompt(1, "permission");
    let ask = m.next();
    assert_eq!(ask["method"], "session/request_permission", "{ask}");
    assert_eq!(m.chunk(), "asked for permission; the answer comes later");
    assert_eq!(m.stop_reason(1), "end_turn");
    m.send(json!({"jsonrpc": "2.0", "id": ask["id"],
        "result": {"outcome": {"outcome": "selected", "optionId": "allow-always"}}}));
    // The answer has no turn to go to: the mock holds it until the session prompts again.
    m.prompt(2, "question");
    assert_eq!(m.chunk(), "earlier permission: allow-always");
    let q = m.next();
    assert_eq!(q["params"]["toolCall"]["title"], "AskUserQuestion", "{q}");
    assert_eq!(m.chunk(), "asked for question; the answer comes later");
    assert_eq!(m.stop_reason(2), "end_turn");
    m.send(
        json!({"jsonrpc": "2.0", "id": q["id"], "result": {"outcome":
        {"outcome": "selected", "optionId": "allow-once"}, "_meta": {"answers": [["No"]]}}}),
    );
    m.prompt(3, "hello");
    assert_eq!(m.chunk(), r#"earlier answer: [["No"]]"#);
    assert_eq!(m.chunk(), "hello");
    assert_eq!(m.stop_reason(3), "end_turn");
}

#[test]
fn mock_agent_writes_stderr_apart_and_crashes_with_the_asked_code() {
    let mut m = Mock::start();
    m.prompt(1, "/stderr a line for stderr");
    assert_eq!(m.stop_reason(1), "end_turn");
    m.prompt(2, "/crash 7");
    let status = m.child.wait().expect("wait");
    assert_eq!(status.code(), Some(7));
    assert!(
        m.lines.recv_timeout(Duration::from_secs(5)).is_err(),
        "no answer to /crash"
    );
    let mut err = String::new();
    m.child
        .stderr
        .take()
        .expect("stderr")
        .read_to_string(&mut err)
        .expect("read stderr");
    assert_eq!(err, "a line for stderr\n");
}

#[test]
fn mock_agent_ends_at_stdin_eof() {
    let mut m = Mock::start();
    m.request(1, "_mock/echo", json!(1));
    m.next();
    m.stdin = None;
    let status = m.child.wait().expect("wait");
    assert_eq!(status.code(), Some(0));
}
