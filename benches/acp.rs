//! Benchmark of the ACP proxy against the built-in mock agent (not a test: it prints figures).
//! Measures the physical limits (a direct pipe to `sandbox-agent mock-agent`; for the sockets, a
//! loopback TCP echo and a blocking TCP relay to the agent, the floor of any TCP proxy), the HTTP round
//! trip through the release daemon at concurrency 1 and 32, SSE delivery of `/stream N`, our
//! WebSocket (c=1, its floor without the agent, 32 in flight on one socket, 32 sockets) and the
//! ACP RFD endpoint (WebSocket profile, Streamable HTTP). Every client is blocking and written
//! here, so that the figures measure the daemon.
//! Run: `cargo bench --bench acp` (builds the release daemon; log level warn);
//! `ACP_BENCH_ONLY=pipe,http,sse,ws,wscore,rfd` selects groups (docs/performance.md; `wscore` is
//! only our WebSocket at c=1 and 32 in flight); `ACP_BENCH_N` round trips at c=1 (default
//! 20 000), `ACP_BENCH_DUR_MS` per concurrent figure (default 5000), `ACP_BENCH_STREAM_N` SSE
//! events (default 100 000); `SANDBOX_AGENT_BIN` drives another daemon build and `BENCH_AB`
//! also prints the figures for the A/B harness (`benches/ab.sh`); `ACP_BENCH_STATE=every|batch:<ms>|os`
//! runs the daemon with a state dir and that sync policy (`--state-dir`, docs/performance.md).
//! Every answer's id is checked; any error or wrong id is counted and reported.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

mod common;
use common::{ab_figure, daemon_bin, free_port, knob, percentile};

const BIN: &str = env!("CARGO_BIN_EXE_sandbox-agent");

fn echo_line(id: u64) -> String {
    format!(r#"{{"jsonrpc":"2.0","id":{id},"method":"_mock/echo","params":{{"n":{id}}}}}"#)
}

/// The `"id":N` of an answer, found without a JSON parser (the mock writes keys sorted).
fn answer_id(line: &[u8]) -> Option<u64> {
    let s = std::str::from_utf8(line).ok()?;
    let i = s.find("\"id\":")? + 5;
    let rest = &s[i..];
    let end = rest
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(rest.len());
    rest[..end].parse().ok()
}

struct Latency {
    p50: Duration,
    p99: Duration,
}

fn summarize(mut v: Vec<Duration>) -> Latency {
    v.sort();
    Latency {
        p50: percentile(&v, 0.50),
        p99: percentile(&v, 0.99),
    }
}

fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

// ---------- the direct pipe ----------

fn spawn_mock() -> Child {
    Command::new(BIN)
        .arg("mock-agent")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn mock-agent")
}

fn pipe_c1(n: u64) -> (Latency, u64) {
    let mut child = spawn_mock();
    let mut stdin = child.stdin.take().unwrap();
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    let got = lines_c1(n, &mut stdin, &mut stdout);
    drop(stdin);
    let _ = child.wait();
    got
}

/// `n` round trips (after 1 000 unmeasured) of one line each at c=1 over `w`/`r`.
fn lines_c1(n: u64, w: &mut impl Write, r: &mut impl BufRead) -> (Latency, u64) {
    let mut line = Vec::new();
    let mut lat = Vec::with_capacity(n as usize);
    let mut errors = 0;
    for id in 0..n + 1000 {
        let msg = echo_line(id) + "\n";
        let t = Instant::now();
        w.write_all(msg.as_bytes()).unwrap();
        line.clear();
        r.read_until(b'\n', &mut line).unwrap();
        let took = t.elapsed();
        if answer_id(&line) != Some(id) {
            errors += 1;
        }
        if id >= 1000 {
            lat.push(took);
        }
    }
    (summarize(lat), errors)
}

/// `clients` threads, each at c=1 for `dur` on a line channel of its own that `open` makes (the
/// writer, the reader, and what to drop after the run). Returns messages/s and errors.
fn many_c1<W, R, G>(clients: u64, dur: Duration, open: impl Fn() -> (W, R, G)) -> (f64, u64)
where
    W: Write + Send + 'static,
    R: BufRead + Send + 'static,
    G: Send + 'static,
{
    let done = Arc::new(AtomicU64::new(0));
    let errors = Arc::new(AtomicU64::new(0));
    let ready = Arc::new(std::sync::Barrier::new(clients as usize));
    let threads: Vec<_> = (0..clients)
        .map(|_| {
            let (done, errors, ready) = (done.clone(), errors.clone(), ready.clone());
            let (mut w, mut r, guard) = open();
            std::thread::spawn(move || {
                let mut line = Vec::new();
                ready.wait();
                let start = Instant::now();
                let mut id = 0u64;
                while start.elapsed() < dur {
                    w.write_all((echo_line(id) + "\n").as_bytes()).unwrap();
                    line.clear();
                    r.read_until(b'\n', &mut line).unwrap();
                    if answer_id(&line) != Some(id) {
                        errors.fetch_add(1, Ordering::Relaxed);
                    }
                    id += 1;
                    done.fetch_add(1, Ordering::Relaxed);
                }
                let took = start.elapsed();
                drop((w, r));
                drop(guard);
                took
            })
        })
        .collect();
    rate(threads, &done, &errors)
}

/// Messages per second over the longest of `threads` (each returns how long it ran), and the
/// errors counted.
fn rate(
    threads: Vec<std::thread::JoinHandle<Duration>>,
    done: &AtomicU64,
    errors: &AtomicU64,
) -> (f64, u64) {
    let mut longest = Duration::ZERO;
    for t in threads {
        longest = longest.max(t.join().unwrap());
    }
    (
        done.load(Ordering::Relaxed) as f64 / longest.as_secs_f64(),
        errors.load(Ordering::Relaxed),
    )
}

/// Reaps an agent when dropped (after its stdin closed).
struct Reap(Child);

impl Drop for Reap {
    fn drop(&mut self) {
        let _ = self.0.wait();
    }
}

/// `agents` agents, each with its own pipe and its own client thread at c=1: the direct-pipe
/// counterpart of many sockets on many serverIds.
fn pipe_many(agents: u64, dur: Duration) -> (f64, u64) {
    many_c1(agents, dur, || {
        let mut child = spawn_mock();
        let stdin = child.stdin.take().unwrap();
        let stdout = BufReader::new(child.stdout.take().unwrap());
        (stdin, stdout, Reap(child))
    })
}

/// The same over `relays` blocking TCP relays (`relay_peer`), one agent each: the floor of many
/// sockets on many serverIds for any TCP proxy.
fn relay_many(relays: u64, dur: Duration) -> (f64, u64) {
    many_c1(relays, dur, || {
        let (addr, server) = serve_one(relay_peer);
        let s = TcpStream::connect(addr).unwrap();
        s.set_nodelay(true).unwrap();
        let w = s.try_clone().unwrap();
        (w, BufReader::new(s), JoinOnDrop(Some(server)))
    })
}

/// Joins a thread when dropped.
struct JoinOnDrop(Option<std::thread::JoinHandle<()>>);

impl Drop for JoinOnDrop {
    fn drop(&mut self) {
        if let Some(t) = self.0.take() {
            let _ = t.join();
        }
    }
}

// ---------- the physical limits of a TCP transport ----------

/// Listens on a loopback port and hands the one connection it accepts to `peer`.
fn serve_one(
    peer: impl FnOnce(TcpStream) + Send + 'static,
) -> (std::net::SocketAddr, std::thread::JoinHandle<()>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let server = std::thread::spawn(move || {
        let (s, _) = listener.accept().unwrap();
        s.set_nodelay(true).unwrap();
        peer(s);
    });
    (addr, server)
}

/// A c=1 round trip of `line`-terminated messages over a loopback TCP connection whose other
/// end is `peer` (given the accepted socket). Returns the latency of each round trip.
fn tcp_c1(n: u64, peer: impl FnOnce(TcpStream) + Send + 'static) -> (Latency, u64) {
    let (addr, server) = serve_one(peer);
    let s = TcpStream::connect(addr).unwrap();
    s.set_nodelay(true).unwrap();
    let mut w = s.try_clone().unwrap();
    let mut r = BufReader::new(s);
    let got = lines_c1(n, &mut w, &mut r);
    drop(w);
    drop(r);
    let _ = server.join();
    got
}

/// Copies `from` to `to` with one `write` per `read` until `from` ends.
fn copy_through(mut from: impl Read, mut to: impl Write) {
    let mut buf = vec![0u8; 64 * 1024];
    while let Ok(k) = from.read(&mut buf) {
        if k == 0 || to.write_all(&buf[..k]).is_err() {
            break;
        }
    }
}

/// The floor of any TCP transport: a loopback TCP round trip to a thread that writes back what
/// it reads (no agent).
fn tcp_echo_c1(n: u64) -> Latency {
    tcp_c1(n, |s| {
        let w = s.try_clone().unwrap();
        copy_through(s, w);
    })
    .0
}

/// The floor of any TCP proxy to the agent: two blocking threads relay the bytes between the
/// socket and the agent's stdin/stdout (no framing, no parsing, no log) - the same four wake-ups
/// per round trip as the daemon (client -> relay -> agent -> relay -> client).
fn relay_c1(n: u64) -> (Latency, u64) {
    tcp_c1(n, relay_peer)
}

/// Relays one accepted socket to a mock agent of its own until the client closes it.
fn relay_peer(s: TcpStream) {
    let mut child = spawn_mock();
    let stdin = child.stdin.take().unwrap();
    let stdout = child.stdout.take().unwrap();
    let w = s.try_clone().unwrap();
    let back = std::thread::spawn(move || copy_through(stdout, w));
    copy_through(s, stdin);
    let _ = child.wait();
    let _ = back.join();
}

/// How many requests the reader has released since the writer last woke: blocks for the first,
/// then takes every one already queued, so that the writer sends them with one `write` (as any
/// pipelining client does: the pipe's and the sockets' writers do the same). `None`: the reader
/// is done.
fn released(rx: &std::sync::mpsc::Receiver<u64>) -> Option<usize> {
    rx.recv().ok()?;
    let mut k = 1;
    while rx.try_recv().is_ok() {
        k += 1;
    }
    Some(k)
}

/// `inflight` requests outstanding at all times for `dur`; returns (req/s, errors).
fn pipe_concurrent(inflight: u64, dur: Duration) -> (f64, u64) {
    let mut child = spawn_mock();
    let stdin = child.stdin.take().unwrap();
    let stdout = child.stdout.take().unwrap();
    let done = Arc::new(AtomicU64::new(0));
    let (tx, rx) = std::sync::mpsc::sync_channel::<u64>(inflight as usize);
    let writer = std::thread::spawn(move || {
        let mut stdin = stdin;
        let mut next = 0u64;
        // Each answered id releases one more request.
        for _ in 0..inflight {
            stdin
                .write_all((echo_line(next) + "\n").as_bytes())
                .unwrap();
            next += 1;
        }
        let mut batch = Vec::new();
        while let Some(k) = released(&rx) {
            batch.clear();
            for _ in 0..k {
                batch.extend_from_slice(echo_line(next).as_bytes());
                batch.push(b'\n');
                next += 1;
            }
            if stdin.write_all(&batch).is_err() {
                break;
            }
        }
    });
    let d2 = done.clone();
    let reader = std::thread::spawn(move || {
        let mut r = BufReader::new(stdout);
        let mut line = Vec::new();
        let mut errors = 0u64;
        let mut seen = std::collections::HashSet::new();
        let start = Instant::now();
        while start.elapsed() < dur {
            line.clear();
            if r.read_until(b'\n', &mut line).unwrap() == 0 {
                break;
            }
            match answer_id(&line) {
                Some(id) if seen.insert(id) => {}
                _ => errors += 1,
            }
            d2.fetch_add(1, Ordering::Relaxed);
            if tx.send(0).is_err() {
                break;
            }
        }
        (start.elapsed(), errors)
    });
    let (elapsed, errors) = reader.join().unwrap();
    let _ = child.kill();
    let _ = child.wait();
    let _ = writer.join();
    (
        done.load(Ordering::Relaxed) as f64 / elapsed.as_secs_f64(),
        errors,
    )
}

fn pipe_stream(n: u64) -> f64 {
    let mut child = spawn_mock();
    let mut stdin = child.stdin.take().unwrap();
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    let prompt = format!(
        r#"{{"jsonrpc":"2.0","id":1,"method":"session/prompt","params":{{"sessionId":"s","prompt":[{{"type":"text","text":"/stream {n}"}}]}}}}"#
    );
    let t = Instant::now();
    stdin.write_all((prompt + "\n").as_bytes()).unwrap();
    let mut line = Vec::new();
    let mut got = 0;
    loop {
        line.clear();
        if stdout.read_until(b'\n', &mut line).unwrap() == 0 {
            break;
        }
        if line.windows(11).any(|w| w == b"stopReason\"") {
            break;
        }
        got += 1;
    }
    let el = t.elapsed();
    assert_eq!(got, n);
    drop(stdin);
    let _ = child.wait();
    n as f64 / el.as_secs_f64()
}

/// The same pipe driven the way an async proxy must drive it (tokio, one reader task matching
/// answers to waiters by id, a lock around stdin): what any async proxy pays before HTTP.
fn pipe_async(n: u64, inflight: u64, dur: Duration) -> (Latency, f64, u64) {
    use std::collections::HashMap;
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt};
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async move {
        let mut child = tokio::process::Command::new(BIN)
            .arg("mock-agent")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let stdin = Arc::new(tokio::sync::Mutex::new(child.stdin.take().unwrap()));
        let waiters: Arc<Mutex<HashMap<u64, tokio::sync::oneshot::Sender<Vec<u8>>>>> =
            Arc::default();
        let w2 = waiters.clone();
        let stdout = child.stdout.take().unwrap();
        tokio::spawn(async move {
            let mut lines = tokio::io::BufReader::new(stdout).split(b'\n');
            while let Ok(Some(line)) = lines.next_segment().await {
                if let Some(id) = answer_id(&line)
                    && let Some(tx) = w2.lock().unwrap().remove(&id)
                {
                    let _ = tx.send(line);
                }
            }
        });
        let call = move |id: u64| {
            let (stdin, waiters) = (stdin.clone(), waiters.clone());
            async move {
                let (tx, rx) = tokio::sync::oneshot::channel();
                waiters.lock().unwrap().insert(id, tx);
                let line = echo_line(id) + "\n";
                stdin.lock().await.write_all(line.as_bytes()).await.unwrap();
                let answer = rx.await.unwrap();
                answer_id(&answer) == Some(id)
            }
        };
        let mut lat = Vec::new();
        let mut errors = 0;
        for id in 0..n + 1000 {
            let t = Instant::now();
            if !call(id).await {
                errors += 1;
            }
            if id >= 1000 {
                lat.push(t.elapsed());
            }
        }
        let done = Arc::new(AtomicU64::new(0));
        let start = Instant::now();
        let tasks: Vec<_> = (0..inflight)
            .map(|t| {
                let (call, done) = (call.clone(), done.clone());
                tokio::spawn(async move {
                    let mut bad = 0;
                    let mut i = 0;
                    while start.elapsed() < dur {
                        if !call(10_000_000 + t * 100_000_000 + i).await {
                            bad += 1;
                        }
                        i += 1;
                        done.fetch_add(1, Ordering::Relaxed);
                    }
                    bad
                })
            })
            .collect();
        for t in tasks {
            errors += t.await.unwrap();
        }
        let rate = done.load(Ordering::Relaxed) as f64 / start.elapsed().as_secs_f64();
        (summarize(lat), rate, errors)
    })
}

// ---------- the daemon ----------

struct Daemon {
    child: Child,
    port: u16,
    _dir: tempdir::Dir,
}

mod tempdir {
    /// A scratch directory removed on drop (the bench has no dev-dependency on tempfile).
    pub struct Dir(pub std::path::PathBuf);
    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

impl Daemon {
    fn start(extra: &[&str]) -> Daemon {
        let port = free_port();
        let dir = std::env::temp_dir().join(format!("acp-bench-{}-{port}", std::process::id()));
        std::fs::create_dir_all(dir.join("work")).unwrap();
        // `SANDBOX_AGENT_BIN=<path>` (or the older `ACP_BENCH_DAEMON`) runs another build of
        // the daemon (A/B comparisons).
        let bin = std::env::var("ACP_BENCH_DAEMON").unwrap_or_else(|_| daemon_bin(BIN));
        let child = Command::new(bin)
            .arg("server")
            .args(["--host", "127.0.0.1", "--port", &port.to_string()])
            .args(["--log-level", "warn", "--no-token"])
            .arg("--data-dir")
            .arg(dir.join("data"))
            .arg("--work-dir")
            .arg(dir.join("work"))
            .args(extra)
            // `ACP_BENCH_STATE=every|batch:<ms>|os`: with a state dir (`--state-dir`) and that
            // sync policy; unset or `off`: without.
            .args(match std::env::var("ACP_BENCH_STATE").as_deref() {
                Ok("off") | Err(_) => Vec::new(),
                Ok(policy) => vec![
                    "--state-dir".to_string(),
                    dir.join("state").display().to_string(),
                    "--state-sync".to_string(),
                    policy.to_string(),
                ],
            })
            .env_remove("NOTIFY_SOCKET")
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn daemon");
        let d = Daemon {
            child,
            port,
            _dir: tempdir::Dir(dir),
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(Instant::now() < deadline, "daemon did not listen");
            std::thread::sleep(Duration::from_millis(20));
        }
        d
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.child.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        );
        let _ = self.child.wait();
    }
}

/// A minimal HTTP/1.1 keep-alive client, so that the figures measure the daemon, not a client
/// library.
struct Conn {
    r: BufReader<TcpStream>,
    w: TcpStream,
}

impl Conn {
    fn open(port: u16) -> Conn {
        let s = TcpStream::connect(("127.0.0.1", port)).unwrap();
        s.set_nodelay(true).unwrap();
        Conn {
            r: BufReader::new(s.try_clone().unwrap()),
            w: s,
        }
    }

    /// POSTs `body`; returns (status, body).
    fn post(&mut self, path: &str, body: &str, extra: &str) -> (u16, Vec<u8>) {
        let req = format!(
            "POST {path} HTTP/1.1\r\nhost: localhost\r\ncontent-type: application/json\r\ncontent-length: {}\r\n{extra}\r\n{body}",
            body.len()
        );
        self.w.write_all(req.as_bytes()).unwrap();
        self.read_response()
    }

    fn get(&mut self, path: &str) -> (u16, Vec<u8>) {
        write!(self.w, "GET {path} HTTP/1.1\r\nhost: localhost\r\n\r\n").unwrap();
        self.read_response()
    }

    fn read_response(&mut self) -> (u16, Vec<u8>) {
        let mut line = String::new();
        self.r.read_line(&mut line).unwrap();
        let status: u16 = line.split(' ').nth(1).unwrap_or("0").parse().unwrap_or(0);
        let mut len = 0usize;
        loop {
            line.clear();
            self.r.read_line(&mut line).unwrap();
            if line == "\r\n" || line.is_empty() {
                break;
            }
            if let Some((k, v)) = line.split_once(':')
                && k.eq_ignore_ascii_case("content-length")
            {
                len = v.trim().parse().unwrap();
            }
        }
        let mut body = vec![0; len];
        self.r.read_exact(&mut body).unwrap();
        (status, body)
    }
}

fn bootstrap(port: u16, server: &str) {
    let mut c = Conn::open(port);
    let (st, _) = c.post(
        &format!("/v1/acp/{server}?agent=mock"),
        r#"{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":1}}"#,
        "",
    );
    assert_eq!(st, 200);
}

fn http_c1(port: u16, n: u64) -> (Latency, u64) {
    bootstrap(port, "c1");
    let mut c = Conn::open(port);
    let mut lat = Vec::with_capacity(n as usize);
    let mut errors = 0;
    for id in 1..=n + 1000 {
        let body = echo_line(id);
        let t = Instant::now();
        let (st, resp) = c.post("/v1/acp/c1", &body, "");
        let took = t.elapsed();
        if st != 200 || answer_id(&resp) != Some(id) {
            errors += 1;
        }
        if id > 1000 {
            lat.push(took);
        }
    }
    (summarize(lat), errors)
}

fn http_concurrent(port: u16, conns: u64, dur: Duration) -> (f64, u64) {
    bootstrap(port, "c32");
    let done = Arc::new(AtomicU64::new(0));
    let errors = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let threads: Vec<_> = (0..conns)
        .map(|t| {
            let (done, errors) = (done.clone(), errors.clone());
            std::thread::spawn(move || {
                let mut c = Conn::open(port);
                let mut i = 0u64;
                while start.elapsed() < dur {
                    let id = t * 100_000_000 + i + 1;
                    i += 1;
                    let (st, resp) = c.post("/v1/acp/c32", &echo_line(id), "");
                    if st != 200 || answer_id(&resp) != Some(id) {
                        errors.fetch_add(1, Ordering::Relaxed);
                    }
                    done.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let el = start.elapsed();
    (
        done.load(Ordering::Relaxed) as f64 / el.as_secs_f64(),
        errors.load(Ordering::Relaxed),
    )
}

/// `conns` keep-alive connections, connection `t` posting to serverId `s{t % agents}`, for `dur`:
/// req/s and errors.
fn http_spread(port: u16, conns: u64, agents: u64, dur: Duration) -> (f64, u64) {
    let agents = agents.clamp(1, conns.max(1));
    for a in 0..agents {
        bootstrap(port, &format!("s{a}"));
    }
    let done = Arc::new(AtomicU64::new(0));
    let errors = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let threads: Vec<_> = (0..conns)
        .map(|t| {
            let (done, errors) = (done.clone(), errors.clone());
            std::thread::spawn(move || {
                let path = format!("/v1/acp/s{}", t % agents);
                let mut c = Conn::open(port);
                let mut i = 0u64;
                while start.elapsed() < dur {
                    let id = t * 100_000_000 + i + 1;
                    i += 1;
                    let (st, resp) = c.post(&path, &echo_line(id), "");
                    if st != 200 || answer_id(&resp) != Some(id) {
                        errors.fetch_add(1, Ordering::Relaxed);
                    }
                    done.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    (
        done.load(Ordering::Relaxed) as f64 / start.elapsed().as_secs_f64(),
        errors.load(Ordering::Relaxed),
    )
}

/// `GET /v1/health` at c=1 (p50) and c=`conns` (req/s): the HTTP stack's own ceiling here.
fn http_health(port: u16, n: u64, conns: u64, dur: Duration) -> (Latency, f64) {
    let mut c = Conn::open(port);
    let mut lat = Vec::new();
    for i in 0..n + 1000 {
        let t = Instant::now();
        let (st, _) = c.get("/v1/health");
        assert_eq!(st, 200);
        if i >= 1000 {
            lat.push(t.elapsed());
        }
    }
    let done = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let threads: Vec<_> = (0..conns)
        .map(|_| {
            let done = done.clone();
            std::thread::spawn(move || {
                let mut c = Conn::open(port);
                while start.elapsed() < dur {
                    c.get("/v1/health");
                    done.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    (
        summarize(lat),
        done.load(Ordering::Relaxed) as f64 / start.elapsed().as_secs_f64(),
    )
}

/// `/stream n` delivered to `subs` SSE subscribers; returns the events/s each subscriber saw
/// (slowest one) and whether every subscriber got every event.
fn http_stream(port: u16, server: &str, subs: usize, n: u64) -> (f64, bool) {
    bootstrap(port, server);
    let last = format!("id: {n}\n").into_bytes();
    let ready = Arc::new(std::sync::Barrier::new(subs + 1));
    let start = Arc::new(Mutex::new(None::<Instant>));
    let readers: Vec<_> = (0..subs)
        .map(|_| {
            let (ready, start, last) = (ready.clone(), start.clone(), last.clone());
            let server = server.to_string();
            std::thread::spawn(move || {
                let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
                // `connection: close` makes the end of the stream (a cut-off subscriber) close
                // the socket, which this reader sees; with keep-alive it would wait forever.
                write!(
                    s,
                    "GET /v1/acp/{server} HTTP/1.1\r\nhost: localhost\r\naccept: text/event-stream\r\nconnection: close\r\n\r\n"
                )
                .unwrap();
                let mut buf = vec![0u8; 256 * 1024];
                let mut tail: Vec<u8> = Vec::new();
                let mut first = true;
                loop {
                    let k = s.read(&mut buf).unwrap_or(0);
                    if first {
                        first = false;
                        ready.wait();
                    }
                    if k == 0 {
                        return None;
                    }
                    // Keep only a short tail so the search stays O(new bytes).
                    tail.extend_from_slice(&buf[..k]);
                    if tail.windows(last.len()).any(|w| w == last.as_slice()) {
                        let t0 = start.lock().unwrap().expect("started");
                        return Some(t0.elapsed());
                    }
                    let keep = tail.len().saturating_sub(last.len());
                    tail.drain(..keep);
                }
            })
        })
        .collect();
    ready.wait();
    *start.lock().unwrap() = Some(Instant::now());
    let mut c = Conn::open(port);
    let body = format!(
        r#"{{"jsonrpc":"2.0","id":1,"method":"session/prompt","params":{{"sessionId":"s","prompt":[{{"type":"text","text":"/stream {n}"}}]}}}}"#
    );
    let (st, _) = c.post(&format!("/v1/acp/{server}"), &body, "");
    assert_eq!(st, 200);
    let mut slowest = Duration::ZERO;
    let mut all = true;
    for r in readers {
        match r.join().unwrap() {
            Some(t) => slowest = slowest.max(t),
            None => all = false,
        }
    }
    (n as f64 / slowest.as_secs_f64(), all)
}

// ---------- WebSocket and the RFD transport ----------

/// A minimal blocking WebSocket client (RFC 6455, text frames only), written here for the same
/// reason as `Conn`: the figures should measure the daemon, and a blocking client costs the same
/// per message as the pipe's. `w` may be moved to another thread (see `split`).
struct WsConn {
    r: BufReader<TcpStream>,
    w: TcpStream,
}

const INIT: &str =
    r#"{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":1}}"#;

impl WsConn {
    /// Opens `path` with an upgrade; returns the socket and the `Acp-Connection-Id` it carried.
    fn open(port: u16, path: &str) -> (WsConn, Option<String>) {
        let s = TcpStream::connect(("127.0.0.1", port)).unwrap();
        s.set_nodelay(true).unwrap();
        let mut w = s.try_clone().unwrap();
        // The key is not checked by this client; the daemon only needs one of the right shape.
        write!(
            w,
            "GET {path} HTTP/1.1\r\nhost: localhost\r\nupgrade: websocket\r\nconnection: Upgrade\r\nsec-websocket-key: YWNwLWJlbmNoLWtleS0wMQ==\r\nsec-websocket-version: 13\r\n\r\n"
        )
        .unwrap();
        let mut r = BufReader::new(s);
        let mut line = String::new();
        r.read_line(&mut line).unwrap();
        assert!(line.starts_with("HTTP/1.1 101"), "upgrade refused: {line}");
        let mut conn = None;
        loop {
            line.clear();
            r.read_line(&mut line).unwrap();
            if line == "\r\n" {
                break;
            }
            if let Some((k, v)) = line.split_once(':')
                && k.eq_ignore_ascii_case("acp-connection-id")
            {
                conn = Some(v.trim().to_string());
            }
        }
        (WsConn { r, w }, conn)
    }

    /// Opens `path`, sends `initialize` and waits for its answer.
    fn ready(port: u16, path: &str) -> WsConn {
        let (mut ws, _) = WsConn::open(port, path);
        ws_send(&mut ws.w, INIT);
        assert_eq!(ws.next_id(), Some(0));
        ws
    }

    /// The payload of the next text frame (control frames skipped); `None` when the socket
    /// closed.
    fn next_text(&mut self, buf: &mut Vec<u8>) -> Option<()> {
        loop {
            let mut head = [0u8; 2];
            self.r.read_exact(&mut head).ok()?;
            assert!(head[0] & 0x80 != 0, "fragmented frames are not expected");
            let len = match head[1] & 0x7f {
                126 => {
                    let mut b = [0u8; 2];
                    self.r.read_exact(&mut b).ok()?;
                    u16::from_be_bytes(b) as usize
                }
                127 => {
                    let mut b = [0u8; 8];
                    self.r.read_exact(&mut b).ok()?;
                    u64::from_be_bytes(b) as usize
                }
                n => n as usize,
            };
            buf.resize(len, 0);
            self.r.read_exact(buf).ok()?;
            match head[0] & 0x0f {
                1 => return Some(()),
                8 => return None,
                // Pings (the daemon's keepalive) need no answer here; pongs and binary: skip.
                _ => {}
            }
        }
    }

    fn next_id(&mut self) -> Option<u64> {
        let mut buf = Vec::new();
        self.next_text(&mut buf)?;
        answer_id(&buf)
    }
}

/// Sends one masked text frame with one `write`.
fn ws_send(w: &mut TcpStream, text: &str) {
    let frame = ws_frame(text);
    w.write_all(&frame).unwrap();
}

fn ws_frame(text: &str) -> Vec<u8> {
    const MASK: [u8; 4] = [0x37, 0xfa, 0x21, 0x3d];
    let p = text.as_bytes();
    let mut f = Vec::with_capacity(p.len() + 14);
    f.push(0x81);
    if p.len() < 126 {
        f.push(0x80 | p.len() as u8);
    } else if p.len() < 65536 {
        f.push(0x80 | 126);
        f.extend_from_slice(&(p.len() as u16).to_be_bytes());
    } else {
        f.push(0x80 | 127);
        f.extend_from_slice(&(p.len() as u64).to_be_bytes());
    }
    f.extend_from_slice(&MASK);
    f.extend(p.iter().enumerate().map(|(i, b)| b ^ MASK[i % 4]));
    f
}

/// Whether the daemon answers a WebSocket upgrade of `path` with 101.
fn ws_upgrades(port: u16, path: &str) -> bool {
    let Ok(mut s) = TcpStream::connect(("127.0.0.1", port)) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(30)));
    if write!(
        s,
        "GET {path} HTTP/1.1\r\nhost: localhost\r\nupgrade: websocket\r\nconnection: Upgrade\r\nsec-websocket-key: YWNwLWJlbmNoLWtleS0wMQ==\r\nsec-websocket-version: 13\r\n\r\n"
    )
    .is_err()
    {
        return false;
    }
    let mut line = String::new();
    BufReader::new(s).read_line(&mut line).is_ok() && line.starts_with("HTTP/1.1 101")
}

/// c=1 over one socket: send, wait for the answer, repeat. `path` is our endpoint
/// (`/v1/acp/..?agent=mock`) or the RFD's WebSocket profile.
fn ws_c1(port: u16, path: &str, n: u64) -> (Latency, u64) {
    let mut ws = WsConn::ready(port, path);
    let mut lat = Vec::with_capacity(n as usize);
    let mut errors = 0;
    let mut buf = Vec::new();
    for id in 1..=n + 1000 {
        let frame = ws_frame(&echo_line(id));
        let t = Instant::now();
        ws.w.write_all(&frame).unwrap();
        if ws.next_text(&mut buf).is_none() || answer_id(&buf) != Some(id) {
            errors += 1;
        }
        if id > 1000 {
            lat.push(t.elapsed());
        }
    }
    (summarize(lat), errors)
}

/// The transport alone: c=1 frames the daemon answers itself without the agent (an empty batch,
/// `[]`, is refused with a JSON-RPC error at once) — the WebSocket's `GET /v1/health`.
fn ws_floor(port: u16, n: u64) -> Latency {
    let mut ws = WsConn::ready(port, "/v1/acp/wsfloor?agent=mock");
    let frame = ws_frame("[]");
    let mut lat = Vec::with_capacity(n as usize);
    let mut buf = Vec::new();
    for i in 0..n + 1000 {
        let t = Instant::now();
        ws.w.write_all(&frame).unwrap();
        ws.next_text(&mut buf).expect("an error frame");
        if i >= 1000 {
            lat.push(t.elapsed());
        }
    }
    summarize(lat)
}

/// `inflight` requests in flight on one socket for `dur`, driven exactly like the pipelined
/// pipe: a writer thread sends, with one `write`, one frame per answer the reader thread received
/// since it last woke (see `released`).
fn ws_one_socket(port: u16, path: &str, inflight: u64, dur: Duration) -> (f64, u64) {
    let mut ws = WsConn::ready(port, path);
    let w = ws.w.try_clone().unwrap();
    let (tx, rx) = std::sync::mpsc::sync_channel::<u64>(inflight as usize);
    let writer = std::thread::spawn(move || {
        let mut w = w;
        let mut next = 1u64;
        for _ in 0..inflight {
            ws_send(&mut w, &echo_line(next));
            next += 1;
        }
        let mut batch = Vec::new();
        while let Some(k) = released(&rx) {
            batch.clear();
            for _ in 0..k {
                batch.extend_from_slice(&ws_frame(&echo_line(next)));
                next += 1;
            }
            if w.write_all(&batch).is_err() {
                break;
            }
        }
        // Closing the socket ends the daemon's side of it.
        let _ = w.shutdown(std::net::Shutdown::Both);
    });
    let start = Instant::now();
    let mut done = 0u64;
    let mut errors = 0u64;
    let mut expect = 1u64;
    let mut buf = Vec::new();
    while start.elapsed() < dur {
        if ws.next_text(&mut buf).is_none() {
            errors += 1;
            break;
        }
        // One socket, one agent: answers come back in the order sent.
        if answer_id(&buf) != Some(expect) {
            errors += 1;
        }
        expect += 1;
        done += 1;
        if tx.send(0).is_err() {
            break;
        }
    }
    let rate = done as f64 / start.elapsed().as_secs_f64();
    drop(tx);
    let _ = writer.join();
    (rate, errors)
}

/// `sockets` sockets, each at c=1 for `dur` on its own thread. `shared`: all on one serverId
/// (every answer is an event of its log, so every socket receives every socket's answers and
/// counts its own); else each on its own serverId (its own agent).
fn ws_many_sockets(port: u16, name: &str, sockets: u64, shared: bool, dur: Duration) -> (f64, u64) {
    let path = |k: u64| {
        if shared {
            format!("/v1/acp/{name}")
        } else {
            format!("/v1/acp/{name}-{k}")
        }
    };
    let mut first = Vec::new();
    for k in 0..if shared { 1 } else { sockets } {
        first.push(WsConn::ready(port, &format!("{}?agent=mock", path(k))));
    }
    drop(first);
    let done = Arc::new(AtomicU64::new(0));
    let errors = Arc::new(AtomicU64::new(0));
    let ready = Arc::new(std::sync::Barrier::new(sockets as usize));
    let threads: Vec<_> = (0..sockets)
        .map(|k| {
            let (done, errors, ready) = (done.clone(), errors.clone(), ready.clone());
            // Start after the initialize answer (event 1 of a shared log); other sockets'
            // answers are skipped like the live ones.
            let p = format!("{}?lastEventId=1", path(k));
            std::thread::spawn(move || {
                let (mut ws, _) = WsConn::open(port, &p);
                ready.wait();
                let start = Instant::now();
                let mut i = 0u64;
                while start.elapsed() < dur {
                    let id = 1_000_000 + k * 100_000_000 + i;
                    ws_send(&mut ws.w, &echo_line(id));
                    loop {
                        match ws.next_id() {
                            Some(got) if got == id => break,
                            Some(_) if shared => {}
                            _ => {
                                errors.fetch_add(1, Ordering::Relaxed);
                                return start.elapsed();
                            }
                        }
                    }
                    i += 1;
                    done.fetch_add(1, Ordering::Relaxed);
                }
                start.elapsed()
            })
        })
        .collect();
    rate(threads, &done, &errors)
}

/// The RFD's Streamable HTTP: POSTs answered 202 on `conns` keep-alive connections, each at
/// c=1, the answers read from the connection stream. Returns (c=1 latency when conns == 1, rate).
fn rfd_http(port: u16, conns: u64, n: u64, dur: Duration) -> (Latency, f64, u64) {
    use std::collections::HashMap;
    let mut c = Conn::open(port);
    let path = "/v1/agents/mock/acp";
    let init = r#"{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":1}}"#;
    let req = format!(
        "POST {path} HTTP/1.1\r\nhost: localhost\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{init}",
        init.len()
    );
    c.w.write_all(req.as_bytes()).unwrap();
    // Read the head by hand for the connection id.
    let mut conn_id = String::new();
    let mut line = String::new();
    let mut len = 0;
    loop {
        line.clear();
        c.r.read_line(&mut line).unwrap();
        if line == "\r\n" {
            break;
        }
        if let Some((k, v)) = line.split_once(':') {
            if k.eq_ignore_ascii_case("acp-connection-id") {
                conn_id = v.trim().to_string();
            }
            if k.eq_ignore_ascii_case("content-length") {
                len = v.trim().parse().unwrap();
            }
        }
    }
    let mut body = vec![0; len];
    c.r.read_exact(&mut body).unwrap();
    assert!(!conn_id.is_empty());
    // The connection stream: a reader thread hands each answer to its waiting sender.
    let waiters: Arc<Mutex<HashMap<u64, std::sync::mpsc::Sender<Instant>>>> = Arc::default();
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nhost: localhost\r\naccept: text/event-stream\r\nacp-connection-id: {conn_id}\r\nconnection: close\r\n\r\n"
    )
    .unwrap();
    let w2 = waiters.clone();
    std::thread::spawn(move || {
        let mut r = BufReader::new(s);
        let mut line = Vec::new();
        loop {
            line.clear();
            if r.read_until(b'\n', &mut line).unwrap_or(0) == 0 {
                return;
            }
            if let Some(data) = line.strip_prefix(b"data: ")
                && let Some(id) = answer_id(data)
                && let Some(tx) = w2.lock().unwrap().remove(&id)
            {
                let _ = tx.send(Instant::now());
            }
        }
    });
    let call = move |c: &mut Conn, id: u64| -> bool {
        let (tx, rx) = std::sync::mpsc::channel();
        waiters.lock().unwrap().insert(id, tx);
        let (st, _) = c.post(
            path,
            &echo_line(id),
            &format!("acp-connection-id: {conn_id}\r\n"),
        );
        st == 202 && rx.recv_timeout(Duration::from_secs(10)).is_ok()
    };
    let call = Arc::new(call);
    let mut lat = Vec::new();
    let mut errors = 0;
    if conns == 1 {
        for id in 1..=n + 1000 {
            let t = Instant::now();
            if !call(&mut c, id) {
                errors += 1;
            }
            if id > 1000 {
                lat.push(t.elapsed());
            }
        }
    }
    let done = Arc::new(AtomicU64::new(0));
    let bad = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let threads: Vec<_> = (0..conns)
        .map(|t| {
            let (call, done, bad) = (call.clone(), done.clone(), bad.clone());
            std::thread::spawn(move || {
                let mut c = Conn::open(port);
                let mut i = 0;
                while start.elapsed() < dur {
                    if !call(&mut c, 10_000_000 + t * 100_000_000 + i) {
                        bad.fetch_add(1, Ordering::Relaxed);
                    }
                    i += 1;
                    done.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let rate = done.load(Ordering::Relaxed) as f64 / start.elapsed().as_secs_f64();
    let lat = if lat.is_empty() {
        summarize(vec![Duration::ZERO])
    } else {
        summarize(lat)
    };
    (lat, rate, errors + bad.load(Ordering::Relaxed))
}

fn main() {
    // `cargo bench` passes `--bench`; nothing to parse.
    let n: u64 = std::env::var("ACP_BENCH_N")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20_000);
    let dur = Duration::from_millis(knob("ACP_BENCH_DUR_MS", 5000));
    let stream_n: u64 = knob("ACP_BENCH_STREAM_N", 100_000);
    // For profiling: `ACP_BENCH_PROFILE=<port>` drives a daemon started by hand, HTTP (c=1 and
    // c=32) by default, or `ACP_BENCH_PROFILE_PATH=ws1|ws32|wsown|rfd1|rfd32|spread` (our WebSocket at c=1, 32 in
    // flight on one socket, 32 sockets on 32 serverIds; the RFD's WebSocket at c=1 and 32 in flight;
    // HTTP from ACP_BENCH_CONNS connections over ACP_BENCH_AGENTS serverIds). `ACP_BENCH_SECS` is the length of the
    // concurrent phase (0 skips it, e.g. to count the syscalls of c=1 alone).
    if let Some(port) = std::env::var("ACP_BENCH_PROFILE")
        .ok()
        .and_then(|p| p.parse().ok())
    {
        let secs: u64 = std::env::var("ACP_BENCH_SECS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(5);
        let secs = Duration::from_secs(secs);
        let tag = std::process::id();
        match std::env::var("ACP_BENCH_PROFILE_PATH").as_deref() {
            Ok("ws1") => {
                let (w1, e) = ws_c1(port, &format!("/v1/acp/p{tag}?agent=mock"), n);
                println!(
                    "WS c=1 p50 {:.1} us p99 {:.1} us errors {e}",
                    us(w1.p50),
                    us(w1.p99)
                );
            }
            Ok("ws32") => {
                let (w, e) = ws_one_socket(port, &format!("/v1/acp/p{tag}?agent=mock"), 32, secs);
                println!("WS 32 in flight {w:.0} msg/s errors {e}");
            }
            Ok("rfd1") => {
                let (w1, e) = ws_c1(port, "/v1/agents/mock/acp", n);
                println!(
                    "RFD WS c=1 p50 {:.1} us p99 {:.1} us errors {e}",
                    us(w1.p50),
                    us(w1.p99)
                );
            }
            Ok("rfd32") => {
                let (w, e) = ws_one_socket(port, "/v1/agents/mock/acp", 32, secs);
                println!("RFD WS 32 in flight {w:.0} msg/s errors {e}");
            }
            Ok("spread") => {
                // ACP_BENCH_CONNS connections spread over ACP_BENCH_AGENTS serverIds (the
                // contention profile: many clients, many agents, nothing shared but the daemon).
                let conns = knob("ACP_BENCH_CONNS", 128);
                let agents = knob("ACP_BENCH_AGENTS", 64);
                let (r, e) = http_spread(port, conns, agents, secs);
                println!("HTTP c={conns} over {agents} agents {r:.0} req/s errors {e}");
            }
            Ok("wsown") => {
                let (w, e) = ws_many_sockets(port, &format!("p{tag}"), 32, false, secs);
                println!("WS 32 sockets, 32 serverIds {w:.0} msg/s errors {e}");
            }
            _ => {
                let (h1, e) = http_c1(port, n);
                println!(
                    "HTTP c=1 p50 {:.1} us p99 {:.1} us errors {e}",
                    us(h1.p50),
                    us(h1.p99)
                );
                if !secs.is_zero() {
                    let (h32, e) = http_concurrent(port, 32, secs);
                    println!("HTTP c=32 {h32:.0} req/s errors {e}");
                }
            }
        }
        return;
    }

    // `ACP_BENCH_ONLY=pipe,http,sse,ws,rfd` (any subset) runs only those groups; the direct
    // pipe always runs, since every ratio is taken against it.
    let only = std::env::var("ACP_BENCH_ONLY").ok();
    let run = |group: &str| {
        only.as_deref()
            .is_none_or(|o| o.split(',').any(|g| g.trim() == group))
    };
    println!(
        "ACP proxy benchmark (mock agent, _mock/echo; {n} round trips at c=1, {dur:?} at c=32)"
    );
    // Round trips per second at c=1 (the inverse of the median), for the A/B figures.
    let per_s = |d: Duration| 1.0 / d.as_secs_f64().max(1e-9);
    let (pipe1, e1) = pipe_c1(n);
    let (pipe32, e2) = pipe_concurrent(32, dur);
    println!(
        "direct pipe    c=1  p50 {:7.1} us  p99 {:7.1} us   errors {e1}",
        us(pipe1.p50),
        us(pipe1.p99)
    );
    println!("direct pipe    c=32 {pipe32:9.0} req/s (32 pipelined)   errors {e2}");
    let mut apipe = None;
    if run("pipe") {
        let (apipe1, apipe32, e5) = pipe_async(n, 32, dur);
        println!(
            "async pipe     c=1  p50 {:7.1} us  p99 {:7.1} us   c=32 {apipe32:.0} req/s   errors {e5}",
            us(apipe1.p50),
            us(apipe1.p99)
        );
        apipe = Some((apipe1, apipe32));
    }
    let pipe_rate = if run("sse") || run("pipe") {
        let r = pipe_stream(stream_n);
        println!("direct pipe    /stream {stream_n}: {r:9.0} events/s");
        r
    } else {
        0.0
    };

    let d = Daemon::start(&[]);
    if run("http") {
        let (health1, health32) = http_health(d.port, n, 32, dur);
        println!(
            "GET /v1/health c=1  p50 {:7.1} us  c=32 {health32:.0} req/s   (HTTP alone, no agent)",
            us(health1.p50)
        );
        let (h1, e3) = http_c1(d.port, n);
        let vs_async = apipe
            .as_ref()
            .map(|(a, _)| format!(", {:.2}x async pipe", us(h1.p50) / us(a.p50)))
            .unwrap_or_default();
        println!(
            "HTTP (daemon)  c=1  p50 {:7.1} us  p99 {:7.1} us   errors {e3}   p50 {:.2}x pipe{vs_async}",
            us(h1.p50),
            us(h1.p99),
            us(h1.p50) / us(pipe1.p50),
        );
        let (h32, e4) = http_concurrent(d.port, 32, dur);
        println!(
            "HTTP (daemon)  c=32 {h32:9.0} req/s                 errors {e4}   {:.2}x pipe",
            h32 / pipe32,
        );
        ab_figure(
            "proxy HTTP c=1 round trips/s (1/p50)",
            per_s(h1.p50),
            Some(("direct pipe", per_s(pipe1.p50))),
        );
        ab_figure(
            "proxy HTTP c=32 req/s",
            h32,
            Some(("direct pipe, 32 pipelined", pipe32)),
        );
    }
    if run("sse") {
        let (s1, all1) = http_stream(d.port, "stream1", 1, stream_n);
        println!(
            "SSE, 1 sub     /stream {stream_n}: {s1:9.0} events/s per subscriber ({:.2}x pipe){}",
            s1 / pipe_rate,
            if all1 { "" } else { "  SUBSCRIBER CUT OFF" }
        );
        ab_figure(
            "SSE 1 subscriber events/s",
            s1,
            Some(("direct pipe", pipe_rate)),
        );
        let (s8, all8) = http_stream(d.port, "stream8", 8, stream_n);
        ab_figure(
            "SSE fan-out 8 subscribers events/s each",
            s8,
            Some(("direct pipe", pipe_rate)),
        );
        println!(
            "SSE, 8 subs    /stream {stream_n}: {s8:9.0} events/s per subscriber ({:.2}x pipe){}",
            s8 / pipe_rate,
            if all8 { "" } else { "  SUBSCRIBER CUT OFF" }
        );
    }
    // A build without the WebSocket route (before the round that added it) gets no figures
    // for it (the A/B table shows them as n/a) instead of a failed run.
    let ws_served =
        (run("ws") || run("wscore")) && ws_upgrades(d.port, "/v1/acp/wsprobe?agent=mock");
    if (run("ws") || run("wscore")) && !ws_served {
        println!("WebSocket      n/a: this build does not upgrade /v1/acp/{{serverId}}");
    }
    if ws_served {
        let (w1, e6) = ws_c1(d.port, "/v1/acp/wsc1?agent=mock", n);
        println!(
            "WebSocket      c=1  p50 {:7.1} us  p99 {:7.1} us   errors {e6}   p50 {:.2}x pipe",
            us(w1.p50),
            us(w1.p99),
            us(w1.p50) / us(pipe1.p50),
        );
        let (w32, e7) = ws_one_socket(d.port, "/v1/acp/ws32?agent=mock", 32, dur);
        println!(
            "WebSocket      32 in flight, 1 socket    {w32:9.0} msg/s   errors {e7}   {:.2}x pipe",
            w32 / pipe32
        );
        ab_figure(
            "WebSocket c=1 round trips/s (1/p50)",
            per_s(w1.p50),
            Some(("direct pipe", per_s(pipe1.p50))),
        );
        ab_figure(
            "WebSocket 32 in flight msg/s",
            w32,
            Some(("direct pipe, 32 pipelined", pipe32)),
        );
    }
    if run("ws") {
        let echo = tcp_echo_c1(n);
        println!(
            "TCP echo       c=1  p50 {:7.1} us  p99 {:7.1} us   (loopback TCP, no agent)   p50 {:.2}x pipe",
            us(echo.p50),
            us(echo.p99),
            us(echo.p50) / us(pipe1.p50)
        );
        let (relay, er) = relay_c1(n);
        println!(
            "TCP relay      c=1  p50 {:7.1} us  p99 {:7.1} us   errors {er}   p50 {:.2}x pipe (blocking threads, bytes only)",
            us(relay.p50),
            us(relay.p99),
            us(relay.p50) / us(pipe1.p50)
        );
        let floor = ws_floor(d.port, n);
        println!(
            "WebSocket      c=1  p50 {:7.1} us  p99 {:7.1} us   answered by the daemon (no agent)",
            us(floor.p50),
            us(floor.p99)
        );
        let (pmany, ep) = pipe_many(32, dur);
        println!(
            "direct pipes   32 agents, each c=1      {pmany:9.0} req/s   errors {ep}   (32 client threads)"
        );
        let (rmany, erm) = relay_many(32, dur);
        println!(
            "TCP relays     32 agents, each c=1      {rmany:9.0} req/s   errors {erm}   {:.2}x 32 pipes (blocking threads, bytes only)",
            rmany / pmany
        );
        let (wown, e8) = ws_many_sockets(d.port, "wsown", 32, false, dur);
        println!(
            "WebSocket      32 sockets, 32 serverIds {wown:9.0} msg/s   errors {e8}   {:.2}x 32 pipes, {:.2}x TCP relays (32 agents)",
            wown / pmany,
            wown / rmany
        );
        let (wmany, e9) = ws_many_sockets(d.port, "wsmany", 32, true, dur);
        println!(
            "WebSocket      32 sockets, 1 serverId   {wmany:9.0} msg/s   errors {e9}   (each answer goes to all 32)"
        );
    }
    if run("rfd") {
        let (rw1, e9) = ws_c1(d.port, "/v1/agents/mock/acp", n);
        let (rw32, e10) = ws_one_socket(d.port, "/v1/agents/mock/acp", 32, dur);
        println!(
            "RFD WebSocket  c=1  p50 {:7.1} us  p99 {:7.1} us   errors {e9};  32 in flight {rw32:.0} msg/s errors {e10}",
            us(rw1.p50),
            us(rw1.p99)
        );
        let (rh1, _, e11) = rfd_http(d.port, 1, n, Duration::ZERO);
        let (_, rh32, e12) = rfd_http(d.port, 32, 0, dur);
        println!(
            "RFD HTTP/1.1   c=1  p50 {:7.1} us  p99 {:7.1} us   errors {e11};  c=32 (32 conns) {rh32:.0} msg/s errors {e12}",
            us(rh1.p50),
            us(rh1.p99)
        );
    }
    drop(d);
}
