//! Helpers every benchmark uses (`mod common;` in each bench; not a bench itself: the manifest
//! sets `autobenches = false`). A bench that does not use one of them must not warn about it.
#![allow(dead_code)]

use std::time::Duration;

/// The environment variable `name` parsed, or `default` when unset or unparsable.
pub fn knob<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// A loopback port free at the time of asking.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// The `p` quantile (0..=1) of `sorted`, nearest rank; zero for no samples.
pub fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

/// The daemon binary to drive: `SANDBOX_AGENT_BIN` when set (the A/B harness, `benches/ab.sh`,
/// points it at the previous build), else `built`, the one cargo built with the bench.
pub fn daemon_bin(built: &str) -> String {
    std::env::var("SANDBOX_AGENT_BIN").unwrap_or_else(|_| built.to_string())
}

/// Whether `bin server --help` lists `flag` (an older build, driven by the A/B harness, may
/// predate it; a bench then leaves the flag out).
pub fn knows_flag(bin: &str, flag: &str) -> bool {
    std::process::Command::new(bin)
        .args(["server", "--help"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).contains(flag))
        .unwrap_or(false)
}

/// One figure for the A/B harness, higher is better (a rate; latencies are given as their
/// inverse), with the physical reference it was measured against in the same run, if any.
/// Printed only when `BENCH_AB` is set, as `AB<TAB>name<TAB>value<TAB>ref name<TAB>ref value`.
pub fn ab_figure(name: &str, value: f64, reference: Option<(&str, f64)>) {
    if std::env::var_os("BENCH_AB").is_none() || !value.is_finite() {
        return;
    }
    match reference {
        Some((r, v)) if v.is_finite() && v > 0.0 => println!("AB\t{name}\t{value}\t{r}\t{v}"),
        _ => println!("AB\t{name}\t{value}\t-\t0"),
    }
}

/// A daemon (or any child) stopped when the bench ends or panics: SIGTERM first (the daemon stops
/// every agent tree), SIGKILL only if it has not exited within `grace`.
pub struct Stopping {
    pub child: std::process::Child,
    pub grace: Duration,
}

impl Stopping {
    /// `child` with the usual 30 s grace.
    pub fn new(child: std::process::Child) -> Stopping {
        Stopping {
            child,
            grace: Duration::from_secs(30),
        }
    }

    pub fn id(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for Stopping {
    fn drop(&mut self) {
        let pid = nix::unistd::Pid::from_raw(self.child.id() as i32);
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
        let deadline = std::time::Instant::now() + self.grace;
        while std::time::Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A process's resident memory (`VmRSS`, KiB); 0 when it cannot be read.
pub fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse().ok())
        })
        .unwrap_or(0)
}
