//! The OpenAPI document against the real daemon: the served bytes are the checked-in
//! `docs/openapi.json` and what `sandbox-agent openapi` prints; every documented operation reaches
//! a handler; the document validates as OpenAPI 3.1 (openapi-spec-validator); a TypeScript client
//! generated from it (openapi-typescript) type-checks; and schemathesis, fuzzing the live daemon
//! from it, finds no server error and no answer the document does not describe.

use std::path::Path;
use std::process::Output;
use std::time::Duration;

use reqwest::{Method, StatusCode};
use serde_json::Value;

use crate::support::{self, BIN, Daemon};

const REGENERATE: &str = "cargo run -q -- openapi > docs/openapi.json";

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn checked_in() -> Vec<u8> {
    std::fs::read(repo().join("docs/openapi.json")).expect("read docs/openapi.json")
}

/// Runs a tool with a deadline; `None` when it cannot be started (not installed).
async fn run_tool(program: &str, args: &[&str], cwd: &Path, limit: Duration) -> Option<Output> {
    let child = tokio::process::Command::new(program)
        .args(args)
        .current_dir(cwd)
        .kill_on_drop(true)
        .output();
    match tokio::time::timeout(limit, child).await {
        Ok(Ok(out)) => Some(out),
        Ok(Err(e)) if e.kind() == std::io::ErrorKind::NotFound => None,
        Ok(Err(e)) => panic!("running {program}: {e}"),
        Err(_) => panic!("{program} {args:?} did not finish within {limit:?}"),
    }
}

fn python_module_present(module: &str) -> bool {
    std::process::Command::new("python3")
        .args(["-c", &format!("import {module}")])
        .output()
        .is_ok_and(|o| o.status.success())
}

fn show(out: &Output) -> String {
    format!(
        "exit {}\n--- stdout\n{}\n--- stderr\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

#[tokio::test]
async fn served_document_is_the_checked_in_file_and_the_cli_output() {
    let d = Daemon::builder().token("doc-token").start();
    let r = d
        .client()
        .get(d.url("/v1/openapi.json"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["content-type"], "application/json");
    let served = r.bytes().await.unwrap().to_vec();
    let printed = std::process::Command::new(BIN)
        .arg("openapi")
        .output()
        .expect("run sandbox-agent openapi");
    assert!(printed.status.success(), "{}", show(&printed));
    assert!(
        printed.stdout == served,
        "`sandbox-agent openapi` prints other bytes than GET /v1/openapi.json serves"
    );
    assert!(
        checked_in() == served,
        "docs/openapi.json differs from the document the daemon serves; regenerate it with\n    \
         {REGENERATE}\nand commit the result"
    );
    let doc: Value = serde_json::from_slice(&served).unwrap();
    assert_eq!(doc["openapi"], "3.1.0");
    assert_eq!(doc["info"]["version"], env!("CARGO_PKG_VERSION"));
}

#[tokio::test]
async fn openapi_json_needs_the_token_and_root_does_not() {
    let d = Daemon::builder().token("doc-token").start();
    let r = support::http()
        .get(d.url("/v1/openapi.json"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);
    assert_eq!(r.headers()["www-authenticate"], "Bearer");
    let r = support::http().get(d.url("/")).send().await.unwrap();
    assert_eq!(r.status(), 200);
    // The document says the same: bearer auth everywhere, except `GET /`.
    let doc: Value = serde_json::from_slice(&checked_in()).unwrap();
    assert_eq!(doc["security"], serde_json::json!([{"bearerAuth": []}]));
    assert_eq!(doc["paths"]["/"]["get"]["security"], serde_json::json!([]));
    assert!(doc["paths"]["/v1/health"]["get"].get("security").is_none());
    assert_eq!(
        doc["components"]["securitySchemes"]["bearerAuth"]["scheme"],
        "bearer"
    );
}

/// Every (path, method) in the document reaches a handler: the router's own fallbacks answer
/// 404 "no route for …" and 405, which no documented operation may get.
#[tokio::test]
async fn every_documented_operation_is_routed() {
    let d = Daemon::builder().token("doc-token").start();
    let doc: Value = serde_json::from_slice(&checked_in()).unwrap();
    let c = d.client();
    let mut seen = 0;
    for (path, item) in doc["paths"].as_object().unwrap() {
        let concrete = path
            .replace("{serverId}", "routed-check")
            .replace("{agent}", "mock");
        for method in item.as_object().unwrap().keys() {
            let m = Method::from_bytes(method.to_ascii_uppercase().as_bytes()).unwrap();
            let mut req = c.request(m.clone(), d.url(&concrete));
            if m == Method::GET && path == "/v1/acp/{serverId}" {
                req = req.header("accept", "text/event-stream");
            }
            let r = req.send().await.unwrap();
            let status = r.status();
            // A stream (the ports' change feed, OpenCode's `/event`) never ends: its head is the answer.
            let streaming = r
                .headers()
                .get("content-type")
                .is_some_and(|v| v.as_bytes().starts_with(b"text/event-stream"));
            let body = if streaming {
                String::new()
            } else {
                r.text().await.unwrap_or_default()
            };
            assert_ne!(status, StatusCode::METHOD_NOT_ALLOWED, "{method} {path}");
            assert!(
                !(status == StatusCode::NOT_FOUND && body.contains("no route for")),
                "{method} {path} is documented but not routed: {body}"
            );
            seen += 1;
        }
    }
    // The contract's inventory (spec 002 §10) plus our additions; a drop means a lost route.
    assert!(seen >= 24, "only {seen} operations documented");
}

#[tokio::test]
async fn document_validates_as_openapi_3_1() {
    if !python_module_present("openapi_spec_validator") {
        support::skip("openapi-spec-validator (PyPI) is missing; run .ci/install-openapi.sh");
        return;
    }
    let file = repo().join("docs/openapi.json");
    let out = run_tool(
        "python3",
        &[
            "-m",
            "openapi_spec_validator",
            "--schema",
            "3.1",
            file.to_str().unwrap(),
        ],
        repo(),
        Duration::from_secs(120),
    )
    .await
    .expect("python3 runs");
    assert!(out.status.success(), "{}", show(&out));
    // A negative control: the validator does reject a broken document.
    let dir = tempfile::tempdir().unwrap();
    let mut doc: Value = serde_json::from_slice(&checked_in()).unwrap();
    doc["paths"]["/v1/acp"]["get"]["responses"] = serde_json::json!({"200": {}});
    let broken = dir.path().join("broken.json");
    std::fs::write(&broken, serde_json::to_vec(&doc).unwrap()).unwrap();
    let out = run_tool(
        "python3",
        &[
            "-m",
            "openapi_spec_validator",
            "--schema",
            "3.1",
            broken.to_str().unwrap(),
        ],
        repo(),
        Duration::from_secs(120),
    )
    .await
    .unwrap();
    assert!(
        !out.status.success(),
        "a response without description passed"
    );
}

/// A real consumer: openapi-typescript generates types from the document, and the TypeScript
/// compiler accepts a client written against them.
#[tokio::test]
async fn openapi_typescript_generates_a_client_that_type_checks() {
    let tools = repo().join("tests/openapi");
    let generator = tools.join("node_modules/.bin/openapi-typescript");
    let tsc = tools.join("node_modules/.bin/tsc");
    if !generator.exists() || !tsc.exists() {
        support::skip("tests/openapi/node_modules is missing; run .ci/install-openapi.sh");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let types = dir.path().join("api.d.ts");
    let out = run_tool(
        generator.to_str().unwrap(),
        &[
            repo().join("docs/openapi.json").to_str().unwrap(),
            "-o",
            types.to_str().unwrap(),
        ],
        &tools,
        Duration::from_secs(120),
    )
    .await
    .expect("openapi-typescript runs");
    assert!(out.status.success(), "{}", show(&out));
    let generated = std::fs::read_to_string(&types).unwrap();
    assert!(generated.contains("\"/v1/acp/{serverId}\""), "{generated}");
    // Uses of the generated types the SDK relies on; a wrong shape fails to compile.
    let client = r#"
import type { paths, components } from "./api";
type Post = paths["/v1/acp/{serverId}"]["post"];
const params: Post["parameters"] = { path: { serverId: "s1" }, query: { agent: "mock" } };
const servers: paths["/v1/acp"]["get"]["responses"][200]["content"]["application/json"] =
  { servers: [] };
const problem: components["schemas"]["Problem"] =
  { type: "urn:x", title: "Not Found", status: 404, detail: "d", serverId: "s1" };
const install: components["schemas"]["InstallOutcome"] =
  { alreadyInstalled: true, already_installed: true, source: "builtin", version: null, artifacts: [] };
const entry: components["schemas"]["FsEntry"] =
  { name: "a", path: "/a", entryType: "file", size: 1 };
export const all = [params, servers, problem, install, entry];
"#;
    std::fs::write(dir.path().join("client.ts"), client).unwrap();
    let out = run_tool(
        tsc.to_str().unwrap(),
        &[
            "--noEmit",
            "--strict",
            "--target",
            "es2022",
            "--moduleResolution",
            "bundler",
            "--module",
            "esnext",
            dir.path().join("client.ts").to_str().unwrap(),
        ],
        &tools,
        Duration::from_secs(180),
    )
    .await
    .expect("tsc runs");
    assert!(out.status.success(), "{}", show(&out));
}

/// Runs schemathesis against the daemon with the checks the document promises; `filter` selects
/// operations. Returns its output, or `Err` with the output when it found something.
async fn schemathesis(
    d: &Daemon,
    schema: &Path,
    token: &str,
    filter: &[&str],
) -> Result<String, String> {
    let scratch = tempfile::tempdir().unwrap();
    let base = format!("http://{}", d.addr);
    let auth = format!("Authorization: Bearer {token}");
    let mut args = vec![
        "-m",
        "schemathesis.cli",
        "run",
        schema.to_str().unwrap(),
        "--url",
        &base,
        "--header",
        &auth,
        "--checks",
        // What the document promises, plus: undocumented methods get 405 with `Allow`, the
        // token is not ignored, a missing required header is refused.
        "not_a_server_error,status_code_conformance,content_type_conformance,\
         response_headers_conformance,response_schema_conformance,unsupported_method,\
         allow_header_conformance,ignored_auth,missing_required_header",
        // Bounded: the whole document takes about two minutes on two cores.
        "--max-examples",
        "40",
        "--workers",
        "1",
        "--request-timeout",
        "30",
        "--no-color",
    ];
    args.extend_from_slice(filter);
    // The scratch directory takes the fuzzer's own files (`.hypothesis/`).
    let out = run_tool("python3", &args, scratch.path(), Duration::from_secs(480))
        .await
        .expect("python3 runs");
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let lines: Vec<&str> = text.lines().collect();
    let tail = lines[lines.len().saturating_sub(400)..].join("\n");
    if !out.status.success() {
        // The daemon's log first and bounded, schemathesis' findings last: a CI log cut to its
        // end still shows what failed (and the seed to replay it with `--seed`).
        let daemon = d.stderr();
        let daemon: Vec<&str> = daemon.lines().collect();
        let daemon = daemon[daemon.len().saturating_sub(60)..].join("\n");
        return Err(format!(
            "--- daemon (last 60 lines)\n{daemon}\n--- schemathesis stderr\n{}\n--- schemathesis\n{tail}\n\
             --- what schemathesis found (repeated from above)\n{}",
            String::from_utf8_lossy(&out.stderr),
            findings(&text),
        ));
    }
    assert!(
        text.contains("Tested: "),
        "schemathesis tested nothing:\n{tail}"
    );
    Ok(text)
}

/// The part of a schemathesis report that names failures (from its `FAILURES` header up to the
/// next section, at most 80 lines) and the seed that replays the run.
fn findings(report: &str) -> String {
    let lines: Vec<&str> = report.lines().collect();
    let start = lines.iter().position(|l| l.contains(" FAILURES "));
    let mut out: Vec<&str> = match start {
        Some(i) => lines[i..]
            .iter()
            .take_while(|l| !l.contains(" WARNINGS ") && !l.contains(" SUMMARY "))
            .take(80)
            .copied()
            .collect(),
        None => vec!["(no FAILURES section: see the whole output above)"],
    };
    out.extend(lines.iter().filter(|l| l.starts_with("Seed: ")));
    out.join("\n")
}

/// Property-based fuzzing of the live daemon from the document: every operation, a bounded number
/// of cases each. The daemon has a token, an fs root in a temporary directory (everything the
/// fuzzer creates stays there) and `--require-preinstall`, so no real agent is ever downloaded;
/// the mock agent serves `?agent=mock` (the document's example). Afterwards every instance is
/// deleted and no agent process is left.
#[tokio::test]
async fn schemathesis_finds_no_server_error_or_undocumented_answer() -> Result<(), Found> {
    if !python_module_present("schemathesis") {
        support::skip("schemathesis (PyPI) is missing; run .ci/install-openapi.sh");
        return Ok(());
    }
    let d = Daemon::builder()
        .token("fuzz-token")
        .confine_to_work_dir()
        .arg("--require-preinstall")
        // Nothing may leave the machine: the registry is a closed loopback port.
        .args(["--acp-registry-url", "http://127.0.0.1:9/"])
        // A request the fuzzer leaves unanswered must not hold the run.
        .args(["--request-timeout", "20s"])
        // A `run` of a command that does not end answers at its timeout, inside the fuzzer's own
        // 30 s read timeout (the default run timeout is 30 s too).
        .args([
            "--process-run-timeout",
            "10s",
            "--process-max-run-timeout",
            "10s",
        ])
        .start();
    // A process that has ended, under the id the document's examples name (`proc_1`): the
    // examples and coverage phases then read its follow stream to the end, and every event of
    // it is checked against the document (a stream the fuzzer reaches only by chance otherwise;
    // that chance once failed CI on a wrong event schema).
    let r = d
        .client()
        .post(d.url("/v1/processes"))
        .json(&serde_json::json!({"command": "echo", "args": ["hi"]}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let created: Value = r.json().await.unwrap();
    assert_eq!(created["id"], "proc_1", "{created}");
    // Pass 1: every operation but the SSE stream. Not excluded, but run on its own below: a 200
    // on it is an endless `text/event-stream`, so the fuzzer would wait out its request timeout
    // on every serverId the other operations created.
    let doc = repo().join("docs/openapi.json");
    let first = schemathesis(
        &d,
        &doc,
        "fuzz-token",
        // The watch is an endless stream of a real directory, proven in tests/it/watch.rs.
        &[
            "--exclude-operation-id",
            "streamAcpEvents",
            "--exclude-operation-id",
            "watchFs",
            // The ports' change feed is endless too, and the proxy would send the fuzzer's
            // requests to whatever else listens on this machine's loopback (tests/it/workspace.rs).
            // Preview-link creation (which only signs a URL) is fuzzed. The port list is not:
            // the fuzzer reuses values it read in answers, and a listener's `command` there (this
            // test binary, when other tests listen) became a `POST /v1/processes/run` that ran
            // the whole test suite again. The list is proven in tests/it/workspace.rs.
            "--exclude-operation-id",
            "listPorts",
            "--exclude-operation-id",
            "portEvents",
            "--exclude-path-regex",
            "^/v1/ports/\\{port\\}/proxy",
            // A clone of a fuzzed URL could reach a host that is not on this machine: the route's
            // refusals are proven with local repositories in tests/it/workspace.rs.
            "--exclude-operation-id",
            "gitClone",
            // OpenCode's event streams never end either (a heartbeat keeps them open); their
            // events are proven in tests/it/opencode.rs.
            "--exclude-operation-id",
            "opencodeEvent",
            "--exclude-operation-id",
            "opencodeGlobalEvent",
            // The desktop starts a real X server on the display a fuzzed body names and launches
            // the programs it names; its refusals and shapes are proven on a real Xvfb in
            // tests/it/desktop.rs.
            "--exclude-tag",
            "desktop",
            // The browser would open the fuzzer's URLs (a host off this machine) and start a
            // Chromium per run; its refusals (bad schemes, sizes, tab ids, 409 before start) and
            // shapes are proven on a real Chromium in tests/it/browser.rs.
            "--exclude-tag",
            "browser",
        ],
    )
    .await;
    if let Err(report) = first {
        return Err(Found(format!("schemathesis found problems:\n{report}")));
    }
    assert!(!d.stderr().contains("panicked"), "{}", d.stderr());

    // Nothing leaks: every instance the fuzzer made is deleted, and its agent is gone.
    let c = d.client();
    let list = d.get_json("/v1/acp").await;
    for s in list["servers"].as_array().unwrap() {
        let id = s["serverId"].as_str().unwrap();
        let r = c
            .delete(d.url(&format!("/v1/acp/{id}")))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 204, "DELETE {id}");
    }
    // Processes the fuzzer started and that still run (it may name any program, the daemon's
    // own binary included) are its to start, not a leak: killed here, so that only a leak stays.
    let procs = d.get_json("/v1/processes").await;
    for p in procs["processes"].as_array().unwrap() {
        if p["status"] == "running" {
            let id = p["id"].as_str().unwrap();
            let _ = c
                .post(d.url(&format!("/v1/processes/{id}/kill")))
                .send()
                .await
                .unwrap();
        }
    }
    let pid = d.pid();
    // On a timeout, say which processes stayed (a flake under load once left no trace).
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let left = support::descendants(pid);
        if left.is_empty() {
            break;
        }
        if std::time::Instant::now() > deadline {
            let named: Vec<String> = left
                .iter()
                .map(|p| {
                    let cmd = std::fs::read(format!("/proc/{p}/cmdline")).unwrap_or_default();
                    format!("{p}: {}", String::from_utf8_lossy(&cmd).replace('\0', " "))
                })
                .collect();
            panic!(
                "processes left after every instance was deleted:\n{}",
                named.join("\n")
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }

    // Pass 2: the SSE operation. Its one instance is `s1` (the document's example id), whose
    // agent has exited after streaming two updates: a 200 is then a finite stream (replay, then
    // end), so schemathesis checks every event of it against `AcpStreamEvent`, beside fuzzing
    // the parameters, headers and error answers. (A live instance's stream never ends.)
    let post = async |body: Value| {
        let r = c
            .post(d.url("/v1/acp/s1?agent=mock"))
            .json(&body)
            .send()
            .await
            .unwrap();
        (
            r.status().as_u16(),
            r.json::<Value>().await.unwrap_or_default(),
        )
    };
    let request = |id: u32, method: &str, params: Value| serde_json::json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
    let (status, _) = post(request(
        0,
        "initialize",
        serde_json::json!({"protocolVersion": 1}),
    ))
    .await;
    assert_eq!(status, 200);
    let (status, new) = post(request(
        1,
        "session/new",
        serde_json::json!({"cwd": "/", "mcpServers": []}),
    ))
    .await;
    assert_eq!(status, 200, "{new}");
    let session = new["result"]["sessionId"].clone();
    let say = |id, text: &str| {
        request(
            id,
            "session/prompt",
            serde_json::json!({"sessionId": session, "prompt": [{"type": "text", "text": text}]}),
        )
    };
    assert_eq!(post(say(2, "/stream 2")).await.0, 200);
    assert_eq!(post(say(3, "/crash")).await.0, 502);
    if let Err(report) = schemathesis(
        &d,
        &doc,
        "fuzz-token",
        &["--include-operation-id", "streamAcpEvents"],
    )
    .await
    {
        return Err(Found(format!(
            "schemathesis found problems on the SSE operation:\n{report}"
        )));
    }
    assert!(!d.stderr().contains("panicked"), "{}", d.stderr());
    let r = c.delete(d.url("/v1/acp/s1")).send().await.unwrap();
    assert_eq!(r.status(), 204, "DELETE s1");

    // A negative control: the same run does catch an answer the document does not describe.
    let scratch = tempfile::tempdir().unwrap();
    let mut wrong: Value = serde_json::from_slice(&checked_in()).unwrap();
    wrong["components"]["schemas"]["Health"]["properties"]["status"] =
        serde_json::json!({"type": "integer"});
    let wrong_path = scratch.path().join("wrong.json");
    std::fs::write(&wrong_path, serde_json::to_vec(&wrong).unwrap()).unwrap();
    let caught = schemathesis(
        &d,
        &wrong_path,
        "fuzz-token",
        &["--include-operation-id", "getHealth"],
    )
    .await;
    assert!(
        caught.is_err_and(|r| r.contains("getHealth") || r.contains("/v1/health")),
        "a wrong response schema went unnoticed"
    );
    Ok(())
}

/// A fuzzing report, returned rather than panicked with: the test harness prints it last, with
/// its lines as they are and no backtrace after it, so a log cut to its end still shows it.
struct Found(String);

impl std::fmt::Debug for Found {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}
