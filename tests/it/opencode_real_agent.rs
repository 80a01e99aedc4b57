//! An OpenCode session driving a real agent, offline: Claude (the npm `claude-code-acp`
//! adapter, installed like the real-agent matrix installs it) behind the OpenCode bridge, its
//! model the fake model server (tests/agents/fake_model.py). A text turn comes back with the
//! fake model's text; a tool turn asks for permission through OpenCode's `permission.asked`, is
//! answered on OpenCode's reply route, writes its file and completes with the model's text; the
//! `opencode run --attach` CLI gets Claude's reply with the daemon's token as its password; each
//! turn ends with one `session.idle`; deleting the session ends the agent's processes.

use std::time::Duration;

use serde_json::{Value, json};

use crate::opencode::{Events, call, create, session_of, text_of};
use crate::real_agents::{FakeModel, agents_file, shared_data_dir};
use crate::support::{Daemon, descendants, eventually_async, on_path, pid_alive, skip};

const SLOW: Duration = Duration::from_secs(120);

fn claude(text: &str) -> Value {
    json!({"model": {"providerID": "claude", "modelID": "default"},
        "parts": [{"type": "text", "text": text}]})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn opencode_session_drives_claude_through_a_permission_offline() {
    if !on_path("npm") || !on_path("node") || !on_path("python3") {
        skip("node, npm or python3 missing (.ci/install-00-base.sh installs them)");
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let model = FakeModel::start(tmp.path());
    let file = agents_file(tmp.path(), "claude", &model);
    let d = Daemon::builder()
        .token(crate::opencode::TOKEN)
        .data_dir(shared_data_dir())
        .arg("--agents-file")
        .arg(&file)
        // The pinned npm fallback, without asking a registry (as the real-agent matrix does).
        .arg("--acp-registry-url")
        .arg("http://127.0.0.1:9/registry.json")
        .start();
    let mut ev = Events::open(&d, "/event").await;
    let s = create(&d, json!({"title": "claude behind OpenCode"})).await;

    // A text turn: the fake model's streamed text is the assistant message.
    let (st, msg) = call(
        &d,
        "POST",
        &format!("/session/{s}/message"),
        Some(claude("say something [[text]]")),
    )
    .await;
    assert_eq!(st, 200, "{msg}\n{}", d.stderr());
    assert!(text_of(&msg).contains("fake says: one two three"), "{msg}");
    assert_eq!(msg["info"]["providerID"], "claude");
    assert!(msg["info"]["error"].is_null(), "{msg}");

    // The session is an instance of the daemon like any other.
    let servers = d.servers().await;
    let row = servers
        .iter()
        .find(|r| r["serverId"] == format!("opencode-{s}"))
        .unwrap_or_else(|| panic!("no instance for {s} in {servers:?}"));
    assert_eq!(row["agent"], "claude", "{row}");

    // OpenCode's own CLI, attached with the token as its password, gets Claude's reply too.
    if let Some(dir) = crate::opencode::opencode_dir() {
        let home = tempfile::tempdir().unwrap();
        let url = d.url("/opencode");
        let (status, out, err) = tokio::task::spawn_blocking(move || {
            crate::opencode::cli_run(
                &dir,
                home.path(),
                &url,
                "claude/default",
                &["say something [[text]]"],
            )
        })
        .await
        .unwrap();
        assert!(status.success(), "{status}\nstdout:\n{out}\nstderr:\n{err}");
        assert!(
            out.contains("fake says: one two three"),
            "stdout:\n{out}\nstderr:\n{err}"
        );
        // The CLI made its own session (and instance): deleted here, so that what ends below
        // is this test's session alone.
        let (_, list) = call(&d, "GET", "/session", None).await;
        for other in list.as_array().unwrap().iter().filter(|x| x["id"] != s) {
            let id = other["id"].as_str().unwrap();
            let (st, _) = call(&d, "DELETE", &format!("/session/{id}"), None).await;
            assert_eq!(st, 200, "DELETE the CLI's session {id}");
        }
    }

    // A tool turn: Claude asks before writing; OpenCode's reply route answers.
    let target = d.work_dir().join("written-through-opencode.txt");
    let (st, _) = call(
        &d,
        "POST",
        &format!("/session/{s}/prompt_async"),
        Some(claude(&format!(
            "[[write {} by-opencode-and-claude]]",
            target.display()
        ))),
    )
    .await;
    assert_eq!(st, 204);
    let asked = ev
        .until_for(SLOW, |e| {
            e["type"] == "permission.asked" && e["properties"]["sessionID"] == s
        })
        .await;
    let id = asked["properties"]["id"].as_str().unwrap().to_string();
    assert!(!target.exists(), "written before the answer");
    let (_, listed) = call(&d, "GET", "/permission", None).await;
    assert_eq!(listed[0]["id"], id, "{listed}");
    let (st, _) = call(
        &d,
        "POST",
        &format!("/permission/{id}/reply"),
        Some(json!({"reply": "once"})),
    )
    .await;
    assert_eq!(st, 200);
    let replied = ev
        .until(|e| e["type"] == "permission.replied" && e["properties"]["requestID"] == id)
        .await;
    assert_eq!(replied["properties"]["reply"], "once");
    let idles = |ev: &Events| {
        ev.seen
            .iter()
            .filter(|e| e["type"] == "session.idle" && session_of(e) == Some(s.as_str()))
            .count()
    };
    // The second turn's idle (the first turn's may still be unread).
    let seen = std::cell::Cell::new(idles(&ev));
    if seen.get() < 2 {
        ev.until_for(SLOW, |e| {
            if e["type"] == "session.idle" && e["properties"]["sessionID"] == s {
                seen.set(seen.get() + 1);
            }
            seen.get() >= 2
        })
        .await;
    }
    assert_eq!(
        std::fs::read_to_string(&target).unwrap_or_default(),
        "by-opencode-and-claude"
    );
    let (_, msgs) = call(&d, "GET", &format!("/session/{s}/message"), None).await;
    let last = msgs.as_array().unwrap().last().unwrap().clone();
    assert_eq!(last["info"]["role"], "assistant", "{last}");
    assert!(last["info"]["time"]["completed"].is_u64(), "{last}");
    assert!(last["info"]["error"].is_null(), "{last}");
    assert!(
        text_of(&last).contains("the file is written"),
        "the model's text after the tool: {last}"
    );
    let tool = last["parts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["type"] == "tool")
        .unwrap_or_else(|| panic!("no tool part: {last}"));
    assert_eq!(tool["state"]["status"], "completed", "{tool}");
    // One idle per turn: the text turn and the tool turn (what arrived since is read too).
    ev.settle(Duration::from_millis(500)).await;
    assert_eq!(idles(&ev), 2, "{:#?}", ev.seen);

    // Deleting the session stops its agent: none of its processes is left.
    let procs = descendants(d.pid());
    assert!(!procs.is_empty(), "no agent process under the daemon");
    let (st, _) = call(&d, "DELETE", &format!("/session/{s}"), None).await;
    assert_eq!(st, 200);
    eventually_async(SLOW, "the agent's processes to end", || {
        let procs = procs.clone();
        async move { procs.iter().all(|p| !pid_alive(*p)).then_some(()) }
    })
    .await;
}
