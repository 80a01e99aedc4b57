//! Benchmark of the edge under a slowloris (not a test: it prints figures for
//! docs/performance.md). Starts the release daemon, measures `GET /v1/health` latency (a fresh
//! connection per request, and one keep-alive connection) on a quiet daemon, then again while
//! `EDGE_BENCH_SOCKETS` (default 300) connections send an unfinished request head and drip one
//! header line per second (reconnecting when the daemon cuts them at `--header-read-timeout`).
//! Last, the same figures while `EDGE_BENCH_WS_SOCKETS` (default 24) WebSockets each send a 2 MiB
//! text message as two 1 MiB frames and never finish it (the attack `tests/it/slow_clients.rs`
//! proves bounded; its latency is measured here, not asserted there).
//! Run: `cargo bench --bench edge`. `EDGE_BENCH_N` sets the requests per figure (default 10 000).
//! `SANDBOX_AGENT_WORKER_THREADS` is passed through to the daemon.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

mod common;
use common::{free_port, knob, percentile};

const BIN: &str = env!("CARGO_BIN_EXE_sandbox-agent");
const REQUEST: &[u8] = b"GET /v1/health HTTP/1.1\r\nHost: localhost\r\n\r\n";

/// Reads one answer with a Content-Length body; panics on anything but 200.
fn read_answer(s: &mut TcpStream, buf: &mut Vec<u8>) {
    buf.clear();
    let mut chunk = [0u8; 1024];
    loop {
        let n = s.read(&mut chunk).expect("read");
        assert!(n > 0, "connection closed mid-answer");
        buf.extend_from_slice(&chunk[..n]);
        if let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
            assert!(head.starts_with("http/1.1 200"), "{head}");
            let len: usize = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length: "))
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or(0);
            if buf.len() >= end + 4 + len {
                return;
            }
        }
    }
}

fn report(what: &str, mut v: Vec<Duration>) {
    v.sort();
    println!(
        "{what:<44} n={:<5} p50={:>7.0} µs  p99={:>7.0} µs  max={:>7.0} µs",
        v.len(),
        percentile(&v, 0.5).as_secs_f64() * 1e6,
        percentile(&v, 0.99).as_secs_f64() * 1e6,
        v.last().unwrap().as_secs_f64() * 1e6
    );
}

fn measure(addr: &str, n: usize) -> (Vec<Duration>, Vec<Duration>) {
    let mut buf = Vec::new();
    let mut fresh = Vec::with_capacity(n);
    for _ in 0..n {
        let t = Instant::now();
        let mut s = TcpStream::connect(addr).unwrap();
        s.set_nodelay(true).unwrap();
        s.write_all(REQUEST).unwrap();
        read_answer(&mut s, &mut buf);
        fresh.push(t.elapsed());
    }
    let mut kept = Vec::with_capacity(n);
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_nodelay(true).unwrap();
    for _ in 0..n {
        let t = Instant::now();
        s.write_all(REQUEST).unwrap();
        read_answer(&mut s, &mut buf);
        kept.push(t.elapsed());
    }
    (fresh, kept)
}

struct Daemon(Child);

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn main() {
    let n = knob("EDGE_BENCH_N", 10000);
    let sockets = knob("EDGE_BENCH_SOCKETS", 300);
    let dir = std::env::temp_dir().join(format!("edge-bench-{}", std::process::id()));
    std::fs::create_dir_all(dir.join("work")).unwrap();
    let port = free_port();
    let _daemon = Daemon(
        Command::new(BIN)
            .arg("server")
            .args(["--host", "127.0.0.1", "--port", &port.to_string()])
            .args([
                "--log-level",
                "warn",
                "--no-token",
                "--header-read-timeout",
                "2s",
                "--acp-inflight-bytes",
                "4M",
                "--body-limit",
                "4M",
            ])
            .arg("--data-dir")
            .arg(dir.join("data"))
            .arg("--work-dir")
            .arg(dir.join("work"))
            .env_remove("NOTIFY_SOCKET")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .spawn()
            .expect("start the daemon"),
    );
    let addr = format!("127.0.0.1:{port}");
    let up = Instant::now();
    while TcpStream::connect(&addr).is_err() {
        assert!(up.elapsed() < Duration::from_secs(10), "daemon not up");
        std::thread::sleep(Duration::from_millis(10));
    }
    let workers = std::env::var("SANDBOX_AGENT_WORKER_THREADS").unwrap_or_else(|_| "auto".into());
    println!("edge bench: worker threads {workers}, {n} requests per figure");

    let (fresh, kept) = measure(&addr, n);
    report("quiet: new connection per request", fresh);
    report("quiet: one keep-alive connection", kept);

    let stop = Arc::new(AtomicBool::new(false));
    let cut = Arc::new(AtomicU64::new(0));
    let attacker = {
        let (stop, cut, addr) = (stop.clone(), cut.clone(), addr.clone());
        std::thread::spawn(move || {
            let open = |addr: &str| {
                let mut s = TcpStream::connect(addr).ok()?;
                s.write_all(b"GET /v1/health HTTP/1.1\r\nHost: localhost\r\n")
                    .ok()?;
                Some(s)
            };
            let mut socks: Vec<Option<TcpStream>> = (0..sockets).map(|_| open(&addr)).collect();
            while !stop.load(Ordering::Relaxed) {
                for slot in socks.iter_mut() {
                    let alive = slot
                        .as_mut()
                        .is_some_and(|s| s.write_all(b"X-Drip: 1\r\n").is_ok());
                    if !alive {
                        cut.fetch_add(1, Ordering::Relaxed);
                        *slot = open(&addr);
                    }
                }
                std::thread::sleep(Duration::from_secs(1));
            }
        })
    };
    // Let the attack build up before measuring.
    std::thread::sleep(Duration::from_secs(2));
    let (fresh, kept) = measure(&addr, n);
    report(
        &format!("slowloris x{sockets}: new connection per request"),
        fresh,
    );
    report(
        &format!("slowloris x{sockets}: one keep-alive connection"),
        kept,
    );
    stop.store(true, Ordering::Relaxed);
    attacker.join().unwrap();
    println!(
        "attack connections cut by the header-read timeout (and replaced): {}",
        cut.load(Ordering::Relaxed)
    );
    unfinished_websocket_messages(&addr, n, knob("EDGE_BENCH_WS_SOCKETS", 24));
    let _ = std::fs::remove_dir_all(&dir);
}

/// An HTTP/1.1 WebSocket handshake on a raw socket to `path` (frames are then written by hand).
fn raw_websocket(addr: &str, path: &str) -> Option<TcpStream> {
    let mut s = TcpStream::connect(addr).ok()?;
    let req = format!(
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\
         Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n"
    );
    s.write_all(req.as_bytes()).ok()?;
    let mut head = Vec::new();
    let mut b = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        if s.read(&mut b).ok()? != 1 {
            return None;
        }
        head.push(b[0]);
    }
    head.starts_with(b"HTTP/1.1 101").then_some(s)
}

/// Health latency while `sockets` WebSockets each hold an unfinished 2 MiB message (two 1 MiB
/// masked frames, a text frame and a continuation, neither with FIN: the message never ends).
fn unfinished_websocket_messages(addr: &str, n: usize, sockets: usize) {
    const MIB: u64 = 1 << 20;
    let header = |first: u8| {
        let mut h = vec![first, 0x80 | 127];
        h.extend_from_slice(&MIB.to_be_bytes());
        h.extend_from_slice(&[0, 0, 0, 0]);
        h
    };
    let stop = Arc::new(AtomicBool::new(false));
    let held = Arc::new(AtomicU64::new(0));
    let attackers: Vec<_> = (0..sockets)
        .map(|_| {
            let (stop, held, addr) = (stop.clone(), held.clone(), addr.to_string());
            let (first, next) = (header(0x01), header(0x00));
            std::thread::spawn(move || {
                let Some(mut s) = raw_websocket(&addr, "/v1/acp/edge-bench?agent=mock") else {
                    return;
                };
                let payload = vec![b' '; MIB as usize];
                for h in [&first, &next] {
                    if s.write_all(h).is_err() || s.write_all(&payload).is_err() {
                        return;
                    }
                }
                held.fetch_add(1, Ordering::Relaxed);
                while !stop.load(Ordering::Relaxed) {
                    std::thread::sleep(Duration::from_millis(100));
                }
            })
        })
        .collect();
    std::thread::sleep(Duration::from_secs(2));
    let (fresh, kept) = measure(addr, n);
    report(&format!("unfinished ws x{sockets}: new connection"), fresh);
    report(&format!("unfinished ws x{sockets}: keep-alive"), kept);
    stop.store(true, Ordering::Relaxed);
    for a in attackers {
        let _ = a.join();
    }
    println!(
        "WebSockets that sent their whole unfinished message: {} of {sockets}",
        held.load(Ordering::Relaxed)
    );
}
