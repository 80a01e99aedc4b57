//! Restart at scale: a daemon with `--state-dir` holds AGENTS mock serverIds (each initialized,
//! with one session and one answered prompt), is killed with SIGKILL (a crash), and a fresh daemon
//! starts on the same state dir. Figures: the start-up (spawn → `/v1/health` answers, every
//! serverId recovered by then), the first full listing, the daemon's RSS with N recovered
//! serverIds, and the restore of every serverId by 32 concurrent clients (the first POST to each
//! starts its agent and `session/load`s its session): serverIds/s and per-restore p50/p99.
//! Asserts only that nothing was lost: every serverId listed after the restart, every session
//! restored and answering.
//! Run: `cargo bench --bench restart` (knobs: AGENTS, CONCURRENCY).

use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

mod common;
use common::{Stopping, daemon_bin, free_port, knob, percentile, rss_kib};

const BUILT: &str = env!("CARGO_BIN_EXE_sandbox-agent");

fn spawn(dir: &std::path::Path, port: u16, agents: usize) -> Stopping {
    let child = Command::new(daemon_bin(BUILT))
        .args(["server", "--host", "127.0.0.1", "--no-token"])
        .args(["--log-level", "warn", "--port", &port.to_string()])
        .args(["--max-agents", &(agents + 8).to_string()])
        .arg("--work-dir")
        .arg(dir.join("work"))
        .arg("--data-dir")
        .arg(dir.join("data"))
        .arg("--state-dir")
        .arg(dir.join("state"))
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(dir.join(format!("daemon-{port}.log"))).unwrap())
        .spawn()
        .expect("start the daemon");
    Stopping::new(child)
}

async fn wait_health(c: &reqwest::Client, base: &str) {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        if let Ok(r) = c.get(format!("{base}/v1/health")).send().await
            && r.status() == 200
        {
            return;
        }
        assert!(Instant::now() < deadline, "the daemon never answered");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

async fn rpc(
    c: &reqwest::Client,
    base: &str,
    server: &str,
    id: u64,
    method: &str,
    p: Value,
) -> Value {
    let r = c
        .post(format!("{base}/v1/acp/{server}?agent=mock"))
        .json(&json!({"jsonrpc": "2.0", "id": id, "method": method, "params": p}))
        .send()
        .await
        .expect("POST");
    assert_eq!(r.status(), 200, "{method} on {server}");
    r.json().await.expect("a JSON answer")
}

fn prompt(sid: &str, text: &str) -> Value {
    json!({"sessionId": sid, "prompt": [{"type": "text", "text": text}]})
}

/// Runs `f(i)` for i in 0..n with `concurrency` at once; each call's latency.
async fn fan_out<F, Fut>(n: usize, concurrency: usize, f: F) -> Vec<Duration>
where
    F: Fn(usize) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = ()> + Send,
{
    let f = Arc::new(f);
    let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for _ in 0..concurrency {
        let (f, next) = (f.clone(), next.clone());
        tasks.push(tokio::spawn(async move {
            let mut lat = Vec::new();
            loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                if i >= n {
                    return lat;
                }
                let t = Instant::now();
                f(i).await;
                lat.push(t.elapsed());
            }
        }));
    }
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.unwrap());
    }
    all.sort();
    all
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    sandbox_agent::install_crypto_provider();
    let agents: usize = knob("AGENTS", 1000);
    let concurrency: usize = knob("CONCURRENCY", 32);
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().to_path_buf();
    std::fs::create_dir_all(dir.join("work")).unwrap();
    let c = reqwest::Client::builder()
        .no_proxy()
        .pool_max_idle_per_host(concurrency)
        .timeout(Duration::from_secs(120))
        .build()
        .unwrap();

    // Before: N serverIds, each with a session that has said something.
    let port = free_port();
    let mut first = spawn(&dir, port, agents);
    let base = format!("http://127.0.0.1:{port}");
    wait_health(&c, &base).await;
    let sessions: Arc<std::sync::Mutex<Vec<String>>> =
        Arc::new(std::sync::Mutex::new(vec![String::new(); agents]));
    let t = Instant::now();
    {
        let (c, base, sessions) = (c.clone(), base.clone(), sessions.clone());
        fan_out(agents, concurrency, move |i| {
            let (c, base, sessions) = (c.clone(), base.clone(), sessions.clone());
            async move {
                let server = format!("r{i:05}");
                rpc(
                    &c,
                    &base,
                    &server,
                    1,
                    "initialize",
                    json!({"protocolVersion": 1}),
                )
                .await;
                let s = rpc(
                    &c,
                    &base,
                    &server,
                    2,
                    "session/new",
                    json!({"cwd": "/", "mcpServers": []}),
                )
                .await;
                let sid = s["result"]["sessionId"]
                    .as_str()
                    .expect("a session")
                    .to_string();
                rpc(
                    &c,
                    &base,
                    &server,
                    3,
                    "session/prompt",
                    prompt(&sid, "before"),
                )
                .await;
                sessions.lock().unwrap()[i] = sid;
            }
        })
        .await;
    }
    let made = t.elapsed();
    let state_bytes = du(&dir.join("state"));
    println!(
        "{agents} serverIds made in {:.1} s (c={concurrency}); state dir {:.1} MiB",
        made.as_secs_f64(),
        state_bytes as f64 / 1048576.0
    );

    // The crash.
    let _ = first.child.kill();
    let _ = first.child.wait();
    drop(first);
    // The agents see their stdin close and exit; let them go before the next daemon starts.
    tokio::time::sleep(Duration::from_millis(500)).await;

    // The restart.
    let port = free_port();
    let t = Instant::now();
    let second = spawn(&dir, port, agents);
    let base = format!("http://127.0.0.1:{port}");
    wait_health(&c, &base).await;
    let up = t.elapsed();
    let t = Instant::now();
    let list: Value = c
        .get(format!("{base}/v1/acp"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let listed_in = t.elapsed();
    let servers = list["servers"].as_array().expect("servers");
    let recovered = servers
        .iter()
        .filter(|s| s["exitReason"] == "daemon_restart")
        .count();
    assert_eq!(
        recovered, agents,
        "every serverId is listed after the restart"
    );
    let rss = rss_kib(second.id());
    println!(
        "restart: spawn → health {:.0} ms; first full listing {:.1} ms; daemon RSS {:.1} MiB ({:.1} KiB per recovered serverId)",
        ms(up),
        ms(listed_in),
        rss as f64 / 1024.0,
        rss as f64 / agents as f64
    );

    // Every serverId restored (its agent started, its session loaded) by its next prompt.
    let t = Instant::now();
    let lat = {
        let (c, base, sessions) = (c.clone(), base.clone(), sessions.clone());
        fan_out(agents, concurrency, move |i| {
            let (c, base) = (c.clone(), base.clone());
            let sid = sessions.lock().unwrap()[i].clone();
            async move {
                let r = rpc(
                    &c,
                    &base,
                    &format!("r{i:05}"),
                    10,
                    "session/prompt",
                    prompt(&sid, "after"),
                )
                .await;
                assert!(
                    r.get("result").is_some(),
                    "the restored session answers: {r}"
                );
            }
        })
        .await
    };
    let took = t.elapsed();
    println!(
        "restore all: {:.1} s, {:.0} serverIds/s (c={concurrency}); per restore p50 {:.1} ms p99 {:.1} ms max {:.1} ms",
        took.as_secs_f64(),
        agents as f64 / took.as_secs_f64(),
        ms(percentile(&lat, 0.5)),
        ms(percentile(&lat, 0.99)),
        ms(lat.last().copied().unwrap_or_default())
    );
    drop(second);
}

fn du(p: &std::path::Path) -> u64 {
    let mut total = 0;
    let mut stack = vec![p.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in rd.flatten() {
            match e.metadata() {
                Ok(m) if m.is_dir() => stack.push(e.path()),
                Ok(m) => total += m.len(),
                Err(_) => {}
            }
        }
    }
    total
}
