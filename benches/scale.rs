//! Density: what the daemon costs per thing it holds, and whether listing and scraping grow with
//! the number of agents (not a test; asserts only that the set-up worked). Run:
//! `cargo bench --bench scale` (or `benches/scale.sh`, which raises `ulimit -n` first).
//!
//! One release daemon, loopback only, every phase bounded in count and time:
//! - **Start rate**: `SCALE_AGENTS` (default `500,1000`) mock instances started by 32 concurrent
//!   clients (`initialize` on a new serverId): agents/s, p50/p99 start, daemon CPU per start, and
//!   the daemon's RSS per idle instance (empty event buffer).
//! - **Listing and scraping against N**: at each N, `GET /v1/acp` (whole and `?limit=100`) and
//!   `/metrics` p50/p99 and size, with `GET /v1/health` probed every 10 ms meanwhile; then the
//!   same at `SCALE_LISTED` (default 5,000) listed instances, the ones beyond the running N
//!   started and then exited (`/crash`), since 5,000 running mock agents do not fit this machine.
//! - **Full event buffer**: `SCALE_FULL` (default 50) instances each fill their event log
//!   (`/stream` past `--event-buffer`): RSS per instance with a full buffer.
//! - **Delete all**: every instance deleted; the daemon's child processes, open fds, agent
//!   cgroups and RSS against before the first start.
//! - **Per connection**: `SCALE_SUBSCRIBERS` (10,000) idle SSE subscribers, `SCALE_CONNS`
//!   (10,000) idle HTTP/1 connections (one request each, then silent), `SCALE_H2` (2,000) idle
//!   HTTP/2 connections, `SCALE_WS` (2,000) idle WebSockets, each held while an honest client's
//!   `GET /v1/health` and `_mock/echo` p50/p99 are measured; RSS per thing.
//! - **Per watch feed**: `SCALE_WATCH` (100) idle `GET /v1/fs/watch` streams (SSE, each on its
//!   own empty directory, not recursive), held once `event: ready` came: RSS per feed, with its
//!   HTTP/1 connection.
//! - **Per process record**: `SCALE_PROCS` (1,000) `POST /v1/processes` of `true`: RSS per
//!   exited record.
//!
//! Memory is the daemon's own `VmRSS` from `/proc/<pid>/status`, as deltas over many things (so
//! the allocator's granularity averages out). Client sockets of each phase bind their own
//! loopback source address (127.0.0.2, .3, …) so that the phases do not share one ephemeral port
//! range. `SANDBOX_AGENT_WORKER_THREADS` sets `--worker-threads`.
//!
//! One concern over ~900 lines: each phase is a short function over the same few helpers (the
//! daemon's RSS, a bounded set of held sockets, the honest client's probe), and the A/B gate
//! runs the whole file as one group; split, the phases would each carry the helpers' imports.

use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};

mod common;
use common::{Stopping, ab_figure, daemon_bin, free_port, knob, knows_flag, percentile};

const BUILT: &str = env!("CARGO_BIN_EXE_sandbox-agent");

/// The daemon stopped (`Stopping`), then its directory removed.
struct DaemonGuard(Option<Stopping>, std::path::PathBuf);

impl Drop for DaemonGuard {
    fn drop(&mut self) {
        drop(self.0.take());
        let _ = std::fs::remove_dir_all(&self.1);
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn p50_p99(mut v: Vec<Duration>) -> (f64, f64) {
    v.sort();
    (ms(percentile(&v, 0.5)), ms(percentile(&v, 0.99)))
}

/// A field of `/proc/<pid>/status` in KiB.
fn status_kib(pid: u32, field: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

/// The most threads the daemon had (`Threads:` of `/proc/<pid>/status`, read every 5 ms) from
/// its start until it is stopped.
struct PeakThreads(Arc<std::sync::atomic::AtomicU64>, Arc<AtomicBool>);

impl PeakThreads {
    fn watch(pid: u32) -> PeakThreads {
        let (peak, stop) = (
            Arc::new(std::sync::atomic::AtomicU64::new(0)),
            Arc::new(AtomicBool::new(false)),
        );
        let (p, s) = (Arc::clone(&peak), Arc::clone(&stop));
        std::thread::spawn(move || {
            while !s.load(Ordering::Relaxed) {
                p.fetch_max(status_kib(pid, "Threads:"), Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(5));
            }
        });
        PeakThreads(peak, stop)
    }

    fn stop(self) -> u64 {
        self.1.store(true, Ordering::Relaxed);
        self.0.load(Ordering::Relaxed)
    }
}

fn rss(pid: u32) -> u64 {
    status_kib(pid, "VmRSS:") * 1024
}

/// The anonymous part of the RSS (the heap, stacks): what the daemon itself allocated, without
/// the pages of its executable and libraries it has mapped (clean, shared, reclaimable).
fn anon(pid: u32) -> u64 {
    status_kib(pid, "RssAnon:") * 1024
}

/// The daemon's CPU time so far (utime + stime).
fn cpu(pid: u32) -> Duration {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let after = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
    let f: Vec<&str> = after.split_whitespace().collect();
    let ticks: u64 = f.get(11).and_then(|v| v.parse().ok()).unwrap_or(0)
        + f.get(12).and_then(|v| v.parse().ok()).unwrap_or(0);
    Duration::from_millis(ticks * 10)
}

/// Open descriptors that are not sockets (the bench's own keep-alive connections come and go).
fn open_fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| {
            d.flatten()
                .filter(|e| {
                    std::fs::read_link(e.path())
                        .is_ok_and(|l| !l.to_string_lossy().starts_with("socket:"))
                })
                .count()
        })
        .unwrap_or(0)
}

/// Direct children of `pid` (every thread's `children` file).
fn children(pid: u32) -> usize {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return 0;
    };
    tasks
        .flatten()
        .map(|t| {
            std::fs::read_to_string(t.path().join("children"))
                .unwrap_or_default()
                .split_whitespace()
                .count()
        })
        .sum()
}

/// Directories beneath the daemon's `<own cgroup>/sandbox-agent` (its agents' groups, when it
/// makes them).
fn cgroups_below(pid: u32) -> usize {
    let own = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap_or_default();
    let Some(path) = own.lines().find_map(|l| l.strip_prefix("0::")) else {
        return 0;
    };
    fn count(dir: &std::path::Path) -> usize {
        std::fs::read_dir(dir)
            .map(|d| {
                d.flatten()
                    .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
                    .map(|e| 1 + count(&e.path()))
                    .sum()
            })
            .unwrap_or(0)
    }
    count(
        &std::path::Path::new("/sys/fs/cgroup")
            .join(path.trim_start_matches('/'))
            .join("sandbox-agent"),
    )
}

struct Bench {
    base: String,
    port: u16,
    pid: u32,
    c: reqwest::Client,
}

impl Bench {
    async fn rpc(&self, server: &str, id: u64, method: &str, params: Value) -> reqwest::Response {
        self.c
            .post(format!("{}/v1/acp/{server}?agent=mock", self.base))
            .json(&json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}))
            .send()
            .await
            .expect("POST")
    }

    /// Starts `ids` with `conc` concurrent clients; each start's latency.
    async fn start_all(self: &Arc<Self>, ids: Vec<String>, conc: usize) -> Vec<Duration> {
        let queue = Arc::new(std::sync::Mutex::new(ids));
        let mut tasks = Vec::new();
        for _ in 0..conc {
            let (b, q) = (self.clone(), queue.clone());
            tasks.push(tokio::spawn(async move {
                let mut out = Vec::new();
                loop {
                    let Some(id) = q.lock().unwrap().pop() else {
                        return out;
                    };
                    let t = Instant::now();
                    let r = b
                        .rpc(&id, 0, "initialize", json!({"protocolVersion": 1}))
                        .await;
                    assert_eq!(r.status(), 200, "start {id}: {:?}", r.text().await);
                    out.push(t.elapsed());
                }
            }));
        }
        let mut all = Vec::new();
        for t in tasks {
            all.extend(t.await.unwrap());
        }
        all
    }

    async fn session(&self, server: &str) -> String {
        let r = self
            .rpc(
                server,
                1,
                "session/new",
                json!({"cwd": "/", "mcpServers": []}),
            )
            .await;
        let v: Value = r.json().await.unwrap();
        v["result"]["sessionId"].as_str().unwrap().to_string()
    }

    async fn prompt(&self, server: &str, session: &str, text: &str) -> u16 {
        self.rpc(
            server,
            2,
            "session/prompt",
            json!({"sessionId": session, "prompt": [{"type": "text", "text": text}]}),
        )
        .await
        .status()
        .as_u16()
    }

    /// `n` GETs of `path`: latencies and the last body's size.
    async fn time_get(&self, path: &str, n: usize) -> (Vec<Duration>, usize) {
        let mut out = Vec::new();
        let mut size = 0;
        for _ in 0..n {
            let t = Instant::now();
            let r = self
                .c
                .get(format!("{}{path}", self.base))
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), 200, "{path}");
            size = r.bytes().await.unwrap().len();
            out.push(t.elapsed());
        }
        (out, size)
    }

    /// `GET /v1/health` every 10 ms on its own client until `stop`.
    fn probe(&self, stop: Arc<AtomicBool>) -> tokio::task::JoinHandle<Vec<Duration>> {
        let url = format!("{}/v1/health", self.base);
        let c = reqwest::Client::builder().no_proxy().build().unwrap();
        tokio::spawn(async move {
            let mut out = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                let t = Instant::now();
                let r = c.get(&url).send().await.expect("health");
                assert_eq!(r.status(), 200);
                out.push(t.elapsed());
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            out
        })
    }

    /// Listing and scraping at the current N, with health probed meanwhile.
    /// Prints the row; returns the whole listing's p50 in ms.
    async fn listing_row(&self, label: &str) -> f64 {
        let stop = Arc::new(AtomicBool::new(false));
        let prober = self.probe(stop.clone());
        let (whole, wsize) = self.time_get("/v1/acp", 40).await;
        let (page, _) = self.time_get("/v1/acp?limit=100", 40).await;
        let (metrics, msize) = self.time_get("/metrics", 20).await;
        stop.store(true, Ordering::Relaxed);
        let health = prober.await.unwrap();
        let (w50, w99) = p50_p99(whole);
        let (p50, p99) = p50_p99(page);
        let (m50, m99) = p50_p99(metrics);
        let (h50, h99) = p50_p99(health);
        println!(
            "| {label} | {w50:.2} / {w99:.2} ({} KB) | {p50:.2} / {p99:.2} | {m50:.2} / {m99:.2} ({} KB) | {h50:.2} / {h99:.2} |",
            wsize / 1000,
            msize / 1000
        );
        w50
    }

    /// The honest client's p50/p99 (health and `_mock/echo` on `server`), 300 each.
    async fn honest(&self, server: &str) -> String {
        let (h, _) = self.time_get("/v1/health", 300).await;
        let mut e = Vec::new();
        for i in 0..300 {
            let t = Instant::now();
            let r = self
                .rpc(server, 100 + i, "_mock/echo", json!({"n": i}))
                .await;
            assert_eq!(r.status(), 200);
            r.bytes().await.unwrap();
            e.push(t.elapsed());
        }
        let (h50, h99) = p50_p99(h);
        let (e50, e99) = p50_p99(e);
        format!("health {h50:.2}/{h99:.2} ms, echo {e50:.2}/{e99:.2} ms (p50/p99)")
    }

    /// A connection from loopback source address `src` (its own ephemeral port range).
    async fn connect(&self, src: u8) -> std::io::Result<TcpStream> {
        let s = TcpSocket::new_v4()?;
        s.bind(format!("127.0.0.{src}:0").parse().unwrap())?;
        s.connect(format!("127.0.0.1:{}", self.port).parse().unwrap())
            .await
    }

    /// Opens `n` connections from `src`, writes `head` on each and reads until `until` appears
    /// in what came back; holds them. Stops early (with what it has) on an error.
    async fn hold(&self, n: usize, src: u8, head: &str, until: &[u8]) -> Vec<TcpStream> {
        let mut held = Vec::with_capacity(n);
        let mut buf = vec![0u8; 4096];
        for i in 0..n {
            let mut s = match self.connect(src).await {
                Ok(s) => s,
                Err(e) => {
                    println!("  (stopped at {i}: {e})");
                    break;
                }
            };
            s.write_all(head.as_bytes()).await.unwrap();
            let mut got = Vec::new();
            let ok = tokio::time::timeout(Duration::from_secs(10), async {
                loop {
                    let k = s.read(&mut buf).await?;
                    if k == 0 {
                        return Ok::<bool, std::io::Error>(false);
                    }
                    got.extend_from_slice(&buf[..k]);
                    if got.windows(until.len()).any(|w| w == until) {
                        return Ok(true);
                    }
                }
            })
            .await;
            if !matches!(ok, Ok(Ok(true))) {
                println!(
                    "  (stopped at {i}: {})",
                    String::from_utf8_lossy(&got[..got.len().min(200)])
                );
                break;
            }
            held.push(s);
        }
        held
    }
}

/// Things per MiB from bytes per thing (a delta under 64 bytes counts as 64: noise, not a gain).
fn per_mib(bytes: f64) -> f64 {
    1048576.0 / bytes.max(64.0)
}

fn kib(bytes: f64) -> String {
    format!("{:.1} KiB", bytes / 1024.0)
}

/// RSS per thing, settled: the delta from `before`, after a pause, over `n`.
async fn per_thing(pid: u32, before: u64, n: usize) -> f64 {
    tokio::time::sleep(Duration::from_millis(1500)).await;
    (rss(pid) as f64 - before as f64) / n.max(1) as f64
}

struct Limits {
    agents: usize,
    subscribers: usize,
    connections: usize,
    watches: usize,
}

/// A fresh release daemon with room for `limits`, answering.
async fn start_daemon(limits: &Limits) -> (DaemonGuard, Arc<Bench>) {
    let bin = daemon_bin(BUILT);
    let port = free_port();
    let dir = tempfile::tempdir().unwrap().keep();
    let mut cmd = Command::new(&bin);
    cmd.args([
        "server",
        "--host",
        "127.0.0.1",
        "--no-token",
        "--log-level",
        "warn",
    ])
    .args(["--port", &port.to_string()])
    .arg("--work-dir")
    .arg(&dir)
    .arg("--data-dir")
    .arg(dir.join("data"))
    .stdout(Stdio::null())
    // The exited instances' 502s are logged as warnings: not on the bench's output.
    .stderr(std::fs::File::create(dir.join("daemon.log")).unwrap());
    // An older build (the A/B harness's previous one) may lack a flag: it is left out.
    for (flag, value) in [
        ("--max-agents", limits.agents.to_string()),
        ("--max-subscribers", limits.subscribers.to_string()),
        ("--max-subscribers-total", limits.subscribers.to_string()),
        ("--max-connections", limits.connections.to_string()),
        ("--max-watches", limits.watches.max(1).to_string()),
        ("--idle-timeout", "10m".to_string()),
    ] {
        if knows_flag(&bin, flag) {
            cmd.args([flag, &value]);
        }
    }
    if let Some(w) = std::env::var("SANDBOX_AGENT_WORKER_THREADS")
        .ok()
        .filter(|w| !w.is_empty())
    {
        cmd.args(["--worker-threads", &w]);
    }
    if let Ok(extra) = std::env::var("SCALE_ARGS") {
        cmd.args(extra.split_whitespace());
    }
    let daemon = DaemonGuard(
        Some(Stopping::new(cmd.spawn().expect("start the daemon"))),
        dir,
    );
    let c = reqwest::Client::builder()
        .no_proxy()
        .pool_max_idle_per_host(64)
        .timeout(Duration::from_secs(120))
        .build()
        .unwrap();
    let b = Arc::new(Bench {
        base: format!("http://127.0.0.1:{port}"),
        port,
        pid: daemon.0.as_ref().map_or(0, Stopping::id),
        c,
    });
    let deadline = Instant::now() + Duration::from_secs(20);
    while b
        .c
        .get(format!("{}/v1/health", b.base))
        .send()
        .await
        .is_err()
    {
        assert!(
            Instant::now() < deadline,
            "the daemon never answered: {}",
            std::fs::read_to_string(daemon.1.join("daemon.log")).unwrap_or_default()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    (daemon, b)
}

/// A fresh daemon with one running instance `hub` (and the honest client's first figures), for
/// measuring one kind of held thing on memory nothing was freed into before.
async fn hub_daemon(limits: &Limits) -> (DaemonGuard, Arc<Bench>) {
    let (d, b) = start_daemon(limits).await;
    b.start_all(vec!["hub".into()], 1).await;
    b.honest("hub").await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    (d, b)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    sandbox_agent::install_crypto_provider();
    // Room for 10,000 client sockets here and as many in the daemon (which inherits the limit).
    if let Ok((_, hard)) =
        nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE)
    {
        let _ =
            nix::sys::resource::setrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE, hard, hard);
    }
    let steps: Vec<usize> = std::env::var("SCALE_AGENTS")
        .unwrap_or_else(|_| "500,1000".into())
        .split(',')
        .filter_map(|s| s.trim().parse().ok())
        .collect();
    let listed = knob("SCALE_LISTED", 5000usize);
    let full = knob("SCALE_FULL", 50usize);
    let subs = knob("SCALE_SUBSCRIBERS", 10_000usize);
    let conns = knob("SCALE_CONNS", 10_000usize);
    let h2 = knob("SCALE_H2", 2000usize);
    let wss = knob("SCALE_WS", 2000usize);
    let procs = knob("SCALE_PROCS", 1000usize);
    let watches = knob("SCALE_WATCH", 100usize);
    let most = steps.iter().copied().max().unwrap_or(0).max(listed);

    let limits = Limits {
        agents: most + 10,
        subscribers: subs.max(wss) + 10,
        connections: subs.max(conns).max(wss).max(h2) + 500,
        watches: watches + 1,
    };
    let (daemon, b) = start_daemon(&limits).await;
    let pid = b.pid;
    // One instance started and deleted first: the lazily built parts of the daemon (the agent
    // registry's entry, the warm-spawn pool) are not counted as per-instance memory.
    b.start_all(vec!["warm".into()], 1).await;
    b.c.delete(format!("{}/v1/acp/warm", b.base))
        .send()
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_secs(3)).await;
    let (rss0, fds0, kids0, groups0) = (rss(pid), open_fds(pid), children(pid), cgroups_below(pid));
    let anon0 = anon(pid);
    println!(
        "daemon {}, worker threads {}; before: RSS {} (anonymous {}), fds (not sockets) {fds0}, children {kids0}, agent cgroups {groups0}",
        daemon_bin(BUILT),
        std::env::var("SANDBOX_AGENT_WORKER_THREADS")
            .ok()
            .filter(|w| !w.is_empty())
            .unwrap_or_else(|| "auto".into()),
        kib(rss0 as f64),
        kib(anon0 as f64)
    );

    // Start rate and per-instance memory, then listing against N.
    println!(
        "\n| N running | started | agents/s | start p50 / p99 ms | daemon CPU per start | RSS per idle instance | peak daemon threads |"
    );
    println!("|---|---|---|---|---|---|---|");
    let mut have = 0;
    for &n in &steps {
        let ids: Vec<String> = (have..n).map(|i| format!("sc-{i:05}")).collect();
        let count = ids.len();
        let (r_before, cpu_before, t) = (rss(pid), cpu(pid), Instant::now());
        let peak = PeakThreads::watch(pid);
        let lat = b.start_all(ids, 32).await;
        let took = t.elapsed();
        let peak = peak.stop();
        let cpu_used = cpu(pid).saturating_sub(cpu_before);
        let per = per_thing(pid, r_before, count).await;
        let (l50, l99) = p50_p99(lat);
        println!(
            "| {n} | {count} | {:.0} | {l50:.1} / {l99:.1} | {:.2} ms | {} | {peak} |",
            count as f64 / took.as_secs_f64(),
            ms(cpu_used) / count as f64,
            kib(per)
        );
        have = n;
        if Some(&n) == steps.last() {
            // Not the start rate: it swings by 2× with the machine's load even between
            // alternating runs, and a gate on it would fail on a busy machine, not a regression.
            ab_figure(
                "scale: idle instances per MiB of daemon RSS",
                per_mib(per),
                None,
            );
        }
    }
    // Full event buffers.
    if full > 0 {
        let before = rss(pid);
        let ids: Vec<String> = (0..full.min(have)).map(|i| format!("sc-{i:05}")).collect();
        for id in &ids {
            let s = b.session(id).await;
            assert_eq!(b.prompt(id, &s, "/stream 5000").await, 200);
        }
        let per = per_thing(pid, before, ids.len()).await;
        let v: Value =
            b.c.get(format!("{}/v1/acp", b.base))
                .send()
                .await
                .unwrap()
                .json()
                .await
                .unwrap();
        let events = v["servers"]
            .as_array()
            .unwrap()
            .iter()
            .find(|s| s["serverId"] == ids[0])
            .map(|s| s["lastEventId"].clone())
            .unwrap_or_default();
        // The retained frames' text: a subscriber without `Last-Event-ID` is sent all of it
        // first (read up to the last event's frame).
        let last = format!("id: {events}\n");
        let mut r =
            b.c.get(format!("{}/v1/acp/{}", b.base, ids[0]))
                .header("accept", "text/event-stream")
                .send()
                .await
                .unwrap();
        let mut text = Vec::new();
        while let Ok(Some(chunk)) = tokio::time::timeout(Duration::from_secs(10), r.chunk())
            .await
            .unwrap()
        {
            text.extend_from_slice(&chunk);
            if let Some(at) = memchr::memmem::find(&text, last.as_bytes())
                && memchr::memmem::find(&text[at..], b"\n\n").is_some()
            {
                break;
            }
        }
        drop(r);
        let frames = text.len() as f64;
        println!(
            "\nfull event buffer ({} instances, /stream 5000 each, lastEventId {events}): RSS per instance grew by {}; the retained frames' text {} ({} beyond it)",
            ids.len(),
            kib(per),
            kib(frames),
            kib(per - frames)
        );
    }

    // The sampler's next pass, so that listings read sampled figures.
    tokio::time::sleep(Duration::from_secs(3)).await;
    println!(
        "\n| listed instances | `GET /v1/acp` p50 / p99 ms (size) | `?limit=100` p50 / p99 | `/metrics` p50 / p99 (size) | `/v1/health` meanwhile p50 / p99 |"
    );
    println!("|---|---|---|---|---|");
    let w50 = b.listing_row(&format!("{have} running")).await;
    ab_figure(
        "scale: GET /v1/acp with every instance listed, 1/p50",
        1000.0 / w50,
        None,
    );

    // Instances beyond the running ones: started, then exited (`/crash 0`), in batches.
    if listed > have {
        let t = Instant::now();
        let mut next = have;
        while next < listed {
            let batch: Vec<String> = (next..(next + 500).min(listed))
                .map(|i| format!("sx-{i:05}"))
                .collect();
            next += batch.len();
            b.start_all(batch.clone(), 32).await;
            let queue = Arc::new(std::sync::Mutex::new(batch));
            let mut tasks = Vec::new();
            for _ in 0..32 {
                let (b, q) = (b.clone(), queue.clone());
                tasks.push(tokio::spawn(async move {
                    loop {
                        let Some(id) = q.lock().unwrap().pop() else {
                            return;
                        };
                        let s = b.session(&id).await;
                        b.prompt(&id, &s, "/crash 0").await;
                    }
                }));
            }
            for t in tasks {
                t.await.unwrap();
            }
        }
        println!(
            "  ({} exited instances made in {:.1} s)",
            listed - have,
            t.elapsed().as_secs_f64()
        );
        tokio::time::sleep(Duration::from_secs(3)).await;
        b.listing_row(&format!("{listed} ({have} running)")).await;
    }

    // Delete everything.
    let (t, cpu_before) = (Instant::now(), cpu(pid));
    let peak = PeakThreads::watch(pid);
    let v: Value =
        b.c.get(format!("{}/v1/acp", b.base))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
    let all: Vec<String> = v["servers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["serverId"].as_str().unwrap().to_string())
        .collect();
    let queue = Arc::new(std::sync::Mutex::new(all));
    let mut tasks = Vec::new();
    for _ in 0..32 {
        let (b, q) = (b.clone(), queue.clone());
        tasks.push(tokio::spawn(async move {
            loop {
                let Some(id) = q.lock().unwrap().pop() else {
                    return;
                };
                let r =
                    b.c.delete(format!("{}/v1/acp/{id}", b.base))
                        .send()
                        .await
                        .unwrap();
                assert!(
                    r.status() == 204 || r.status() == 404,
                    "{id}: {}",
                    r.status()
                );
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let settle = Instant::now() + Duration::from_secs(60);
    while children(pid) > kids0 && Instant::now() < settle {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let took = t.elapsed();
    tokio::time::sleep(Duration::from_secs(3)).await;
    let (peak, cpu_used) = (peak.stop(), cpu(pid).saturating_sub(cpu_before));
    let rss_after = rss(pid);
    let anon_after = anon(pid);
    let threads_after = status_kib(pid, "Threads:");
    println!(
        "\ndelete all: {:.1} s, daemon CPU {:.2} s, at most {peak} daemon threads; children {} (before {kids0}), fds (not sockets) {} (before {fds0}), agent cgroups {} (before {groups0}), RSS {} (before {}, {:+.1} %), anonymous {} (before {}, {:+.1} %), {threads_after} threads 3 s after",
        took.as_secs_f64(),
        cpu_used.as_secs_f64(),
        children(pid),
        open_fds(pid),
        cgroups_below(pid),
        kib(rss_after as f64),
        kib(rss0 as f64),
        (rss_after as f64 / rss0 as f64 - 1.0) * 100.0,
        kib(anon_after as f64),
        kib(anon0 as f64),
        (anon_after as f64 / anon0 as f64 - 1.0) * 100.0
    );
    // The runtime's blocking-pool threads idle out after 10 s (their stacks and arenas with them).
    tokio::time::sleep(Duration::from_secs(12)).await;
    let threads = status_kib(pid, "Threads:");
    let (later, anon_later) = (rss(pid), anon(pid));
    println!(
        "15 s after: RSS {} ({:+.1} %), anonymous {} ({:+.1} %), {threads} threads",
        kib(later as f64),
        (later as f64 / rss0 as f64 - 1.0) * 100.0,
        kib(anon_later as f64),
        (anon_later as f64 / anon0 as f64 - 1.0) * 100.0
    );

    drop(daemon);

    // Connections and subscribers, one kind at a time, each in a fresh daemon, each with the
    // honest client.
    let (mut daemon, mut b) = hub_daemon(&limits).await;
    let mut pid = b.pid;
    println!("\nquiet: {}", b.honest("hub").await);
    println!("\n| held | count | RSS per thing | honest client meanwhile |");
    println!("|---|---|---|---|");
    let head =
        |path: &str, extra: &str| format!("GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n{extra}\r\n");

    let before = rss(pid);
    let held = b
        .hold(
            subs,
            2,
            &head("/v1/acp/hub", "Accept: text/event-stream\r\n"),
            b"\r\n\r\n",
        )
        .await;
    let per = per_thing(pid, before, held.len()).await;
    ab_figure(
        "scale: idle SSE subscribers per MiB of daemon RSS",
        per_mib(per),
        None,
    );
    println!(
        "| idle SSE subscribers (with their HTTP/1 connection) | {} | {} | {} |",
        held.len(),
        kib(per),
        b.honest("hub").await
    );
    drop(held);
    drop(daemon);
    (daemon, b) = hub_daemon(&limits).await;
    pid = b.pid;

    let before = rss(pid);
    let held = b.hold(conns, 3, &head("/v1/health", ""), b"\"ok\"").await;
    let per_conn = per_thing(pid, before, held.len()).await;
    ab_figure(
        "scale: idle HTTP/1 connections per MiB of daemon RSS",
        per_mib(per_conn),
        None,
    );
    println!(
        "| idle HTTP/1 connections (one request each) | {} | {} | {} |",
        held.len(),
        kib(per_conn),
        b.honest("hub").await
    );
    drop(held);
    println!(
        "| → SSE subscriber beyond its connection | | {} | |",
        kib(per - per_conn)
    );
    drop(daemon);
    (daemon, b) = hub_daemon(&limits).await;
    pid = b.pid;

    let before = rss(pid);
    let mut clients = Vec::new();
    for i in 0..h2 {
        let c = reqwest::Client::builder()
            .no_proxy()
            .http2_prior_knowledge()
            .local_address(std::net::IpAddr::from([127, 0, 0, 4]))
            .build()
            .unwrap();
        match c.get(format!("{}/v1/health", b.base)).send().await {
            Ok(r) if r.version() == reqwest::Version::HTTP_2 => clients.push(c),
            other => {
                println!(
                    "  (HTTP/2 stopped at {i}: {:?})",
                    other.map(|r| r.version())
                );
                break;
            }
        }
    }
    let per = per_thing(pid, before, clients.len()).await;
    println!(
        "| idle HTTP/2 connections (one request each) | {} | {} | {} |",
        clients.len(),
        kib(per),
        b.honest("hub").await
    );
    drop(clients);
    drop(daemon);
    (daemon, b) = hub_daemon(&limits).await;
    pid = b.pid;

    let before = rss(pid);
    let ws_head = head(
        "/v1/acp/hub",
        "Upgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n",
    );
    let held = b.hold(wss, 5, &ws_head, b"\r\n\r\n").await;
    let per = per_thing(pid, before, held.len()).await;
    println!(
        "| idle WebSockets | {} | {} | {} |",
        held.len(),
        kib(per),
        b.honest("hub").await
    );
    drop(held);
    drop(daemon);
    (daemon, b) = hub_daemon(&limits).await;
    pid = b.pid;

    if watches > 0 {
        // Each feed on its own empty directory beneath the daemon's work dir (made first, so
        // that the directories are not counted).
        for i in 0..watches {
            std::fs::create_dir_all(daemon.1.join(format!("w-{i:05}"))).unwrap();
        }
        let before = rss(pid);
        let mut held = Vec::new();
        for i in 0..watches {
            let h = head(
                &format!("/v1/fs/watch?path=w-{i:05}"),
                "Accept: text/event-stream\r\n",
            );
            let got = b.hold(1, 6, &h, b"event: ready").await;
            if got.is_empty() {
                break;
            }
            held.extend(got);
        }
        let per = per_thing(pid, before, held.len()).await;
        println!(
            "| idle `/v1/fs/watch` feeds (with their HTTP/1 connection, {} threads now) | {} | {} | {} |",
            status_kib(pid, "Threads:"),
            held.len(),
            kib(per),
            b.honest("hub").await
        );
        drop(held);
        drop(daemon);
        (daemon, b) = hub_daemon(&limits).await;
        pid = b.pid;
    }

    let before = rss(pid);
    let mut ids = Vec::new();
    for _ in 0..procs {
        let r =
            b.c.post(format!("{}/v1/processes", b.base))
                .json(&json!({"command": "true"}))
                .send()
                .await
                .unwrap();
        if r.status() != 200 {
            // An older build (the A/B harness's previous one) may not have the route.
            println!("  (POST /v1/processes answered {})", r.status());
            break;
        }
        let v: Value = r.json().await.unwrap();
        ids.push(v["id"].as_str().unwrap().to_string());
    }
    let settle = Instant::now() + Duration::from_secs(30);
    while children(pid) > kids0 + 1 && Instant::now() < settle {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    if !ids.is_empty() {
        let per = per_thing(pid, before, ids.len()).await;
        let (l50, l99) = p50_p99(b.time_get("/v1/processes", 20).await.0);
        println!(
            "| exited `/v1/processes` records | {} | {} | `GET /v1/processes` {l50:.2}/{l99:.2} ms |",
            ids.len(),
            kib(per)
        );
    }
    for id in ids {
        let _ =
            b.c.delete(format!("{}/v1/processes/{id}", b.base))
                .send()
                .await;
    }
    println!(
        "\nafter everything: RSS {}, fds {}",
        kib(rss(b.pid) as f64),
        open_fds(b.pid)
    );
    drop(daemon);
}
