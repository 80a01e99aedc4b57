//! Route tests of the in-process tier (`support::app`): the real router, middleware and services
//! driven without a socket. What is answered here does not depend on a process of the daemon's
//! own: status codes and problem bodies of the ACP proxy's bootstrap and of bad bodies, id
//! handling, the fs API's contract statuses, and the edge's fallbacks and token check. Agents are
//! still the real mock agent in a child process.

use axum::body::Body;
use axum::http::{Method, Request, StatusCode, header};
use serde_json::{Value, json};

use crate::support::app::{Answer, App};

fn request(id: Value, method: &str, params: Value) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params})
}

fn prompt(id: Value, session: &str, text: &str) -> Value {
    request(
        id,
        "session/prompt",
        json!({"sessionId": session, "prompt": [{"type": "text", "text": text}]}),
    )
}

/// A POST of raw `body` with `headers` (JSON content type unless one is given).
async fn post_raw(app: &App, uri: &str, body: impl Into<Body>, headers: &[(&str, &str)]) -> Answer {
    let mut req = Request::builder()
        .method(Method::POST)
        .uri(uri)
        .header(header::HOST, "127.0.0.1");
    if !headers
        .iter()
        .any(|(k, _)| k.eq_ignore_ascii_case("content-type"))
    {
        req = req.header(header::CONTENT_TYPE, "application/json");
    }
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    app.send(req.body(body.into()).unwrap()).await
}

async fn get_with(app: &App, uri: &str, headers: &[(&str, &str)]) -> Answer {
    let mut req = Request::builder()
        .uri(uri)
        .header(header::HOST, "127.0.0.1");
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    app.send(req.body(Body::empty()).unwrap()).await
}

async fn servers(app: &App) -> Vec<Value> {
    let a = app.get("/v1/acp").await;
    assert_eq!(a.status, 200);
    a.json()["servers"].as_array().cloned().unwrap_or_default()
}

async fn start_session(app: &App, server_id: &str) -> String {
    let init = app
        .post(
            &format!("/v1/acp/{server_id}?agent=mock"),
            request(json!(0), "initialize", json!({"protocolVersion": 1})),
        )
        .await;
    assert_eq!(init.status, 200, "{}", String::from_utf8_lossy(&init.body));
    let new = app
        .post(
            &format!("/v1/acp/{server_id}"),
            request(
                json!(1),
                "session/new",
                json!({"cwd": "/", "mcpServers": []}),
            ),
        )
        .await;
    assert_eq!(new.status, 200);
    new.json()["result"]["sessionId"]
        .as_str()
        .unwrap()
        .to_string()
}

#[tokio::test]
async fn the_root_health_and_unknown_routes_answer_as_documented() {
    let app = App::start::<_, &str>([]).await;
    let root = app.get("/").await;
    assert_eq!(root.status, 200);
    assert_eq!(root.json()["name"], "Sandbox Agent");
    let health = app.get("/v1/health").await.json();
    assert_eq!(health["status"], "ok");
    assert_eq!(health["durable"], false);
    assert_eq!(health["dataDir"]["writable"], true);
    let p = app
        .get("/v1/no-such-route")
        .await
        .problem(StatusCode::NOT_FOUND);
    assert!(
        p["detail"].as_str().unwrap().contains("/v1/no-such-route"),
        "{p}"
    );
    let a = app.request(Method::PATCH, "/v1/health", None).await;
    a.problem(StatusCode::METHOD_NOT_ALLOWED);
    assert!(
        a.headers.contains_key(header::ALLOW),
        "a 405 names what is allowed"
    );
}

#[tokio::test]
async fn with_a_token_every_route_but_the_root_needs_it() {
    let app = App::start(["--token", "s3cret"]).await;
    assert_eq!(app.get("/").await.status, 200);
    let a = app.get("/v1/health").await;
    a.problem(StatusCode::UNAUTHORIZED);
    assert!(a.headers.contains_key(header::WWW_AUTHENTICATE));
    let wrong = get_with(&app, "/v1/health", &[("authorization", "Bearer nope")]).await;
    wrong.problem(StatusCode::UNAUTHORIZED);
    let ok = get_with(&app, "/v1/health", &[("authorization", "bearer s3cret")]).await;
    assert_eq!(ok.status, 200, "the scheme is case-insensitive");
}

#[tokio::test]
async fn requests_keep_numeric_and_string_ids() {
    let app = App::start::<_, &str>([]).await;
    let a = app
        .post(
            "/v1/acp/ids?agent=mock",
            request(json!(0), "_mock/echo", json!({"n": 0})),
        )
        .await;
    assert_eq!(a.status, 200);
    assert_eq!(a.content_type(), "application/json");
    let body = a.json();
    assert!(body["id"].is_number());
    assert_eq!(body["id"], json!(0));
    assert_eq!(body["result"], json!({"n": 0}));
    for id in [json!("abc"), json!("7"), json!(42), json!(-3), json!("")] {
        let a = app
            .post(
                "/v1/acp/ids",
                request(id.clone(), "_mock/echo", json!({"x": 1})),
            )
            .await;
        assert_eq!(a.status, 200);
        assert_eq!(a.json()["id"], id, "id {id} comes back unchanged");
    }
    // A string "7" and a number 7 are different ids: both in flight at once are fine.
    let (x, y) = tokio::join!(
        app.post("/v1/acp/ids", prompt(json!(7), "s", "/sleep 300")),
        app.post("/v1/acp/ids", prompt(json!("7"), "s", "/sleep 300")),
    );
    assert_eq!((x.status, y.status), (StatusCode::OK, StatusCode::OK));
    assert_eq!(x.json()["id"], json!(7));
    assert_eq!(y.json()["id"], json!("7"));
}

#[tokio::test]
async fn notifications_and_client_responses_are_accepted() {
    let app = App::start::<_, &str>([]).await;
    start_session(&app, "n").await;
    let cancel = json!({"jsonrpc":"2.0","method":"session/cancel","params":{"sessionId":"mock-1"}});
    let a = app.post("/v1/acp/n", cancel).await;
    assert_eq!((a.status, a.body.len()), (StatusCode::ACCEPTED, 0));
    let a = app
        .post("/v1/acp/n", json!({"jsonrpc":"2.0","id":99,"result":{}}))
        .await;
    assert_eq!((a.status, a.body.len()), (StatusCode::ACCEPTED, 0));
    // The agent is still fine afterwards.
    let a = app
        .post("/v1/acp/n", request(json!(2), "_mock/echo", json!(1)))
        .await;
    assert_eq!(a.status, 200);
}

#[tokio::test]
async fn bootstrap_errors_are_400_404_409() {
    let app = App::start::<_, &str>([]).await;
    let msg = request(json!(1), "initialize", json!({}));
    // No agent on a new serverId.
    let p = app
        .post("/v1/acp/fresh", msg.clone())
        .await
        .problem(StatusCode::BAD_REQUEST);
    assert_eq!(p["serverId"], "fresh");
    // Unknown agent.
    let p = app
        .post("/v1/acp/fresh?agent=nope", msg.clone())
        .await
        .problem(StatusCode::BAD_REQUEST);
    assert_eq!(p["agent"], "nope");
    assert!(servers(&app).await.is_empty(), "nothing was created");
    // Invalid serverIds, on every method.
    let long = "x".repeat(129);
    for bad in ["a%20b", "a$b", long.as_str(), "%C3%A9"] {
        let path = format!("/v1/acp/{bad}");
        app.post(&format!("{path}?agent=mock"), msg.clone())
            .await
            .problem(StatusCode::BAD_REQUEST);
        assert_eq!(app.get(&path).await.status, 400, "GET {bad}");
        assert_eq!(app.delete(&path).await.status, 400, "DELETE {bad}");
    }
    let ok_id = "A-z.0_9".to_string() + &"y".repeat(121);
    assert_eq!(ok_id.len(), 128);
    let a = app
        .post(&format!("/v1/acp/{ok_id}?agent=mock"), msg.clone())
        .await;
    assert_eq!(a.status, 200);
    // Mismatched agent on an existing serverId.
    let p = app
        .post(&format!("/v1/acp/{ok_id}?agent=claude"), msg.clone())
        .await
        .problem(StatusCode::CONFLICT);
    assert_eq!(p["agent"], "mock");
    // Unknown serverId on GET.
    get_with(
        &app,
        "/v1/acp/never-created",
        &[("accept", "text/event-stream")],
    )
    .await
    .problem(StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn bad_bodies_and_headers_are_refused() {
    let app = App::start(["--body-limit", "1K"]).await;
    let path = "/v1/acp/b?agent=mock";
    for (body, what) in [
        ("{not json", "syntax"),
        ("[{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"x\"}]", "batch"),
        ("42", "number"),
        ("\"str\"", "string"),
        ("{\"jsonrpc\":\"2.0\"}", "neither method nor id"),
        ("", "empty"),
        // No agent can echo such an id: refused at once instead of waiting out the timeout.
        (
            "{\"jsonrpc\":\"2.0\",\"id\":{},\"method\":\"x\"}",
            "object id",
        ),
        ("{\"jsonrpc\":\"2.0\",\"id\":[1],\"result\":{}}", "array id"),
        (
            "{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":7}",
            "number method",
        ),
    ] {
        let a = post_raw(&app, path, body, &[]).await;
        assert_eq!(a.status, 400, "{what}");
        a.problem(StatusCode::BAD_REQUEST);
    }
    let msg = request(json!(1), "_mock/echo", json!({})).to_string();
    for ct in [
        "text/plain",
        "application/x-www-form-urlencoded",
        "application/jsonx",
    ] {
        post_raw(&app, path, msg.clone(), &[("content-type", ct)])
            .await
            .problem(StatusCode::UNSUPPORTED_MEDIA_TYPE);
    }
    let no_type = Request::builder()
        .method(Method::POST)
        .uri(path)
        .header(header::HOST, "127.0.0.1")
        .body(Body::from(msg.clone()))
        .unwrap();
    assert_eq!(app.send(no_type).await.status, 415, "missing content type");
    post_raw(&app, path, msg.clone(), &[("accept", "text/html")])
        .await
        .problem(StatusCode::NOT_ACCEPTABLE);
    post_raw(
        &app,
        path,
        msg.clone(),
        &[("accept", "application/json;q=0, text/html")],
    )
    .await
    .problem(StatusCode::NOT_ACCEPTABLE);
    let big = json!({"jsonrpc":"2.0","id":1,"method":"x","params":"y".repeat(2000)}).to_string();
    let p = post_raw(&app, path, big, &[])
        .await
        .problem(StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(p["limit"], 1024);
    assert!(
        servers(&app).await.is_empty(),
        "refused bodies start nothing"
    );
    // Parameters on the content type and broad Accept ranges are fine; a pretty-printed body too.
    let pretty =
        serde_json::to_string_pretty(&request(json!(1), "_mock/echo", json!({"a": [1, 2]})))
            .unwrap();
    let a = post_raw(
        &app,
        path,
        pretty,
        &[
            ("content-type", "Application/JSON; charset=utf-8"),
            ("accept", "text/html, */*;q=0.1"),
        ],
    )
    .await;
    assert_eq!(a.status, 200);
    assert_eq!(a.json()["result"], json!({"a": [1, 2]}));
    // GET with an Accept that excludes the event stream, and a bad Last-Event-ID.
    let a = get_with(&app, "/v1/acp/b", &[("accept", "application/json")]).await;
    assert_eq!(a.status, 406);
    let a = get_with(&app, "/v1/acp/b", &[("last-event-id", "abc")]).await;
    assert_eq!(a.status, 400);
}

#[tokio::test]
async fn every_fs_contract_status_is_answered() {
    let app = App::start::<_, &str>([]).await;
    let this = &app;
    let put = |path: &str, body: &'static str| {
        let uri = format!("/v1/fs/file?path={path}");
        async move { this.put_bytes(&uri, body).await }
    };
    assert_eq!(put("dir/a.txt", "a").await.status, 200);
    assert_eq!(put("b.txt", "b").await.status, 200);

    // entries and stat
    let a = app.get("/v1/fs/entries?path=dir").await;
    assert_eq!(a.status, 200);
    let v = a.json();
    assert_eq!(v[0]["name"], "a.txt");
    assert_eq!(v[0]["entryType"], "file");
    assert_eq!(v[0]["size"], 1);
    assert!(v[0]["modified"].as_str().unwrap().ends_with('Z'));
    let a = app.get("/v1/fs/entries").await;
    assert_eq!(a.status, 200, "entries without a path lists the work dir");
    assert_eq!(a.json().as_array().unwrap().len(), 2);
    let a = app.get("/v1/fs/stat?path=dir").await;
    assert_eq!(
        (a.status, a.json()["entryType"].clone()),
        (StatusCode::OK, json!("directory"))
    );
    for (path, status) in [
        ("/v1/fs/stat?path=nope", StatusCode::NOT_FOUND),
        ("/v1/fs/entries?path=nope", StatusCode::NOT_FOUND),
        ("/v1/fs/file?path=nope", StatusCode::NOT_FOUND),
        ("/v1/fs/entries?path=b.txt", StatusCode::BAD_REQUEST),
        ("/v1/fs/file?path=dir", StatusCode::BAD_REQUEST),
        ("/v1/fs/stat", StatusCode::BAD_REQUEST),
    ] {
        app.get(path).await.problem(status);
    }
    // A fifo is refused at once rather than blocking the request on open or read.
    nix::unistd::mkfifo(
        &app.path("pipe"),
        nix::sys::stat::Mode::from_bits_truncate(0o644),
    )
    .unwrap();
    assert_eq!(app.get("/v1/fs/file?path=pipe").await.status, 400);
    std::fs::remove_file(app.path("pipe")).unwrap();
    // PUT onto a directory, or below a file.
    assert_eq!(put("dir", "x").await.status, 400);
    assert_eq!(put("b.txt/x", "x").await.status, 400);

    // mkdir: no body, no content type; idempotent; a file in the way is 409.
    let a = app
        .request(Method::POST, "/v1/fs/mkdir?path=m/n", None)
        .await;
    assert_eq!(a.status, 200);
    assert_eq!(a.json()["path"], app.path("m/n").display().to_string());
    assert!(app.path("m/n").is_dir());
    assert_eq!(
        app.request(Method::POST, "/v1/fs/mkdir?path=m/n", None)
            .await
            .status,
        200
    );
    assert_eq!(
        app.request(Method::POST, "/v1/fs/mkdir?path=b.txt", None)
            .await
            .status,
        409
    );

    // move
    let mv = |body: Value| app.post("/v1/fs/move", body);
    assert_eq!(
        mv(json!({"from":"b.txt","to":"dir/a.txt"})).await.status,
        409
    );
    assert_eq!(std::fs::read_to_string(app.path("dir/a.txt")).unwrap(), "a");
    assert_eq!(mv(json!({"from":"nope","to":"x"})).await.status, 404);
    let a = mv(json!({"from":"b.txt","to":"m"})).await;
    assert_eq!(a.status, 409, "an existing directory without overwrite");
    let a = mv(json!({"from":"b.txt","to":"m","overwrite":true})).await;
    assert_eq!(a.status, 400, "a file cannot replace a directory");
    let a = mv(json!({"from":"b.txt","to":"dir/a.txt","overwrite":true})).await;
    assert_eq!(a.status, 200);
    assert_eq!(
        a.json(),
        json!({"from": app.path("b.txt").display().to_string(), "to": app.path("dir/a.txt").display().to_string()})
    );
    assert_eq!(std::fs::read_to_string(app.path("dir/a.txt")).unwrap(), "b");
    assert!(!app.path("b.txt").exists());
    let a = mv(json!({"from":"dir/a.txt","to":"new/deep/c.txt"})).await;
    assert_eq!(a.status, 200, "parents of the destination are created");
    assert_eq!(
        post_raw(&app, "/v1/fs/move", "not json", &[]).await.status,
        400
    );

    // delete
    let del = |q: &str| {
        let uri = format!("/v1/fs/entry?{q}");
        async move { this.delete(&uri).await }
    };
    assert_eq!(del("path=new").await.status, 409);
    assert!(app.path("new/deep/c.txt").exists());
    assert_eq!(del("path=ghost").await.status, 404);
    let a = del("path=new&recursive=true").await;
    assert_eq!(a.status, 200);
    assert_eq!(a.json()["path"], app.path("new").display().to_string());
    assert!(!app.path("new").exists());
    assert_eq!(del("path=m/n").await.status, 200, "an empty directory");
    assert_eq!(del("path=dir&recursive=true").await.status, 200);
}

/// A stored config file that is not a JSON object (written by hand, or through the fs API) is the
/// client's data, not a fault of the daemon: 409 naming the file, for reads, writes and deletes.
#[tokio::test]
async fn a_corrupt_stored_config_file_is_409_naming_it() {
    let app = App::start::<_, &str>([]).await;
    let dir = app.path("proj");
    std::fs::create_dir_all(dir.join(".sandbox-agent/config")).unwrap();
    let file = dir.join(".sandbox-agent/config/skills.json");
    std::fs::write(&file, "not json").unwrap();
    let q = format!("directory={}&skillName=s", dir.display());
    let p = app
        .get(&format!("/v1/config/skills?{q}"))
        .await
        .problem(StatusCode::CONFLICT);
    assert!(
        p["detail"]
            .as_str()
            .unwrap()
            .contains(&file.display().to_string()),
        "{p}"
    );
    app.delete(&format!("/v1/config/skills?{q}"))
        .await
        .problem(StatusCode::CONFLICT);
    assert_eq!(
        std::fs::read_to_string(&file).unwrap(),
        "not json",
        "nothing was changed"
    );
}
