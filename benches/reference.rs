//! The ACP proxy side by side with the reference implementation's binary (not a test: it prints
//! figures). Run `benches/reference.sh`, which fetches the reference's published Linux binary from
//! the npm registry (`@sandbox-agent/cli-linux-x64`) into `target/reference/` and points its `mock`
//! agent at our `sandbox-agent mock-agent`, so that both proxies drive the very same agent.
//!
//! For each daemon, alternating, `REF_BENCH_ROUNDS` rounds (default 3): `_mock/echo` POSTs to
//! `/v1/acp/{serverId}` on keep-alive HTTP/1.1 connections, c=1 (`REF_BENCH_N` round trips,
//! default 3,000: p50/p99) and c=32 (`REF_BENCH_SECS` seconds, default 5: requests/s). Ours runs
//! with `--worker-threads 1` and `2` (the machine's cores); the reference with its defaults.
//! Every answer is checked to carry its request's id. Blocking clients, written here.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

mod common;
use common::{Stopping, free_port, knob, percentile};

const BIN: &str = env!("CARGO_BIN_EXE_sandbox-agent");

struct Daemon {
    _child: Stopping,
    port: u16,
}

/// One keep-alive HTTP/1.1 connection.
struct Conn {
    r: BufReader<TcpStream>,
}

impl Conn {
    fn open(port: u16) -> Conn {
        let s = TcpStream::connect(("127.0.0.1", port)).expect("connect");
        s.set_nodelay(true).unwrap();
        Conn {
            r: BufReader::new(s),
        }
    }

    /// POSTs `body` to `path`; the status and the body.
    fn post(&mut self, path: &str, body: &str) -> (u16, Vec<u8>) {
        let req = format!(
            "POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nAccept: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        );
        self.r.get_mut().write_all(req.as_bytes()).expect("write");
        let mut line = String::new();
        self.r.read_line(&mut line).expect("status line");
        let status: u16 = line
            .split(' ')
            .nth(1)
            .and_then(|s| s.parse().ok())
            .unwrap_or(0);
        let (mut len, mut chunked) = (0usize, false);
        loop {
            line.clear();
            self.r.read_line(&mut line).expect("header");
            let l = line.trim_end();
            if l.is_empty() {
                break;
            }
            let lower = l.to_ascii_lowercase();
            if let Some(v) = lower.strip_prefix("content-length:") {
                len = v.trim().parse().unwrap_or(0);
            } else if lower.starts_with("transfer-encoding:") && lower.contains("chunked") {
                chunked = true;
            }
        }
        let mut out = Vec::new();
        if chunked {
            loop {
                line.clear();
                self.r.read_line(&mut line).expect("chunk size");
                let n = usize::from_str_radix(line.trim(), 16).unwrap_or(0);
                let mut chunk = vec![0u8; n + 2];
                self.r.read_exact(&mut chunk).expect("chunk");
                if n == 0 {
                    break;
                }
                out.extend_from_slice(&chunk[..n]);
            }
        } else {
            out.resize(len, 0);
            self.r.read_exact(&mut out).expect("body");
        }
        (status, out)
    }
}

fn echo(id: u64) -> String {
    format!(r#"{{"jsonrpc":"2.0","id":{id},"method":"_mock/echo","params":{{"n":{id}}}}}"#)
}

fn carries_id(body: &[u8], id: u64) -> bool {
    let s = String::from_utf8_lossy(body);
    s.contains(&format!("\"id\":{id},")) || s.contains(&format!("\"id\":{id}}}"))
}

fn wait_up(port: u16) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "daemon on {port} never listened");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn ours(threads: usize) -> Daemon {
    let port = free_port();
    let dir = std::env::temp_dir().join(format!("ref-bench-ours-{port}"));
    std::fs::create_dir_all(&dir).unwrap();
    let child = Command::new(BIN)
        .args([
            "server",
            "--host",
            "127.0.0.1",
            "--no-token",
            "--log-level",
            "warn",
        ])
        .args([
            "--port",
            &port.to_string(),
            "--worker-threads",
            &threads.to_string(),
        ])
        .arg("--work-dir")
        .arg(&dir)
        .arg("--data-dir")
        .arg(dir.join("data"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start ours");
    wait_up(port);
    Daemon {
        _child: Stopping {
            child,
            grace: Duration::from_secs(10),
        },
        port,
    }
}

fn reference(bin: &str, home: &str) -> Daemon {
    let port = free_port();
    let child = Command::new(bin)
        .args([
            "server",
            "--no-token",
            "--no-telemetry",
            "--port",
            &port.to_string(),
        ])
        .env("HOME", home)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start the reference");
    wait_up(port);
    Daemon {
        _child: Stopping {
            child,
            grace: Duration::from_secs(10),
        },
        port,
    }
}

/// c=1 p50/p99 in µs and c=32 requests/s against `d`.
fn measure(d: &Daemon, n: usize, secs: u64) -> (f64, f64, f64) {
    let path = "/v1/acp/bench";
    let mut c = Conn::open(d.port);
    let (s, b) = c.post(
        &format!("{path}?agent=mock"),
        &echo(0)
            .replace("_mock/echo", "initialize")
            .replace(r#"{"n":0}"#, r#"{"protocolVersion":1}"#),
    );
    assert_eq!(s, 200, "initialize: {}", String::from_utf8_lossy(&b));
    for i in 1..=200 {
        let (s, b) = c.post(path, &echo(i));
        assert!(
            s == 200 && carries_id(&b, i),
            "warm-up {i}: {s} {}",
            String::from_utf8_lossy(&b)
        );
    }
    let mut lat = Vec::with_capacity(n);
    for i in 0..n as u64 {
        let id = 1000 + i;
        let t = Instant::now();
        let (s, b) = c.post(path, &echo(id));
        lat.push(t.elapsed());
        assert!(s == 200 && carries_id(&b, id), "c=1 {id}: {s}");
    }
    lat.sort();
    let us = |d: Duration| d.as_secs_f64() * 1e6;
    let (p50, p99) = (us(percentile(&lat, 0.5)), us(percentile(&lat, 0.99)));
    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicU64::new(0));
    let threads: Vec<_> = (0..32u64)
        .map(|k| {
            let (stop, done, port) = (stop.clone(), done.clone(), d.port);
            std::thread::spawn(move || {
                let mut c = Conn::open(port);
                let mut id = 1_000_000 * (k + 1);
                while !stop.load(Ordering::Relaxed) {
                    id += 1;
                    let (s, b) = c.post(path, &echo(id));
                    assert!(s == 200 && carries_id(&b, id), "c=32 {id}: {s}");
                    done.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(500));
    let (n0, t0) = (done.load(Ordering::Relaxed), Instant::now());
    std::thread::sleep(Duration::from_secs(secs));
    let rate = (done.load(Ordering::Relaxed) - n0) as f64 / t0.elapsed().as_secs_f64();
    stop.store(true, Ordering::Relaxed);
    for t in threads {
        t.join().unwrap();
    }
    (p50, p99, rate)
}

fn main() {
    let bin =
        std::env::var("REF_BIN").expect("REF_BIN: the reference binary (benches/reference.sh)");
    let home = std::env::var("REF_HOME").expect("REF_HOME: its home with the mock agent");
    let rounds = knob("REF_BENCH_ROUNDS", 3usize);
    let n = knob("REF_BENCH_N", 3000usize);
    let secs = knob("REF_BENCH_SECS", 5u64);
    println!("| round | daemon | c=1 p50 / p99 µs | c=32 req/s |");
    println!("|---|---|---|---|");
    let mut figures: Vec<(String, f64, f64)> = Vec::new();
    for r in 1..=rounds {
        let mut order = vec!["ours, 1 worker", "ours, 2 workers", "reference"];
        if r % 2 == 0 {
            order.reverse();
        }
        for which in order {
            let d = match which {
                "reference" => reference(&bin, &home),
                "ours, 1 worker" => ours(1),
                _ => ours(2),
            };
            let (p50, p99, rate) = measure(&d, n, secs);
            drop(d);
            println!("| {r} | {which} | {p50:.0} / {p99:.0} | {rate:.0} |");
            figures.push((which.to_string(), p50, rate));
        }
    }
    let med = |which: &str, f: fn(&(String, f64, f64)) -> f64| {
        let mut v: Vec<f64> = figures.iter().filter(|x| x.0 == which).map(f).collect();
        v.sort_by(|a, b| a.partial_cmp(b).unwrap());
        v[v.len() / 2]
    };
    let (rp50, rrate) = (med("reference", |x| x.1), med("reference", |x| x.2));
    for which in ["ours, 1 worker", "ours, 2 workers"] {
        println!(
            "{which}: c=1 p50 {:.2}× the reference's (lower is better), c=32 {:.2}× its requests/s (medians)",
            med(which, |x| x.1) / rp50,
            med(which, |x| x.2) / rrate
        );
    }
}
