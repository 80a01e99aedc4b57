//! The inspector's Desktop tab in headless Chromium (`ui/test/desktop-e2e.mjs`) against the real
//! daemon on a real Xvfb: Start from the tab, frames on the live view, a click on an xterm (launched
//! through the API) and keys typed on the live view reaching it (its shell writes the line to a
//! file), the screenshot and recording buttons' downloads, and Stop.

use std::path::Path;
use std::time::Duration;

use crate::support::{self, Daemon, on_path};

#[tokio::test]
async fn inspector_desktop_tab_drives_a_real_desktop_in_chromium() {
    let ui = Path::new(env!("CARGO_MANIFEST_DIR")).join("ui");
    if !on_path("node") || !ui.join("node_modules/playwright-core").exists() {
        support::skip(
            "node or ui/node_modules/playwright-core is missing; run .ci/install-inspector.sh",
        );
        return;
    }
    if !Path::new("/usr/bin/chromium").exists() {
        support::skip("/usr/bin/chromium is missing; run .ci/install-inspector.sh");
        return;
    }
    let missing: Vec<&str> = [
        "Xvfb", "openbox", "xdotool", "xclip", "ffmpeg", "xprop", "xterm",
    ]
    .into_iter()
    .filter(|t| !on_path(t))
    .collect();
    if !missing.is_empty() {
        support::skip(&format!("missing {missing:?}; run .ci/install-desktop.sh"));
        return;
    }
    let d = Daemon::builder().token("desktop-e2e-token").start();
    let out = tempfile::tempdir().unwrap();
    let typed = out.path().join("typed.txt");
    let shots = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/ui-screenshots");
    let run = tokio::time::timeout(
        Duration::from_secs(150),
        tokio::process::Command::new("node")
            .arg("test/desktop-e2e.mjs")
            .arg(format!("http://{}", d.addr))
            .arg("desktop-e2e-token")
            .arg("174")
            .arg(&typed)
            .arg(&shots)
            .current_dir(&ui)
            .kill_on_drop(true)
            .output(),
    )
    .await
    .expect("desktop-e2e.mjs finished in time")
    .expect("run node");
    let stdout = String::from_utf8_lossy(&run.stdout);
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(
        run.status.success(),
        "desktop-e2e failed:\n{stdout}\n{stderr}"
    );
    let summary: serde_json::Value =
        serde_json::from_str(stdout.lines().last().unwrap_or("")).expect("a JSON summary");
    assert_eq!(
        summary["steps"],
        serde_json::json!([
            "tab",
            "start",
            "frames",
            "click-and-type",
            "screenshot",
            "recording",
            "stop"
        ]),
        "{stdout}"
    );
    assert_eq!(
        std::fs::read_to_string(&typed).unwrap(),
        "typed in chromium"
    );
}
