//! What the daemon learnt about a serverId's sessions outlives the daemon: after a restart (and
//! before any client sends `initialize` again) the inventory still shows the title the agent
//! gave each session, `session/list` is still answered by the daemon for an agent that does not
//! list sessions itself (and relayed for one that does), and a session bundle carries the
//! titles to another daemon.

use serde_json::{Value, json};

use crate::sessions::{agents_file, post, prompt, request};
use crate::support::Daemon;

const SECS10: std::time::Duration = std::time::Duration::from_secs(10);

/// `initialize`, `session/new` and a prompt that makes the mock title the session; the id.
async fn titled_session(d: &Daemon, server: &str, agent: &str, title: &str) -> String {
    let (s, init) = post(
        d,
        &format!("/v1/acp/{server}?agent={agent}"),
        &request(json!(0), "initialize", json!({"protocolVersion": 1})),
    )
    .await;
    assert_eq!(s, 200, "{init}");
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
    let (s, _) = post(
        d,
        &format!("/v1/acp/{server}"),
        &prompt(json!(2), &session, &format!("/title {title}")),
    )
    .await;
    assert_eq!(s, 200);
    session
}

fn title_of(listed: &Value, server: &str) -> Value {
    listed["sessions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["serverId"] == server)
        .map(|s| s["title"].clone())
        .unwrap_or(Value::Null)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn titles_and_the_list_capability_survive_a_restart_and_titles_travel_in_bundles() {
    let tmp = tempfile::tempdir().unwrap();
    let state = tmp.path().join("state");
    let work = tmp.path().join("work");
    std::fs::create_dir_all(&work).unwrap();
    let agents = agents_file(
        tmp.path(),
        &[("loader", &[]), ("lister", &["--list-sessions"])],
    );
    let args = |b: crate::support::DaemonBuilder| {
        b.work_dir(&work)
            .args(crate::durable::state_args(&state))
            .arg("--agents-file")
            .arg(&agents)
    };
    let mut a = args(Daemon::builder()).start();
    let plain = titled_session(&a, "plain", "loader", "Fix the login bug").await;
    let listing = titled_session(&a, "listing", "lister", "Agent lists me").await;
    assert_eq!(
        title_of(&a.get_json("/v1/sessions").await, "plain"),
        "Fix the login bug"
    );
    assert_eq!(a.stop(SECS10), 0);

    let b = args(Daemon::builder()).start();
    // Read back from the state dir, before any POST.
    let listed = b.get_json("/v1/sessions").await;
    assert_eq!(title_of(&listed, "plain"), "Fix the login bug", "{listed}");
    assert_eq!(title_of(&listed, "listing"), "Agent lists me", "{listed}");

    // No client sent `initialize` to this daemon: the capabilities come from the state dir.
    let (s, own) = post(
        &b,
        "/v1/acp/plain",
        &request(json!(7), "session/list", json!({})),
    )
    .await;
    assert_eq!(s, 200, "{own}");
    let sessions = own["result"]["sessions"].as_array().expect("a list");
    assert_eq!(sessions.len(), 1, "{own}");
    assert_eq!(sessions[0]["sessionId"], plain.as_str());
    assert_eq!(
        sessions[0]["title"], "Fix the login bug",
        "answered by the daemon: {own}"
    );
    let (s, relayed) = post(
        &b,
        "/v1/acp/listing",
        &request(json!(7), "session/list", json!({})),
    )
    .await;
    assert_eq!(s, 200, "{relayed}");
    assert_eq!(
        relayed["result"]["sessions"][0]["title"], "listed by the mock",
        "relayed to the agent that lists: {relayed}"
    );
    assert_eq!(
        relayed["result"]["sessions"][0]["sessionId"],
        listing.as_str()
    );

    // A bundle carries the title; imported under another serverId the inventory shows it.
    let bundle = b
        .client()
        .get(b.url("/v1/acp/plain/bundle"))
        .send()
        .await
        .unwrap();
    assert_eq!(bundle.status(), 200);
    let bundle = bundle.bytes().await.unwrap();
    let mut ar = tar::Archive::new(flate2::read::GzDecoder::new(&bundle[..]));
    let manifest: Value = ar
        .entries()
        .unwrap()
        .map(|e| e.unwrap())
        .find(|e| e.path().unwrap().to_str() == Some("manifest.json"))
        .map(|e| serde_json::from_reader(e).unwrap())
        .expect("a manifest");
    assert_eq!(
        manifest["sessions"][0]["title"], "Fix the login bug",
        "{manifest}"
    );
    // Another daemon (its own state and work dirs) takes the bundle.
    let work_c = tmp.path().join("work-c");
    std::fs::create_dir_all(&work_c).unwrap();
    let c = Daemon::builder()
        .work_dir(&work_c)
        .args(crate::durable::state_args(&tmp.path().join("state-c")))
        .arg("--agents-file")
        .arg(&agents)
        .start();
    let r = c
        .client()
        .post(c.url("/v1/acp/plain-copy/bundle"))
        .header("content-type", "application/gzip")
        .body(bundle)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201, "{}", r.text().await.unwrap());
    let listed = c.get_json("/v1/sessions").await;
    assert_eq!(
        title_of(&listed, "plain-copy"),
        "Fix the login bug",
        "{listed}"
    );
    // And the copy's list capability came with it: answered by the daemon.
    let (s, own) = post(
        &c,
        "/v1/acp/plain-copy",
        &request(json!(8), "session/list", json!({})),
    )
    .await;
    assert_eq!(s, 200, "{own}");
    assert_eq!(
        own["result"]["sessions"][0]["title"], "Fix the login bug",
        "{own}"
    );
}
