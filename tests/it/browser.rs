//! The browser API (`/v1/browser/*`) on a real Chromium: routes before start are 409, bad input
//! 400/404; a page served on loopback navigated to, screenshotted (the PNG decodes), read as text
//! and markdown, its accessibility snapshot naming its heading and button; tabs opened, activated,
//! closed; a stop that leaves no process and no profile; a killed Chromium restarted with back-off,
//! and left down after five quick crashes in a row; a full-page screenshot taller than the viewport; and
//! Playwright connecting through the DevTools proxy (`connectOverCDP`) with the daemon's token.
//! Chromium and playwright-core come from `.ci/install-inspector.sh`.

use std::path::Path;
use std::time::Duration;

use axum::http::StatusCode;
use serde_json::json;

use crate::support::app::App;
use crate::support::{Daemon, eventually_async, skip};

const PAGE: &str = "<!doctype html><html><head><title>Test page</title></head><body>\
<h1>Hello heading</h1><p>Some <b>bold</b> text and a <a href=\"/next\">link</a>.</p>\
<ul><li>one</li><li>two</li></ul><button>Press me</button><script>var hidden = 1;</script>\
</body></html>";

/// A page 3,000 CSS pixels tall (served at `/tall`).
const TALL: &str = "<!doctype html><html><head><title>Tall</title></head>\
<body style=\"margin:0\"><div style=\"height:3000px;background:linear-gradient(red,blue)\">top</div>\
</body></html>";

/// The width and height in a PNG's header.
fn png_size(b: &[u8]) -> (u32, u32) {
    assert_eq!(&b[..8], b"\x89PNG\r\n\x1a\n", "not a PNG");
    (
        u32::from_be_bytes(b[16..20].try_into().unwrap()),
        u32::from_be_bytes(b[20..24].try_into().unwrap()),
    )
}

fn have_chromium() -> bool {
    if Path::new("/usr/bin/chromium").exists() {
        true
    } else {
        skip("/usr/bin/chromium is missing; run .ci/install-inspector.sh");
        false
    }
}

/// A loopback HTTP server answering every request with `PAGE`; returns its base URL.
async fn page_server() -> String {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        while let Ok((mut s, _)) = l.accept().await {
            tokio::spawn(async move {
                let mut buf = vec![0u8; 8192];
                let n = s.read(&mut buf).await.unwrap_or(0);
                let page = if buf[..n].starts_with(b"GET /tall ") {
                    TALL
                } else {
                    PAGE
                };
                let resp = format!(
                    "HTTP/1.1 200 OK\r\ncontent-type: text/html\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{page}",
                    page.len()
                );
                let _ = s.write_all(resp.as_bytes()).await;
            });
        }
    });
    format!("http://{addr}")
}

fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|s| !s.contains(") Z "))
        .unwrap_or(false)
}

#[tokio::test]
async fn browser_routes_before_start_are_409_and_bad_input_is_400() {
    let app = App::start(Vec::<String>::new()).await;
    let s = app.get("/v1/browser/status").await.json();
    assert_eq!(s["state"], "inactive", "{s}");
    for uri in [
        "/v1/browser/tabs",
        "/v1/browser/screenshot",
        "/v1/browser/content",
        "/v1/browser/accessibility",
        "/v1/browser/cdp/json/version",
    ] {
        app.get(uri).await.problem(StatusCode::CONFLICT);
    }
    app.post(
        "/v1/browser/navigate",
        json!({"url": "http://127.0.0.1:1/"}),
    )
    .await
    .problem(StatusCode::CONFLICT);
    // Input is checked before the state.
    for url in [
        "file:///etc/passwd",
        "javascript:alert(1)",
        "chrome://settings",
        "nope",
    ] {
        let p = app
            .post("/v1/browser/navigate", json!({"url": url}))
            .await
            .problem(StatusCode::BAD_REQUEST);
        assert_eq!(p["field"], "url", "{p}");
    }
    app.post("/v1/browser/start", json!({"width": 5}))
        .await
        .problem(StatusCode::BAD_REQUEST);
    app.post("/v1/browser/start", json!({"bogus": 1}))
        .await
        .problem(StatusCode::BAD_REQUEST);
    // Not headless needs a desktop.
    app.post("/v1/browser/start", json!({"headless": false}))
        .await
        .problem(StatusCode::CONFLICT);
    app.get("/v1/browser/content?format=pdf")
        .await
        .problem(StatusCode::BAD_REQUEST);
}

#[tokio::test]
async fn browser_drives_a_page_and_stop_leaves_no_process() {
    if !have_chromium() {
        return;
    }
    let base = page_server().await;
    let app = App::start(Vec::<String>::new()).await;
    let a = app.post("/v1/browser/start", json!({})).await;
    assert_eq!(
        a.status,
        StatusCode::OK,
        "{}",
        String::from_utf8_lossy(&a.body)
    );
    let s = a.json();
    assert_eq!(s["state"], "active", "{s}");
    let pid = s["pid"].as_u64().unwrap() as u32;
    let kids = crate::support::descendants(pid);
    assert!(!kids.is_empty(), "Chromium has helper processes");

    let n = app
        .post(
            "/v1/browser/navigate",
            json!({"url": format!("{base}/page")}),
        )
        .await;
    assert_eq!(
        n.status,
        StatusCode::OK,
        "{}",
        String::from_utf8_lossy(&n.body)
    );
    let tab = n.json();
    assert_eq!(tab["title"], "Test page", "{tab}");

    let shot = app.get("/v1/browser/screenshot").await;
    assert_eq!(shot.status, StatusCode::OK);
    assert_eq!(shot.content_type(), "image/png");
    assert_eq!(&shot.body[..8], b"\x89PNG\r\n\x1a\n");
    let w = u32::from_be_bytes(shot.body[16..20].try_into().unwrap());
    assert!(w > 0);
    let jpg = app
        .get("/v1/browser/screenshot?format=jpeg&quality=50")
        .await;
    assert_eq!(jpg.content_type(), "image/jpeg");
    assert_eq!(&jpg.body[..2], b"\xff\xd8");

    let text = app.get("/v1/browser/content").await.json();
    let t = text["content"].as_str().unwrap();
    assert!(t.contains("Hello heading") && t.contains("Press me"), "{t}");
    assert!(!t.contains("hidden = 1"), "{t}");
    let md = app.get("/v1/browser/content?format=markdown").await.json();
    let m = md["content"].as_str().unwrap();
    assert!(m.contains("# Hello heading"), "{m}");
    assert!(m.contains("**bold**"), "{m}");
    assert!(m.contains(&format!("[link]({base}/next)")), "{m}");
    assert!(m.contains("- one"), "{m}");

    let ax = app.get("/v1/browser/accessibility").await.json();
    let nodes = ax["nodes"].as_array().unwrap();
    let has = |role: &str, name: &str| nodes.iter().any(|n| n["role"] == role && n["name"] == name);
    assert!(has("heading", "Hello heading"), "{ax}");
    assert!(has("button", "Press me"), "{ax}");
    let small = app.get("/v1/browser/accessibility?maxNodes=2").await.json();
    assert_eq!(small["nodes"].as_array().unwrap().len(), 2);
    assert_eq!(small["truncated"], true);

    // Tabs.
    let first = tab["id"].as_str().unwrap().to_string();
    let t2 = app
        .post("/v1/browser/tabs", json!({"url": "about:blank"}))
        .await
        .json();
    let second = t2["id"].as_str().unwrap().to_string();
    let list = app.get("/v1/browser/tabs").await.json();
    assert_eq!(list["tabs"].as_array().unwrap().len(), 2, "{list}");
    let a = app
        .post(&format!("/v1/browser/tabs/{first}/activate"), json!(null))
        .await;
    assert_eq!(a.status, StatusCode::NO_CONTENT);
    let c = app.delete(&format!("/v1/browser/tabs/{second}")).await;
    assert_eq!(c.status, StatusCode::NO_CONTENT);
    eventually_async(Duration::from_secs(10), "the tab closes", || async {
        let l = app.get("/v1/browser/tabs").await.json();
        (l["tabs"].as_array().unwrap().len() == 1).then_some(())
    })
    .await;
    app.delete("/v1/browser/tabs/ABCDEF0123")
        .await
        .problem(StatusCode::NOT_FOUND);
    app.delete("/v1/browser/tabs/..%2F..%2Fjson")
        .await
        .problem(StatusCode::BAD_REQUEST);
    app.get("/v1/browser/content?tabId=FFFF")
        .await
        .problem(StatusCode::NOT_FOUND);
    app.post("/v1/browser/tabs", json!({"url": "file:///etc/passwd"}))
        .await
        .problem(StatusCode::BAD_REQUEST);

    let s = app.post("/v1/browser/stop", json!(null)).await.json();
    assert_eq!(s["state"], "inactive", "{s}");
    assert!(!alive(pid));
    for k in kids {
        assert!(!alive(k), "Chromium's process {k} outlived stop");
    }
    app.get("/v1/browser/tabs")
        .await
        .problem(StatusCode::CONFLICT);
}

/// Whether `pid` is gone entirely (not even a zombie waiting for its parent).
fn gone(pid: u32) -> bool {
    !Path::new(&format!("/proc/{pid}")).exists()
}

fn kill9(pid: u32) {
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
}

#[tokio::test]
async fn browser_killed_chromium_is_restarted_then_stays_down_after_quick_crashes() {
    if !have_chromium() {
        return;
    }
    let base = page_server().await;
    let app = App::start(Vec::<String>::new()).await;
    let a = app
        .post("/v1/browser/start", json!({"width": 640, "height": 480}))
        .await;
    assert_eq!(
        a.status,
        StatusCode::OK,
        "{}",
        String::from_utf8_lossy(&a.body)
    );
    let s = a.json();
    assert_eq!(s["restarts"], 0, "{s}");
    let pid = s["pid"].as_u64().unwrap() as u32;
    let mut dead = crate::support::descendants(pid);
    dead.push(pid);
    kill9(pid);
    let s = eventually_async(Duration::from_secs(20), "Chromium comes back", || async {
        let s = app.get("/v1/browser/status").await.json();
        (s["state"] == "active" && s["restarts"] == 1).then_some(s)
    })
    .await;
    assert_ne!(s["pid"].as_u64().unwrap() as u32, pid, "{s}");
    assert_eq!(s["lastError"]["code"], "browser_exited", "{s}");
    assert!(
        s["lastError"]["message"]
            .as_str()
            .unwrap()
            .contains("signal 9)"),
        "{s}"
    );
    // The same settings, and it works.
    let n = app
        .post(
            "/v1/browser/navigate",
            json!({"url": format!("{base}/page")}),
        )
        .await;
    assert_eq!(
        n.status,
        StatusCode::OK,
        "{}",
        String::from_utf8_lossy(&n.body)
    );
    let shot = app.get("/v1/browser/screenshot").await;
    let w = u32::from_be_bytes(shot.body[16..20].try_into().unwrap());
    assert!(w <= 640, "{w}");
    eventually_async(
        Duration::from_secs(10),
        "the killed Chromium's processes are gone and reaped",
        || async { dead.iter().all(|p| gone(*p)).then_some(()) },
    )
    .await;

    // Quick crashes in a row: restarted each time with a longer wait, until it stays down.
    let mut kills = 1;
    let mut last_pid = s["pid"].as_u64().unwrap() as u32;
    let s = loop {
        dead.extend(crate::support::descendants(last_pid));
        dead.push(last_pid);
        kill9(last_pid);
        kills += 1;
        let s = eventually_async(Duration::from_secs(30), "restarted or down", || async {
            let s = app.get("/v1/browser/status").await.json();
            let pid = s["pid"].as_u64().map(|p| p as u32);
            ((s["state"] == "active" && pid != Some(last_pid)) || s["state"] == "failed")
                .then_some(s)
        })
        .await;
        if s["state"] == "failed" {
            break s;
        }
        assert!(kills < 10, "it never gave up: {s}");
        last_pid = s["pid"].as_u64().unwrap() as u32;
    };
    assert_eq!(kills, 5, "five quick crashes in a row: {s}");
    assert_eq!(s["restarts"], 4, "{s}");
    assert_eq!(s["lastError"]["code"], "restart_exhausted", "{s}");
    app.get("/v1/browser/tabs")
        .await
        .problem(StatusCode::CONFLICT);
    eventually_async(
        Duration::from_secs(10),
        "no process of any Chromium is left",
        || async { dead.iter().all(|p| gone(*p)).then_some(()) },
    )
    .await;
    // A client start brings it up again, the count reset.
    let a = app.post("/v1/browser/start", json!({})).await;
    assert_eq!(
        a.status,
        StatusCode::OK,
        "{}",
        String::from_utf8_lossy(&a.body)
    );
    let s = a.json();
    assert_eq!(s["restarts"], 0, "{s}");
    assert!(s.get("lastError").is_none(), "{s}");
    let pid = s["pid"].as_u64().unwrap() as u32;
    app.post("/v1/browser/stop", json!(null)).await;
    assert!(!alive(pid));
}

#[tokio::test]
async fn browser_full_page_screenshot_is_taller_than_the_viewport() {
    if !have_chromium() {
        return;
    }
    let base = page_server().await;
    let app = App::start(Vec::<String>::new()).await;
    let a = app
        .post("/v1/browser/start", json!({"width": 800, "height": 600}))
        .await;
    assert_eq!(
        a.status,
        StatusCode::OK,
        "{}",
        String::from_utf8_lossy(&a.body)
    );
    let n = app
        .post(
            "/v1/browser/navigate",
            json!({"url": format!("{base}/tall")}),
        )
        .await
        .json();
    assert_eq!(n["title"], "Tall", "{n}");
    let view = app.get("/v1/browser/screenshot").await;
    assert_eq!(view.status, StatusCode::OK);
    let (vw, vh) = png_size(&view.body);
    assert!(vh <= 600 && vw <= 800, "the viewport is {vw}x{vh}");
    let full = app.get("/v1/browser/screenshot?fullPage=true").await;
    assert_eq!(
        full.status,
        StatusCode::OK,
        "{}",
        String::from_utf8_lossy(&full.body)
    );
    assert_eq!(full.content_type(), "image/png");
    let (fw, fh) = png_size(&full.body);
    assert_eq!(fh, 3000, "the whole page, not the {vh}px viewport");
    // The document's width: the viewport's less its scrollbar.
    assert!(fw > 0 && fw <= vw, "{fw} wide, the viewport {vw}");
    let jpg = app
        .get("/v1/browser/screenshot?fullPage=true&format=jpeg&quality=40")
        .await;
    assert_eq!(jpg.status, StatusCode::OK);
    assert_eq!(&jpg.body[..2], b"\xff\xd8");
    // The viewport is what it was: a full-page capture does not resize it for later calls.
    let again = app.get("/v1/browser/screenshot").await;
    assert_eq!(png_size(&again.body), (vw, vh));
    app.get("/v1/browser/screenshot?fullPage=maybe")
        .await
        .problem(StatusCode::BAD_REQUEST);
    app.post("/v1/browser/stop", json!(null)).await;
}

fn ui_dir() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("ui")
}

#[tokio::test]
async fn playwright_connects_through_the_cdp_proxy() {
    if !have_chromium() {
        return;
    }
    if !ui_dir().join("node_modules/playwright-core").exists() {
        skip("ui/node_modules/playwright-core is missing; run .ci/install-inspector.sh");
        return;
    }
    let base = page_server().await;
    let token = "browser-cdp-token";
    let d = Daemon::builder().token(token).start();
    let client = d.client();
    let r = client
        .post(d.url("/v1/browser/start"))
        .json(&json!({}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK, "{}", r.text().await.unwrap());
    // Without the token: 401, on the discovery document and on the socket.
    let anon = reqwest::Client::new();
    let r = anon
        .get(d.url("/v1/browser/cdp/json/version"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
    let v: serde_json::Value = client
        .get(d.url("/v1/browser/cdp/json/version"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let ws = v["webSocketDebuggerUrl"].as_str().unwrap();
    assert!(ws.ends_with("/v1/browser/cdp"), "{v}");
    let script = r#"
const { chromium } = require('playwright-core');
(async () => {
  const [endpoint, token, page] = process.argv.slice(1);
  const browser = await chromium.connectOverCDP(endpoint, { headers: { Authorization: 'Bearer ' + token } });
  const ctx = browser.contexts()[0];
  const p = await ctx.newPage();
  await p.goto(page);
  const snap = await p.locator('body').ariaSnapshot();
  const text = await p.locator('h1').innerText();
  console.log(JSON.stringify({ snap, text }));
  await browser.close();
})().catch((e) => { console.error(e); process.exit(1); });
"#;
    let out = tokio::time::timeout(
        Duration::from_secs(60),
        tokio::process::Command::new("node")
            .arg("-e")
            .arg(script)
            .arg(d.url("/v1/browser/cdp"))
            .arg(token)
            .arg(format!("{base}/page"))
            .current_dir(ui_dir())
            .kill_on_drop(true)
            .output(),
    )
    .await
    .expect("node finished")
    .expect("run node");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_str(stdout.trim()).unwrap();
    assert_eq!(v["text"], "Hello heading", "{v}");
    let snap = v["snap"].as_str().unwrap();
    assert!(snap.contains("heading \"Hello heading\""), "{snap}");
    assert!(snap.contains("button \"Press me\""), "{snap}");
    // The page Playwright opened is one of the daemon's tabs.
    let tabs: serde_json::Value = client
        .get(d.url("/v1/browser/tabs"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert!(
        tabs["tabs"]
            .as_array()
            .unwrap()
            .iter()
            .any(|t| t["title"] == "Test page"),
        "{tabs}"
    );
    // The WebSocket URL with the token in the query (upgrades only), and without it.
    use futures_util::{SinkExt, StreamExt};
    let ws_url = d.url("/v1/browser/cdp").replacen("http://", "ws://", 1);
    assert!(
        tokio_tungstenite::connect_async(ws_url.as_str())
            .await
            .is_err(),
        "the proxy opened without the token"
    );
    let (mut ws, _) = tokio_tungstenite::connect_async(format!("{ws_url}?access_token={token}"))
        .await
        .expect("the proxy opens with ?access_token=");
    ws.send(tokio_tungstenite::tungstenite::Message::text(
        r#"{"id":1,"method":"Browser.getVersion"}"#,
    ))
    .await
    .unwrap();
    let answer = loop {
        let m = ws.next().await.expect("an answer").unwrap();
        if let tokio_tungstenite::tungstenite::Message::Text(t) = m {
            let v: serde_json::Value = serde_json::from_str(&t).unwrap();
            if v["id"] == 1 {
                break v;
            }
        }
    };
    assert!(
        answer["result"]["product"]
            .as_str()
            .is_some_and(|p| p.contains("Chrom")),
        "{answer}"
    );
    drop(ws);
    let r = client.post(d.url("/v1/browser/stop")).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::OK);
}
