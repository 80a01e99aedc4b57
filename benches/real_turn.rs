//! A real turn's overhead: the same scripted Claude turn (the fake model of
//! `tests/agents/fake_model.py` streams three chunks, then `end_turn`), driven over stdio straight
//! into the agent and through the daemon's `/v1/acp/{serverId}`; p50 of 20 turns each. The
//! difference is what the daemon costs per turn. Prints figures; asserts nothing.
//! Needs node, npm and python3; installs Claude into `target/real-agents` if the tests have not.
//! Run: `cargo bench --bench real_turn`

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

mod common;
use common::free_port;

const BIN: &str = env!("CARGO_BIN_EXE_sandbox-agent");
const TURNS: usize = 20;

fn data_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("target/real-agents")
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

fn summary(name: &str, mut ms: Vec<f64>) -> f64 {
    ms.sort_by(f64::total_cmp);
    let p50 = percentile(&ms, 0.5);
    println!(
        "{name:<22} p50 {p50:>7.2} ms   p90 {:>7.2} ms   min {:>7.2} ms",
        percentile(&ms, 0.9),
        ms[0]
    );
    p50
}

/// The installed Claude adapter: program and PATH entries, from the installer's manifest.
fn claude() -> (PathBuf, Vec<PathBuf>) {
    let manifest = data_dir().join("agents/claude/manifest.json");
    if !manifest.exists() {
        let ok = Command::new(BIN)
            .args(["agents", "install", "claude", "--acp-registry-url"])
            .arg("http://127.0.0.1:9/registry.json")
            .arg("--data-dir")
            .arg(data_dir())
            .status()
            .expect("run the installer")
            .success();
        assert!(ok, "installing claude failed");
    }
    let m: Value = serde_json::from_slice(&std::fs::read(manifest).unwrap()).unwrap();
    let program = PathBuf::from(m["program"].as_str().unwrap());
    let path = m["pathPrepend"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| PathBuf::from(p.as_str().unwrap()))
        .collect();
    (program, path)
}

struct FakeModel(Child, u16);

impl FakeModel {
    fn start() -> FakeModel {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/agents/fake_model.py");
        let mut child = Command::new("python3")
            .arg(script)
            .stdout(Stdio::piped())
            .spawn()
            .expect("python3");
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let port = line.trim().trim_start_matches("port ").parse().unwrap();
        FakeModel(child, port)
    }
}

impl Drop for FakeModel {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn prompt(id: u64, session: &str) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "method": "session/prompt",
           "params": {"sessionId": session,
                      "prompt": [{"type": "text", "text": "bench [[text]]"}]}})
}

/// Turns straight over the agent's stdin/stdout: the floor for a turn with this agent and model.
fn over_stdio(model: &FakeModel, home: &Path, cwd: &Path) -> Vec<f64> {
    let (program, prepend) = claude();
    let mut path = prepend;
    path.extend(std::env::split_paths(
        &std::env::var_os("PATH").unwrap_or_default(),
    ));
    let mut child = Command::new(program)
        .env(
            "ANTHROPIC_BASE_URL",
            format!("http://127.0.0.1:{}", model.1),
        )
        .env("ANTHROPIC_API_KEY", "sk-fake")
        .env("IS_SANDBOX", "1")
        .env("HOME", home)
        .env("PATH", std::env::join_paths(path).unwrap())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .process_group(0)
        .spawn()
        .expect("start claude");
    let mut stdin = child.stdin.take().unwrap();
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    let mut call = |msg: Value| -> Value {
        let id = msg["id"].clone();
        writeln!(stdin, "{msg}").unwrap();
        stdin.flush().unwrap();
        loop {
            let mut line = String::new();
            assert!(stdout.read_line(&mut line).unwrap() > 0, "claude exited");
            let v: Value = serde_json::from_str(&line).unwrap_or(Value::Null);
            if v["id"] == id && v.get("method").is_none() {
                return v;
            }
        }
    };
    call(json!({"jsonrpc": "2.0", "id": 1, "method": "initialize",
                "params": {"protocolVersion": 1, "clientCapabilities": {}}}));
    let s = call(json!({"jsonrpc": "2.0", "id": 2, "method": "session/new",
                        "params": {"cwd": cwd, "mcpServers": []}}));
    let session = s["result"]["sessionId"].as_str().unwrap().to_string();
    call(prompt(3, &session)); // warm-up (the first turn also asks for a title)
    let mut ms = Vec::new();
    for i in 0..TURNS as u64 {
        let t = Instant::now();
        let r = call(prompt(10 + i, &session));
        ms.push(t.elapsed().as_secs_f64() * 1e3);
        assert_eq!(r["result"]["stopReason"], "end_turn", "{r}");
    }
    let _ = nix::sys::signal::killpg(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGKILL,
    );
    let _ = child.wait();
    ms
}

/// The same turns through the daemon: one POST per prompt, answered with the prompt's response.
fn through_daemon(model: &FakeModel, home: &Path, cwd: &Path, tmp: &Path) -> Vec<f64> {
    let agents = tmp.join("agents.toml");
    std::fs::write(
        &agents,
        format!(
            "[[agent]]\nid = \"claude\"\n[agent.env]\nANTHROPIC_BASE_URL = \
             \"http://127.0.0.1:{}\"\nANTHROPIC_API_KEY = \"sk-fake\"\nHOME = \"{}\"\n",
            model.1,
            home.display()
        ),
    )
    .unwrap();
    let port = free_port();
    let mut daemon = Command::new(BIN)
        .args(["server", "--log-level", "warn", "--port", &port.to_string()])
        .arg("--data-dir")
        .arg(data_dir())
        .arg("--agents-file")
        .arg(&agents)
        .args(["--acp-registry-url", "http://127.0.0.1:9/registry.json"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let ms = rt.block_on(async {
        let client = reqwest::Client::new();
        let base = format!("http://127.0.0.1:{port}");
        let deadline = Instant::now() + Duration::from_secs(10);
        while client
            .get(format!("{base}/v1/health"))
            .send()
            .await
            .is_err()
        {
            assert!(Instant::now() < deadline, "the daemon did not start");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let url = format!("{base}/v1/acp/bench-claude");
        let post = |msg: Value, first: bool| {
            let u = if first {
                format!("{url}?agent=claude")
            } else {
                url.clone()
            };
            let c = client.clone();
            async move {
                c.post(u)
                    .json(&msg)
                    .send()
                    .await
                    .unwrap()
                    .json::<Value>()
                    .await
                    .unwrap()
            }
        };
        post(
            json!({"jsonrpc": "2.0", "id": 1, "method": "initialize",
                   "params": {"protocolVersion": 1, "clientCapabilities": {}}}),
            true,
        )
        .await;
        let s = post(
            json!({"jsonrpc": "2.0", "id": 2, "method": "session/new",
                   "params": {"cwd": cwd, "mcpServers": []}}),
            false,
        )
        .await;
        let session = s["result"]["sessionId"].as_str().unwrap().to_string();
        post(prompt(3, &session), false).await;
        let mut ms = Vec::new();
        for i in 0..TURNS as u64 {
            let t = Instant::now();
            let r = post(prompt(10 + i, &session), false).await;
            ms.push(t.elapsed().as_secs_f64() * 1e3);
            assert_eq!(r["result"]["stopReason"], "end_turn", "{r}");
        }
        let _ = client.delete(&url).send().await;
        ms
    });
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(daemon.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    );
    let _ = daemon.wait();
    ms
}

use std::os::unix::process::CommandExt;

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    sandbox_agent::install_crypto_provider();
    let tmp = tempfile::tempdir().unwrap();
    let (home, cwd) = (tmp.path().join("home"), tmp.path().join("work"));
    std::fs::create_dir_all(&home).unwrap();
    std::fs::create_dir_all(&cwd).unwrap();
    let model = FakeModel::start();
    println!("A scripted Claude turn (3 streamed chunks, end_turn), {TURNS} turns each:");
    let direct = summary("stdio (direct)", over_stdio(&model, &home, &cwd));
    let daemon = summary(
        "through the daemon",
        through_daemon(&model, &home, &cwd, tmp.path()),
    );
    println!(
        "daemon overhead per turn: {:+.2} ms at p50 ({:.3}x)",
        daemon - direct,
        daemon / direct
    );
}
