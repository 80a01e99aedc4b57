//! `gitBase` when the `session/new` (or `session/load`) is POSTed with `Prefer: respond-async`:
//! the POST is answered 202 and the agent's answer goes to the SSE stream, yet the session's
//! base commit (the repository's HEAD when the request came) is recorded all the same — also
//! when that POST is the one that creates the instance.

use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::support::{Daemon, eventually_async, on_path, skip};
use crate::workspace::git;

async fn post_async(d: &Daemon, server: &str, body: Value) {
    let r = d
        .client()
        .post(d.url(&format!("/v1/acp/{server}?agent=mock")))
        .header("prefer", "respond-async")
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::ACCEPTED);
}

/// The answer to request `id`, read from the instance's SSE stream.
async fn answer_on_stream(d: &Daemon, server: &str, id: u64) -> Value {
    eventually_async(
        Duration::from_secs(10),
        "the answer on the stream",
        || async {
            let mut resp = d
                .client()
                .get(d.url(&format!("/v1/acp/{server}")))
                .header("accept", "text/event-stream")
                .timeout(Duration::from_millis(800))
                .send()
                .await
                .ok()?;
            let mut text = String::new();
            while let Ok(Some(chunk)) = resp.chunk().await {
                text.push_str(&String::from_utf8_lossy(&chunk));
                let found = text
                    .lines()
                    .filter_map(|l| l.strip_prefix("data: "))
                    .filter_map(|v| serde_json::from_str::<Value>(v).ok())
                    .find(|v| v["id"] == id && v.get("result").is_some());
                if found.is_some() {
                    return found;
                }
            }
            None
        },
    )
    .await
}

#[tokio::test]
async fn a_session_opened_with_respond_async_records_its_git_base() {
    if !on_path("git") {
        return skip("git is not installed");
    }
    let d = Daemon::start();
    let r = d.work_dir().join("repo");
    std::fs::create_dir_all(&r).unwrap();
    git(&r, &["init", "-q", "-b", "main"]);
    std::fs::write(r.join("a.txt"), "one\n").unwrap();
    git(&r, &["add", "-A"]);
    git(&r, &["commit", "-qm", "first"]);
    let first = git(&r, &["rev-parse", "HEAD"]);

    // The first request the instance ever gets: it is created by this POST.
    post_async(
        &d,
        "gb-async",
        json!({"jsonrpc":"2.0","id":1,"method":"session/new",
               "params":{"cwd": r.display().to_string(),"mcpServers":[]}}),
    )
    .await;
    let a = answer_on_stream(&d, "gb-async", 1).await;
    let sid1 = a["result"]["sessionId"].as_str().unwrap().to_string();

    // The agent commits; a second session opened now has the new HEAD as its base.
    std::fs::write(r.join("a.txt"), "two\n").unwrap();
    git(&r, &["commit", "-qam", "agent"]);
    let second = git(&r, &["rev-parse", "HEAD"]);
    assert_ne!(first, second);
    post_async(
        &d,
        "gb-async",
        json!({"jsonrpc":"2.0","id":2,"method":"session/new",
               "params":{"cwd": r.display().to_string(),"mcpServers":[]}}),
    )
    .await;
    let a = answer_on_stream(&d, "gb-async", 2).await;
    let sid2 = a["result"]["sessionId"].as_str().unwrap().to_string();
    assert_ne!(sid1, sid2);

    let sessions = eventually_async(Duration::from_secs(10), "both bases listed", || async {
        let servers = d.servers().await;
        let row = servers.iter().find(|s| s["serverId"] == "gb-async")?;
        let list = row["sessions"].as_array()?.clone();
        (list.len() == 2).then_some(list)
    })
    .await;
    let cwd = r.display().to_string();
    assert_eq!(
        sessions,
        vec![
            json!({"sessionId": sid1, "cwd": cwd, "gitBase": first}),
            json!({"sessionId": sid2, "cwd": cwd, "gitBase": second}),
        ]
    );
    // "What did the first session change" still shows the agent's committed change.
    let diff: Value = d
        .client()
        .get(d.url(&format!("/v1/git/diff?path={cwd}&base={first}")))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(diff["files"][0]["path"], "a.txt", "{diff}");
}
