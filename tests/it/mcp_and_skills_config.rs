//! `/v1/config/mcp` and `/v1/config/skills` through the in-process tier (`support::app`): round
//! trips, the 400s and 404s of the contract, the file on disk, and concurrent writes of
//! different names all kept. Nothing here needs a process of the daemon's own.

use axum::body::Body;
use axum::http::{Method, Request, StatusCode, header};
use serde_json::{Value, json};

use crate::support::app::{Answer, App};

fn url(kind: &str, dir: &str, name: &str) -> String {
    let param = if kind == "mcp" {
        "mcpName"
    } else {
        "skillName"
    };
    format!("/v1/config/{kind}?directory={dir}&{param}={name}")
}

async fn put(app: &App, uri: &str, body: &Value) -> Answer {
    app.request(Method::PUT, uri, Some(body.clone())).await
}

/// A `PUT` of `body` as it is, declared as JSON.
async fn put_raw(app: &App, uri: &str, body: &str) -> Answer {
    let req = Request::builder()
        .method(Method::PUT)
        .uri(uri)
        .header(header::HOST, "127.0.0.1")
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from(body.to_string()))
        .unwrap();
    app.send(req).await
}

#[tokio::test]
async fn mcp_and_skills_entries_round_trip_through_the_directory_file() {
    let app = App::start::<_, &str>([]).await;
    std::fs::create_dir_all(app.path("proj")).unwrap();
    let local =
        json!({"type":"local","command":["npx","-y","srv"],"env":{"K":"v"},"timeoutMs":3000});
    let remote = json!({"type":"remote","url":"https://mcp.example/sse","transport":"sse","headers":{"A":"b"}});
    let skill =
        json!({"sources":[{"type":"github","source":"org/repo","skills":["a"],"ref":"main"}]});
    for (kind, name, body) in [
        ("mcp", "fs", &local),
        ("mcp", "web", &remote),
        ("skills", "s1", &skill),
    ] {
        let r = put(&app, &url(kind, "proj", name), body).await;
        assert_eq!(
            r.status,
            204,
            "{kind}/{name}: {}",
            String::from_utf8_lossy(&r.body)
        );
        let r = app.get(&url(kind, "proj", name)).await;
        assert_eq!(r.status, 200);
        assert_eq!(&r.json(), body);
    }
    let on_disk: Value = serde_json::from_slice(
        &std::fs::read(app.path("proj/.sandbox-agent/config/mcp.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(on_disk, json!({"fs": local, "web": remote}));
    let skills: Value = serde_json::from_slice(
        &std::fs::read(app.path("proj/.sandbox-agent/config/skills.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(skills, json!({"s1": skill}));

    // Absolute directories work the same; PUT replaces an entry.
    let abs = app.path("proj").display().to_string();
    let r = put(&app, &url("mcp", &abs, "fs"), &remote).await;
    assert_eq!(r.status, 204);
    let r = app.get(&url("mcp", "proj", "fs")).await;
    assert_eq!(r.json(), remote);

    let r = app.delete(&url("mcp", "proj", "fs")).await;
    assert_eq!(r.status, 204);
    app.get(&url("mcp", "proj", "fs"))
        .await
        .problem(StatusCode::NOT_FOUND);
    let r = app.delete(&url("mcp", "proj", "fs")).await;
    assert_eq!(r.status, 204, "DELETE is idempotent");
    let r = app.get(&url("mcp", "proj", "web")).await;
    assert_eq!(r.status, 200, "other entries are kept");
}

#[tokio::test]
async fn config_requests_without_params_or_with_bad_bodies_are_400() {
    let app = App::start::<_, &str>([]).await;
    std::fs::create_dir_all(app.path("proj")).unwrap();
    std::fs::write(app.path("file"), "x").unwrap();
    for q in [
        "/v1/config/mcp?directory=proj",
        "/v1/config/mcp?mcpName=x",
        "/v1/config/mcp?directory=proj&skillName=x",
        "/v1/config/skills?directory=proj&mcpName=x",
        "/v1/config/skills",
        "/v1/config/mcp?directory=&mcpName=x",
    ] {
        for m in [Method::GET, Method::DELETE] {
            let r = app.request(m.clone(), q, None).await;
            assert_eq!(r.status, 400, "{m} {q}");
            r.problem(StatusCode::BAD_REQUEST);
        }
    }
    for (kind, body, reason) in [
        ("mcp", "not json", "JSON"),
        ("mcp", r#"{"type":"local"}"#, "command"),
        ("mcp", r#"{"type":"local","command":""}"#, "command"),
        ("mcp", r#"{"type":"remote","url":"ftp://x"}"#, "url"),
        (
            "mcp",
            r#"{"type":"remote","url":"https://x","transport":"ws"}"#,
            "ws",
        ),
        ("mcp", r#"{"type":"stdio","command":"x"}"#, "stdio"),
        (
            "mcp",
            r#"{"type":"local","command":"x","timeoutMs":-1}"#,
            "-1",
        ),
        ("skills", r#"{"sources":[{"source":"o/r"}]}"#, "type"),
        ("skills", r#"{"sources":"o/r"}"#, "sources"),
    ] {
        let v = put_raw(&app, &url(kind, "proj", "n"), body)
            .await
            .problem(StatusCode::BAD_REQUEST);
        assert!(
            v["detail"].as_str().unwrap().contains(reason),
            "{body}: {v}"
        );
    }
    assert!(
        !app.path("proj/.sandbox-agent/config/mcp.json").exists(),
        "nothing stored"
    );
    app.get(&url("mcp", "missing-dir", "n"))
        .await
        .problem(StatusCode::NOT_FOUND);
    let r = put(
        &app,
        &url("mcp", "file", "n"),
        &json!({"type":"local","command":"x"}),
    )
    .await;
    assert_eq!(r.status, 400, "a file is not a directory");
    app.get(&url("skills", "proj", "none"))
        .await
        .problem(StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn concurrent_puts_of_different_names_are_all_kept() {
    let app = App::start::<_, &str>([]).await;
    std::fs::create_dir_all(app.path("proj")).unwrap();
    let puts = (0..32).map(|i| {
        let (app, u) = (&app, url("mcp", "proj", &format!("srv{i}")));
        async move {
            put(
                app,
                &u,
                &json!({"type":"local","command":format!("cmd{i}")}),
            )
            .await
            .status
        }
    });
    for s in futures_util::future::join_all(puts).await {
        assert_eq!(s, 204);
    }
    let on_disk: Value = serde_json::from_slice(
        &std::fs::read(app.path("proj/.sandbox-agent/config/mcp.json")).unwrap(),
    )
    .unwrap();
    let map = on_disk.as_object().unwrap();
    assert_eq!(map.len(), 32);
    for i in 0..32 {
        assert_eq!(map[&format!("srv{i}")]["command"], format!("cmd{i}"));
    }
}
