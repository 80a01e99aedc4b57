//! An agent that withdraws one of its requests (`$/cancel_request` naming a permission request
//! it sent) is not offered that request again: a client that subscribes afterwards replays the
//! rest of the turn without the request and without the withdrawal.

use serde_json::{Value, json};

use crate::sessions::{post, prompt, request};
use crate::support::Daemon;

/// Every message the event stream replays within a second.
async fn replay(d: &Daemon, server: &str) -> Vec<Value> {
    let mut resp = d
        .client()
        .get(d.url(&format!("/v1/acp/{server}")))
        .header("accept", "text/event-stream")
        .timeout(std::time::Duration::from_secs(1))
        .send()
        .await
        .unwrap();
    let mut text = String::new();
    while let Ok(Some(chunk)) = resp.chunk().await {
        text.push_str(&String::from_utf8_lossy(&chunk));
    }
    text.lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter_map(|d| serde_json::from_str(d).ok())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_withdrawn_permission_request_is_not_replayed() {
    let d = Daemon::start();
    let (s, _) = post(
        &d,
        "/v1/acp/w?agent=mock",
        &request(json!(0), "initialize", json!({"protocolVersion": 1})),
    )
    .await;
    assert_eq!(s, 200);
    let (_, new) = post(
        &d,
        "/v1/acp/w",
        &request(
            json!(1),
            "session/new",
            json!({"cwd": "/", "mcpServers": []}),
        ),
    )
    .await;
    let session = new["result"]["sessionId"].as_str().unwrap().to_string();
    let (s, done) = post(&d, "/v1/acp/w", &prompt(json!(2), &session, "/withdraw")).await;
    assert_eq!(s, 200, "{done}");
    assert_eq!(done["result"]["stopReason"], "end_turn");
    let events = replay(&d, "w").await;
    let chunk = |e: &Value| e.pointer("/params/update/content/text").cloned();
    assert!(
        events.iter().any(|e| chunk(e) == Some(json!("withdrawn"))),
        "the turn is replayed: {events:?}"
    );
    assert!(
        !events
            .iter()
            .any(|e| e["method"] == "session/request_permission"
                || e["method"] == "$/cancel_request"),
        "the withdrawn request is offered again: {events:?}"
    );
    // A request not withdrawn is still replayed to a late subscriber (the control).
    let r = d
        .client()
        .post(d.url("/v1/acp/w"))
        .header("content-type", "application/json")
        .header("prefer", "respond-async")
        .body(prompt(json!(3), &session, "/permission").to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 202);
    crate::support::eventually_async(
        std::time::Duration::from_secs(10),
        "the permission request in the replay",
        || async {
            replay(&d, "w")
                .await
                .iter()
                .any(|e| e["method"] == "session/request_permission")
                .then_some(())
        },
    )
    .await;
}
