//! The desktop API (`/v1/desktop/*`) on a real Xvfb, through the in-process router: screenshots
//! in each format, an xterm launched through the API that receives typed text, window geometry
//! read back, the clipboard, a recording ffprobe accepts, a killed display server reported, and
//! a stop that leaves no process. Each test uses a display number of its own. Tools come from
//! `.ci/install-desktop.sh`.

use std::time::Duration;

use axum::http::StatusCode;
use serde_json::json;

use crate::support::app::App;
use crate::support::{eventually_async, skip};

fn have_tools() -> bool {
    let missing: Vec<&str> = [
        "Xvfb", "openbox", "xdotool", "xclip", "ffmpeg", "ffprobe", "xprop", "xterm",
    ]
    .into_iter()
    .filter(|t| {
        !std::process::Command::new("sh")
            .args(["-c", &format!("command -v {t}")])
            .stdout(std::process::Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    })
    .collect();
    if missing.is_empty() {
        true
    } else {
        skip(&format!("missing {missing:?}; run .ci/install-desktop.sh"));
        false
    }
}

async fn start(app: &App, display: u32, w: u32, h: u32) -> serde_json::Value {
    let a = app
        .post(
            "/v1/desktop/start",
            json!({"displayNum": display, "width": w, "height": h}),
        )
        .await;
    assert_eq!(
        a.status,
        StatusCode::OK,
        "{}",
        String::from_utf8_lossy(&a.body)
    );
    let s = a.json();
    assert_eq!(s["state"], "active", "{s}");
    assert_eq!(s["display"], format!(":{display}"));
    s
}

fn pids(status: &serde_json::Value) -> Vec<u32> {
    status["processes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["pid"].as_u64().unwrap() as u32)
        .collect()
}

fn alive(pid: u32) -> bool {
    // A reaped child has no /proc entry; a zombie would still say "Z".
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|s| !s.contains(") Z "))
        .unwrap_or(false)
}

/// The width and height a PNG's IHDR declares.
fn png_size(b: &[u8]) -> (u32, u32) {
    assert_eq!(&b[..8], b"\x89PNG\r\n\x1a\n", "not a PNG");
    let n = |i: usize| u32::from_be_bytes(b[i..i + 4].try_into().unwrap());
    (n(16), n(20))
}

#[tokio::test]
async fn desktop_input_before_start_is_409_and_bad_bodies_are_problems() {
    let app = App::start(Vec::<String>::new()).await;
    let s = app.get("/v1/desktop/status").await.json();
    assert!(
        s["state"] == "inactive" || s["state"] == "install_required",
        "{s}"
    );
    app.post("/v1/desktop/mouse/move", json!({"x": 1, "y": 1}))
        .await
        .problem(StatusCode::CONFLICT);
    app.get("/v1/desktop/screenshot")
        .await
        .problem(StatusCode::CONFLICT);
    app.post("/v1/desktop/keyboard/type", json!({"text": "x"}))
        .await
        .problem(StatusCode::CONFLICT);
    // Malformed bodies are problem+json 400, not text/plain 422.
    app.post("/v1/desktop/mouse/move", json!({"x": "a", "y": 1}))
        .await
        .problem(StatusCode::BAD_REQUEST);
    // An absurd size is refused before anything is started.
    let p = app
        .post("/v1/desktop/start", json!({"width": 100000, "height": 10}))
        .await
        .problem(StatusCode::BAD_REQUEST);
    assert_eq!(p["field"], "width", "{p}");
    let s = app.get("/v1/desktop/status").await.json();
    assert!(s["processes"].as_array().unwrap().is_empty(), "{s}");
}

#[tokio::test]
async fn desktop_screenshots_typing_windows_and_clipboard_on_a_real_display() {
    if !have_tools() {
        return;
    }
    let app = App::start(Vec::<String>::new()).await;
    let status = start(&app, 161, 640, 480).await;
    // A second start with the same settings answers the same desktop.
    let again = app
        .post("/v1/desktop/start", json!({"displayNum": 161}))
        .await;
    assert_eq!(again.status, StatusCode::OK);
    assert_eq!(pids(&again.json()), pids(&status));
    app.post("/v1/desktop/start", json!({"displayNum": 162}))
        .await
        .problem(StatusCode::CONFLICT);

    let png = app.get("/v1/desktop/screenshot").await;
    assert_eq!(png.status, StatusCode::OK);
    assert_eq!(png.content_type(), "image/png");
    assert_eq!(png_size(&png.body), (640, 480));
    let region = app
        .get("/v1/desktop/screenshot/region?x=10&y=20&width=100&height=50")
        .await;
    assert_eq!(png_size(&region.body), (100, 50));
    let scaled = app.get("/v1/desktop/screenshot?scale=0.5").await;
    assert_eq!(png_size(&scaled.body), (320, 240));
    let jpeg = app
        .get("/v1/desktop/screenshot?format=jpeg&quality=50")
        .await;
    assert_eq!(jpeg.content_type(), "image/jpeg");
    assert_eq!(&jpeg.body[..3], b"\xff\xd8\xff");
    let webp = app.get("/v1/desktop/screenshot?format=webp").await;
    assert_eq!(webp.content_type(), "image/webp");
    assert_eq!(&webp.body[..4], b"RIFF");
    assert_eq!(&webp.body[8..12], b"WEBP");
    let p = app
        .get("/v1/desktop/screenshot/region?x=600&y=0&width=100&height=10")
        .await
        .problem(StatusCode::BAD_REQUEST);
    assert_eq!(p["field"], "width", "{p}");
    app.get("/v1/desktop/screenshot?format=gif")
        .await
        .problem(StatusCode::BAD_REQUEST);

    // Pointer moves read back.
    let m = app
        .post("/v1/desktop/mouse/move", json!({"x": 123, "y": 45}))
        .await
        .json();
    assert_eq!((m["x"].as_i64(), m["y"].as_i64()), (Some(123), Some(45)));
    let m = app.get("/v1/desktop/mouse/position").await.json();
    assert_eq!((m["x"].as_i64(), m["y"].as_i64()), (Some(123), Some(45)));
    app.post("/v1/desktop/mouse/click", json!({"x": 640, "y": 0}))
        .await
        .problem(StatusCode::BAD_REQUEST);

    // An xterm whose shell writes what it reads into a file.
    let typed = app.path("typed.txt");
    let script = format!("cat > {}", typed.display());
    let l = app
        .post(
            "/v1/desktop/launch",
            json!({"app": "xterm", "args": ["-u8", "-title", "typing-target", "-e", "sh", "-c", script], "wait": true}),
        )
        .await;
    assert_eq!(
        l.status,
        StatusCode::OK,
        "{}",
        String::from_utf8_lossy(&l.body)
    );
    let win = l.json()["windowId"].as_str().expect("a window").to_string();
    app.post(&format!("/v1/desktop/windows/{win}/focus"), json!(null))
        .await;
    let f = app.get("/v1/desktop/windows/focused").await.json();
    assert_eq!(f["id"], win.as_str(), "{f}");
    assert_eq!(f["title"], "typing-target");
    let t = app
        .post("/v1/desktop/keyboard/type", json!({"text": "héllo wörld"}))
        .await;
    assert_eq!(t.json(), json!({"ok": true}));
    app.post("/v1/desktop/keyboard/press", json!({"key": "Return"}))
        .await;
    let got = eventually_async(
        Duration::from_secs(20),
        "the typed line in the file",
        || {
            let typed = typed.clone();
            async move {
                std::fs::read_to_string(&typed)
                    .ok()
                    .filter(|s| s.ends_with('\n'))
            }
        },
    )
    .await;
    assert_eq!(got, "héllo wörld\n");
    let p = app
        .post(
            "/v1/desktop/keyboard/press",
            json!({"key": "NoSuchKeyAtAll"}),
        )
        .await
        .problem(StatusCode::BAD_REQUEST);
    assert_eq!(p["field"], "key");

    // Geometry: what move/resize answer is what the window list reads back.
    app.post(
        &format!("/v1/desktop/windows/{win}/resize"),
        json!({"width": 0, "height": 100}),
    )
    .await
    .problem(StatusCode::BAD_REQUEST);
    let r = app
        .post(
            &format!("/v1/desktop/windows/{win}/resize"),
            json!({"width": 300, "height": 200}),
        )
        .await
        .json();
    // xterm sizes itself in whole character cells: within one cell of the request.
    assert!((r["width"].as_i64().unwrap() - 300).abs() < 20, "{r}");
    assert!((r["height"].as_i64().unwrap() - 200).abs() < 30, "{r}");
    let mv = app
        .post(
            &format!("/v1/desktop/windows/{win}/move"),
            json!({"x": 40, "y": 60}),
        )
        .await
        .json();
    let list = app.get("/v1/desktop/windows").await.json();
    let listed = list["windows"]
        .as_array()
        .unwrap()
        .iter()
        .find(|w| w["id"] == win.as_str())
        .cloned()
        .expect("the xterm is listed");
    for k in ["x", "y", "width", "height"] {
        assert_eq!(listed[k], mv[k], "{k}: {listed} vs {mv}");
    }
    assert_eq!(listed["width"], r["width"]);
    app.post("/v1/desktop/windows/12345/focus", json!(null))
        .await
        .problem(StatusCode::NOT_FOUND);

    // The clipboard round trip answers (the owner holds no pipe of the request).
    let set = app
        .post("/v1/desktop/clipboard", json!({"text": "clip ✓ ünïcode"}))
        .await;
    assert_eq!(set.json(), json!({"ok": true}));
    let got = app.get("/v1/desktop/clipboard").await.json();
    assert_eq!(
        got,
        json!({"selection": "clipboard", "text": "clip ✓ ünïcode"})
    );
    let other = app
        .get("/v1/desktop/clipboard?selection=primary")
        .await
        .json();
    assert_eq!(other["selection"], "primary");
    app.get("/v1/desktop/clipboard?selection=bogus")
        .await
        .problem(StatusCode::BAD_REQUEST);
    // Other routes still answer after a clipboard write.
    assert_eq!(
        app.get("/v1/desktop/display/info").await.status,
        StatusCode::OK
    );

    // Stop leaves no process of the desktop: Xvfb, openbox, the xterm, the clipboard owner.
    let l = app
        .post("/v1/desktop/launch", json!({"app": "xterm"}))
        .await
        .json();
    let mut all = pids(&app.get("/v1/desktop/status").await.json());
    all.push(l["pid"].as_u64().unwrap() as u32);
    let s = app.post("/v1/desktop/stop", json!(null)).await;
    assert_eq!(s.status, StatusCode::OK);
    assert_eq!(s.json()["state"], "inactive");
    for pid in all {
        assert!(!alive(pid), "pid {pid} outlived the stop");
    }
    assert!(!std::path::Path::new("/tmp/.X11-unix/X161").exists());
    app.post("/v1/desktop/mouse/move", json!({"x": 1, "y": 1}))
        .await
        .problem(StatusCode::CONFLICT);
}

#[tokio::test]
async fn desktop_killed_display_server_is_reported_failed_and_restartable() {
    if !have_tools() {
        return;
    }
    let app = App::start(Vec::<String>::new()).await;
    let s = start(&app, 163, 320, 240).await;
    let ps = pids(&s);
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(ps[0] as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    let failed = eventually_async(Duration::from_secs(10), "state failed", || {
        let app = &app;
        async move {
            let s = app.get("/v1/desktop/status").await.json();
            (s["state"] == "failed").then_some(s)
        }
    })
    .await;
    assert_eq!(
        failed["lastError"]["code"], "display_server_exited",
        "{failed}"
    );
    app.post("/v1/desktop/mouse/move", json!({"x": 1, "y": 1}))
        .await
        .problem(StatusCode::CONFLICT);
    // The window manager goes with it, and a new start on the same number works.
    eventually_async(Duration::from_secs(10), "openbox gone", || {
        let pid = ps[1];
        async move { (!alive(pid)).then_some(()) }
    })
    .await;
    let again = eventually_async(Duration::from_secs(10), "a restart", || {
        let app = &app;
        async move {
            let a = app
                .post(
                    "/v1/desktop/start",
                    json!({"displayNum": 163, "width": 320, "height": 240}),
                )
                .await;
            (a.status == StatusCode::OK).then(|| a.json())
        }
    })
    .await;
    assert_eq!(again["display"], ":163");
    app.post("/v1/desktop/stop", json!(null)).await;
}

#[tokio::test]
async fn desktop_recording_is_an_mp4_ffprobe_accepts_and_delete_removes_it() {
    if !have_tools() {
        return;
    }
    let app = App::start(Vec::<String>::new()).await;
    start(&app, 164, 320, 240).await;
    app.post("/v1/desktop/recording/stop", json!(null))
        .await
        .problem(StatusCode::CONFLICT);
    let r = app
        .post("/v1/desktop/recording/start", json!({"fps": 10}))
        .await
        .json();
    assert_eq!(r["status"], "recording", "{r}");
    let id = r["id"].as_str().unwrap().to_string();
    app.post("/v1/desktop/recording/start", json!({}))
        .await
        .problem(StatusCode::CONFLICT);
    app.post("/v1/desktop/mouse/move", json!({"x": 100, "y": 100}))
        .await;
    // Frames for a few seconds (not a timing assertion: ffprobe below checks what was written).
    tokio::time::sleep(Duration::from_secs(3)).await;
    let done = app
        .post("/v1/desktop/recording/stop", json!(null))
        .await
        .json();
    assert_eq!(done["status"], "completed", "{done}");
    assert!(done["bytes"].as_u64().unwrap() > 0);
    let file = app
        .get(&format!("/v1/desktop/recordings/{id}/download"))
        .await;
    assert_eq!(file.status, StatusCode::OK);
    assert_eq!(file.content_type(), "video/mp4");
    assert_eq!(file.body.len() as u64, done["bytes"].as_u64().unwrap());
    let path = app.path("rec.mp4");
    std::fs::write(&path, &file.body).unwrap();
    let probe = std::process::Command::new("ffprobe")
        .args([
            "-v",
            "error",
            "-show_entries",
            "stream=codec_name,width,height",
            "-of",
            "csv=p=0",
        ])
        .arg(&path)
        .output()
        .unwrap();
    assert!(
        probe.status.success(),
        "{}",
        String::from_utf8_lossy(&probe.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&probe.stdout).trim(),
        "h264,320,240",
        "{} bytes; {}",
        file.body.len(),
        String::from_utf8_lossy(&probe.stderr)
    );
    let list = app.get("/v1/desktop/recordings").await.json();
    assert_eq!(list["recordings"].as_array().unwrap().len(), 1);
    assert_eq!(
        app.delete(&format!("/v1/desktop/recordings/{id}"))
            .await
            .status,
        StatusCode::NO_CONTENT
    );
    app.get(&format!("/v1/desktop/recordings/{id}"))
        .await
        .problem(StatusCode::NOT_FOUND);
    assert!(
        std::fs::read_dir(app.data_dir().join("desktop-recordings"))
            .unwrap()
            .next()
            .is_none(),
        "the file is removed"
    );
    app.post("/v1/desktop/stop", json!(null)).await;
}

/// The published npm SDK (`sandbox-agent` 0.4.2), unchanged, drives every desktop method of its
/// client against our daemon (`tests/processes-compat/desktop.mjs`).
#[tokio::test]
async fn published_npm_sdk_drives_the_desktop_api() {
    if !have_tools() {
        return;
    }
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/processes-compat");
    if !dir.join("node_modules/sandbox-agent").exists() {
        skip("tests/processes-compat/node_modules is missing; run .ci/install-processes.sh");
        return;
    }
    let d = crate::support::Daemon::builder()
        .token("desk-token")
        .start();
    let typed = d.work_dir().join("sdk-typed.txt");
    let out = tokio::time::timeout(
        Duration::from_secs(120),
        tokio::process::Command::new("node")
            .arg(dir.join("desktop.mjs"))
            .arg(format!("http://{}", d.addr))
            .arg("desk-token")
            .arg("165")
            .arg(&typed)
            .current_dir(&dir)
            .kill_on_drop(true)
            .output(),
    )
    .await
    .expect("the SDK finished within 120 s")
    .expect("run node");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "node failed ({}):\n{stdout}\n{}\ndaemon:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr),
        d.stderr()
    );
    let s: serde_json::Value = serde_json::from_str(stdout.lines().last().unwrap_or("")).unwrap();
    assert_eq!(s["notRunning"]["status"], 409, "{s}");
    assert_eq!(s["started"]["state"], "active");
    assert_eq!(s["display"]["display"], ":165");
    assert_eq!(s["display"]["resolution"]["width"], 800);
    assert_eq!(s["png"]["magic"], "PNG");
    assert_eq!(
        (s["jpeg"]["first"].as_u64(), s["jpeg"]["second"].as_u64()),
        (Some(0xff), Some(0xd8))
    );
    assert_eq!(s["offScreen"]["status"], 400, "{s}");
    assert_eq!(
        (s["moved"]["x"].as_i64(), s["moved"]["y"].as_i64()),
        (Some(50), Some(60))
    );
    assert_eq!(
        (s["dragged"]["x"].as_i64(), s["dragged"]["y"].as_i64()),
        (Some(30), Some(40))
    );
    assert_eq!(
        (s["position"]["x"].as_i64(), s["position"]["y"].as_i64()),
        (Some(100), Some(100))
    );
    for k in ["typed", "pressed", "keyDown", "keyUp", "clipSet"] {
        assert_eq!(s[k]["ok"], true, "{k}: {s}");
    }
    assert_eq!(s["badKey"]["status"], 400, "{s}");
    let win = s["launched"]["windowId"].as_str().expect("a window id");
    assert_eq!(s["focused"]["id"], win);
    assert_eq!(s["focusedWindow"]["title"], "sdk-term");
    assert!(
        s["windows"]["windows"]
            .as_array()
            .unwrap()
            .iter()
            .any(|w| w["id"] == win)
    );
    assert_eq!(s["clip"]["text"], "sdk clipboard ✓");
    assert_eq!(s["stream"]["active"], false);
    assert_eq!(s["recStopped"]["status"], "completed", "{s}");
    assert_eq!(s["mp4"]["ftyp"], "ftyp");
    assert!(
        s["afterDelete"]["recordings"]
            .as_array()
            .unwrap()
            .is_empty()
    );
    assert_eq!(s["stopped"]["state"], "inactive");
    let got = std::fs::read_to_string(&typed).unwrap_or_default();
    assert_eq!(got, "from the sdk\n");
}

/// The live view: a WebSocket through the daemon's port with the token in its URL, JPEG frames
/// out, input events back, ended when the desktop stops.
#[tokio::test]
async fn live_view_streams_jpeg_frames_and_takes_input() {
    use futures_util::{SinkExt, StreamExt};
    use tokio_tungstenite::tungstenite::Message;
    if !have_tools() {
        return;
    }
    let d = crate::support::Daemon::builder()
        .token("live-token")
        .start();
    let http = d.client();
    let started = http
        .post(d.url("/v1/desktop/start"))
        .json(&json!({"displayNum": 166, "width": 320, "height": 200}))
        .send()
        .await
        .unwrap();
    assert_eq!(started.status(), 200);
    // Without the token the upgrade is refused.
    let bare = format!("ws://{}/v1/desktop/stream/frames", d.addr);
    assert!(
        tokio_tungstenite::connect_async(bare.as_str())
            .await
            .is_err()
    );
    let url = format!(
        "ws://{}/v1/desktop/stream/frames?access_token=live-token&fps=5",
        d.addr
    );
    let (mut ws, _) = tokio_tungstenite::connect_async(url)
        .await
        .expect("WebSocket");
    let Message::Text(ready) = ws.next().await.unwrap().unwrap() else {
        panic!("ready first")
    };
    let ready: serde_json::Value = serde_json::from_str(ready.as_str()).unwrap();
    assert_eq!(ready, json!({"type": "ready", "width": 320, "height": 200}));
    let Message::Binary(frame) = ws.next().await.unwrap().unwrap() else {
        panic!("a frame")
    };
    assert_eq!(&frame[..3], b"\xff\xd8\xff", "a JPEG");
    ws.send(Message::text(
        json!({"type": "move", "x": 33, "y": 44}).to_string(),
    ))
    .await
    .unwrap();
    eventually_async(Duration::from_secs(10), "the pointer moved", || {
        let (http, d) = (&http, &d);
        async move {
            let p: serde_json::Value = http
                .get(d.url("/v1/desktop/mouse/position"))
                .send()
                .await
                .ok()?
                .json()
                .await
                .ok()?;
            (p["x"] == 33 && p["y"] == 44).then_some(())
        }
    })
    .await;
    ws.send(Message::text(
        json!({"type": "key", "key": "No Such"}).to_string(),
    ))
    .await
    .unwrap();
    let err = loop {
        match ws.next().await.unwrap().unwrap() {
            Message::Text(t) => {
                break serde_json::from_str::<serde_json::Value>(t.as_str()).unwrap();
            }
            Message::Binary(_) => continue,
            other => panic!("unexpected {other:?}"),
        }
    };
    assert_eq!(err["type"], "error", "{err}");
    let stopped = http.post(d.url("/v1/desktop/stop")).send().await.unwrap();
    assert_eq!(stopped.status(), 200);
    let end = loop {
        match ws.next().await {
            Some(Ok(Message::Text(t))) => {
                break serde_json::from_str::<serde_json::Value>(t.as_str()).unwrap();
            }
            Some(Ok(Message::Binary(_))) => continue,
            other => panic!("unexpected {other:?}"),
        }
    };
    assert_eq!(end["type"], "end", "{end}");
}

/// `DISPLAY` for everything started while the desktop runs: a `/v1/processes` program talks to
/// the X server (`xdpyinfo` reads the screen size set at start), a caller's own `DISPLAY` wins,
/// an agent started meanwhile has it in its environment, and programs started after `stop` do
/// not get it.
#[tokio::test]
async fn desktop_display_reaches_processes_and_agents_started_while_it_runs() {
    if !have_tools() {
        return;
    }
    let app = App::start(Vec::<String>::new()).await;
    let echo = json!({"command": "sh", "args": ["-c", "printf %s \"$DISPLAY\""]});
    let before = app.post("/v1/processes/run", echo.clone()).await.json();
    assert_ne!(before["stdout"], ":167", "{before}");

    start(&app, 167, 320, 208).await;
    let seen = app.post("/v1/processes/run", echo.clone()).await.json();
    assert_eq!(seen["stdout"], ":167", "{seen}");
    let info = app
        .post("/v1/processes/run", json!({"command": "xdpyinfo"}))
        .await
        .json();
    assert_eq!(info["exitCode"], 0, "{info}");
    assert!(
        info["stdout"].as_str().unwrap().contains("320x208 pixels"),
        "{info}"
    );
    let geometry = app
        .post(
            "/v1/processes/run",
            json!({"command": "xdotool", "args": ["getdisplaygeometry"]}),
        )
        .await
        .json();
    assert_eq!(geometry["stdout"], "320 208\n", "{geometry}");
    // The caller's own DISPLAY wins.
    let own = app
        .post(
            "/v1/processes/run",
            json!({"command": "sh", "args": ["-c", "printf %s \"$DISPLAY\""], "env": {"DISPLAY": ":4242"}}),
        )
        .await
        .json();
    assert_eq!(own["stdout"], ":4242", "{own}");

    // An agent started while the desktop runs has DISPLAY in its environment.
    let init = app
        .post(
            "/v1/acp/display-agent?agent=mock",
            json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {"protocolVersion": 1}}),
        )
        .await;
    assert_eq!(
        init.status,
        StatusCode::OK,
        "{}",
        String::from_utf8_lossy(&init.body)
    );
    let servers = app.get("/v1/acp").await.json();
    let pid = servers["servers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["serverId"] == "display-agent")
        .and_then(|s| s["pid"].as_u64())
        .unwrap_or_else(|| panic!("no pid for the agent: {servers}"));
    let environ = std::fs::read(format!("/proc/{pid}/environ")).expect("agent environ");
    assert!(
        environ.split(|b| *b == 0).any(|kv| kv == b"DISPLAY=:167"),
        "the agent has no DISPLAY=:167"
    );
    app.delete("/v1/acp/display-agent").await;

    let stop = app.post("/v1/desktop/stop", json!({})).await;
    assert_eq!(stop.status, StatusCode::OK);
    let after = app.post("/v1/processes/run", echo).await.json();
    assert_ne!(after["stdout"], ":167", "{after}");
}

/// The reference's WebRTC stream routes are answered with a 501 problem naming the live view,
/// not a 404 or a 200 that would leave a client waiting for media.
#[tokio::test]
async fn webrtc_stream_routes_are_501_naming_the_frames_live_view() {
    let app = App::start(Vec::<String>::new()).await;
    for answer in [
        app.post("/v1/desktop/stream/start", json!({})).await,
        app.post("/v1/desktop/stream/stop", json!({})).await,
        app.get("/v1/desktop/stream/signaling").await,
    ] {
        let p = answer.problem(StatusCode::NOT_IMPLEMENTED);
        assert_eq!(p["alternative"], "/v1/desktop/stream/frames", "{p}");
    }
    let s = app.get("/v1/desktop/stream/status").await.json();
    assert_eq!(s["active"], false, "{s}");
}
