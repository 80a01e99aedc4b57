//! Start-up benchmark: time from spawning the daemon to its READY=1 notification, and its idle
//! resident memory after start and after a burst of requests. Prints figures; asserts nothing.
//! Run: `cargo bench --bench startup`

use std::io::{Read, Write};
use std::os::unix::net::UnixDatagram;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_sandbox-agent");
const RUNS: usize = 40;

fn vm_rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    let idx = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[idx]
}

fn get(addr: &str, path: &str) {
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut out = Vec::new();
    s.read_to_end(&mut out).unwrap();
    assert!(out.starts_with(b"HTTP/1.1 200"));
}

fn main() {
    let dir = tempfile::tempdir().unwrap();
    let mut ready_ms = Vec::new();
    let mut rss_ready = Vec::new();
    let mut rss_busy = Vec::new();
    for i in 0..RUNS {
        let sock = dir.path().join(format!("n{i}.sock"));
        let notify = UnixDatagram::bind(&sock).unwrap();
        notify
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        let started = Instant::now();
        let mut child = Command::new(BIN)
            .args(["server", "--port", "0", "--log-level", "warn"])
            .arg("--data-dir")
            .arg(dir.path().join("data"))
            .env("NOTIFY_SOCKET", &sock)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let mut buf = [0u8; 512];
        let addr = loop {
            let n = notify.recv(&mut buf).expect("READY=1 within 10 s");
            let msg = String::from_utf8_lossy(&buf[..n]).into_owned();
            if msg.lines().any(|l| l == "READY=1") {
                let elapsed = started.elapsed();
                ready_ms.push(elapsed.as_secs_f64() * 1000.0);
                break msg.split("http://").nth(1).unwrap().trim().to_string();
            }
        };
        // Let lazy start-up work (if any) settle, then read the idle footprint.
        std::thread::sleep(Duration::from_millis(100));
        rss_ready.push(vm_rss_kib(child.id()) as f64 / 1024.0);
        for _ in 0..200 {
            get(&addr, "/v1/health");
        }
        std::thread::sleep(Duration::from_millis(100));
        rss_busy.push(vm_rss_kib(child.id()) as f64 / 1024.0);
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(child.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        )
        .unwrap();
        let status = child.wait().unwrap();
        assert!(status.success(), "daemon exited with {status}");
    }
    for v in [&mut ready_ms, &mut rss_ready, &mut rss_busy] {
        v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    }
    println!("start-up over {RUNS} runs (release build, spawn -> READY=1 received):");
    println!(
        "  start to READY: min {:.1} ms, p50 {:.1} ms, p90 {:.1} ms, max {:.1} ms",
        ready_ms[0],
        percentile(&ready_ms, 0.5),
        percentile(&ready_ms, 0.9),
        ready_ms[RUNS - 1]
    );
    println!(
        "  idle RSS after READY: p50 {:.1} MiB, max {:.1} MiB",
        percentile(&rss_ready, 0.5),
        rss_ready[RUNS - 1]
    );
    println!(
        "  idle RSS after 200 requests: p50 {:.1} MiB, max {:.1} MiB",
        percentile(&rss_busy, 0.5),
        rss_busy[RUNS - 1]
    );
}
