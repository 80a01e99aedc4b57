//! The TypeScript SDK (`sdks/typescript`: `acp-http-client` and `sandbox-agent`) tested end to end:
//! runs its `npm test` against this build's binary, so `tests/run` (and CI) covers the SDK's
//! suite — connection gates, stream resume and gap, typed problems, files, local mode and the
//! headless-Chromium page. Skips (strict in CI) when node, npm or the workspace's node_modules are
//! missing; `.ci/install-sdk.sh` installs them and Chromium.

use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::support::{BIN, on_path, skip};

const REPO: &str = env!("CARGO_MANIFEST_DIR");
/// The whole suite takes ~40 s here; each npm test is bounded to 3 min by its runner too.
const SUITE_TIMEOUT: Duration = Duration::from_secs(900);

#[test]
fn typescript_sdk_npm_test_passes_against_this_daemon() {
    let dir = Path::new(REPO).join("sdks/typescript");
    for tool in ["node", "npm"] {
        if !on_path(tool) {
            skip(&format!("`{tool}` is not installed (.ci/install-sdk.sh)"));
            return;
        }
    }
    if !dir.join("node_modules/@agentclientprotocol/sdk").is_dir() {
        skip("sdks/typescript has no node_modules (.ci/install-sdk.sh runs npm ci)");
        return;
    }
    if !Path::new("/usr/bin/chromium").exists() {
        // The suite still runs; its browser test skips (or fails under strict mode) on its own.
        skip("no /usr/bin/chromium: the SDK's browser test cannot run (.ci/install-sdk.sh)");
    }
    // `npm test` rebuilds dist/, which the provider suites import.
    let _build = crate::support::SDK_BUILD
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    let log = std::env::temp_dir().join(format!("sdk-npm-test-{}.log", std::process::id()));
    let out = std::fs::File::create(&log).expect("log file");
    let mut child = Command::new("npm")
        .arg("test")
        .current_dir(&dir)
        .env("SANDBOX_AGENT_BIN", BIN)
        .stdin(Stdio::null())
        .stdout(out.try_clone().expect("log file"))
        .stderr(out)
        .process_group(0)
        .spawn()
        .expect("npm test starts");
    let deadline = Instant::now() + SUITE_TIMEOUT;
    let status = loop {
        if let Some(s) = child.try_wait().expect("wait for npm test") {
            break Some(s);
        }
        if Instant::now() > deadline {
            // npm, node and their daemons share the process group: end them all.
            let _ = Command::new("kill")
                .args(["-KILL", "--", &format!("-{}", child.id())])
                .status();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    let output = std::fs::read_to_string(&log).unwrap_or_default();
    let _ = std::fs::remove_file(&log);
    match status {
        Some(s) if s.success() => {
            assert!(
                output.contains("# pass ") && output.contains("# fail 0"),
                "npm test succeeded but ran no test?\n{output}"
            );
        }
        Some(s) => panic!("npm test failed ({s}):\n{output}"),
        None => panic!("npm test did not finish within {SUITE_TIMEOUT:?}:\n{output}"),
    }
}
