//! Session bundles with real agents (Claude, Codex, Gemini) against the fake model server: a turn
//! with a codeword and a tool call in daemon A, the bundle exported, A's HOME, state dir and work
//! dir removed, the bundle imported into daemon B (another HOME, state dir, work dir and cwd), and
//! the next prompt in B reaches the model with the whole earlier conversation, the codeword and
//! the tool call included: the agent's own session files were carried and restored with
//! `session/load`. (Gemini's test also proves the file is renamed for a minute before the import:
//! the export and import run within the minute its session began.)

use std::io::Read;
use std::path::Path;
use std::time::Duration;

use serde_json::{Value, json};

use crate::real_agents::{
    Events, FakeModel, agents_file, answer_permission, post, prompt, shared_data_dir, spawn_post,
};
use crate::support::{Daemon, eventually_async, on_path};

const CODEWORD: &str = "QUINCE-7";

fn daemon_in(dir: &Path, agent: &str, model: &FakeModel) -> Daemon {
    std::fs::create_dir_all(dir.join("work/proj")).unwrap();
    let file = agents_file(dir, agent, model);
    Daemon::builder()
        .data_dir(shared_data_dir())
        .work_dir(dir.join("work"))
        .args(crate::durable::state_args(&dir.join("state")))
        .arg("--agents-file")
        .arg(&file)
        .arg("--acp-registry-url")
        .arg("http://127.0.0.1:9/registry.json")
        .start()
}

/// The text of every agent file in the bundle.
fn agent_files(bundle: &[u8]) -> Vec<(String, String)> {
    let mut ar = tar::Archive::new(flate2::read::GzDecoder::new(bundle));
    let mut out = Vec::new();
    for e in ar.entries().unwrap() {
        let mut e = e.unwrap();
        let p = e.path().unwrap().display().to_string();
        let mut s = String::new();
        e.read_to_string(&mut s).unwrap();
        if p.starts_with("files/") {
            out.push((p, s));
        }
    }
    out
}

/// How the bundle goes from A to B.
#[derive(Clone, Copy, PartialEq)]
enum Move {
    /// `GET` then `POST /v1/acp/{serverId}/bundle`.
    Http,
    /// The TypeScript SDK's `exportSession` streamed into `importSession`.
    Sdk,
    /// `sandbox-agent acp export > f.tgz` then `acp import --cwd OLD=NEW < f.tgz`.
    Cli,
}

/// The TypeScript SDK's workspace, when its node_modules are installed.
fn sdk_dir() -> Option<std::path::PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("sdks/typescript");
    dir.join("node_modules/sandbox-agent")
        .is_dir()
        .then_some(dir)
}

async fn carry(agent: &str, how: Move) {
    if !on_path("npm") || !on_path("node") || !on_path("python3") {
        crate::support::skip("node, npm or python3 missing (.ci/install-00-base.sh installs them)");
        return;
    }
    if how == Move::Sdk && sdk_dir().is_none() {
        crate::support::skip("sdks/typescript has no node_modules (.ci/install-sdk.sh)");
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let model = FakeModel::start(tmp.path());
    let (da, db) = (tmp.path().join("a"), tmp.path().join("b"));
    let a = daemon_in(&da, agent, &model);
    let server = format!("carry-{agent}");
    let cwd_a = da.join("work/proj");
    post(
        &a,
        &server,
        &format!("?agent={agent}"),
        json!({"jsonrpc": "2.0", "id": 1, "method": "initialize",
               "params": {"protocolVersion": 1, "clientCapabilities": {}}}),
    )
    .await;
    let events = Events::follow(&a, &server);
    let created = post(
        &a,
        &server,
        "",
        json!({"jsonrpc": "2.0", "id": 2, "method": "session/new",
               "params": {"cwd": cwd_a, "mcpServers": []}}),
    )
    .await;
    let session = created["result"]["sessionId"]
        .as_str()
        .unwrap_or_else(|| panic!("{created}\n{}", a.stderr()))
        .to_string();
    if agent == "codex" {
        let set = post(
            &a,
            &server,
            "",
            json!({"jsonrpc": "2.0", "id": 3, "method": "session/set_mode",
                   "params": {"sessionId": session, "modeId": "workspace-write"}}),
        )
        .await;
        assert!(set.get("error").is_none(), "{set}");
    }
    let done = post(
        &a,
        &server,
        "",
        prompt(
            10,
            &session,
            &format!("remember the codeword {CODEWORD} [[text]]"),
        ),
    )
    .await;
    assert_eq!(done["result"]["stopReason"], "end_turn", "{done}");
    let written = cwd_a.join("tool.txt");
    let turn = spawn_post(
        &a,
        &server,
        prompt(
            11,
            &session,
            &format!("[[write {} by-{agent}]]", written.display()),
        ),
    );
    answer_permission(&a, &server, &events, &session, "allow_once").await;
    let done = tokio::time::timeout(Duration::from_secs(60), turn)
        .await
        .expect("the tool turn ended")
        .unwrap();
    assert_eq!(done["result"]["stopReason"], "end_turn", "{done}");
    assert!(written.exists());

    // Export once the agent has written both turns to its own files.
    let url = a.url(&format!("/v1/acp/{server}/bundle"));
    let client = a.client();
    let bundle = eventually_async(Duration::from_secs(20), "the agent's session files", || {
        let (client, url) = (client.clone(), url.clone());
        async move {
            let r = client.get(url).send().await.ok()?;
            if r.status() != 200 {
                return None;
            }
            let b = r.bytes().await.ok()?.to_vec();
            let files = agent_files(&b);
            files
                .iter()
                .any(|(_, t)| t.contains(CODEWORD) && t.contains("tool.txt"))
                .then_some(b)
        }
    })
    .await;
    let b = daemon_in(&db, agent, &model);
    let cwd_b = db.join("work/proj");
    let map = format!("{}={}", cwd_a.display(), cwd_b.display());
    let body: Value = match how {
        Move::Http => {
            drop(a);
            std::fs::remove_dir_all(&da).unwrap();
            let r = b
                .client()
                .post(b.url(&format!("/v1/acp/{server}/bundle?cwd={map}")))
                .header("content-type", "application/gzip")
                .body(bundle)
                .send()
                .await
                .unwrap();
            let status = r.status().as_u16();
            let body: Value = r.json().await.unwrap();
            assert_eq!(status, 201, "{body}");
            body
        }
        Move::Sdk => {
            let dir = sdk_dir().unwrap();
            let (ua, ub) = (a.url(""), b.url(""));
            let args = (server.clone(), cwd_a.clone(), cwd_b.clone());
            // Blocking (the daemons are other processes): the SDK build lock is not held across
            // an await.
            let out = tokio::task::spawn_blocking(move || {
                let _build = crate::support::SDK_BUILD
                    .lock()
                    .unwrap_or_else(|e| e.into_inner());
                // dist/ is built, not committed (as `npm test` does first).
                let built = std::process::Command::new("npm")
                    .args(["run", "build"])
                    .current_dir(&dir)
                    .output()
                    .unwrap();
                assert!(
                    built.status.success(),
                    "{}",
                    String::from_utf8_lossy(&built.stdout)
                );
                std::process::Command::new("node")
                    .arg(dir.join("test/fixtures/move-session.mjs"))
                    .arg(ua)
                    .arg(ub)
                    .arg(&args.0)
                    .arg(&args.1)
                    .arg(&args.2)
                    .current_dir(&dir)
                    .output()
                    .unwrap()
            })
            .await
            .unwrap();
            assert!(
                out.status.success(),
                "{}",
                String::from_utf8_lossy(&out.stderr)
            );
            drop(a);
            std::fs::remove_dir_all(&da).unwrap();
            serde_json::from_slice(&out.stdout).unwrap()
        }
        Move::Cli => {
            let bin = env!("CARGO_BIN_EXE_sandbox-agent");
            let file = tmp.path().join("moved.tgz");
            let out = std::process::Command::new(bin)
                .args(["acp", "export", &server, "--url", &a.url("")])
                .stdout(std::fs::File::create(&file).unwrap())
                .output()
                .unwrap();
            assert!(
                out.status.success(),
                "{}",
                String::from_utf8_lossy(&out.stderr)
            );
            drop(a);
            std::fs::remove_dir_all(&da).unwrap();
            let out = std::process::Command::new(bin)
                .args([
                    "acp",
                    "import",
                    &server,
                    "--cwd",
                    &map,
                    "--json",
                    "--url",
                    &b.url(""),
                ])
                .stdin(std::fs::File::open(&file).unwrap())
                .output()
                .unwrap();
            assert!(
                out.status.success(),
                "{}",
                String::from_utf8_lossy(&out.stderr)
            );
            serde_json::from_slice(&out.stdout).unwrap()
        }
    };
    assert_eq!(body["sessions"], json!([session]), "{body}");
    assert!(
        body["files"]
            .as_array()
            .unwrap()
            .iter()
            .all(|f| f.as_str().unwrap().starts_with(db.to_str().unwrap())),
        "{body}"
    );
    let events = Events::follow(&b, &server);
    let before = model.requests().len();
    let done = post(
        &b,
        &server,
        "",
        prompt(20, &session, "which codeword? [[text]]"),
    )
    .await;
    assert_eq!(
        done["result"]["stopReason"],
        "end_turn",
        "{done}\n{}",
        b.stderr()
    );
    let restored = events.restored().await;
    assert_eq!(restored["params"]["reason"], "import", "{restored}");
    assert_eq!(
        restored["params"]["sessions"][0]["sessionId"],
        session.as_str(),
        "{restored}"
    );
    let asked: Vec<Value> = model.requests()[before..]
        .iter()
        .filter(|r| r["marker"] == "text" && r["conversation"].is_string())
        .cloned()
        .collect();
    let last = asked.last().expect("a model request for the prompt in B");
    let conv = last["conversation"].as_str().unwrap();
    assert!(
        conv.contains(CODEWORD),
        "the codeword is not in B's request: {conv}"
    );
    assert!(
        conv.contains("tool.txt") && conv.contains("which codeword"),
        "the tool call is not in B's request: {conv}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claude_session_moves_to_a_fresh_daemon_with_its_tool_call() {
    carry("claude", Move::Http).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_codex_session_moves_to_a_fresh_daemon_with_its_tool_call() {
    carry("codex", Move::Http).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gemini_session_moves_to_a_fresh_daemon_with_its_tool_call() {
    carry("gemini", Move::Http).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claude_session_moves_through_the_typescript_sdk_streams() {
    carry("claude", Move::Sdk).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claude_session_moves_through_the_cli_export_and_import() {
    carry("claude", Move::Cli).await;
}
