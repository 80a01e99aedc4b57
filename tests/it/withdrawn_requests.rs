//! An agent that withdraws one of its requests (`$/cancel_request` naming a permission request
//! it sent) is not offered that request again: a client that subscribes afterwards replays the
//! rest of the turn without the request and without the withdrawal. The same after a restart
//! on the same state dir and after a session bundle's round trip, where the log is read back.

use serde_json::{Value, json};

use crate::durable::state_args;
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

/// `initialize`, `session/new` and a `/withdraw` turn on serverId `server`; the session id.
async fn withdraw_turn(d: &Daemon, server: &str) -> String {
    let (s, _) = post(
        d,
        &format!("/v1/acp/{server}?agent=mock"),
        &request(json!(0), "initialize", json!({"protocolVersion": 1})),
    )
    .await;
    assert_eq!(s, 200);
    let (_, new) = post(
        d,
        &format!("/v1/acp/{server}"),
        &request(
            json!(1),
            "session/new",
            json!({"cwd": "/", "mcpServers": []}),
        ),
    )
    .await;
    let session = new["result"]["sessionId"].as_str().unwrap().to_string();
    let (s, done) = post(
        d,
        &format!("/v1/acp/{server}"),
        &prompt(json!(2), &session, "/withdraw"),
    )
    .await;
    assert_eq!(s, 200, "{done}");
    assert_eq!(done["result"]["stopReason"], "end_turn");
    session
}

/// The replay holds the `/withdraw` turn but neither its request nor its withdrawal; the
/// permission requests it holds (not withdrawn).
fn assert_withdrawn_left_out(events: &[Value]) -> Vec<Value> {
    let chunk = |e: &Value| e.pointer("/params/update/content/text").cloned();
    assert!(
        events.iter().any(|e| chunk(e) == Some(json!("withdrawn"))),
        "the turn is replayed: {events:?}"
    );
    assert!(
        !events.iter().any(|e| e["method"] == "$/cancel_request"
            || e["params"]["toolCall"]["title"] == "Withdrawn tool call"),
        "the withdrawn request is offered again: {events:?}"
    );
    events
        .iter()
        .filter(|e| e["method"] == "session/request_permission")
        .cloned()
        .collect()
}

/// Starts a `/permission` turn (answered 202) and waits until a late subscriber is offered
/// its request.
async fn ask_permission(d: &Daemon, server: &str, session: &str) {
    let r = d
        .client()
        .post(d.url(&format!("/v1/acp/{server}")))
        .header("content-type", "application/json")
        .header("prefer", "respond-async")
        .body(prompt(json!(3), session, "/permission").to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 202);
    crate::support::eventually_async(
        std::time::Duration::from_secs(10),
        "the permission request in the replay",
        || async {
            replay(d, server)
                .await
                .iter()
                .any(|e| e["method"] == "session/request_permission")
                .then_some(())
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_withdrawn_permission_request_is_not_replayed() {
    let d = Daemon::start();
    let session = withdraw_turn(&d, "w").await;
    let asked = assert_withdrawn_left_out(&replay(&d, "w").await);
    assert!(asked.is_empty(), "{asked:?}");
    // A request not withdrawn is still replayed to a late subscriber (the control).
    ask_permission(&d, "w", &session).await;
}

/// The daemon stopped and started again on its state dir reads the log back from disk: the
/// withdrawn request is still left out of the replay, the one not withdrawn is still offered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_withdrawn_request_stays_withdrawn_after_a_restart() {
    let tmp = tempfile::tempdir().unwrap();
    let state = tmp.path().join("state");
    let start = || {
        Daemon::builder()
            .work_dir(tmp.path().join("work"))
            .args(state_args(&state))
            .start()
    };
    let mut a = start();
    let session = withdraw_turn(&a, "w").await;
    ask_permission(&a, "w", &session).await;
    a.stop(std::time::Duration::from_secs(10));

    let b = start();
    let row = crate::durable::server(&b, "w").await;
    assert_eq!(row["exitReason"], "daemon_restart", "{row}");
    let asked = assert_withdrawn_left_out(&replay(&b, "w").await);
    assert_eq!(asked.len(), 1, "the request not withdrawn: {asked:?}");
    assert_eq!(asked[0]["params"]["sessionId"], session.as_str());
}

/// A session bundle carries the log with the withdrawal: the daemon that imports it does not
/// offer the withdrawn request either, and replays the rest as the exporting daemon did.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_withdrawn_request_stays_withdrawn_through_a_bundle() {
    let tmp = tempfile::tempdir().unwrap();
    let daemon = |name: &str| {
        let home = tmp.path().join(name).join("home");
        std::fs::create_dir_all(&home).unwrap();
        Daemon::builder()
            .work_dir(tmp.path().join(name).join("work"))
            .env("HOME", &home)
            .args(state_args(&tmp.path().join(name).join("state")))
            .start()
    };
    let a = daemon("a");
    withdraw_turn(&a, "w").await;
    let before = replay(&a, "w").await;
    assert!(assert_withdrawn_left_out(&before).is_empty());
    let (s, bundle) = crate::session_bundles::export(&a, "w").await;
    assert_eq!(s, 200);
    drop(a);

    let b = daemon("b");
    let (s, body) = crate::session_bundles::import(&b, "w", "", bundle).await;
    assert_eq!(s, 201, "{body}");
    let after = replay(&b, "w").await;
    assert!(assert_withdrawn_left_out(&after).is_empty(), "{after:?}");
    assert_eq!(after, before, "the same events replayed");
}

/// A reload (SIGHUP) carries the log to the new image, which does not offer the withdrawn
/// request either (the agent and its pending request live on).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_withdrawn_request_stays_withdrawn_across_a_reload() {
    let mut d = Daemon::start();
    let session = withdraw_turn(&d, "w").await;
    ask_permission(&d, "w", &session).await;
    crate::reload::reload(&mut d);
    let asked = assert_withdrawn_left_out(&replay(&d, "w").await);
    assert_eq!(asked.len(), 1, "the request not withdrawn: {asked:?}");
}

/// The agent carried live across a reload withdraws a request it sent before the reload: the
/// new image knows the request (found in the carried log) and leaves both out of the replay.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_asked_before_a_reload_can_be_withdrawn_after_it() {
    let mut d = Daemon::start();
    let session = withdraw_turn(&d, "w").await;
    let r = d
        .client()
        .post(d.url("/v1/acp/w"))
        .header("content-type", "application/json")
        .header("prefer", "respond-async")
        .body(prompt(json!(3), &session, "/withdraw on-cancel").to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 202);
    crate::support::eventually_async(
        std::time::Duration::from_secs(10),
        "the request in the replay",
        || async {
            replay(&d, "w")
                .await
                .iter()
                .any(|e| e["method"] == "session/request_permission")
                .then_some(())
        },
    )
    .await;
    crate::reload::reload(&mut d);
    let (s, _) = post(
        &d,
        "/v1/acp/w",
        &json!({"jsonrpc": "2.0", "method": "session/cancel", "params": {"sessionId": session}}),
    )
    .await;
    assert!((200..300).contains(&s), "{s}");
    let events = crate::support::eventually_async(
        std::time::Duration::from_secs(10),
        "the second withdrawal's chunk",
        || async {
            let events = replay(&d, "w").await;
            (events
                .iter()
                .filter(|e| e["params"]["update"]["content"]["text"] == "withdrawn")
                .count()
                == 2)
                .then_some(events)
        },
    )
    .await;
    let asked = assert_withdrawn_left_out(&events);
    assert!(asked.is_empty(), "{asked:?}");
}
