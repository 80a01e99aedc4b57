//! The session inventory (`GET /v1/sessions`) and the ACP session methods the daemon follows:
//! paging and its errors, titles from `session_info_update`, `session/close` and
//! `session/delete`, the daemon's own answer to `session/list` for an agent that does not
//! advertise it (and the relay for one that does), `usage_update` in the metrics, and, after a
//! restart, the inventory read back and the sessions restored with `session/resume` where the
//! agent advertises it, `session/load` otherwise. In-process (`support::app`) except the
//! restarts, which need the binary.

use std::path::Path;
use std::time::Duration;

use serde_json::{Value, json};

use crate::support::Daemon;
use crate::support::app::App;

const SECS10: Duration = Duration::from_secs(10);

pub(crate) fn request(id: Value, method: &str, params: Value) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params})
}

pub(crate) fn prompt(id: Value, session: &str, text: &str) -> Value {
    request(
        id,
        "session/prompt",
        json!({"sessionId": session, "prompt": [{"type": "text", "text": text}]}),
    )
}

/// An agents file with mock agents `id = [extra mock-agent flags]`.
pub(crate) fn agents_file(dir: &Path, agents: &[(&str, &[&str])]) -> String {
    let mut text = String::new();
    for (id, flags) in agents {
        let mut args = vec!["\"mock-agent\"".to_string()];
        args.extend(flags.iter().map(|f| format!("\"{f}\"")));
        text.push_str(&format!(
            "[[agent]]\nid = \"{id}\"\ncommand = \"{}\"\nargs = [{}]\n\n",
            env!("CARGO_BIN_EXE_sandbox-agent"),
            args.join(", ")
        ));
    }
    let path = dir.join("agents.toml");
    std::fs::write(&path, text).unwrap();
    path.display().to_string()
}

/// `initialize` (first POST, naming `agent`) then `session/new` in `cwd`; the session id.
async fn new_session(app: &App, server_id: &str, agent: Option<&str>, cwd: &str) -> String {
    if let Some(agent) = agent {
        let init = app
            .post(
                &format!("/v1/acp/{server_id}?agent={agent}"),
                request(json!(0), "initialize", json!({"protocolVersion": 1})),
            )
            .await;
        assert_eq!(init.status, 200, "{}", String::from_utf8_lossy(&init.body));
    }
    let new = app
        .post(
            &format!("/v1/acp/{server_id}"),
            request(
                json!("new"),
                "session/new",
                json!({"cwd": cwd, "mcpServers": []}),
            ),
        )
        .await;
    assert_eq!(new.status, 200, "{}", String::from_utf8_lossy(&new.body));
    new.json()["result"]["sessionId"]
        .as_str()
        .unwrap()
        .to_string()
}

fn ids(page: &Value) -> Vec<(String, String)> {
    page["sessions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            (
                s["serverId"].as_str().unwrap().to_string(),
                s["sessionId"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

#[tokio::test]
async fn the_inventory_pages_every_session_with_an_opaque_cursor() {
    let app = App::start::<_, &str>([]).await;
    let a1 = new_session(&app, "inv-a", Some("mock"), "/").await;
    let a2 = new_session(&app, "inv-a", None, "/tmp").await;
    let b1 = new_session(&app, "inv-b", Some("mock"), "/").await;

    let first = app.get("/v1/sessions?limit=2").await;
    assert_eq!(first.status, 200);
    let first = first.json();
    assert_eq!(
        ids(&first),
        vec![("inv-a".into(), a1.clone()), ("inv-a".into(), a2.clone())]
    );
    let s = &first["sessions"][0];
    assert_eq!(s["agent"], "mock");
    assert_eq!(s["cwd"], "/");
    assert_eq!(s["state"], "live");
    assert!(s["createdAtMs"].as_u64().unwrap() > 0);
    assert!(s["lastActivityAtMs"].as_u64().unwrap() >= s["createdAtMs"].as_u64().unwrap());
    assert_eq!(first["sessions"][1]["cwd"], "/tmp");
    let cursor = first["nextCursor"]
        .as_str()
        .expect("a next page")
        .to_string();

    let second = app
        .get(&format!("/v1/sessions?limit=2&cursor={cursor}"))
        .await;
    assert_eq!(second.status, 200);
    let second = second.json();
    assert_eq!(ids(&second), vec![("inv-b".into(), b1.clone())]);
    assert!(second.get("nextCursor").is_none(), "{second}");

    // One serverId only; the whole list without a limit.
    let only_b = app.get("/v1/sessions?serverId=inv-b").await.json();
    assert_eq!(ids(&only_b), vec![("inv-b".into(), b1.clone())]);
    assert_eq!(ids(&app.get("/v1/sessions").await.json()).len(), 3);

    // A DELETEd serverId takes its sessions along.
    assert_eq!(app.delete("/v1/acp/inv-a").await.status, 204);
    assert_eq!(
        ids(&app.get("/v1/sessions").await.json()),
        vec![("inv-b".into(), b1)]
    );
}

#[tokio::test]
async fn bad_inventory_parameters_are_400_problems() {
    let app = App::start::<_, &str>([]).await;
    for uri in [
        "/v1/sessions?limit=0",
        "/v1/sessions?limit=1001",
        "/v1/sessions?limit=ten",
        "/v1/sessions?limit=-1",
        "/v1/sessions?cursor=zz",
        "/v1/sessions?cursor=6162",
        "/v1/sessions?page=2",
    ] {
        let a = app.get(uri).await;
        let p = a.problem(axum::http::StatusCode::BAD_REQUEST);
        assert!(!p["detail"].as_str().unwrap().is_empty(), "{uri}: {p}");
    }
    let a = app.get("/v1/sessions").await;
    assert_eq!(a.status, 200);
    assert_eq!(a.json(), json!({"sessions": []}));
}

#[tokio::test]
async fn titles_close_and_delete_are_followed() {
    let app = App::start::<_, &str>([]).await;
    let s1 = new_session(&app, "titles", Some("mock"), "/").await;
    let s2 = new_session(&app, "titles", None, "/").await;
    let before = app.get("/v1/sessions").await.json()["sessions"][0]["lastActivityAtMs"]
        .as_u64()
        .unwrap();
    let p = app
        .post(
            "/v1/acp/titles",
            prompt(json!(2), &s1, "/title Fix the login bug"),
        )
        .await;
    assert_eq!(p.status, 200);
    let list = app.get("/v1/sessions").await.json();
    let first = &list["sessions"][0];
    assert_eq!(first["sessionId"], s1.as_str());
    assert_eq!(first["title"], "Fix the login bug");
    assert!(first["lastActivityAtMs"].as_u64().unwrap() >= before);
    assert!(list["sessions"][1].get("title").is_none());

    let close = app
        .post(
            "/v1/acp/titles",
            request(json!(3), "session/close", json!({"sessionId": s1})),
        )
        .await;
    assert_eq!(close.status, 200);
    assert_eq!(close.json()["result"], json!({}));
    let list = app.get("/v1/sessions").await.json();
    assert_eq!(list["sessions"][0]["state"], "closed");
    assert_eq!(list["sessions"][1]["state"], "live");

    // A failed delete (unknown session) changes nothing; a successful one removes it.
    let bad = app
        .post(
            "/v1/acp/titles",
            request(json!(4), "session/delete", json!({"sessionId": "nope"})),
        )
        .await;
    assert!(bad.json()["error"].is_object());
    let del = app
        .post(
            "/v1/acp/titles",
            request(json!(5), "session/delete", json!({"sessionId": s2})),
        )
        .await;
    assert_eq!(del.json()["result"], json!({}));
    assert_eq!(
        ids(&app.get("/v1/sessions").await.json()),
        vec![("titles".into(), s1)]
    );
}

#[tokio::test]
async fn session_list_is_answered_by_the_daemon_unless_the_agent_advertises_it() {
    let dir = tempfile::tempdir().unwrap();
    let agents = agents_file(dir.path(), &[("lister", &["--list-sessions"])]);
    let app = App::start(["--agents-file", agents.as_str()]).await;

    // The mock without the capability: the daemon answers from the inventory.
    let s1 = new_session(&app, "nolist", Some("mock"), "/").await;
    let s2 = new_session(&app, "nolist", None, "/tmp").await;
    app.post("/v1/acp/nolist", prompt(json!(2), &s2, "/title second"))
        .await;
    // Another serverId's sessions are not this agent's.
    new_session(&app, "other", Some("mock"), "/").await;
    let list = app
        .post(
            "/v1/acp/nolist",
            request(json!(7), "session/list", json!({})),
        )
        .await;
    assert_eq!(list.status, 200);
    let list = list.json();
    assert_eq!(list["id"], 7);
    let sessions = list["result"]["sessions"].as_array().unwrap();
    assert_eq!(sessions.len(), 2, "{list}");
    assert_eq!(sessions[0]["sessionId"], s1.as_str());
    assert_eq!(sessions[0]["cwd"], "/");
    assert!(sessions[0]["updatedAt"].as_str().unwrap().ends_with('Z'));
    assert_eq!(sessions[1]["title"], "second");
    // The cwd filter.
    let filtered = app
        .post(
            "/v1/acp/nolist",
            request(json!(8), "session/list", json!({"cwd": "/tmp"})),
        )
        .await
        .json();
    let f = filtered["result"]["sessions"].as_array().unwrap();
    assert_eq!(f.len(), 1);
    assert_eq!(f[0]["sessionId"], s2.as_str());
    // A cursor that is not ours is a JSON-RPC invalid-params error.
    let bad = app
        .post(
            "/v1/acp/nolist",
            request(json!(9), "session/list", json!({"cursor": "zz"})),
        )
        .await
        .json();
    assert_eq!(bad["error"]["code"], -32602);

    // An agent that advertises it: relayed (the mock's own answer carries its own title).
    let own = new_session(&app, "withlist", Some("lister"), "/").await;
    let relayed = app
        .post(
            "/v1/acp/withlist",
            request(json!(7), "session/list", json!({})),
        )
        .await
        .json();
    assert_eq!(
        relayed["result"]["sessions"][0]["title"], "listed by the mock",
        "{relayed}"
    );
    assert_eq!(relayed["result"]["sessions"][0]["sessionId"], own.as_str());
}

#[tokio::test]
async fn usage_updates_are_counted_per_agent_in_the_metrics() {
    let dir = tempfile::tempdir().unwrap();
    // An agent id of this test's own: the counters are process-wide.
    let agents = agents_file(dir.path(), &[("usagemock", &[])]);
    let app = App::start(["--agents-file", agents.as_str()]).await;
    let s = new_session(&app, "usage", Some("usagemock"), "/").await;
    for (i, text) in ["/usage 1200 200000 0.25", "/usage 3400 200000 0.75"]
        .iter()
        .enumerate()
    {
        let p = app
            .post("/v1/acp/usage", prompt(json!(10 + i), &s, text))
            .await;
        assert_eq!(p.status, 200);
    }
    let m = app.get("/metrics").await;
    assert_eq!(m.status, 200);
    let text = String::from_utf8_lossy(&m.body).to_string();
    let line = |name: &str| {
        text.lines()
            .find(|l| l.starts_with(name) && l.contains("agent=\"usagemock\""))
            .unwrap_or_else(|| panic!("no {name} for usagemock in\n{text}"))
            .rsplit(' ')
            .next()
            .unwrap()
            .parse::<f64>()
            .unwrap()
    };
    assert_eq!(line("sandbox_agent_acp_usage_updates_total"), 2.0);
    assert_eq!(line("sandbox_agent_acp_usage_used_tokens"), 3400.0);
    assert_eq!(line("sandbox_agent_acp_usage_size_tokens"), 200000.0);
    assert_eq!(line("sandbox_agent_acp_usage_cost"), 0.75);
    assert!(text.contains("currency=\"USD\""));
}

/// POSTs through the binary; the body as JSON.
pub(crate) async fn post(d: &Daemon, path: &str, msg: &Value) -> (u16, Value) {
    let resp = d
        .client()
        .post(d.url(path))
        .header("content-type", "application/json")
        .body(msg.to_string())
        .send()
        .await
        .unwrap();
    let status = resp.status().as_u16();
    (status, resp.json().await.unwrap_or(Value::Null))
}

/// After a restart: the inventory lists the session as `restored` (read back from the state
/// dir), and the next POST restores it with `how`.
async fn restart_restores_with(agent: &str, flags: &[&str], how: &str) {
    let tmp = tempfile::tempdir().unwrap();
    let state = tmp.path().join("state");
    let work = tmp.path().join("work");
    std::fs::create_dir_all(&work).unwrap();
    let agents = agents_file(tmp.path(), &[(agent, flags)]);
    let args = |b: crate::support::DaemonBuilder| {
        b.work_dir(&work)
            .args(super::durable::state_args(&state))
            .arg("--agents-file")
            .arg(&agents)
    };
    let mut a = args(Daemon::builder()).start();
    let (s, init) = post(
        &a,
        &format!("/v1/acp/r1?agent={agent}"),
        &request(json!(0), "initialize", json!({"protocolVersion": 1})),
    )
    .await;
    assert_eq!(s, 200, "{init}");
    let (_, new) = post(
        &a,
        "/v1/acp/r1",
        &request(
            json!(1),
            "session/new",
            json!({"cwd": "/", "mcpServers": []}),
        ),
    )
    .await;
    let session = new["result"]["sessionId"].as_str().unwrap().to_string();
    let (s, _) = post(&a, "/v1/acp/r1", &prompt(json!(2), &session, "remember me")).await;
    assert_eq!(s, 200);
    let created = a.get_json("/v1/sessions").await["sessions"][0]["createdAtMs"].clone();
    assert_eq!(a.stop(SECS10), 0);

    let b = args(Daemon::builder()).start();
    let listed = b.get_json("/v1/sessions").await;
    let s0 = &listed["sessions"][0];
    assert_eq!(s0["sessionId"], session.as_str(), "{listed}");
    assert_eq!(s0["agent"], agent);
    assert_eq!(s0["state"], "restored");
    assert_eq!(s0["cwd"], "/");
    assert_eq!(s0["createdAtMs"], created);

    let (s, body) = post(&b, "/v1/acp/r1", &prompt(json!(3), &session, "/history")).await;
    assert_eq!(s, 200, "{body}");
    let events = crate::support::eventually_async(SECS10, "the restored notification", || {
        let b = &b;
        async move {
            let resp = b
                .client()
                .get(b.url("/v1/acp/r1"))
                .header("accept", "text/event-stream")
                .timeout(Duration::from_millis(500))
                .send()
                .await
                .ok()?;
            // The stream stays open: read what arrives within the timeout.
            let mut text = String::new();
            let mut resp = resp;
            while let Ok(Some(chunk)) = resp.chunk().await {
                text.push_str(&String::from_utf8_lossy(&chunk));
                if text.contains("_sandboxagent/restored") {
                    return Some(text);
                }
            }
            None
        }
    })
    .await;
    let note: Value = events
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter_map(|d| serde_json::from_str::<Value>(d).ok())
        .find(|v| v["method"] == "_sandboxagent/restored")
        .unwrap();
    assert_eq!(
        note["params"]["sessions"],
        json!([{"sessionId": session, "how": how}]),
        "{note}"
    );
    let listed = b.get_json("/v1/sessions").await;
    assert_eq!(listed["sessions"][0]["state"], "live", "{listed}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_restores_with_session_resume_where_the_agent_advertises_it() {
    restart_restores_with("resumer", &["--resume-session"], "session/resume").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_restores_with_session_load_otherwise() {
    restart_restores_with("loader", &[], "session/load").await;
}

/// `sandbox-agent sessions`: every page as a table, or `{"sessions": [...]}` with `--json`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_lists_sessions_as_a_table_and_as_json() {
    let d = Daemon::start();
    let cli = |args: &[&str]| {
        let mut cmd = std::process::Command::new(crate::support::BIN);
        cmd.args(args).stdin(std::process::Stdio::null());
        for (k, _) in std::env::vars_os() {
            if k.to_string_lossy().starts_with("SANDBOX_AGENT_") {
                cmd.env_remove(k);
            }
        }
        cmd.env("SANDBOX_AGENT_URL", d.url(""));
        if let Some(t) = &d.token {
            cmd.env("SANDBOX_AGENT_TOKEN", t);
        }
        cmd.output().unwrap()
    };
    let none = cli(&["sessions"]);
    assert_eq!(none.status.code(), Some(0));
    assert_eq!(String::from_utf8_lossy(&none.stdout), "no sessions\n");

    let (s, _) = post(
        &d,
        "/v1/acp/cli1?agent=mock",
        &request(json!(0), "initialize", json!({"protocolVersion": 1})),
    )
    .await;
    assert_eq!(s, 200);
    let (_, new) = post(
        &d,
        "/v1/acp/cli1",
        &request(
            json!(1),
            "session/new",
            json!({"cwd": "/", "mcpServers": []}),
        ),
    )
    .await;
    let session = new["result"]["sessionId"].as_str().unwrap().to_string();
    post(
        &d,
        "/v1/acp/cli1",
        &prompt(json!(2), &session, "/title Tidy up"),
    )
    .await;

    let o = cli(&["sessions", "--json"]);
    assert_eq!(
        o.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let listed: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(listed["sessions"][0]["sessionId"], session.as_str());
    assert_eq!(listed["sessions"][0]["title"], "Tidy up");

    let o = cli(&["sessions"]);
    assert_eq!(o.status.code(), Some(0));
    let text = String::from_utf8_lossy(&o.stdout).to_string();
    let mut lines = text.lines();
    assert!(lines.next().unwrap().starts_with("SERVER ID"), "{text}");
    let row = lines.next().unwrap();
    assert!(row.starts_with("cli1"), "{text}");
    assert!(
        row.contains(&session) && row.contains("live") && row.contains("Tidy up"),
        "{text}"
    );
}

/// Reads `GET /v1/acp/{server}` from the start until an event's data satisfies `done`; every
/// event's (id, data) so far.
async fn events_until(
    d: &Daemon,
    server: &str,
    done: impl Fn(&Value) -> bool,
) -> Vec<(u64, Value)> {
    crate::support::eventually_async(SECS10, "the awaited event", || {
        let done = &done;
        async move {
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
                let mut events = Vec::new();
                let mut id = 0;
                for l in text.lines() {
                    if let Some(v) = l.strip_prefix("id: ") {
                        id = v.parse().unwrap_or(0);
                    } else if let Some(v) = l.strip_prefix("data: ")
                        && let Ok(v) = serde_json::from_str::<Value>(v)
                    {
                        events.push((id, v));
                    }
                }
                if events.iter().any(|(_, v)| done(v)) {
                    return Some(events);
                }
            }
            None
        }
    })
    .await
}

/// `elicitation/create` is kept like a permission request: a subscriber that comes after it was
/// sent gets it replayed, any client answers it with a POST, and after a restart the request is
/// still in the replayed log with its original id.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_elicitation_is_replayed_to_late_subscribers_and_survives_a_restart() {
    let tmp = tempfile::tempdir().unwrap();
    let state = tmp.path().join("state");
    let args = |b: crate::support::DaemonBuilder| b.args(super::durable::state_args(&state));
    let mut a = args(Daemon::builder()).start();
    let (s, _) = post(
        &a,
        "/v1/acp/el?agent=mock",
        &request(json!(0), "initialize", json!({"protocolVersion": 1})),
    )
    .await;
    assert_eq!(s, 200);
    let (_, new) = post(
        &a,
        "/v1/acp/el",
        &request(
            json!(1),
            "session/new",
            json!({"cwd": "/", "mcpServers": []}),
        ),
    )
    .await;
    let session = new["result"]["sessionId"].as_str().unwrap().to_string();
    // The prompt waits for the answer: respond-async, so the POST returns at once.
    let resp = a
        .client()
        .post(a.url("/v1/acp/el"))
        .header("content-type", "application/json")
        .header("prefer", "respond-async")
        .body(prompt(json!(2), &session, "/elicit").to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 202);
    // A subscriber arriving only now still gets the request.
    let events = events_until(&a, "el", |v| v["method"] == "elicitation/create").await;
    let (event_id, req) = events
        .iter()
        .find(|(_, v)| v["method"] == "elicitation/create")
        .cloned()
        .unwrap();
    assert_eq!(req["params"]["sessionId"], session.as_str());
    let answer = json!({"jsonrpc": "2.0", "id": req["id"],
        "result": {"action": "accept", "content": {"branch": "main"}}});
    let (s, _) = post(&a, "/v1/acp/el", &answer).await;
    assert_eq!(s, 202);
    // The prompt's answer (on the stream: its POST was answered 202) follows the report.
    let done = events_until(&a, "el", |v| {
        v["id"] == 2 && v["result"]["stopReason"] == "end_turn"
    })
    .await;
    assert!(
        done.iter().any(|(_, v)| {
            v["params"]["update"]["content"]["text"] == "elicitation: accept main"
        })
    );
    assert_eq!(a.stop(SECS10), 0);

    let b = args(Daemon::builder()).start();
    let replayed = events_until(&b, "el", |v| v["method"] == "elicitation/create").await;
    assert!(
        replayed
            .iter()
            .any(|(id, v)| *id == event_id && v["method"] == "elicitation/create"),
        "{replayed:?}"
    );
}

/// `$/cancel_request` from a client is relayed to the agent, and the POST waiting for the
/// cancelled request is answered at once with the JSON-RPC error -32800 (the mock ignores the
/// notification, so only the daemon can have answered).
#[tokio::test]
async fn a_cancel_request_answers_the_pending_post() {
    let app = App::start::<_, &str>([]).await;
    let s = new_session(&app, "cancel", Some("mock"), "/").await;
    let hang = app.post("/v1/acp/cancel", prompt(json!("slow-1"), &s, "/hang"));
    let cancel = async {
        // Cancel once the prompt is in flight (listed as a pending request).
        crate::support::eventually_async(SECS10, "the prompt in flight", || async {
            let list = app.get("/v1/acp").await.json();
            (list["servers"][0]["pendingRequests"] == 1).then_some(())
        })
        .await;
        let a = app
            .post(
                "/v1/acp/cancel",
                json!({"jsonrpc": "2.0", "method": "$/cancel_request", "params": {"id": "slow-1"}}),
            )
            .await;
        assert_eq!(a.status, 202);
    };
    let (answer, ()) = tokio::join!(hang, cancel);
    assert_eq!(answer.status, 200);
    let body = answer.json();
    assert_eq!(body["id"], "slow-1");
    assert_eq!(body["error"]["code"], -32800, "{body}");
    // A cancel for an id nobody waits for is relayed and changes nothing.
    let a = app
        .post(
            "/v1/acp/cancel",
            json!({"jsonrpc": "2.0", "method": "$/cancel_request", "params": {"id": 99}}),
        )
        .await;
    assert_eq!(a.status, 202);
}
