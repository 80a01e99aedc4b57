//! Benchmark of the process API (not a test: it prints figures for docs/performance.md).
//! 1. Output throughput: `yes | head -c N` (N = `PROC_BENCH_BYTES`, default 1 GiB; 0 skips it)
//!    read straight from the pipe, against the same command started with `POST /v1/processes`
//!    and read through `GET …/logs?follow=true` (SSE, base64 JSON entries decoded by the client).
//!    Bytes lost to the log's cap (gap events) are counted and reported, never hidden.
//! 2. Start latency: `true` run with fork+exec directly, against `POST /v1/processes/run`
//!    (`PROC_BENCH_RUNS`, default 300, after 20 warm-up runs), twice: back to back, and spaced
//!    by `PROC_BENCH_GAP_MS` (default 50 ms, not timed) as an interactive user would start them.
//!
//! 3. The runtime thread during starts: `GET /v1/health` every 2 ms on its own connection, idle
//!    and while the runs of 2. go back to back again (with `--warm-spawns 0` every start moves
//!    its child into a cgroup, which can wait for a kernel grace period).
//!
//! Run: `cargo bench --bench processes` (builds the release daemon; log level warn). Extra daemon
//! flags: `PROC_BENCH_ARGS` (e.g. `--warm-spawns 0`); another daemon binary (say, an older
//! build, to compare): `SANDBOX_AGENT_BIN` (or `PROC_BENCH_DAEMON`). The load average is printed
//! before and after. With `BENCH_AB` set (the A/B harness, `benches/ab.sh`), only the output
//! throughput and the back-to-back starts run, and their figures are printed for the harness; a
//! build without the process API is reported and skipped.

use std::io::Read;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use base64::Engine;
use futures_util::StreamExt;
use serde_json::{Value, json};

mod common;
use common::{ab_figure, daemon_bin, free_port, knob, knows_flag, percentile};

const BIN: &str = env!("CARGO_BIN_EXE_sandbox-agent");

fn script(bytes: u64) -> String {
    format!("yes | head -c {bytes}")
}

fn direct_throughput(bytes: u64) -> (u64, Duration) {
    let t = Instant::now();
    let mut child = Command::new("sh")
        .args(["-c", &script(bytes)])
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn sh");
    let mut out = child.stdout.take().unwrap();
    let mut buf = vec![0u8; 64 * 1024];
    let mut total = 0u64;
    loop {
        let n = out.read(&mut buf).expect("read");
        if n == 0 {
            break;
        }
        total += n as u64;
    }
    child.wait().expect("wait");
    (total, t.elapsed())
}

struct Followed {
    delivered: u64,
    lost: u64,
    took: Duration,
}

async fn follow_throughput(client: &reqwest::Client, base: &str, bytes: u64) -> Followed {
    let t = Instant::now();
    let info: Value = client
        .post(format!("{base}/v1/processes"))
        .json(&json!({"command": "sh", "args": ["-c", script(bytes)]}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let id = info["id"].as_str().expect("created").to_string();
    let resp = client
        .get(format!("{base}/v1/processes/{id}/logs?follow=true"))
        .send()
        .await
        .unwrap();
    let mut stream = resp.bytes_stream();
    let mut buf: Vec<u8> = Vec::new();
    let (mut delivered, mut lost) = (0u64, 0u64);
    let b64 = base64::engine::general_purpose::STANDARD;
    while let Some(chunk) = stream.next().await {
        buf.extend_from_slice(&chunk.unwrap());
        let mut start = 0;
        while let Some(i) = memchr_frame(&buf[start..]) {
            let frame = &buf[start..start + i];
            start += i + 2;
            let text = std::str::from_utf8(frame).unwrap();
            let event = text
                .lines()
                .find_map(|l| l.strip_prefix("event: "))
                .unwrap_or("");
            let Some(data) = text.lines().find_map(|l| l.strip_prefix("data: ")) else {
                continue;
            };
            let v: Value = serde_json::from_str(data).unwrap();
            match event {
                "log" => delivered += b64.decode(v["data"].as_str().unwrap()).unwrap().len() as u64,
                "gap" => lost += v["to"].as_u64().unwrap() - v["from"].as_u64().unwrap(),
                _ => {}
            }
        }
        buf.drain(..start);
    }
    let took = t.elapsed();
    let _ = client
        .delete(format!("{base}/v1/processes/{id}"))
        .send()
        .await;
    Followed {
        delivered,
        lost,
        took,
    }
}

fn memchr_frame(b: &[u8]) -> Option<usize> {
    b.windows(2).position(|w| w == b"\n\n")
}

fn mbps(bytes: u64, d: Duration) -> f64 {
    bytes as f64 / d.as_secs_f64() / 1e6
}

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

/// p50, p90 and p99 of `samples` (sorted here).
fn summary(samples: &mut [Duration]) -> String {
    samples.sort();
    format!(
        "p50 {:.2?}  p90 {:.2?}  p99 {:.2?}",
        percentile(samples, 0.5),
        percentile(samples, 0.9),
        percentile(samples, 0.99)
    )
}

/// `runs` timed runs of `true` through the API after 20 untimed ones, `gap` apart (untimed).
async fn api_latency(
    client: &reqwest::Client,
    base: &str,
    runs: usize,
    gap: Duration,
) -> (Vec<Duration>, usize) {
    let mut api = Vec::with_capacity(runs);
    let mut errors = 0;
    for i in 0..runs + 20 {
        if !gap.is_zero() {
            tokio::time::sleep(gap).await;
        }
        let t = Instant::now();
        let r: Value = client
            .post(format!("{base}/v1/processes/run"))
            .json(&json!({"command": "true"}))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        if r["exitCode"] != 0 {
            errors += 1;
        }
        if i >= 20 {
            api.push(t.elapsed());
        }
    }
    (api, errors)
}

/// GET /v1/health every 2 ms on a connection of its own, for as long as `busy` runs; returns
/// the probes' latencies. With `busy` a burst of starts, a long probe is the runtime thread held.
async fn health_while<F: std::future::Future<Output = ()>>(base: &str, busy: F) -> Vec<Duration> {
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let probe = {
        let (base, done) = (base.to_string(), done.clone());
        tokio::spawn(async move {
            let client = reqwest::Client::new();
            let mut samples = Vec::new();
            while !done.load(std::sync::atomic::Ordering::Relaxed) {
                let t = Instant::now();
                let r = client
                    .get(format!("{base}/v1/health"))
                    .send()
                    .await
                    .unwrap();
                assert!(r.status().is_success());
                samples.push(t.elapsed());
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
            samples
        })
    };
    busy.await;
    done.store(true, std::sync::atomic::Ordering::Relaxed);
    probe.await.unwrap()
}

fn with_max(samples: &mut [Duration]) -> String {
    let s = summary(samples);
    format!(
        "{s}  max {:.2?}  ({} probes)",
        samples.last().copied().unwrap_or_default(),
        samples.len()
    )
}

fn main() {
    let bytes = knob("PROC_BENCH_BYTES", 1 << 30);
    let runs = knob("PROC_BENCH_RUNS", 300) as usize;
    let gap = Duration::from_millis(knob("PROC_BENCH_GAP_MS", 50));
    let bin = std::env::var("PROC_BENCH_DAEMON").unwrap_or_else(|_| daemon_bin(BIN));
    let ab = std::env::var_os("BENCH_AB").is_some();
    // Log caps large enough for the throughput run, where the build knows them.
    let mut caps: Vec<&str> = Vec::new();
    if knows_flag(&bin, "--process-max-log-bytes") {
        caps.extend(["--process-max-log-bytes", "256M"]);
    }
    if knows_flag(&bin, "--process-max-total-log-bytes") {
        caps.extend(["--process-max-total-log-bytes", "512M"]);
    }
    let extra: Vec<String> = std::env::var("PROC_BENCH_ARGS")
        .unwrap_or_default()
        .split_whitespace()
        .map(str::to_owned)
        .collect();
    println!(
        "daemon {bin} {}; load average {}",
        extra.join(" "),
        loadavg()
    );
    let port = free_port();
    let work = std::env::temp_dir().join(format!("proc-bench-{}", std::process::id()));
    std::fs::create_dir_all(&work).unwrap();
    let mut daemon = Command::new(&bin)
        .args([
            "--no-token",
            "--log-level",
            "warn",
            "--port",
            &port.to_string(),
        ])
        .args(&caps)
        .arg("--data-dir")
        .arg(work.join("data"))
        .arg("--work-dir")
        .arg(&work)
        .args(&extra)
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start the daemon");
    let base = format!("http://127.0.0.1:{port}");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    sandbox_agent::install_crypto_provider();
    rt.block_on(async {
        let client = reqwest::Client::new();
        let deadline = Instant::now() + Duration::from_secs(10);
        while client
            .get(format!("{base}/v1/health"))
            .send()
            .await
            .is_err()
        {
            assert!(Instant::now() < deadline, "daemon did not start");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }

        let probe = client
            .post(format!("{base}/v1/processes/run"))
            .json(&json!({"command": "true"}))
            .send()
            .await
            .unwrap();
        if probe.status() == reqwest::StatusCode::NOT_FOUND {
            println!("this build has no process API (POST /v1/processes/run is 404): skipped");
            return;
        }
        if bytes > 0 {
            println!("== output throughput, {bytes} bytes of `yes`");
            for round in 1..=2 {
                let (n, took) = direct_throughput(bytes);
                println!(
                    "direct pipe      round {round}: {:.0} MB/s ({n} bytes in {:.2?})",
                    mbps(n, took),
                    took
                );
                let f = follow_throughput(&client, &base, bytes).await;
                if round == 2 {
                    ab_figure(
                        "process output MB/s (follow)",
                        mbps(f.delivered, f.took),
                        Some(("direct pipe", mbps(n, took))),
                    );
                }
                println!(
                    "through follow   round {round}: {:.0} MB/s delivered ({} bytes, {} lost to the cap, in {:.2?})",
                    mbps(f.delivered, f.took),
                    f.delivered,
                    f.lost,
                    f.took
                );
            }
        }

        println!("== start latency of `true` ({runs} runs after 20 warm-up)");
        let mut direct = Vec::with_capacity(runs);
        for i in 0..runs + 20 {
            let t = Instant::now();
            let st = Command::new("true").status().unwrap();
            assert!(st.success());
            if i >= 20 {
                direct.push(t.elapsed());
            }
        }
        println!("fork+exec direct:                 {}", summary(&mut direct));
        let (mut api, errors) = api_latency(&client, &base, runs, Duration::ZERO).await;
        println!(
            "POST /v1/processes/run, back to back: {}  (errors {errors})",
            summary(&mut api)
        );
        let per_s = |d: Duration| 1.0 / d.as_secs_f64().max(1e-9);
        ab_figure(
            "process start runs/s (1/p50)",
            per_s(percentile(&api, 0.5)),
            Some(("fork+exec direct", per_s(percentile(&direct, 0.5)))),
        );
        if ab {
            return;
        }
        let (mut spaced, errors) = api_latency(&client, &base, runs, gap).await;
        println!(
            "POST /v1/processes/run, {gap:?} apart: {}  (errors {errors})",
            summary(&mut spaced)
        );

        println!("== the runtime thread during starts: GET /v1/health every 2 ms");
        let mut idle = health_while(&base, tokio::time::sleep(Duration::from_secs(2))).await;
        println!("while idle (2 s):                 {}", with_max(&mut idle));
        let mut busy = health_while(&base, async {
            api_latency(&client, &base, runs, Duration::ZERO).await;
        })
        .await;
        println!("while {runs} runs go back to back: {}", with_max(&mut busy));
        println!("load average {}", loadavg());
    });
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(daemon.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    );
    let _ = daemon.wait();
    let _ = std::fs::remove_dir_all(&work);
}
