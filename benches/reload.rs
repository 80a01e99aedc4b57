//! In-place reload benchmark: with AGENTS mock agents and PROCESSES processes running (each
//! agent with some events in its log, each process with some output), the time from SIGHUP to
//! the new image's READY=1, and the longest a client waited meanwhile: a prober opens a fresh
//! connection for `GET /v1/health` every 2 ms (the figure is its slowest answer during the
//! reload). Prints figures; asserts only that nothing was lost.
//! Run: `cargo bench --bench reload` (knobs: AGENTS, PROCESSES, RELOADS).

use std::io::{Read, Write};
use std::os::unix::net::UnixDatagram;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

mod common;
use common::{knob, percentile};

const BIN: &str = env!("CARGO_BIN_EXE_sandbox-agent");

fn request(addr: &str, method: &str, path: &str, body: &str) -> String {
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    out
}

fn health(addr: &str) -> Result<Duration, String> {
    let t = Instant::now();
    let mut s = std::net::TcpStream::connect(addr).map_err(|e| e.to_string())?;
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    s.write_all(b"GET /v1/health HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        .map_err(|e| e.to_string())?;
    let mut out = Vec::new();
    s.read_to_end(&mut out).map_err(|e| e.to_string())?;
    if out.starts_with(b"HTTP/1.1 200") {
        Ok(t.elapsed())
    } else {
        Err(String::from_utf8_lossy(&out[..out.len().min(40)]).into_owned())
    }
}

fn main() {
    let agents: usize = knob("AGENTS", 64);
    let processes: usize = knob("PROCESSES", 64);
    let reloads: usize = knob("RELOADS", 5);
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("notify.sock");
    let notify = UnixDatagram::bind(&sock).unwrap();
    notify
        .set_read_timeout(Some(Duration::from_secs(60)))
        .unwrap();
    let mut child = Command::new(BIN)
        .args(["server", "--port", "0", "--log-level", "warn"])
        .args(["--max-agents", &(agents + 8).to_string()])
        .args(["--process-max-concurrent", &(processes + 8).to_string()])
        .arg("--data-dir")
        .arg(dir.path().join("data"))
        .arg("--work-dir")
        .arg(dir.path())
        .env("NOTIFY_SOCKET", &sock)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut buf = [0u8; 4096];
    let wait_ready = |buf: &mut [u8]| -> String {
        loop {
            let n = notify.recv(buf).expect("READY=1 within 60 s");
            let msg = String::from_utf8_lossy(&buf[..n]).into_owned();
            if msg.lines().any(|l| l == "READY=1") {
                return msg;
            }
        }
    };
    let msg = wait_ready(&mut buf);
    let addr = msg.split("http://").nth(1).unwrap().trim().to_string();

    for i in 0..agents {
        let init =
            r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":1}}"#;
        let r = request(&addr, "POST", &format!("/v1/acp/b{i}?agent=mock"), init);
        assert!(r.starts_with("HTTP/1.1 200"), "{r}");
        let new = r#"{"jsonrpc":"2.0","id":2,"method":"session/new","params":{"cwd":"/tmp","mcpServers":[]}}"#;
        let r = request(&addr, "POST", &format!("/v1/acp/b{i}"), new);
        let sid = r
            .split("\"sessionId\":\"")
            .nth(1)
            .unwrap()
            .split('"')
            .next()
            .unwrap();
        let prompt = format!(
            r#"{{"jsonrpc":"2.0","id":3,"method":"session/prompt","params":{{"sessionId":"{sid}","prompt":[{{"type":"text","text":"/stream 100"}}]}}}}"#
        );
        let r = request(&addr, "POST", &format!("/v1/acp/b{i}"), &prompt);
        assert!(r.starts_with("HTTP/1.1 200"), "{r}");
    }
    for _ in 0..processes {
        let body = r#"{"command":"sh","args":["-c","i=0; while true; do i=$((i+1)); echo $i; sleep 0.1; done"]}"#;
        let r = request(&addr, "POST", "/v1/processes", body);
        assert!(r.starts_with("HTTP/1.1 200"), "{r}");
    }

    let stop = Arc::new(AtomicBool::new(false));
    let samples = Arc::new(std::sync::Mutex::new(Vec::<(Instant, Duration)>::new()));
    let failures = Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    let prober = {
        let (stop, samples, failures, addr) = (
            stop.clone(),
            samples.clone(),
            failures.clone(),
            addr.clone(),
        );
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                let at = Instant::now();
                match health(&addr) {
                    Ok(d) => samples.lock().unwrap().push((at, d)),
                    Err(e) => failures.lock().unwrap().push(e),
                }
                std::thread::sleep(Duration::from_millis(2));
            }
        })
    };

    let mut to_ready = Vec::new();
    let mut longest_wait = Vec::new();
    for _ in 0..reloads {
        std::thread::sleep(Duration::from_millis(300));
        let t = Instant::now();
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(child.id() as i32),
            nix::sys::signal::Signal::SIGHUP,
        )
        .unwrap();
        let msg = wait_ready(&mut buf);
        assert!(msg.contains("STATUS=listening"), "reload failed: {msg}");
        let took = t.elapsed();
        to_ready.push(took);
        // Probes that started from the signal to shortly after READY=1.
        std::thread::sleep(Duration::from_millis(100));
        let worst = samples
            .lock()
            .unwrap()
            .iter()
            .filter(|(at, _)| *at >= t && *at <= t + took + Duration::from_millis(50))
            .map(|(_, d)| *d)
            .max()
            .unwrap_or_default();
        longest_wait.push(worst);
    }
    stop.store(true, Ordering::Relaxed);
    prober.join().unwrap();
    let failures = failures.lock().unwrap();
    let listing = request(&addr, "GET", "/v1/acp", "");
    let running = listing.matches("\"status\":\"running\"").count();

    to_ready.sort();
    longest_wait.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    println!(
        "reload with {agents} agents and {processes} processes, {reloads} reloads \
         ({} probes, {} failed; {running} agents running after)",
        samples.lock().unwrap().len(),
        failures.len()
    );
    println!(
        "  SIGHUP -> READY=1: median {:.1} ms, max {:.1} ms",
        ms(percentile(&to_ready, 0.5)),
        ms(*to_ready.last().unwrap())
    );
    println!(
        "  longest client wait (fresh connection, GET /v1/health): median {:.1} ms, max {:.1} ms",
        ms(percentile(&longest_wait, 0.5)),
        ms(*longest_wait.last().unwrap())
    );
    assert!(failures.is_empty(), "probes failed: {failures:?}");
    assert_eq!(running, agents, "every agent still running");

    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let _ = child.wait();
}
