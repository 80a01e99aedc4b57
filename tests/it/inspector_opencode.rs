//! The inspector links OpenCode sessions and the ACP instances behind them: `GET /v1/acp` names,
//! for the instance of an OpenCode session, that session (`opencode: {sessionId, title}`, kept
//! current when the title changes) and for no other instance (not even one a client named
//! `opencode-…`); and in Chromium (`ui/test/opencode-link.mjs`) the Instances tab shows it, the
//! Sessions tab lists the OpenCode session with its instance and ACP session, and the instance's
//! button leads to its row.

use std::path::Path;
use std::time::Duration;

use serde_json::json;

use crate::inspector::{node, node_with};
use crate::opencode::{TOKEN, call, create, prompt_body};
use crate::support::{self, Daemon};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inspector_links_opencode_sessions_and_their_instances() {
    let d = Daemon::builder().token(TOKEN).start();
    let s = create(&d, json!({"title": "Linked session"})).await;
    let (st, _) = call(
        &d,
        "POST",
        &format!("/session/{s}/message"),
        Some(prompt_body("hi")),
    )
    .await;
    assert_eq!(st, 200);
    // Two instances that back nothing: a plain one, and one named like a bridge instance.
    for id in ["plain", "opencode-ses_not_a_session"] {
        let r = d
            .post_json(
                &format!("/v1/acp/{id}?agent=mock"),
                &json!({"jsonrpc": "2.0", "id": 1, "method": "initialize",
                    "params": {"protocolVersion": 1, "clientCapabilities": {}}}),
            )
            .await;
        assert!(r["result"].is_object(), "{r}");
    }
    let rows = d.servers().await;
    let row = |id: &str| {
        rows.iter()
            .find(|r| r["serverId"] == id)
            .unwrap_or_else(|| panic!("no {id} in {rows:?}"))
            .clone()
    };
    assert_eq!(
        row(&format!("opencode-{s}"))["opencode"],
        json!({"sessionId": s, "title": "Linked session"})
    );
    assert!(row("plain").get("opencode").is_none());
    assert!(row("opencode-ses_not_a_session").get("opencode").is_none());
    // And the other way: the OpenCode session names its instance and ACP session.
    let (_, info) = call(&d, "GET", &format!("/session/{s}"), None).await;
    assert_eq!(info["acpServerId"], format!("opencode-{s}"));
    assert!(info["acpSessionId"].is_string(), "{info}");
    // A new title is what the listing says from then on.
    let (st, _) = call(
        &d,
        "PATCH",
        &format!("/session/{s}"),
        Some(json!({"title": "Renamed"})),
    )
    .await;
    assert_eq!(st, 200);
    let rows = d.servers().await;
    let linked = rows
        .iter()
        .find(|r| r["serverId"] == format!("opencode-{s}"))
        .unwrap();
    assert_eq!(linked["opencode"]["title"], "Renamed");

    // In the browser.
    if node_with("playwright-core").is_none() {
        return;
    }
    if !Path::new("/usr/bin/chromium").exists() {
        support::skip("/usr/bin/chromium is missing; run .ci/install-inspector.sh");
        return;
    }
    let shots = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/ui-screenshots");
    let out = node(
        &[
            "test/opencode-link.mjs".as_ref(),
            format!("http://{}", d.addr).as_ref(),
            TOKEN.as_ref(),
            s.as_ref(),
            "Renamed".as_ref(),
            "plain".as_ref(),
            shots.as_os_str(),
        ],
        Duration::from_secs(120),
        "the Chromium run (ui/test/opencode-link.mjs)",
    )
    .await;
    let summary: serde_json::Value =
        serde_json::from_str(out.lines().last().unwrap_or("")).expect("a JSON summary");
    assert_eq!(
        summary["checked"],
        json!([
            "instance-names-its-opencode-session",
            "opencode-session-names-its-instance",
            "button-reveals-the-instance"
        ])
    );
}
