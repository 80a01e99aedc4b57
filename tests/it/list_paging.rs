//! `?limit=&cursor=` on the list routes (in-process tier): pages cover every item once, in order,
//! a full page names the next, the last page names none, no parameters answer everything as
//! before paging, and a bad limit or cursor is a 400 problem.

use axum::http::StatusCode;
use serde_json::{Value, json};

use crate::support::app::App;

fn init() -> Value {
    json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {"protocolVersion": 1}})
}

/// Follows `nextCursor` from `first` to the end; the items of every page under `key`.
async fn every_page(app: &App, first: &str, key: &str) -> Vec<Vec<Value>> {
    let mut pages = Vec::new();
    let mut uri = first.to_string();
    loop {
        let a = app.get(&uri).await;
        assert_eq!(
            a.status,
            StatusCode::OK,
            "{}",
            String::from_utf8_lossy(&a.body)
        );
        let body = a.json();
        pages.push(body[key].as_array().unwrap().clone());
        match body["nextCursor"].as_str() {
            Some(c) => uri = format!("{first}&cursor={c}"),
            None => return pages,
        }
        assert!(pages.len() < 20, "paging does not end");
    }
}

#[tokio::test]
async fn acp_instances_page_by_serverid() {
    let app = App::start::<_, &str>([]).await;
    for id in ["p-e", "p-a", "p-c", "p-d", "p-b"] {
        let a = app.post(&format!("/v1/acp/{id}?agent=mock"), init()).await;
        assert_eq!(
            a.status,
            StatusCode::OK,
            "{}",
            String::from_utf8_lossy(&a.body)
        );
    }
    let all = app.get("/v1/acp").await.json();
    assert!(
        all.get("nextCursor").is_none(),
        "no limit, no cursor: {all}"
    );
    assert_eq!(all["servers"].as_array().unwrap().len(), 5);

    let pages = every_page(&app, "/v1/acp?limit=2", "servers").await;
    let ids: Vec<Vec<&str>> = pages
        .iter()
        .map(|p| p.iter().map(|s| s["serverId"].as_str().unwrap()).collect())
        .collect();
    assert_eq!(ids, [vec!["p-a", "p-b"], vec!["p-c", "p-d"], vec!["p-e"]]);
    // Every row of a page is whole: a running instance has its process figures.
    for s in pages.iter().flatten() {
        assert_eq!(s["status"], "running", "{s}");
        assert!(s["rssBytes"].as_u64().unwrap() > 0, "{s}");
    }
    // A page that ends exactly at the last item names one more, empty, page.
    let exact = every_page(&app, "/v1/acp?limit=5", "servers").await;
    assert_eq!(exact.iter().map(Vec::len).collect::<Vec<_>>(), [5, 0]);

    // A cursor whose instance is gone still continues after its place.
    let first = app.get("/v1/acp?limit=2").await.json();
    let cursor = first["nextCursor"].as_str().unwrap().to_string();
    assert_eq!(
        app.delete("/v1/acp/p-b").await.status,
        StatusCode::NO_CONTENT
    );
    let next = app
        .get(&format!("/v1/acp?limit=2&cursor={cursor}"))
        .await
        .json();
    assert_eq!(next["servers"][0]["serverId"], "p-c");

    for bad in [
        "limit=0",
        "limit=1001",
        "limit=two",
        "cursor=p-a",
        "cursor=%25%25",
        "limit=-3",
    ] {
        let a = app.get(&format!("/v1/acp?{bad}")).await;
        let p = a.problem(StatusCode::BAD_REQUEST);
        assert!(
            p["detail"]
                .as_str()
                .unwrap()
                .contains(if bad.starts_with("limit") {
                    "limit"
                } else {
                    "cursor"
                }),
            "{p}"
        );
    }
}

#[tokio::test]
async fn process_records_page_oldest_first() {
    let app = App::start::<_, &str>([]).await;
    let mut ids = Vec::new();
    for n in 0..4 {
        // Two that run on (their figures are listed) and two that exit at once.
        let (command, args) = if n % 2 == 0 {
            ("sleep", json!(["30"]))
        } else {
            ("true", json!([]))
        };
        let a = app
            .post("/v1/processes", json!({"command": command, "args": args}))
            .await;
        assert_eq!(
            a.status,
            StatusCode::OK,
            "{}",
            String::from_utf8_lossy(&a.body)
        );
        ids.push(a.json()["id"].as_str().unwrap().to_string());
    }
    let all = app.get("/v1/processes").await.json();
    assert!(all.get("nextCursor").is_none(), "{all}");
    assert_eq!(all["processes"].as_array().unwrap().len(), 4);

    let pages = every_page(&app, "/v1/processes?limit=3", "processes").await;
    let listed: Vec<Vec<&str>> = pages
        .iter()
        .map(|p| p.iter().map(|r| r["id"].as_str().unwrap()).collect())
        .collect();
    assert_eq!(listed, [vec![&*ids[0], &*ids[1], &*ids[2]], vec![&*ids[3]]]);
    let first = &pages[0][0];
    assert_eq!(first["status"], "running", "{first}");
    assert!(
        first.get("stats").is_some_and(|s| !s.is_null()),
        "a running record has its figures: {first}"
    );

    for bad in ["limit=0", "limit=x", "cursor=zzz"] {
        app.get(&format!("/v1/processes?{bad}"))
            .await
            .problem(StatusCode::BAD_REQUEST);
    }
    for id in &ids {
        let _ = app
            .post(&format!("/v1/processes/{id}/kill"), json!({}))
            .await;
    }
}

#[tokio::test]
async fn agents_page_by_id() {
    let app = App::start::<_, &str>([]).await;
    let all = app.get("/v1/agents").await.json();
    assert!(all.get("nextCursor").is_none(), "{all}");
    let mut ids: Vec<String> = all["agents"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["id"].as_str().unwrap().to_string())
        .collect();
    ids.sort();
    assert!(ids.len() >= 3, "{ids:?}");
    let pages = every_page(&app, "/v1/agents?limit=2", "agents").await;
    assert!(pages.iter().all(|p| p.len() <= 2));
    let paged: Vec<String> = pages
        .iter()
        .flatten()
        .map(|a| a["id"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(paged, ids);
    app.get("/v1/agents?limit=1001")
        .await
        .problem(StatusCode::BAD_REQUEST);
}

#[tokio::test]
async fn directory_entries_page_by_name_with_the_cursor_in_a_header() {
    let app = App::start::<_, &str>([]).await;
    let dir = app.path("paged");
    std::fs::create_dir_all(&dir).unwrap();
    for name in ["e", "b", "d", "a", "c"] {
        std::fs::write(dir.join(name), name).unwrap();
    }
    let path = dir.display().to_string();
    let whole = app.get(&format!("/v1/fs/entries?path={path}")).await;
    assert!(whole.headers.get("sandbox-agent-next-cursor").is_none());
    assert_eq!(whole.json().as_array().unwrap().len(), 5);

    let mut names = Vec::new();
    let mut uri = format!("/v1/fs/entries?path={path}&limit=2");
    loop {
        let a = app.get(&uri).await;
        assert_eq!(
            a.status,
            StatusCode::OK,
            "{}",
            String::from_utf8_lossy(&a.body)
        );
        let page = a.json();
        assert!(page.as_array().unwrap().len() <= 2);
        names.extend(
            page.as_array()
                .unwrap()
                .iter()
                .map(|e| e["name"].as_str().unwrap().to_string()),
        );
        match a.headers.get("sandbox-agent-next-cursor") {
            Some(c) => {
                uri = format!(
                    "/v1/fs/entries?path={path}&limit=2&cursor={}",
                    c.to_str().unwrap()
                )
            }
            None => break,
        }
        assert!(names.len() <= 10, "paging does not end");
    }
    assert_eq!(names, ["a", "b", "c", "d", "e"]);
    app.get(&format!("/v1/fs/entries?path={path}&cursor=!!"))
        .await
        .problem(StatusCode::BAD_REQUEST);
}
