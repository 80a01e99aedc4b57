//! OpenCode permission and question requests that outlive the turn that asked them: an agent
//! may end its turn while its `session/request_permission` still waits (the mock's bare words
//! `permission` and `question` do). The synchronous prompt comes back, the request stays listed
//! until answered on either reply route, the answer reaches the agent, and an "always" answer is
//! remembered for the session's next matching request (answered without asking).

use serde_json::{Value, json};

use crate::opencode::{Events, call, create, daemon, prompt_body, text_of};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn opencode_requests_stay_answerable_after_their_turn_ended() {
    let d = daemon();
    let mut ev = Events::open(&d, "/event").await;
    let s = create(&d, json!({})).await;

    // The prompt is answered while the request still waits.
    let (st, msg) = call(
        &d,
        "POST",
        &format!("/session/{s}/message"),
        Some(prompt_body("permission")),
    )
    .await;
    assert_eq!(st, 200, "{msg}");
    assert_eq!(
        text_of(&msg),
        "asked for permission; the answer comes later"
    );
    let (_, list) = call(&d, "GET", "/permission", None).await;
    let id = list[0]["id"]
        .as_str()
        .expect("a waiting request")
        .to_string();
    assert_eq!(list[0]["sessionID"], s);
    let (_, status) = call(&d, "GET", "/session/status", None).await;
    assert_eq!(status[&s]["type"], "idle", "{status}");

    // "always" on the global route: replied, gone from the list.
    let (st, _) = call(
        &d,
        "POST",
        &format!("/permission/{id}/reply"),
        Some(json!({"reply": "always"})),
    )
    .await;
    assert_eq!(st, 200);
    let replied = ev
        .until(|e| e["type"] == "permission.replied" && e["properties"]["requestID"] == id)
        .await;
    assert_eq!(replied["properties"]["reply"], "always");
    let (_, list) = call(&d, "GET", "/permission", None).await;
    assert_eq!(list, json!([]));

    // The next prompt: the agent got the answer, and its new request is answered by the rule.
    let (st, msg) = call(
        &d,
        "POST",
        &format!("/session/{s}/message"),
        Some(prompt_body("permission")),
    )
    .await;
    assert_eq!(st, 200, "{msg}");
    assert!(
        text_of(&msg).starts_with("earlier permission: allow-always"),
        "{msg}"
    );
    let auto = ev
        .until(|e| e["type"] == "permission.replied" && e["properties"]["requestID"] != id)
        .await;
    assert_eq!(auto["properties"]["reply"], "always");
    assert_eq!(auto["properties"]["sessionID"], s);
    let (_, list) = call(&d, "GET", "/permission", None).await;
    assert_eq!(list, json!([]));
    let asked: Vec<&Value> = ev
        .seen
        .iter()
        .filter(|e| e["type"] == "permission.asked")
        .collect();
    assert_eq!(asked.len(), 1, "the remembered rule asks nobody");

    // The older per-session route with `allow`, on another session (no rule there).
    let t = create(&d, json!({})).await;
    call(
        &d,
        "POST",
        &format!("/session/{t}/message"),
        Some(prompt_body("permission")),
    )
    .await;
    let (_, list) = call(&d, "GET", "/permission", None).await;
    let pid = list[0]["id"].as_str().expect("a request of t").to_string();
    let (st, _) = call(
        &d,
        "POST",
        &format!("/session/{t}/permissions/{pid}"),
        Some(json!({"response": "allow"})),
    )
    .await;
    assert_eq!(st, 200);
    let (_, msg) = call(
        &d,
        "POST",
        &format!("/session/{t}/message"),
        Some(prompt_body("again")),
    )
    .await;
    assert_eq!(text_of(&msg), "earlier permission: allow-onceagain");

    // A question: listed after its turn, answered; another rejected.
    for (reply, told) in [
        ("reply", r#"earlier answer: [["Yes"]]"#),
        ("reject", "earlier permission: reject-once"),
    ] {
        let (st, msg) = call(
            &d,
            "POST",
            &format!("/session/{s}/message"),
            Some(prompt_body("question")),
        )
        .await;
        assert_eq!(
            (
                st,
                text_of(&msg).ends_with("asked for question; the answer comes later")
            ),
            (200, true),
            "{msg}"
        );
        let (_, list) = call(&d, "GET", "/question", None).await;
        let q = list[0]["id"]
            .as_str()
            .expect("a waiting question")
            .to_string();
        assert_eq!(list[0]["questions"][0]["options"][1]["label"], "No");
        let body = (reply == "reply").then(|| json!({"answers": [["Yes"]]}));
        let (st, _) = call(&d, "POST", &format!("/question/{q}/{reply}"), body).await;
        assert_eq!(st, 200);
        let kind = if reply == "reply" {
            "question.replied"
        } else {
            "question.rejected"
        };
        ev.until(|e| e["type"] == kind && e["properties"]["requestID"] == q)
            .await;
        let (_, list) = call(&d, "GET", "/question", None).await;
        assert_eq!(list, json!([]));
        let (_, msg) = call(
            &d,
            "POST",
            &format!("/session/{s}/message"),
            Some(prompt_body("x")),
        )
        .await;
        assert_eq!(text_of(&msg), format!("{told}x"));
    }
}
