//! `/v1/config/mcp` and `/v1/config/skills` seen from a client: round trips, the 400s and 404s of
//! the contract, the file on disk, and concurrent writes of different names all kept.

use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::support::Daemon;

fn url(d: &Daemon, kind: &str, dir: &str, name: &str) -> String {
    let param = if kind == "mcp" {
        "mcpName"
    } else {
        "skillName"
    };
    d.url(&format!("/v1/config/{kind}?directory={dir}&{param}={name}"))
}

#[tokio::test]
async fn mcp_and_skills_entries_round_trip_through_the_directory_file() {
    let d = Daemon::start();
    std::fs::create_dir_all(d.path("proj")).unwrap();
    let c = d.client();
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
        let r = c
            .put(url(&d, kind, "proj", name))
            .json(body)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 204, "{kind}/{name}: {:?}", r.text().await);
        let r = c.get(url(&d, kind, "proj", name)).send().await.unwrap();
        assert_eq!(r.status(), 200);
        assert_eq!(&r.json::<Value>().await.unwrap(), body);
    }
    let on_disk: Value = serde_json::from_slice(
        &std::fs::read(d.path("proj/.sandbox-agent/config/mcp.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(on_disk, json!({"fs": local, "web": remote}));
    let skills: Value = serde_json::from_slice(
        &std::fs::read(d.path("proj/.sandbox-agent/config/skills.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(skills, json!({"s1": skill}));

    // Absolute directories work the same; PUT replaces an entry.
    let abs = d.path("proj").display().to_string();
    let r = c
        .put(url(&d, "mcp", &abs, "fs"))
        .json(&remote)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 204);
    let r = c.get(url(&d, "mcp", "proj", "fs")).send().await.unwrap();
    assert_eq!(r.json::<Value>().await.unwrap(), remote);

    let r = c.delete(url(&d, "mcp", "proj", "fs")).send().await.unwrap();
    assert_eq!(r.status(), 204);
    let r = c.get(url(&d, "mcp", "proj", "fs")).send().await.unwrap();
    assert_eq!(r.status(), 404);
    assert_eq!(r.headers()["content-type"], "application/problem+json");
    let r = c.delete(url(&d, "mcp", "proj", "fs")).send().await.unwrap();
    assert_eq!(r.status(), 204, "DELETE is idempotent");
    let r = c.get(url(&d, "mcp", "proj", "web")).send().await.unwrap();
    assert_eq!(r.status(), 200, "other entries are kept");
}

#[tokio::test]
async fn config_requests_without_params_or_with_bad_bodies_are_400() {
    let d = Daemon::start();
    std::fs::create_dir_all(d.path("proj")).unwrap();
    std::fs::write(d.path("file"), "x").unwrap();
    let c = d.client();
    for q in [
        "/v1/config/mcp?directory=proj",
        "/v1/config/mcp?mcpName=x",
        "/v1/config/mcp?directory=proj&skillName=x",
        "/v1/config/skills?directory=proj&mcpName=x",
        "/v1/config/skills",
        "/v1/config/mcp?directory=&mcpName=x",
    ] {
        for m in [reqwest::Method::GET, reqwest::Method::DELETE] {
            let r = c.request(m.clone(), d.url(q)).send().await.unwrap();
            assert_eq!(r.status(), 400, "{m} {q}");
            assert_eq!(r.headers()["content-type"], "application/problem+json");
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
        let r = c
            .put(url(&d, kind, "proj", "n"))
            .header("content-type", "application/json")
            .body(body)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 400, "{body}");
        let v: Value = r.json().await.unwrap();
        assert!(
            v["detail"].as_str().unwrap().contains(reason),
            "{body}: {v}"
        );
    }
    assert!(
        !d.path("proj/.sandbox-agent/config/mcp.json").exists(),
        "nothing stored"
    );
    let r = c
        .get(url(&d, "mcp", "missing-dir", "n"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::NOT_FOUND);
    let r = c
        .put(url(&d, "mcp", "file", "n"))
        .json(&json!({"type":"local","command":"x"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400, "a file is not a directory");
    let r = c
        .get(url(&d, "skills", "proj", "none"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404);
}

#[tokio::test]
async fn concurrent_puts_of_different_names_are_all_kept() {
    let d = Daemon::start();
    std::fs::create_dir_all(d.path("proj")).unwrap();
    let c = d.client();
    let puts = (0..32).map(|i| {
        let c = c.clone();
        let u = url(&d, "mcp", "proj", &format!("srv{i}"));
        async move {
            c.put(u)
                .json(&json!({"type":"local","command":format!("cmd{i}")}))
                .send()
                .await
                .unwrap()
                .status()
        }
    });
    for s in futures_util::future::join_all(puts).await {
        assert_eq!(s, 204);
    }
    let on_disk: Value = serde_json::from_slice(
        &std::fs::read(d.path("proj/.sandbox-agent/config/mcp.json")).unwrap(),
    )
    .unwrap();
    let map = on_disk.as_object().unwrap();
    assert_eq!(map.len(), 32);
    for i in 0..32 {
        assert_eq!(map[&format!("srv{i}")]["command"], format!("cmd{i}"));
    }
}
