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
//!
//! CPU per request: over each phase, the CPU time of the daemon process (all its threads, not
//! its children: `/proc/<pid>/task/*/schedstat`, i.e. utime + stime in ns), of the agent (every
//! process under the daemon, read the same way) and of this bench's client threads, divided by the requests of the phase. On a
//! shared 2-core machine wall-clock requests/s mostly measures the client and the agent; the
//! daemon's CPU per request is what the proxy itself costs, and load barely moves it. The
//! `busy` column is the daemon's CPU over the c=32 window's wall time (100 % = one core).
//!
//! `REF_BENCH_PREVIOUS=<binary>`: a previous build of ours joins the rotation (1 worker), for an
//! A/B of a change in the same run, alternating with the rest.
//!
//! `REF_BENCH_PIN=1` (needs `taskset`): the daemon runs on core 0 (`taskset -c 0`), this bench's
//! client threads and the agent on core 1, so that at c=32 the daemon's core is the bound where
//! the daemon is the slower side (its `busy` near 100 % says so). `REF_BENCH_PIN=a,b` picks other
//! cores (daemon on a, client and agent on b).

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
    child: Stopping,
    port: u16,
}

/// `REF_BENCH_PIN`: the daemon's core and the client's and agent's core, when pinning.
fn pinning() -> Option<(String, String)> {
    let v = std::env::var("REF_BENCH_PIN").ok()?;
    match v.as_str() {
        "" | "0" => None,
        "1" => Some(("0".into(), "1".into())),
        cores => {
            let (a, b) = cores
                .split_once(',')
                .expect("REF_BENCH_PIN: 1, or <daemon core>,<client core>");
            Some((a.trim().to_string(), b.trim().to_string()))
        }
    }
}

/// Pins every thread of `pid` to `core` (`taskset -a -p -c`).
fn pin(pid: u32, core: &str) {
    let ok = Command::new("taskset")
        .args(["-a", "-p", "-c", core, &pid.to_string()])
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    assert!(ok, "taskset -a -p -c {core} {pid} failed (REF_BENCH_PIN)");
}

/// The daemon's start command: `bin`, under `taskset -c <core>` when pinning.
fn launcher(bin: &str) -> Command {
    match pinning() {
        Some((core, _)) => {
            let mut c = Command::new("taskset");
            c.args(["-c", &core, bin]);
            c
        }
        None => Command::new(bin),
    }
}

/// A process's parent and its utime + stime in clock ticks (`/proc/<pid>/stat`, fields 4, 14,
/// 15; the command name in field 2 may hold spaces and parentheses, so fields are counted after
/// its last `)`).
fn stat(pid: u32) -> Option<(u32, u64)> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &s[s.rfind(')')? + 1..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ppid = f.get(1)?.parse().ok()?;
    let utime: u64 = f.get(11)?.parse().ok()?;
    let stime: u64 = f.get(12)?.parse().ok()?;
    Some((ppid, utime + stime))
}

/// Every process under `root` (children, their children…), from the parents in `/proc/*/stat`.
fn descendants(root: u32) -> Vec<u32> {
    let mut parent = std::collections::HashMap::new();
    for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        if let Some(pid) = e.file_name().to_str().and_then(|n| n.parse::<u32>().ok())
            && let Some((ppid, _)) = stat(pid)
        {
            parent.insert(pid, ppid);
        }
    }
    let mut out = Vec::new();
    let mut frontier = vec![root];
    while let Some(p) = frontier.pop() {
        for (&c, &pp) in &parent {
            if pp == p {
                out.push(c);
                frontier.push(c);
            }
        }
    }
    out
}

/// A process's CPU time in ns: the sum of its threads' time on a CPU (`/proc/<pid>/task/*/
/// schedstat`, the same quantity as utime + stime, counted in ns rather than 10 ms ticks, which
/// a c=1 run of a few thousand requests needs), else utime + stime from `/proc/<pid>/stat`.
/// A thread that ended in the window would be missed; none does (no blocking work is asked).
fn cpu_ns(pid: u32) -> u64 {
    let mut sum = 0u64;
    let mut any = false;
    for e in std::fs::read_dir(format!("/proc/{pid}/task"))
        .into_iter()
        .flatten()
        .flatten()
    {
        if let Ok(s) = std::fs::read_to_string(e.path().join("schedstat"))
            && let Some(ns) = s
                .split_whitespace()
                .next()
                .and_then(|v| v.parse::<u64>().ok())
        {
            sum += ns;
            any = true;
        }
    }
    if any {
        sum
    } else {
        stat(pid).map_or(0, |s| s.1 * (1e9 / clock_ticks()) as u64)
    }
}

/// CPU ns of the daemon, of each process under it, and of this bench (its client threads).
struct Cpu {
    daemon: u64,
    agents: std::collections::HashMap<u32, u64>,
    client: u64,
}

impl Cpu {
    fn read(daemon: u32) -> Cpu {
        Cpu {
            daemon: cpu_ns(daemon),
            agents: descendants(daemon)
                .into_iter()
                .map(|p| (p, cpu_ns(p)))
                .collect(),
            client: cpu_ns(std::process::id()),
        }
    }

    /// µs of CPU per request since `before`, over `n` requests: daemon, agent, client. A process
    /// that started in between counts from 0; one that ended in between is lost (none does: the
    /// one agent lives through the run).
    fn per_request(&self, before: &Cpu, n: u64) -> [f64; 3] {
        let agents: u64 = self
            .agents
            .iter()
            .map(|(p, t)| t.saturating_sub(before.agents.get(p).copied().unwrap_or(0)))
            .sum();
        let per = |t: u64| t as f64 / 1e3 / n.max(1) as f64;
        [
            per(self.daemon.saturating_sub(before.daemon)),
            per(agents),
            per(self.client.saturating_sub(before.client)),
        ]
    }
}

/// `/proc/<pid>/stat` counts CPU time in USER_HZ ticks, which Linux fixes at 100 per second on
/// every architecture it runs on (the ABI promise behind `sysconf(_SC_CLK_TCK)`).
fn clock_ticks() -> f64 {
    100.0
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

fn ours(bin: &str, threads: usize) -> Daemon {
    let port = free_port();
    let dir = std::env::temp_dir().join(format!("ref-bench-ours-{port}"));
    std::fs::create_dir_all(&dir).unwrap();
    let child = launcher(bin)
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
        child: Stopping {
            child,
            grace: Duration::from_secs(10),
        },
        port,
    }
}

fn reference(bin: &str, home: &str) -> Daemon {
    let port = free_port();
    let child = launcher(bin)
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
        child: Stopping {
            child,
            grace: Duration::from_secs(10),
        },
        port,
    }
}

/// What one run of one daemon measured.
struct Figures {
    p50: f64,
    p99: f64,
    /// CPU µs per request at c=1: daemon, agent, client.
    c1_cpu: [f64; 3],
    rate: f64,
    /// CPU µs per request at c=32: daemon, agent, client.
    c32_cpu: [f64; 3],
    /// The daemon's CPU over the c=32 window's wall time, in % of one core.
    busy: f64,
}

/// c=1 p50/p99 in µs, c=32 requests/s, and the CPU per request of each phase, against `d`.
fn measure(d: &Daemon, n: usize, secs: u64) -> Figures {
    let path = "/v1/acp/bench";
    let pid = d.child.id();
    let mut c = Conn::open(d.port);
    let (s, b) = c.post(
        &format!("{path}?agent=mock"),
        &echo(0)
            .replace("_mock/echo", "initialize")
            .replace(r#"{"n":0}"#, r#"{"protocolVersion":1}"#),
    );
    assert_eq!(s, 200, "initialize: {}", String::from_utf8_lossy(&b));
    if let Some((_, core)) = pinning() {
        for p in descendants(pid) {
            pin(p, &core);
        }
    }
    for i in 1..=200 {
        let (s, b) = c.post(path, &echo(i));
        assert!(
            s == 200 && carries_id(&b, i),
            "warm-up {i}: {s} {}",
            String::from_utf8_lossy(&b)
        );
    }
    let mut lat = Vec::with_capacity(n);
    let before = Cpu::read(pid);
    for i in 0..n as u64 {
        let id = 1000 + i;
        let t = Instant::now();
        let (s, b) = c.post(path, &echo(id));
        lat.push(t.elapsed());
        assert!(s == 200 && carries_id(&b, id), "c=1 {id}: {s}");
    }
    let c1_cpu = Cpu::read(pid).per_request(&before, n as u64);
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
    let before = Cpu::read(pid);
    let (n0, t0) = (done.load(Ordering::Relaxed), Instant::now());
    std::thread::sleep(Duration::from_secs(secs));
    let (n1, wall) = (done.load(Ordering::Relaxed), t0.elapsed().as_secs_f64());
    let after = Cpu::read(pid);
    stop.store(true, Ordering::Relaxed);
    for t in threads {
        t.join().unwrap();
    }
    let c32_cpu = after.per_request(&before, n1 - n0);
    let rate = (n1 - n0) as f64 / wall;
    Figures {
        p50,
        p99,
        c1_cpu,
        rate,
        c32_cpu,
        busy: c32_cpu[0] * rate / 1e4,
    }
}

fn main() {
    let bin =
        std::env::var("REF_BIN").expect("REF_BIN: the reference binary (benches/reference.sh)");
    let home = std::env::var("REF_HOME").expect("REF_HOME: its home with the mock agent");
    let rounds = knob("REF_BENCH_ROUNDS", 3usize);
    let n = knob("REF_BENCH_N", 3000usize);
    let secs = knob("REF_BENCH_SECS", 5u64);
    let previous = std::env::var("REF_BENCH_PREVIOUS")
        .ok()
        .filter(|p| !p.is_empty());
    if let Some((daemon, client)) = pinning() {
        // Before any client thread exists: they inherit it.
        pin(std::process::id(), &client);
        println!("pinned: daemon on core {daemon}, client and agent on core {client}");
    }
    println!(
        "| round | daemon | c=1 p50 / p99 µs | c=1 CPU µs/req daemon / agent / client | \
         c=32 req/s | c=32 CPU µs/req daemon / agent / client | daemon busy |"
    );
    println!("|---|---|---|---|---|---|---|");
    let mut figures: Vec<(&str, Figures)> = Vec::new();
    for r in 1..=rounds {
        let mut order = vec!["ours, 1 worker", "ours, 2 workers", "reference"];
        if previous.is_some() {
            order.insert(1, "previous, 1 worker");
        }
        if r % 2 == 0 {
            order.reverse();
        }
        for which in order {
            let d = match which {
                "reference" => reference(&bin, &home),
                "ours, 1 worker" => ours(BIN, 1),
                "previous, 1 worker" => ours(previous.as_deref().unwrap_or(BIN), 1),
                _ => ours(BIN, 2),
            };
            let f = measure(&d, n, secs);
            drop(d);
            let cpu = |c: [f64; 3]| format!("{:.1} / {:.1} / {:.1}", c[0], c[1], c[2]);
            println!(
                "| {r} | {which} | {:.0} / {:.0} | {} | {:.0} | {} | {:.0} % |",
                f.p50,
                f.p99,
                cpu(f.c1_cpu),
                f.rate,
                cpu(f.c32_cpu),
                f.busy
            );
            figures.push((which, f));
        }
    }
    let med = |which: &str, f: fn(&Figures) -> f64| {
        let mut v: Vec<f64> = figures
            .iter()
            .filter(|x| x.0 == which)
            .map(|x| f(&x.1))
            .collect();
        v.sort_by(|a, b| a.partial_cmp(b).unwrap());
        v[v.len() / 2]
    };
    let (p50, rate) = (|f: &Figures| f.p50, |f: &Figures| f.rate);
    let (cpu1, cpu32) = (|f: &Figures| f.c1_cpu[0], |f: &Figures| f.c32_cpu[0]);
    println!(
        "reference (medians): daemon CPU {:.1} µs/req at c=1, {:.1} µs/req at c=32; agent {:.1} µs/req at c=32",
        med("reference", cpu1),
        med("reference", cpu32),
        med("reference", |f| f.c32_cpu[1])
    );
    let mut ours = vec!["ours, 1 worker", "ours, 2 workers"];
    if previous.is_some() {
        ours.push("previous, 1 worker");
    }
    for which in ours {
        println!(
            "{which} (medians): c=1 p50 {:.2}× the reference's (lower is better), c=32 {:.2}× its \
             requests/s; daemon CPU per request {:.2}× the reference's at c=1 ({:.1} µs), {:.2}× \
             at c=32 ({:.1} µs), i.e. {:.1}× the requests per CPU-second; agent {:.1} µs/req",
            med(which, p50) / med("reference", p50),
            med(which, rate) / med("reference", rate),
            med(which, cpu1) / med("reference", cpu1),
            med(which, cpu1),
            med(which, cpu32) / med("reference", cpu32),
            med(which, cpu32),
            med("reference", cpu32) / med(which, cpu32),
            med(which, |f| f.c32_cpu[1])
        );
    }
}
