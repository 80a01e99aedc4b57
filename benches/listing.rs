//! `GET /v1/acp` with thousands of agent processes (not a test; asserts only that the set-up
//! worked). Starts the release daemon, creates `LIST_BENCH_AGENTS` mock instances (default 30)
//! and tells each to fork `LIST_BENCH_FORKS` sleeping children (default 100: ~3,000 agent
//! processes), then lists `LIST_BENCH_N` times in a row (default 300) while a prober sends
//! `GET /v1/health` every 5 ms on its own connection. Prints listing p50/p99/max, and health
//! p50/p99/max before (quiet) and during the listing. Everything is deleted and the daemon
//! stopped at the end; each phase has a deadline. `LIST_BENCH_ARGS` adds daemon flags (e.g.
//! `--agent-cgroups off`); `SANDBOX_AGENT_WORKER_THREADS` sets `--worker-threads`.
//!
//! Run: `cargo bench --bench listing`.

use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

mod common;
use common::{Stopping, free_port, knob, percentile};

const BIN: &str = env!("CARGO_BIN_EXE_sandbox-agent");

fn summary(mut v: Vec<Duration>) -> String {
    v.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    format!(
        "n {} p50 {:.2} ms p99 {:.2} ms max {:.2} ms",
        v.len(),
        ms(percentile(&v, 0.5)),
        ms(percentile(&v, 0.99)),
        ms(v.last().copied().unwrap_or_default())
    )
}

/// `GET /v1/health` every 5 ms until `stop`; every latency.
async fn probe_health(c: reqwest::Client, url: String, stop: Arc<AtomicBool>) -> Vec<Duration> {
    let mut out = Vec::new();
    while !stop.load(Ordering::Relaxed) {
        let t = Instant::now();
        let r = c.get(&url).send().await.expect("health answers");
        assert_eq!(r.status(), 200);
        out.push(t.elapsed());
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    out
}

async fn rpc(c: &reqwest::Client, base: &str, server: &str, id: u64, method: &str, params: Value) {
    let r = c
        .post(format!("{base}/v1/acp/{server}?agent=mock"))
        .json(&json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}))
        .send()
        .await
        .expect("POST");
    assert_eq!(r.status(), 200, "{method} on {server}");
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    sandbox_agent::install_crypto_provider();
    let agents = knob("LIST_BENCH_AGENTS", 30);
    let forks = knob("LIST_BENCH_FORKS", 100);
    let n = knob("LIST_BENCH_N", 300);
    let port = free_port();
    let dir = tempfile::tempdir().unwrap();
    let base = format!("http://127.0.0.1:{port}");
    let mut cmd = Command::new(BIN);
    cmd.args([
        "server",
        "--host",
        "127.0.0.1",
        "--no-token",
        "--log-level",
        "warn",
    ])
    .arg("--port")
    .arg(port.to_string())
    .arg("--work-dir")
    .arg(dir.path())
    .arg("--data-dir")
    .arg(dir.path().join("data"))
    .args(["--max-agents", &(agents + 1).to_string()])
    .stdout(Stdio::null())
    .stderr(Stdio::inherit());
    if let Ok(w) = std::env::var("SANDBOX_AGENT_WORKER_THREADS") {
        cmd.args(["--worker-threads", &w]);
    }
    // e.g. `--agent-cgroups off`: the listing then scans /proc once per instance.
    if let Ok(extra) = std::env::var("LIST_BENCH_ARGS") {
        cmd.args(extra.split_whitespace());
    }
    let daemon = Stopping::new(cmd.spawn().expect("start the daemon"));
    let c = reqwest::Client::builder().no_proxy().build().unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while c.get(format!("{base}/v1/health")).send().await.is_err() {
        assert!(Instant::now() < deadline, "the daemon never answered");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    // Health on a quiet daemon (nothing running), as the reference.
    let stop = Arc::new(AtomicBool::new(false));
    let prober = tokio::spawn(probe_health(
        c.clone(),
        format!("{base}/v1/health"),
        stop.clone(),
    ));
    tokio::time::sleep(Duration::from_secs(2)).await;
    stop.store(true, Ordering::Relaxed);
    let quiet = prober.await.unwrap();

    let t = Instant::now();
    for i in 0..agents {
        let s = format!("list-{i}");
        rpc(
            &c,
            &base,
            &s,
            1,
            "initialize",
            json!({"protocolVersion": 1}),
        )
        .await;
        rpc(
            &c,
            &base,
            &s,
            2,
            "session/new",
            json!({"cwd": "/", "mcpServers": []}),
        )
        .await;
        let prompt = json!({"sessionId": "mock-1",
            "prompt": [{"type": "text", "text": format!("/fork {forks}")}]});
        rpc(&c, &base, &s, 3, "session/prompt", prompt).await;
    }
    let list: Value = c
        .get(format!("{base}/v1/acp"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let procs: u64 = list["servers"]
        .as_array()
        .expect("a list of servers")
        .iter()
        .filter_map(|r| r["processes"].as_u64())
        .sum();
    println!(
        "{agents} agents, {procs} agent processes listed (set up in {:.1} s)",
        t.elapsed().as_secs_f64()
    );
    assert!(
        procs >= agents * (forks + 1) * 9 / 10,
        "fewer processes than asked for: {procs}"
    );

    // The listing, back to back, with the prober running.
    let stop = Arc::new(AtomicBool::new(false));
    let prober = tokio::spawn(probe_health(
        c.clone(),
        format!("{base}/v1/health"),
        stop.clone(),
    ));
    let mut lists = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(300);
    for _ in 0..n {
        let t = Instant::now();
        let r = c.get(format!("{base}/v1/acp")).send().await.unwrap();
        assert_eq!(r.status(), 200);
        let _ = r.bytes().await.unwrap();
        lists.push(t.elapsed());
        if Instant::now() > deadline {
            println!("(stopped after {} listings: 300 s deadline)", lists.len());
            break;
        }
    }
    stop.store(true, Ordering::Relaxed);
    let during = prober.await.unwrap();

    println!("GET /v1/acp:             {}", summary(lists));
    println!("GET /v1/health, quiet:   {}", summary(quiet));
    println!("GET /v1/health, listing: {}", summary(during));

    for i in 0..agents {
        let _ = c.delete(format!("{base}/v1/acp/list-{i}")).send().await;
    }
    drop(daemon);
}
