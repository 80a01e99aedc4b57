//! The harness: starts the real `sandbox-agent` binary on 127.0.0.1:0 with a NOTIFY_SOCKET the
//! test owns, waits for READY=1, learns the address from STATUS=, and on drop sends SIGTERM and
//! checks a clean exit (status 0). The binary-level tests talk HTTP to the real daemon through it;
//! route tests that need no process use `app::App` instead.

#![allow(dead_code)]

/// The in-process tier: the real router without a socket or a process of its own.
pub mod app;

use std::ffi::OsString;
use std::io::Read;
use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub const BIN: &str = env!("CARGO_BIN_EXE_sandbox-agent");

/// Polls `cond` until it returns `Some` or the deadline passes (never a fixed sleep).
pub fn eventually<T>(timeout: Duration, what: &str, mut cond: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = cond() {
            return v;
        }
        if Instant::now() > deadline {
            panic!("timed out after {timeout:?} waiting for {what}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Async flavour of [`eventually`].
pub async fn eventually_async<T, F, Fut>(timeout: Duration, what: &str, mut cond: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = cond().await {
            return v;
        }
        if Instant::now() > deadline {
            panic!("timed out after {timeout:?} waiting for {what}");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

pub struct DaemonBuilder {
    args: Vec<OsString>,
    envs: Vec<(OsString, OsString)>,
    token: Option<String>,
    expect_exit: Option<i32>,
    wrapper: Vec<OsString>,
    clear_env: bool,
    confine_to_work_dir: bool,
    data_dir: Option<PathBuf>,
    work_dir: Option<PathBuf>,
    stderr_unread: bool,
    any_user_bin: bool,
    binary: Option<PathBuf>,
}

impl Default for DaemonBuilder {
    fn default() -> Self {
        DaemonBuilder {
            args: Vec::new(),
            envs: Vec::new(),
            token: None,
            expect_exit: Some(0),
            wrapper: Vec::new(),
            clear_env: false,
            confine_to_work_dir: false,
            data_dir: None,
            work_dir: None,
            stderr_unread: false,
            any_user_bin: false,
            binary: None,
        }
    }
}

impl DaemonBuilder {
    pub fn arg(mut self, a: impl Into<OsString>) -> Self {
        self.args.push(a.into());
        self
    }

    pub fn args<I, S>(mut self, items: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<OsString>,
    {
        self.args.extend(items.into_iter().map(Into::into));
        self
    }

    pub fn env(mut self, k: impl Into<OsString>, v: impl Into<OsString>) -> Self {
        self.envs.push((k.into(), v.into()));
        self
    }

    /// Uses this data dir instead of a private one (e.g. an install cache shared by tests).
    pub fn data_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.data_dir = Some(dir.into());
        self
    }

    /// Uses this work dir instead of a private one (e.g. one that outlives a daemon restart).
    pub fn work_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.work_dir = Some(dir.into());
        self
    }

    /// Starts the daemon with this bearer token; `Daemon::client` then sends it.
    pub fn token(mut self, t: &str) -> Self {
        self.token = Some(t.to_string());
        self
    }

    /// The exit status `Drop` expects after SIGTERM; `None` skips the check.
    pub fn expect_exit(mut self, code: Option<i32>) -> Self {
        self.expect_exit = code;
        self
    }

    /// Runs the daemon under a wrapper command (e.g. `unshare --pid --fork --mount-proc`).
    /// Starts the daemon from `bin_for_any_user()`, for tests whose agents run as another user
    /// (the daemon starts the mock agent from its own executable).
    pub fn any_user_bin(mut self) -> Self {
        self.any_user_bin = true;
        self
    }

    pub fn wrapper<I, S>(mut self, items: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<OsString>,
    {
        self.wrapper.extend(items.into_iter().map(Into::into));
        self
    }

    /// The daemon's stderr becomes a pipe that nobody reads (the test keeps its read end open,
    /// so writes block once the pipe is full); `Daemon::stderr` is then empty.
    pub fn stderr_unread_pipe(mut self) -> Self {
        self.stderr_unread = true;
        self
    }

    /// Also passes `--fs-root <work dir>`: every filesystem path is confined to the test's
    /// private work directory.
    pub fn confine_to_work_dir(mut self) -> Self {
        self.confine_to_work_dir = true;
        self
    }

    /// Starts the daemon from this file instead of the built binary (e.g. a copy a test
    /// replaces, as a package upgrade would).
    pub fn binary(mut self, path: impl Into<PathBuf>) -> Self {
        self.binary = Some(path.into());
        self
    }

    pub fn start(self) -> Daemon {
        Daemon::start_with(self)
    }
}

pub struct Daemon {
    pub child: Option<Child>,
    pub addr: String,
    pub token: Option<String>,
    pub notify: UnixDatagram,
    pub dir: tempfile::TempDir,
    pub messages: Vec<String>,
    expect_exit: Option<i32>,
    stderr_path: PathBuf,
    data: PathBuf,
    work: PathBuf,
    /// The read end of an unread stderr pipe (`stderr_unread_pipe`), held open until drop.
    pub stderr_pipe: Option<std::os::fd::OwnedFd>,
}

impl Daemon {
    pub fn builder() -> DaemonBuilder {
        DaemonBuilder::default()
    }

    /// A daemon with the defaults (no token, port 0, a private data and work dir).
    pub fn start() -> Daemon {
        Self::builder().start()
    }

    fn start_with(b: DaemonBuilder) -> Daemon {
        let dir = tempfile::tempdir().expect("tempdir");
        let sock_path = dir.path().join("notify.sock");
        let notify = UnixDatagram::bind(&sock_path).expect("bind notify socket");
        notify
            .set_read_timeout(Some(Duration::from_millis(200)))
            .unwrap();
        let stderr_path = dir.path().join("daemon.stderr");
        let mut stderr_pipe = None;
        let stderr: Stdio = if b.stderr_unread {
            let (r, w) = nix::unistd::pipe().expect("pipe");
            stderr_pipe = Some(r);
            w.into()
        } else {
            std::fs::File::create(&stderr_path).unwrap().into()
        };
        let data = b
            .data_dir
            .clone()
            .unwrap_or_else(|| dir.path().join("data"));
        let work = b
            .work_dir
            .clone()
            .unwrap_or_else(|| dir.path().join("work"));
        std::fs::create_dir_all(&work).unwrap();

        let bin = if let Some(p) = &b.binary {
            p.as_path()
        } else if b.any_user_bin {
            bin_for_any_user()
        } else {
            Path::new(BIN)
        };
        let mut cmd = if b.wrapper.is_empty() {
            Command::new(bin)
        } else {
            let mut c = Command::new(&b.wrapper[0]);
            c.args(&b.wrapper[1..]).arg(bin);
            c
        };
        if b.clear_env {
            cmd.env_clear();
        }
        cmd.arg("server")
            .args(["--host", "127.0.0.1", "--port", "0"])
            .arg("--data-dir")
            .arg(&data)
            .arg("--work-dir")
            .arg(&work)
            .args(&b.args)
            .env("NOTIFY_SOCKET", &sock_path)
            .env("RUST_BACKTRACE", "1")
            .env_remove("SANDBOX_AGENT_TOKEN")
            .env_remove("LISTEN_FDS")
            .env_remove("LISTEN_PID")
            .env_remove("WATCHDOG_USEC")
            .env_remove("WATCHDOG_PID")
            .env_remove("JOURNAL_STREAM")
            .envs(b.envs.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(stderr);
        if let Some(t) = &b.token {
            cmd.arg("--token").arg(t);
        }
        if b.confine_to_work_dir {
            cmd.arg("--fs-root").arg(&work);
        }
        let child = cmd.spawn().expect("spawn sandbox-agent");
        let mut daemon = Daemon {
            child: Some(child),
            addr: String::new(),
            token: b.token,
            notify,
            dir,
            messages: Vec::new(),
            expect_exit: b.expect_exit,
            stderr_path,
            data,
            work,
            stderr_pipe,
        };
        daemon.addr = daemon.wait_ready();
        daemon
    }

    /// Waits for READY=1 and returns the address named by STATUS=.
    fn wait_ready(&mut self) -> String {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            for msg in self.read_notify() {
                if msg.lines().any(|l| l == "READY=1") {
                    let status = msg
                        .lines()
                        .find_map(|l| l.strip_prefix("STATUS="))
                        .unwrap_or_else(|| panic!("READY=1 without STATUS=: {msg:?}"));
                    let addr = status
                        .split("http://")
                        .nth(1)
                        .unwrap_or_else(|| panic!("STATUS= names no address: {status:?}"));
                    return addr.trim().to_string();
                }
            }
            if let Some(status) = self.child.as_mut().unwrap().try_wait().unwrap() {
                panic!(
                    "daemon exited before READY ({status}); stderr:\n{}",
                    self.stderr()
                );
            }
            if Instant::now() > deadline {
                panic!("no READY=1 within 20 s; stderr:\n{}", self.stderr());
            }
        }
    }

    /// Reads the notifications that arrive within about 200 ms (bounded even when the daemon
    /// keeps sending, e.g. watchdog pings).
    pub fn read_notify(&mut self) -> Vec<String> {
        let mut out = Vec::new();
        let mut buf = [0u8; 4096];
        let until = Instant::now() + Duration::from_millis(200);
        while Instant::now() < until {
            let Ok(n) = self.notify.recv(&mut buf) else {
                break;
            };
            let msg = String::from_utf8_lossy(&buf[..n]).into_owned();
            self.messages.push(msg.clone());
            out.push(msg);
        }
        out
    }

    /// Waits until a notification containing `line` (e.g. `STOPPING=1`) arrives.
    pub fn wait_notify(&mut self, line: &str, timeout: Duration) -> String {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(m) = self.messages.iter().find(|m| m.lines().any(|l| l == line)) {
                return m.clone();
            }
            self.read_notify();
            if Instant::now() > deadline {
                panic!("no {line} within {timeout:?}; got {:?}", self.messages);
            }
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{}", self.addr, path)
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().unwrap().id()
    }

    pub fn work_dir(&self) -> PathBuf {
        self.work.clone()
    }

    pub fn data_dir(&self) -> PathBuf {
        self.data.clone()
    }

    pub fn stderr(&self) -> String {
        let mut s = String::new();
        if let Ok(mut f) = std::fs::File::open(&self.stderr_path) {
            let _ = f.read_to_string(&mut s);
        }
        s
    }

    /// A reqwest client that sends the daemon's token, if any.
    pub fn client(&self) -> reqwest::Client {
        sandbox_agent::install_crypto_provider();
        let mut headers = reqwest::header::HeaderMap::new();
        if let Some(t) = &self.token {
            headers.insert(
                reqwest::header::AUTHORIZATION,
                format!("Bearer {t}").parse().unwrap(),
            );
        }
        reqwest::Client::builder()
            .default_headers(headers)
            .no_proxy()
            .build()
            .unwrap()
    }

    /// `GET path` (with the token), its body parsed as JSON; panics on a transport error or a
    /// body that is not JSON.
    pub async fn get_json(&self, path: &str) -> serde_json::Value {
        self.client()
            .get(self.url(path))
            .send()
            .await
            .unwrap_or_else(|e| panic!("GET {path}: {e}"))
            .json()
            .await
            .unwrap_or_else(|e| panic!("GET {path} is not JSON: {e}"))
    }

    /// `POST path` with a JSON body; the answer's JSON (whatever the status).
    pub async fn post_json(&self, path: &str, body: &serde_json::Value) -> serde_json::Value {
        self.client()
            .post(self.url(path))
            .json(body)
            .send()
            .await
            .unwrap_or_else(|e| panic!("POST {path}: {e}"))
            .json()
            .await
            .unwrap_or_else(|e| panic!("POST {path} is not JSON: {e}"))
    }

    /// The rows of `GET /v1/acp`.
    pub async fn servers(&self) -> Vec<serde_json::Value> {
        self.get_json("/v1/acp").await["servers"]
            .as_array()
            .expect("a list of servers")
            .clone()
    }

    /// Sends `sig` to the daemon process.
    pub fn signal(&self, sig: nix::sys::signal::Signal) {
        let pid = nix::unistd::Pid::from_raw(self.pid() as i32);
        nix::sys::signal::kill(pid, sig).expect("signal daemon");
    }

    /// SIGTERM, then the exit status (code, or 128+signal) within `timeout`.
    pub fn stop(&mut self, timeout: Duration) -> i32 {
        if let Some(child) = &self.child {
            let pid = nix::unistd::Pid::from_raw(child.id() as i32);
            let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
        }
        self.wait_exit(timeout, "SIGTERM")
    }

    /// Waits for an exit already asked for (a stop signal sent by the test: a second one from
    /// `stop` would be the emergency exit). Kills the daemon and panics after `timeout`.
    pub fn wait_exit(&mut self, timeout: Duration, since: &str) -> i32 {
        let Some(mut child) = self.child.take() else {
            return 0;
        };
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = child.try_wait().unwrap() {
                use std::os::unix::process::ExitStatusExt;
                return status
                    .code()
                    .unwrap_or_else(|| 128 + status.signal().unwrap_or(0));
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                panic!(
                    "daemon did not exit within {timeout:?} of {since}; stderr:\n{}",
                    self.stderr()
                );
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    pub fn path(&self, p: &str) -> PathBuf {
        Path::new(&self.work_dir()).join(p)
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if self.child.is_none() {
            return;
        }
        let code = self.stop(Duration::from_secs(30));
        if let Some(expected) = self.expect_exit
            && code != expected
            && !std::thread::panicking()
        {
            panic!(
                "daemon exited with {code}, expected {expected}; stderr:\n{}",
                self.stderr()
            );
        }
    }
}

/// True when this process may do what root can (cgroups, namespaces).
pub fn is_root() -> bool {
    nix::unistd::geteuid().is_root()
}

/// The daemon's binary at a path any user can execute, for tests that run it (or the mock agent
/// it starts from its own executable) as uid 65534. That is `BIN` itself when every directory
/// above it lets others through; a fresh clone under `/root` (mode 0700) does not, so then it is
/// a copy in `$TMPDIR/sandbox-agent-any-user-<uid>-<hash of BIN's path>/`: one per checkout,
/// replaced (by rename) once per test run, so concurrent runs of one build share it.
pub fn bin_for_any_user() -> &'static Path {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    static COPY: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    COPY.get_or_init(|| {
        let bin = Path::new(BIN);
        let reachable = bin
            .ancestors()
            .skip(1)
            .all(|dir| std::fs::metadata(dir).is_ok_and(|m| m.permissions().mode() & 0o001 != 0));
        if reachable {
            return bin.to_path_buf();
        }
        let key = BIN.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
        });
        let uid = nix::unistd::geteuid();
        let dir = std::env::temp_dir().join(format!("sandbox-agent-any-user-{uid}-{key:016x}"));
        match std::fs::create_dir(&dir) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => panic!("create {}: {e}", dir.display()),
        }
        // In a world-writable TMPDIR the directory must be ours, or someone else chose the binary.
        let meta = std::fs::symlink_metadata(&dir).expect("stat the copy's directory");
        assert!(
            meta.is_dir() && meta.uid() == uid.as_raw(),
            "{} is not a directory of ours",
            dir.display()
        );
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        let copy = dir.join("sandbox-agent");
        let part = dir.join(format!("sandbox-agent.{}", std::process::id()));
        std::fs::copy(bin, &part).expect("copy the daemon binary");
        std::fs::set_permissions(&part, std::fs::Permissions::from_mode(0o755)).unwrap();
        std::fs::rename(&part, &copy).expect("install the daemon binary copy");
        copy
    })
}

/// Held while something builds or runs the TypeScript SDK's `dist/` (`tsc -b`): the SDK suite
/// (sdk.rs) and the provider suites (providers.rs) must not rewrite it under each other.
pub static SDK_BUILD: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Says why a test is skipped (the test then returns early). A skip must never pass unseen:
/// with `SANDBOX_AGENT_TESTS_STRICT=1` (set by `.ci/run`, which installs every tool the tests
/// need) a skip fails the test; otherwise `SKIPPED: <test>: <reason>` goes to the real stderr —
/// written to the descriptor, not through `eprintln!`, which the test harness captures and shows
/// only for failures — so it stands in cargo's own output next to the `... ok` that cargo
/// counts as passed; and the line is appended to `target/skipped-tests.txt` (or
/// `$SANDBOX_AGENT_SKIP_REPORT`), which the test runner script prints at the end.
pub fn skip(reason: &str) {
    let test = std::thread::current()
        .name()
        .unwrap_or("unnamed test")
        .to_string();
    if std::env::var_os("SANDBOX_AGENT_TESTS_STRICT").is_some_and(|v| v != "0" && !v.is_empty()) {
        panic!("{test} would be skipped, but SANDBOX_AGENT_TESTS_STRICT is set: {reason}");
    }
    {
        use std::io::Write;
        let _ = std::io::stderr().write_all(format!("SKIPPED: {test}: {reason}\n").as_bytes());
    }
    let report = std::env::var_os("SANDBOX_AGENT_SKIP_REPORT")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("target/skipped-tests.txt"));
    if let Ok(mut f) = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(report)
    {
        use std::io::Write;
        let _ = writeln!(f, "{test}: {reason}");
    }
}

/// Every process below `pid` (children, their children, ...), found iteratively.
pub fn descendants(pid: u32) -> Vec<u32> {
    let mut out = Vec::new();
    let mut stack = vec![pid];
    while let Some(p) = stack.pop() {
        // The daemon's idle warm-spawn stubs belong to no agent or process yet.
        for c in children_of(p).into_iter().filter(|c| !is_idle_stub(*c)) {
            out.push(c);
            stack.push(c);
        }
    }
    out
}

/// True for a warm-spawn stub still waiting to exec (`sandbox-agent spawn-stub <fd>`): once it
/// execs a program its command line is the program's.
pub fn is_idle_stub(pid: u32) -> bool {
    std::fs::read(format!("/proc/{pid}/cmdline"))
        .is_ok_and(|c| c.split(|b| *b == 0).nth(1) == Some(b"spawn-stub".as_slice()))
}

/// True when `cmd` is an executable file in a directory of PATH.
pub fn on_path(cmd: &str) -> bool {
    std::env::var_os("PATH")
        .is_some_and(|p| std::env::split_paths(&p).any(|d| d.join(cmd).is_file()))
}

/// Every pid whose /proc/<pid>/stat says it is a zombie (`Z`), among `pids`.
pub fn zombies_among(pids: &[u32]) -> Vec<u32> {
    pids.iter()
        .copied()
        .filter(|p| {
            std::fs::read_to_string(format!("/proc/{p}/stat"))
                .ok()
                .and_then(|s| s.rsplit_once(") ").map(|(_, rest)| rest.starts_with('Z')))
                .unwrap_or(false)
        })
        .collect()
}

/// True while /proc/<pid> exists and is not a zombie.
pub fn pid_alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(s) => !s
            .rsplit_once(") ")
            .is_some_and(|(_, rest)| rest.starts_with('Z')),
        Err(_) => false,
    }
}

/// Open descriptors of `pid`, sockets included.
pub fn open_fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |d| d.count())
}

/// Open descriptors of `pid` other than sockets (a test's own connections come and go).
pub fn open_fds_but_sockets(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| {
            d.flatten()
                .filter(|e| {
                    std::fs::read_link(e.path())
                        .is_ok_and(|t| !t.to_string_lossy().starts_with("socket:"))
                })
                .count()
        })
        .unwrap_or(0)
}

/// The children of `pid`: every process whose /proc/<n>/stat names `pid` as its parent.
///
/// Not /proc/<pid>/task/*/children: that lists each thread's own children, and when a thread
/// that started children ends (the mock runs each prompt on a thread of its own) they move to
/// another thread, so a scan that races the move misses them.
pub fn children_of(pid: u32) -> Vec<u32> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let mut out: Vec<u32> = dir
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|n| {
            std::fs::read_to_string(format!("/proc/{n}/stat"))
                .ok()
                .and_then(|s| {
                    let rest = s.rsplit_once(") ")?.1;
                    rest.split_whitespace().nth(1)?.parse::<u32>().ok()
                })
                == Some(pid)
        })
        .collect();
    out.sort_unstable();
    out
}

/// A plain HTTP client (no token), with the TLS provider installed.
pub fn http() -> reqwest::Client {
    sandbox_agent::install_crypto_provider();
    reqwest::Client::builder().no_proxy().build().unwrap()
}
