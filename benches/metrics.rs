//! Benchmark of `GET /metrics` (not a test: it prints figures): the release daemon with 64 mock
//! agent instances and 64 running processes, then sequential scrapes in the Prometheus text format
//! and in OpenMetrics — latency (p50, p99), body size, and the daemon's CPU time per scrape.
//! Run: `cargo bench --bench metrics`; `METRICS_BENCH_N` scrapes per format (default 500),
//! `METRICS_BENCH_INSTANCES` and `METRICS_BENCH_PROCESSES` (default 64 each); `SANDBOX_AGENT_BIN`
//! drives another daemon build.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{daemon_bin, free_port, knob, percentile};

const BIN: &str = env!("CARGO_BIN_EXE_sandbox-agent");

/// One HTTP/1.1 request on a fresh connection; the status and the body.
fn request(port: u16, method: &str, path: &str, headers: &str, body: &str) -> (u16, Vec<u8>) {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    let req = format!(
        "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n{headers}Content-Length: {}\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes()).unwrap();
    let mut out = Vec::new();
    s.read_to_end(&mut out).unwrap();
    let head_end = out
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .expect("a response head")
        + 4;
    let status = std::str::from_utf8(&out[9..12]).unwrap().parse().unwrap();
    let head = String::from_utf8_lossy(&out[..head_end]).to_ascii_lowercase();
    let mut body = out[head_end..].to_vec();
    if head.contains("transfer-encoding: chunked") {
        body = dechunk(&body);
    }
    (status, body)
}

fn dechunk(mut b: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    loop {
        let Some(eol) = b.windows(2).position(|w| w == b"\r\n") else {
            return out;
        };
        let n = usize::from_str_radix(std::str::from_utf8(&b[..eol]).unwrap().trim(), 16).unwrap();
        if n == 0 {
            return out;
        }
        out.extend_from_slice(&b[eol + 2..eol + 2 + n]);
        b = &b[eol + 2 + n + 2..];
    }
}

fn cpu_ticks(pid: u32) -> u64 {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let rest = &text[text.rfind(')').unwrap() + 1..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap()
}

fn main() {
    let n: usize = knob("METRICS_BENCH_N", 500);
    let instances: usize = knob("METRICS_BENCH_INSTANCES", 64);
    let processes: usize = knob("METRICS_BENCH_PROCESSES", 64);
    let port = free_port();
    let dir = std::env::temp_dir().join(format!("metrics-bench-{}", std::process::id()));
    std::fs::create_dir_all(dir.join("work")).unwrap();
    let mut child = Command::new(daemon_bin(BIN))
        .arg("server")
        .args(["--host", "127.0.0.1", "--port", &port.to_string()])
        .args(["--log-level", "warn", "--no-token"])
        .args(["--max-agents", &instances.max(1).to_string()])
        .args(["--process-max-concurrent", &processes.max(1).to_string()])
        .arg("--data-dir")
        .arg(dir.join("data"))
        .arg("--work-dir")
        .arg(dir.join("work"))
        .env_remove("NOTIFY_SOCKET")
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn daemon");
    let deadline = Instant::now() + Duration::from_secs(10);
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "daemon did not listen");
        std::thread::sleep(Duration::from_millis(20));
    }
    let json = "Content-Type: application/json\r\n";
    for i in 0..instances {
        let (status, body) = request(
            port,
            "POST",
            &format!("/v1/acp/bench-{i}?agent=mock"),
            json,
            r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":1}}"#,
        );
        assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    }
    for _ in 0..processes {
        let (status, body) = request(
            port,
            "POST",
            "/v1/processes",
            json,
            r#"{"command":"sleep","args":["600"]}"#,
        );
        assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    }
    // Let the sampler read every instance's figures at least once.
    std::thread::sleep(Duration::from_secs(3));
    let (_, first) = request(port, "GET", "/metrics", "", "");
    let series = String::from_utf8_lossy(&first)
        .lines()
        .filter(|l| l.starts_with("sandbox_agent_agent_memory_bytes{"))
        .count();
    println!(
        "metrics scrape: {instances} instances, {processes} processes, {series} per-instance memory series"
    );
    for (name, accept) in [
        ("prometheus text", ""),
        (
            "openmetrics",
            "Accept: application/openmetrics-text;version=1.0.0\r\n",
        ),
    ] {
        let mut times = Vec::with_capacity(n);
        let mut size = 0;
        let cpu_before = cpu_ticks(child.id());
        let started = Instant::now();
        for _ in 0..n {
            let t = Instant::now();
            let (status, body) = request(port, "GET", "/metrics", accept, "");
            times.push(t.elapsed());
            assert_eq!(status, 200);
            size = body.len();
        }
        let wall = started.elapsed();
        let cpu = (cpu_ticks(child.id()) - cpu_before) as f64 / 100.0;
        times.sort();
        println!(
            "  {name:16} p50 {:>7.0} us  p99 {:>7.0} us  {:>6.0} scrapes/s  body {:>6} B  daemon CPU {:>5.0} us/scrape",
            percentile(&times, 0.5).as_secs_f64() * 1e6,
            percentile(&times, 0.99).as_secs_f64() * 1e6,
            n as f64 / wall.as_secs_f64(),
            size,
            cpu / n as f64 * 1e6,
        );
    }
    // SIGTERM: the daemon stops every agent and process it started before it exits.
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    );
    let _ = child.wait();
    let _ = std::fs::remove_dir_all(&dir);
}
