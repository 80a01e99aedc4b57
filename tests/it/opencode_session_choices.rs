//! What an OpenCode client chooses for a session, and how it stops a turn: `permissionMode:
//! "bypass"` (or its `permission_mode` spelling) lets every permission request through without
//! asking; an `agent` alone in a prompt picks that provider and its default model; `/session/status`
//! says `busy` while a turn runs; `abort` ends a running turn (its message carries the abort, the
//! session is idle again and prompts on) and is harmless on an idle session.

use serde_json::json;

use crate::opencode::{Events, call, create, daemon, prompt_body, text_of};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn opencode_bypass_mode_asks_nobody() {
    let d = daemon();
    let mut ev = Events::open(&d, "/event").await;
    for key in ["permissionMode", "permission_mode"] {
        let s = create(&d, json!({key: "bypass"})).await;
        let (_, info) = call(&d, "GET", &format!("/session/{s}"), None).await;
        assert_eq!(info["permissionMode"], "bypass", "{key}: {info}");
        let (st, msg) = call(
            &d,
            "POST",
            &format!("/session/{s}/message"),
            Some(prompt_body("/permission")),
        )
        .await;
        assert_eq!(st, 200, "{msg}");
        assert_eq!(text_of(&msg), "permission: allow-always", "{key}");
        let replied = ev
            .until(|e| e["type"] == "permission.replied" && e["properties"]["sessionID"] == s)
            .await;
        assert_eq!(replied["properties"]["reply"], "always");
    }
    assert!(
        !ev.seen.iter().any(|e| e["type"] == "permission.asked"),
        "a bypassing session asked"
    );
    // Without it, the same prompt asks.
    let s = create(&d, json!({})).await;
    call(
        &d,
        "POST",
        &format!("/session/{s}/message"),
        Some(prompt_body("permission")),
    )
    .await;
    ev.until(|e| e["type"] == "permission.asked" && e["properties"]["sessionID"] == s)
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn opencode_agent_alone_picks_the_provider_and_its_default_model() {
    let d = daemon();
    let s = create(&d, json!({})).await;
    let (st, msg) = call(
        &d,
        "POST",
        &format!("/session/{s}/message"),
        Some(json!({"agent": "mock", "parts": [{"type": "text", "text": "agent only"}]})),
    )
    .await;
    assert_eq!(st, 200, "{msg}");
    assert_eq!(msg["info"]["providerID"], "mock");
    assert_eq!(msg["info"]["modelID"], "mock");
    assert_eq!(text_of(&msg), "agent only");
    let (_, info) = call(&d, "GET", &format!("/session/{s}"), None).await;
    assert_eq!(
        (info["providerID"].clone(), info["modelID"].clone()),
        (json!("mock"), json!("mock"))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn opencode_abort_ends_a_running_turn_and_is_harmless_when_idle() {
    let d = daemon();
    let mut ev = Events::open(&d, "/event").await;
    let s = create(&d, json!({})).await;
    let (_, aborted) = call(&d, "POST", &format!("/session/{s}/abort"), None).await;
    assert_eq!(aborted, json!(true));
    let (_, status) = call(&d, "GET", "/session/status", None).await;
    assert_eq!(status[&s]["type"], "idle", "{status}");

    let (st, _) = call(
        &d,
        "POST",
        &format!("/session/{s}/prompt_async"),
        Some(prompt_body("/hang")),
    )
    .await;
    assert_eq!(st, 204);
    ev.until(|e| {
        e["type"] == "session.status"
            && e["properties"]["sessionID"] == s
            && e["properties"]["status"]["type"] == "busy"
    })
    .await;
    let (_, status) = call(&d, "GET", "/session/status", None).await;
    assert_eq!(status[&s]["type"], "busy", "{status}");
    let (_, aborted) = call(&d, "POST", &format!("/session/{s}/abort"), None).await;
    assert_eq!(aborted, json!(true));
    let err = ev
        .until(|e| e["type"] == "session.error" && e["properties"]["sessionID"] == s)
        .await;
    assert_eq!(err["properties"]["error"]["name"], "MessageAbortedError");
    ev.until(|e| e["type"] == "session.idle" && e["properties"]["sessionID"] == s)
        .await;
    let (_, msgs) = call(&d, "GET", &format!("/session/{s}/message"), None).await;
    let last = msgs.as_array().unwrap().last().unwrap().clone();
    assert_eq!(
        last["info"]["error"]["name"], "MessageAbortedError",
        "{last}"
    );
    let (_, status) = call(&d, "GET", "/session/status", None).await;
    assert_eq!(status[&s]["type"], "idle", "{status}");
    // It prompts on.
    let (st, msg) = call(
        &d,
        "POST",
        &format!("/session/{s}/message"),
        Some(prompt_body("after")),
    )
    .await;
    assert_eq!((st, text_of(&msg)), (200, "after".to_string()));

    // An abort right behind the first `prompt_async` of a new session (its ACP session not made
    // yet, its prompt not sent): the turn still ends, aborted.
    let t = create(&d, json!({})).await;
    let (st, _) = call(
        &d,
        "POST",
        &format!("/session/{t}/prompt_async"),
        Some(prompt_body("/hang")),
    )
    .await;
    assert_eq!(st, 204);
    let (_, aborted) = call(&d, "POST", &format!("/session/{t}/abort"), None).await;
    assert_eq!(aborted, json!(true));
    let err = ev
        .until(|e| e["type"] == "session.error" && e["properties"]["sessionID"] == t)
        .await;
    assert_eq!(err["properties"]["error"]["name"], "MessageAbortedError");
    ev.until(|e| e["type"] == "session.idle" && e["properties"]["sessionID"] == t)
        .await;
    let (st, msg) = call(
        &d,
        "POST",
        &format!("/session/{t}/message"),
        Some(prompt_body("on")),
    )
    .await;
    assert_eq!((st, text_of(&msg)), (200, "on".to_string()));
}
