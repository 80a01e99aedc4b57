//! `sandbox-agent install desktop` where the packages are already installed (a no-op that says
//! so, twice in a row) and where one program is missing from `PATH` (it names exactly that
//! package); and a daemon whose `PATH` lacks a desktop program: `status` says
//! `install_required` with the package, and the routes that need it answer a 503 problem naming
//! the tool and its package, never a 500.

use std::path::Path;
use std::process::Command;

use serde_json::json;

use crate::support::{Daemon, on_path, skip};

const PROGRAMS: &[&str] = &["Xvfb", "openbox", "xdotool", "xclip", "ffmpeg", "xprop"];

fn have_tools() -> bool {
    let missing: Vec<&&str> = PROGRAMS.iter().filter(|t| !on_path(t)).collect();
    if missing.is_empty() {
        true
    } else {
        skip(&format!("missing {missing:?}; run .ci/install-desktop.sh"));
        false
    }
}

/// A directory of links to every desktop program (and `sh`) except `left_out`.
fn path_without(dir: &Path, left_out: &str) {
    for t in PROGRAMS.iter().chain(&["sh"]).filter(|t| **t != left_out) {
        let out = Command::new("sh")
            .args(["-c", &format!("command -v {t}")])
            .output()
            .unwrap();
        let real = String::from_utf8(out.stdout).unwrap();
        std::os::unix::fs::symlink(real.trim(), dir.join(t)).unwrap();
    }
}

fn install(args: &[&str], path: Option<&Path>) -> (i32, String) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_sandbox-agent"));
    cmd.arg("install").args(args);
    if let Some(p) = path {
        cmd.env("PATH", p);
    }
    let out = cmd.output().expect("run sandbox-agent install");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.code().unwrap_or(-1), text)
}

#[test]
fn install_desktop_where_everything_is_installed_is_a_no_op() {
    if !have_tools() {
        return;
    }
    for _ in 0..2 {
        let (code, text) = install(&["desktop"], None);
        assert_eq!(code, 0, "{text}");
        assert!(text.contains("already installed"), "{text}");
        assert!(text.contains("Xvfb") && text.contains("xdotool"), "{text}");
        assert!(!text.contains("apt-get"), "it ran or proposed apt: {text}");
    }
}

#[test]
fn install_desktop_names_only_the_missing_package() {
    if !have_tools() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    path_without(dir.path(), "xdotool");
    let (code, text) = install(&["desktop", "--dry-run"], Some(dir.path()));
    assert_eq!(code, 0, "{text}");
    assert!(text.contains("missing packages: xdotool\n"), "{text}");
    assert!(
        text.contains("apt-get install -y --no-install-recommends xdotool\n"),
        "{text}"
    );
    // ffmpeg's program is there, so its package is not proposed.
    assert!(!text.contains("ffmpeg"), "{text}");
}

#[tokio::test]
async fn a_daemon_missing_a_desktop_program_answers_503_naming_the_package() {
    if !have_tools() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    path_without(dir.path(), "xdotool");
    let d = Daemon::builder().env("PATH", dir.path()).start();
    let s = d.get_json("/v1/desktop/status").await;
    assert_eq!(s["state"], "install_required", "{s}");
    assert_eq!(s["missingDependencies"], json!(["xdotool"]), "{s}");
    assert!(
        s["installCommand"].as_str().unwrap().contains("xdotool"),
        "{s}"
    );

    // Xvfb and openbox are there, so the display starts; pointer input needs xdotool.
    let started = d
        .client()
        .post(d.url("/v1/desktop/start"))
        .json(&json!({"displayNum": 168, "width": 320, "height": 200}))
        .send()
        .await
        .unwrap();
    let code = started.status().as_u16();
    let body: serde_json::Value = started.json().await.unwrap();
    if code == 503 {
        assert_eq!(body["package"], "xdotool", "{body}");
    } else {
        assert_eq!(code, 200, "{body}");
        let moved = d
            .client()
            .post(d.url("/v1/desktop/mouse/move"))
            .json(&json!({"x": 1, "y": 1}))
            .send()
            .await
            .unwrap();
        assert_eq!(moved.status().as_u16(), 503);
        assert_eq!(moved.headers()["content-type"], "application/problem+json");
        let p: serde_json::Value = moved.json().await.unwrap();
        assert_eq!(p["tool"], "xdotool", "{p}");
        assert_eq!(p["package"], "xdotool", "{p}");
        // A screenshot needs only ffmpeg, which is there.
        let shot = d
            .client()
            .get(d.url("/v1/desktop/screenshot"))
            .send()
            .await
            .unwrap();
        assert_eq!(shot.status().as_u16(), 200);
        let stop = d.post_json("/v1/desktop/stop", &json!({})).await;
        assert_eq!(stop["state"], "install_required", "{stop}");
    }
}
