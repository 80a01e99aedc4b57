//! The inspector at `/ui/`: how the embedded files are served (no token needed, content types,
//! caching, the Content-Security-Policy), that the committed bundle is exactly the build of its
//! sources, and the end-to-end run in headless Chromium (`ui/test/e2e.mjs`) against the real
//! daemon and the mock agent.

use std::path::{Path, PathBuf};
use std::time::Duration;

use reqwest::StatusCode;
use reqwest::header::{
    ACCEPT_ENCODING, CACHE_CONTROL, CONTENT_ENCODING, CONTENT_SECURITY_POLICY, CONTENT_TYPE, ETAG,
    IF_NONE_MATCH, LOCATION, VARY,
};

use crate::support::{self, Daemon};

pub(crate) fn ui_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("ui")
}

/// A client that neither follows redirects nor sends a token.
fn bare_client() -> reqwest::Client {
    sandbox_agent::install_crypto_provider();
    reqwest::Client::builder()
        .no_proxy()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap()
}

/// Every `src="…"` and `href="…"` value in the page.
fn asset_refs(html: &str) -> Vec<String> {
    let mut out = Vec::new();
    for attr in ["src=\"", "href=\""] {
        let mut rest = html;
        while let Some(i) = rest.find(attr) {
            rest = &rest[i + attr.len()..];
            let end = rest.find('"').unwrap();
            out.push(rest[..end].to_string());
            rest = &rest[end..];
        }
    }
    out
}

#[tokio::test]
async fn ui_is_served_without_a_token_with_strict_headers() {
    let d = Daemon::builder().token("ui-token").start();
    let c = bare_client();

    let r = c.get(d.url("/ui")).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::PERMANENT_REDIRECT);
    assert_eq!(r.headers()[LOCATION], "/ui/");

    let r = c.get(d.url("/ui/")).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::OK, "the page loads without a token");
    let h = r.headers().clone();
    assert_eq!(h[CONTENT_TYPE], "text/html; charset=utf-8");
    assert_eq!(h[CACHE_CONTROL], "no-cache");
    assert_eq!(h["x-content-type-options"], "nosniff");
    let csp = h[CONTENT_SECURITY_POLICY].to_str().unwrap().to_string();
    for directive in [
        "default-src 'none'",
        "script-src 'self'",
        "style-src 'self'",
        "connect-src 'self'",
        "frame-ancestors 'none'",
    ] {
        assert!(csp.contains(directive), "CSP lacks {directive}: {csp}");
    }
    assert!(
        !csp.contains("unsafe"),
        "CSP allows something unsafe: {csp}"
    );
    let html = r.text().await.unwrap();
    // Nothing inline: no <style>, no style attribute, and every <script> is an empty one with src.
    assert!(
        !html.contains("<style") && !html.contains(" style="),
        "inline style in the page"
    );
    for (i, _) in html.match_indices("<script") {
        let tag = &html[i..i + html[i..].find("</script>").expect("closed script")];
        assert!(
            tag.contains(" src=\"") && tag.ends_with('>'),
            "inline script: {tag}"
        );
    }
    for id in [
        "token-input",
        "agent-select",
        "connect-button",
        "session-new-button",
        "prompt-input",
        "send-button",
        "cancel-button",
        "transcript",
        "raw-log",
        "permission-dialog",
        "instances-table",
        "status",
    ] {
        assert!(
            html.contains(&format!("data-testid=\"{id}\"")),
            "no data-testid {id}"
        );
    }

    // Each asset the page names: served, typed, hashed (immutable), revalidated by its ETag.
    let refs = asset_refs(&html);
    assert_eq!(refs.len(), 3, "script, stylesheet and icon: {refs:?}");
    for name in &refs {
        assert!(
            !name.contains("//") && !name.starts_with('/'),
            "the page names a remote or absolute asset: {name}"
        );
        let r = c.get(d.url(&format!("/ui/{name}"))).send().await.unwrap();
        assert_eq!(r.status(), StatusCode::OK, "{name}");
        let expected_type = match name.rsplit_once('.').unwrap().1 {
            "js" => "text/javascript; charset=utf-8",
            "css" => "text/css; charset=utf-8",
            "svg" => "image/svg+xml",
            other => panic!("unexpected asset type {other}"),
        };
        assert_eq!(r.headers()[CONTENT_TYPE], expected_type, "{name}");
        assert_eq!(
            r.headers()[CACHE_CONTROL],
            "public, max-age=31536000, immutable",
            "{name}"
        );
        assert!(r.headers().contains_key(CONTENT_SECURITY_POLICY), "{name}");
        let etag = r.headers()[ETAG].clone();
        let bytes = r.bytes().await.unwrap();
        let on_disk = std::fs::read(ui_dir().join("dist").join(name)).unwrap();
        assert!(bytes == on_disk, "{name} is not the committed ui/dist file");
        let r = c
            .get(d.url(&format!("/ui/{name}")))
            .header(IF_NONE_MATCH, etag)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::NOT_MODIFIED, "{name}");
    }

    // The script goes gzip-compressed to a client that accepts it, as its own representation.
    let script = refs.iter().find(|r| r.ends_with(".js")).unwrap();
    let plain = c.get(d.url(&format!("/ui/{script}"))).send().await.unwrap();
    assert!(!plain.headers().contains_key(CONTENT_ENCODING));
    let plain_etag = plain.headers()[ETAG].clone();
    let r = c
        .get(d.url(&format!("/ui/{script}")))
        .header(ACCEPT_ENCODING, "br;q=1, gzip;q=0.5")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(r.headers()[CONTENT_ENCODING], "gzip");
    assert_eq!(r.headers()[VARY], "accept-encoding");
    let gz_etag = r.headers()[ETAG].clone();
    assert_ne!(gz_etag, plain_etag, "each encoding has its own ETag");
    let compressed = r.bytes().await.unwrap();
    let mut unpacked = Vec::new();
    std::io::Read::read_to_end(
        &mut flate2::read::GzDecoder::new(&compressed[..]),
        &mut unpacked,
    )
    .unwrap();
    assert!(
        unpacked == std::fs::read(ui_dir().join("dist").join(script)).unwrap(),
        "the gzip body unpacks to the committed script"
    );
    assert!(compressed.len() < unpacked.len() / 2, "compression pays");
    let r = c
        .get(d.url(&format!("/ui/{script}")))
        .header(ACCEPT_ENCODING, "gzip")
        .header(IF_NONE_MATCH, gz_etag)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::NOT_MODIFIED);
    let r = c
        .get(d.url(&format!("/ui/{script}")))
        .header(ACCEPT_ENCODING, "gzip;q=0")
        .send()
        .await
        .unwrap();
    assert!(
        !r.headers().contains_key(CONTENT_ENCODING),
        "q=0 refuses gzip"
    );

    // HEAD works; other methods, unknown files and traversal attempts are problem+json.
    let r = c.head(d.url("/ui/")).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    for (method, path, status) in [
        (
            reqwest::Method::POST,
            "/ui/",
            StatusCode::METHOD_NOT_ALLOWED,
        ),
        (reqwest::Method::GET, "/ui/nope.js", StatusCode::NOT_FOUND),
        (
            reqwest::Method::GET,
            "/ui/../Cargo.toml",
            StatusCode::NOT_FOUND,
        ),
        (
            reqwest::Method::GET,
            "/ui/%2e%2e/Cargo.toml",
            StatusCode::NOT_FOUND,
        ),
    ] {
        let r = c.request(method.clone(), d.url(path)).send().await.unwrap();
        assert_eq!(r.status(), status, "{method} {path}");
        if status != StatusCode::OK {
            assert_eq!(
                r.headers()[CONTENT_TYPE],
                "application/problem+json",
                "{method} {path}"
            );
        }
    }

    // Exempting /ui/ from the token did not open the API.
    let r = c.get(d.url("/v1/agents")).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
}

/// The absolute path of `node` on PATH: the agents file names it absolutely, so the scripted agent
/// does not depend on the PATH the daemon passes to agents.
fn which_node() -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|dir| dir.join("node"))
        .find(|p| p.is_file())
}

/// The node tool a test needs, or `None` after saying why the test is skipped.
pub(crate) fn node_with(module: &str) -> Option<PathBuf> {
    let node_ok = std::process::Command::new("node")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !node_ok {
        support::skip("node is not installed; run .ci/install-inspector.sh");
        return None;
    }
    let path = ui_dir().join("node_modules").join(module);
    if !path.exists() {
        support::skip(&format!(
            "ui/node_modules/{module} is missing; run .ci/install-inspector.sh"
        ));
        return None;
    }
    Some(path)
}

/// Runs `node args…` in ui/ with a deadline; panics with its output if it fails.
pub(crate) async fn node(args: &[&std::ffi::OsStr], timeout: Duration, what: &str) -> String {
    let out = tokio::time::timeout(
        timeout,
        tokio::process::Command::new("node")
            .args(args)
            .current_dir(ui_dir())
            .kill_on_drop(true)
            .output(),
    )
    .await
    .unwrap_or_else(|_| panic!("{what} did not finish within {timeout:?}"))
    .expect("run node");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "{what} failed ({}):\n{stdout}\n{stderr}",
        out.status
    );
    stdout
}

#[tokio::test]
async fn ui_bundle_is_the_build_of_its_sources() {
    if node_with("esbuild").is_none() {
        return;
    }
    // Rebuilds in memory from ui/src (and the SDK's sources) and compares with ui/dist.
    let out = node(
        &["build.mjs".as_ref(), "--check".as_ref()],
        Duration::from_secs(120),
        "node build.mjs --check",
    )
    .await;
    assert!(out.contains("matches a fresh build"), "{out}");
}

#[tokio::test]
async fn ui_sources_typecheck() {
    let Some(ts) = node_with("typescript") else {
        return;
    };
    let tsc = ts.join("bin").join("tsc");
    node(
        &[tsc.as_os_str(), "-p".as_ref(), ".".as_ref()],
        Duration::from_secs(180),
        "tsc -p ui",
    )
    .await;
}

/// The pure cores of the page (line diff, content-block text, sizes), under `node --test`.
#[tokio::test]
async fn ui_unit_tests_pass() {
    if node_with("esbuild").is_none() {
        return;
    }
    let out = node(
        &["--test".as_ref(), "test/unit.test.mjs".as_ref()],
        Duration::from_secs(120),
        "node --test test/unit.test.mjs",
    )
    .await;
    assert!(
        out.contains("# fail 0") && !out.contains("# pass 0"),
        "{out}"
    );
}

#[tokio::test]
async fn inspector_drives_the_mock_agent_in_chromium() {
    if node_with("playwright-core").is_none() {
        return;
    }
    if !Path::new("/usr/bin/chromium").exists() {
        support::skip("/usr/bin/chromium is missing; run .ci/install-inspector.sh");
        return;
    }
    let shots = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/ui-screenshots");
    let _ = std::fs::remove_dir_all(&shots);
    // The user agent `scripted` streams the update kinds the mock never sends (thought, plan,
    // tool call with a diff).
    let agents = tempfile::tempdir().unwrap();
    let agents_file = agents.path().join("agents.toml");
    let script = ui_dir().join("test/scripted-agent.mjs");
    let node_bin = which_node().expect("node was found above");
    std::fs::write(
        &agents_file,
        format!(
            "[[agent]]\nid = \"scripted\"\nname = \"Scripted agent\"\ncommand = {:?}\nargs = [{:?}]\n\
             credentials_env = [\"SCRIPTED_API_KEY\"]\n\
             credentials_files = [\"~/.scripted/credentials.json\"]\n",
            node_bin.display().to_string(),
            script.display().to_string()
        ),
    )
    .unwrap();
    let d = Daemon::builder()
        .token("inspector-e2e-token")
        .arg("--agents-file")
        .arg(&agents_file)
        .start();
    std::fs::create_dir_all(d.path("notes")).unwrap();
    std::fs::write(d.path("notes/readme.txt"), "hello from the work dir\n").unwrap();
    // A second daemon keeping only 10 events per serverId, for the step that shows a `gap`.
    let small = Daemon::builder()
        .token("inspector-e2e-token")
        .args(["--event-buffer", "10"])
        .start();
    let out = node(
        &[
            "test/e2e.mjs".as_ref(),
            format!("http://{}", d.addr).as_ref(),
            "inspector-e2e-token".as_ref(),
            shots.as_os_str(),
            format!("http://{}", small.addr).as_ref(),
        ],
        Duration::from_secs(200),
        "the Chromium run (ui/test/e2e.mjs)",
    )
    .await;
    let summary: serde_json::Value =
        serde_json::from_str(out.lines().last().unwrap_or("")).expect("e2e prints a JSON summary");
    let steps: Vec<&str> = summary["steps"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["step"].as_str().unwrap())
        .collect();
    assert_eq!(
        steps,
        [
            "1-hello",
            "2-stream",
            "3-permission",
            "4-cancel",
            "instance-figures",
            "sessions",
            "5-crash",
            "files-and-install",
            "layout-and-credentials",
            "rich-updates",
            "slow-stream",
            "6-wrong-token",
            "gap",
            "7-no-errors"
        ]
    );
    for shot in [
        "1-hello",
        "2-stream",
        "3-permission-dialog",
        "3-permission",
        "4-cancel",
        "instance-figures",
        "sessions",
        "5-crash",
        "files",
        "rich-updates",
        "6-wrong-token",
        "gap",
        "other-instance",
    ] {
        let path = shots.join(format!("{shot}.png"));
        let len = std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
        assert!(len > 1000, "no screenshot {}", path.display());
    }
    assert_eq!(
        std::fs::read_to_string(d.path("notes/uploaded.txt")).unwrap(),
        "uploaded through the inspector\n",
        "the file uploaded in the browser is on disk"
    );
}
