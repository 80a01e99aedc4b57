//! In-place reload: on SIGHUP (`systemctl reload`) the daemon checks the binary at the path it
//! was started from, quiesces HTTP, writes every running agent and process, its event or output
//! log, the listening socket and the cgroups into a versioned hand-off in a memfd, and `execve`s
//! that binary with its original arguments. The pid does not change, so every child is still
//! ours; the new image reads the hand-off (`receive`), adopts the children on the same pipes and
//! serves on the same socket. Until the quiesce begins nothing has changed, so every failure
//! there (a broken config, a missing binary, an unknown state version) leaves the old image
//! serving.
//!
//! The hand-off is JSON in a memfd whose descriptor number reaches the new image in one
//! variable (`config::HANDOFF_FD_VAR`, removed from the environment at once); the token given by
//! flag or environment travels inside it, never in argv or the environment.

use std::collections::BTreeSet;
use std::ffi::{CString, OsString};
use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use nix::fcntl::{FcntlArg, FdFlag, fcntl};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::acp::AcpState;
use crate::config::HANDOFF_FD_VAR;
use crate::http::AppState;
use crate::processes::ProcessesState;
use crate::supervisor::CgroupsState;

mod memory;
mod waiter;
mod wire;
pub use waiter::{INIT_COMM, Outcome, Waiters, tell, tell_legacy_ready, wait_main};
pub use wire::{HandoffError, HexPayload, Payload};

/// The version of the hand-off this binary writes. 3: the bulk (events, output) travels as raw
/// records beside a small JSON head (`wire.rs`); 2: RFD connections are carried
/// (`connections`); versions 1 and 2 (one JSON document) are still read.
pub const STATE_VERSION: u32 = 3;
/// The oldest version this binary reads (a newer binary must read the previous one's state).
pub const OLDEST_ACCEPTED: u32 = 1;

/// How long a reload waits for requests in flight (and connections to close) before the exec.
pub const DRAIN: Duration = Duration::from_secs(5);
/// How long the answers of the requests a reload cuts (a `processes/run`) may take to go out.
const CUT_ANSWERS: Duration = Duration::from_secs(2);
/// How long the new binary's check may take.
const CHECK_TIMEOUT: Duration = Duration::from_secs(10);

pub fn accepts(version: u32) -> bool {
    (OLDEST_ACCEPTED..=STATE_VERSION).contains(&version)
}

/// Everything the new image takes over.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, PartialEq)]
pub struct Handoff {
    pub version: u32,
    /// The token given by `--token` or `SANDBOX_AGENT_TOKEN` (the file's is read again).
    pub token: Option<String>,
    pub listener_fd: i32,
    /// A stop signal arrived after the point of no return: the new image stops at once.
    pub stop_requested: bool,
    pub cgroups: CgroupsState,
    pub acp: AcpState,
    /// The RFD connections on carried instances (version 2).
    #[serde(default)]
    pub connections: Vec<crate::acp::connection::ConnectionState>,
    pub processes: ProcessesState,
    /// Every descriptor kept across the exec (the new image closes what it does not take).
    pub fds: Vec<i32>,
    /// The tickets of the `sandbox-agent reload` commands waiting for the outcome (the new
    /// image tells them `ready`).
    #[serde(default)]
    pub waiters: Vec<u64>,
    /// How many payload records are beside the head (version 3).
    #[serde(default)]
    pub payloads: u64,
}

impl Handoff {
    /// Parses a JSON hand-off (a version-3 head, or a whole version-1/2 document), refusing a
    /// version this binary does not read.
    pub fn from_json(bytes: &[u8]) -> Result<Handoff, HandoffError> {
        #[derive(serde::Deserialize)]
        struct Head {
            version: u32,
        }
        let head: Head = serde_json::from_slice(bytes).map_err(HandoffError::Parse)?;
        if !accepts(head.version) {
            return Err(HandoffError::Version(
                head.version,
                OLDEST_ACCEPTED,
                STATE_VERSION,
            ));
        }
        serde_json::from_slice(bytes).map_err(HandoffError::Parse)
    }
}

/// How the daemon was started: what a reload executes again.
#[derive(Debug, Clone)]
pub struct Launch {
    /// The path the binary was started from (resolved at start; a package upgrade replaces
    /// the file there).
    pub exe: PathBuf,
    /// The arguments without the token (`--token X`, `--token=X`).
    pub argv: Vec<OsString>,
    /// The environment without the token.
    pub env: Vec<(OsString, OsString)>,
}

impl Launch {
    /// Captures argv and the environment; call at the top of `main`, before the token is
    /// overwritten in the process's memory.
    pub fn capture() -> Launch {
        let argv: Vec<OsString> = std::env::args_os().collect();
        Launch {
            exe: started_as(argv.first()),
            argv: strip_token(argv),
            env: crate::config::launch_env(),
        }
    }
}

/// The path the binary was started as: `argv[0]` (made absolute; looked up in `PATH` when it has
/// no slash) when that path is, at this moment, the file running — so that a symlink a package
/// repoints (`/usr/bin/sandbox-agent` → `…/v2`) is followed again at the next reload. Otherwise
/// (an `argv[0]` that names something else) the resolved `/proc/self/exe`.
fn started_as(argv0: Option<&OsString>) -> PathBuf {
    use std::os::unix::fs::MetadataExt;
    let resolved = std::env::current_exe()
        .map(
            |p| match p.as_os_str().as_bytes().strip_suffix(b" (deleted)") {
                Some(rest) => PathBuf::from(std::ffi::OsStr::from_bytes(rest)),
                None => p,
            },
        )
        .unwrap_or_else(|_| PathBuf::from("/proc/self/exe"));
    let Some(argv0) = argv0.map(PathBuf::from) else {
        return resolved;
    };
    let candidates: Vec<PathBuf> = if argv0.as_os_str().as_bytes().contains(&b'/') {
        match std::env::current_dir() {
            Ok(cwd) => vec![cwd.join(&argv0)],
            Err(_) => vec![argv0],
        }
    } else {
        std::env::var_os("PATH")
            .map(|p| std::env::split_paths(&p).map(|d| d.join(&argv0)).collect())
            .unwrap_or_default()
    };
    let Ok(running) = std::fs::metadata("/proc/self/exe") else {
        return resolved;
    };
    candidates
        .into_iter()
        .filter(|c| c.is_absolute())
        .find(|c| {
            std::fs::metadata(c).is_ok_and(|m| m.dev() == running.dev() && m.ino() == running.ino())
        })
        .unwrap_or(resolved)
}

fn strip_token(argv: Vec<OsString>) -> Vec<OsString> {
    let mut out = Vec::with_capacity(argv.len());
    let mut skip = false;
    for a in argv {
        if std::mem::take(&mut skip) {
            continue;
        }
        if a == "--" {
            out.push(a);
            continue;
        }
        if a == "--token" {
            skip = true;
            continue;
        }
        if a.as_bytes().starts_with(b"--token=") {
            continue;
        }
        out.push(a);
    }
    out
}

/// What a reload needs from the running daemon.
pub struct Reloading<'a> {
    pub launch: &'a Launch,
    pub token: Option<&'a str>,
    pub state: &'a AppState,
    pub listener: &'a Arc<TcpListener>,
    /// Cancelled to quiesce: the accept loop stops, connections finish, streams end.
    pub drain: &'a CancellationToken,
    pub server: &'a mut Option<tokio::task::JoinHandle<()>>,
    pub tasks: &'a TaskTracker,
    pub root: &'a CancellationToken,
    /// Held from the last check of `root` to the exec, so that no stop signal is lost between.
    pub signals: &'a crate::daemon::signals::Gate,
    /// The `sandbox-agent reload` commands waiting for the outcome.
    pub waiters: &'a Waiters,
}

/// Why a reload was refused: nothing changed, the old image serves on. Each message names the
/// problem (and a configuration error its file, line and column), never a line of the file.
#[derive(Debug, thiserror::Error)]
pub enum Refusal {
    #[error("the new binary {exe} cannot run: {source}")]
    CannotRun {
        exe: PathBuf,
        #[source]
        source: crate::supervisor::ToolError,
    },
    #[error("the new binary {exe} does not read this state (version {STATE_VERSION})")]
    StateVersion { exe: PathBuf },
    #[error("the configuration is not valid: {}", .0.join("; "))]
    Config(Vec<String>),
    #[error(
        "the configuration is not valid (run `{exe} reload-check -- <the daemon's arguments>` \
         as the daemon's user to see why)"
    )]
    ConfigUnexplained { exe: PathBuf },
    #[error("the new binary {exe}'s check failed ({status})")]
    CheckFailed {
        exe: PathBuf,
        status: std::process::ExitStatus,
    },
    #[error("the daemon is stopping")]
    Stopping,
    #[error(transparent)]
    NoRoom(#[from] memory::NoRoom),
    #[error("cannot create the hand-off memfd: {0}")]
    Memfd(#[source] std::io::Error),
}

/// Why a reload failed past the point of no return: the daemon stops gracefully.
#[derive(Debug, thiserror::Error)]
pub enum Fatal {
    #[error("cannot write the hand-off: {0}")]
    Export(#[source] std::io::Error),
    #[error("cannot write the hand-off: {0}")]
    Write(#[from] HandoffError),
    #[error("cannot keep a descriptor across the exec: {0}")]
    KeepFd(#[source] nix::Error),
    #[error("cannot execute {exe}: {source}")]
    Exec {
        exe: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// Why a reload did not happen.
pub enum Failed {
    /// Nothing changed: the old image serves on.
    Refused(Refusal),
    /// Past the quiesce: the daemon cannot go on serving and stops gracefully.
    Fatal(Fatal),
}

/// Runs the reload; returns only when it did not happen (an exec that succeeds never returns).
pub async fn reload(r: Reloading<'_>) -> Failed {
    let started = std::time::Instant::now();
    crate::daemon::systemd::notify_reloading();
    tracing::info!(exe = %r.launch.exe.display(), "reload requested: checking the new binary");
    if let Err(why) = check(r.launch, r.token.is_some()).await {
        return Failed::Refused(why);
    }
    if r.root.is_cancelled() {
        return Failed::Refused(Refusal::Stopping);
    }
    // What the hand-off will hold must fit in the memory the daemon may still use: the old
    // image frees each payload as it writes it, but the worst case (nothing handed back) is
    // what is checked.
    let needed = r.state.acp.handoff_bytes() + r.state.processes.handoff_bytes();
    if let Err(why) = memory::check(needed) {
        return Failed::Refused(why.into());
    }
    let memfd = match memfd() {
        Ok(f) => f,
        Err(e) => return Failed::Refused(Refusal::Memfd(e)),
    };
    // Point of no return: from here on the old image stops serving.
    crate::daemon::systemd::notify_watchdog();
    r.state.acp.begin_handoff();
    r.drain.cancel();
    if let Some(server) = r.server.take() {
        let _ = server.await;
    }
    r.tasks.close();
    if tokio::time::timeout(DRAIN, r.tasks.wait()).await.is_err() {
        // A `processes/run` still going is stopped and answered with a problem that says so
        // (not as if its program had died of a signal); a short wait lets those answers out.
        r.state.processes.cut_runs();
        let _ = tokio::time::timeout(CUT_ANSWERS, r.tasks.wait()).await;
        tracing::warn!(
            open = r.tasks.len(),
            "reload: requests still in flight after the drain; their connections are cut"
        );
    }
    r.state.supervisor.close_warm().await;
    // Uploads the drain cut leave no temporary in the user's tree (no destructor runs at exec).
    let cut = crate::sys::blocking(crate::files::remove_live_temporaries).await;
    if cut > 0 {
        tracing::warn!(
            removed = cut,
            "reload: removed the temporaries of transfers it cut"
        );
    }
    let mut keep: Vec<OwnedFd> = Vec::new();
    let mut handoff = match export(&r, &mut keep).await {
        Ok(h) => h,
        Err(e) => return Failed::Fatal(Fatal::Export(e)),
    };
    // With a state dir, what its writer still holds reaches the disk before the exec ends the
    // writer thread (the new image appends after it). After the export: the readers are frozen,
    // so nothing they push is left behind in memory only.
    if let Some(store) = r.state.state.clone() {
        crate::sys::blocking(move || store.flush_blocking(Duration::from_secs(2))).await;
    }
    let opencode = r.state.opencode.clone();
    crate::sys::blocking(move || opencode.flush_blocking(Duration::from_secs(2))).await;
    let carried = (
        handoff.acp.instances.len(),
        handoff.processes.processes.len(),
    );
    // The bulk is written now (raw records, each freed once written); the head is written again
    // below once the signal thread is held. A failure here stops the daemon; it never execs a
    // hand-off the new image could not read.
    let write_started = std::time::Instant::now();
    let written = match wire::write(&mut handoff, &memfd) {
        Ok(w) => w,
        Err(e) => return Failed::Fatal(e.into()),
    };
    for fd in keep.iter().map(|f| f.as_fd()).chain([memfd.as_fd()]) {
        if let Err(e) = fcntl(fd, FcntlArg::F_SETFD(FdFlag::empty())) {
            return Failed::Fatal(Fatal::KeepFd(e));
        }
    }
    tracing::info!(
        agents = carried.0,
        processes = carried.1,
        payloads = written.payloads,
        handoff_bytes = written.payload_bytes + written.head_bytes,
        write_ms = write_started.elapsed().as_millis() as u64,
        quiesce_ms = started.elapsed().as_millis() as u64,
        "reload: executing the new image"
    );
    crate::daemon::systemd::notify_watchdog();
    // The log writer is a thread the exec ends: what it still holds (this line included) is
    // written first.
    // So is the trace exporter's batch: the spans of the requests just served go out now.
    crate::sys::blocking(|| {
        crate::telemetry::flush(Duration::from_secs(1));
        crate::logging::flush(Duration::from_millis(500))
    })
    .await;
    // From here no signal is read: a stop signal stays pending and reaches the new image. One
    // read before the hold has cancelled `root` already, and the hand-off says so. The hold is a
    // hop to the signal thread and back; the runtime has nothing left to serve meanwhile.
    let held = r.signals.hold();
    if let Err(e) = &held {
        tracing::warn!(error = %e, "reload: cannot hold the signal thread; a stop signal sent during the exec may be lost");
    }
    let release = || {
        if held.is_ok() {
            r.signals.release();
        }
    };
    handoff.stop_requested = r.root.is_cancelled();
    // No SIGHUP is read from here on: every waiter registered so far is told by the new image.
    handoff.waiters = r.waiters.take();
    if let Err(e) = wire::write_head(&handoff, &memfd, &written) {
        release();
        r.waiters.add_all(&handoff.waiters);
        return Failed::Fatal(e.into());
    }
    if let Some(pause) = crate::config::test_hooks::reload_pause() {
        // Debug builds only: the window in which a stop signal must stay pending.
        std::thread::sleep(pause);
    }
    let e = exec(r.launch, memfd.as_raw_fd());
    release();
    Failed::Fatal(Fatal::Exec {
        exe: r.launch.exe.clone(),
        source: e,
    })
}

async fn export(r: &Reloading<'_>, keep: &mut Vec<OwnedFd>) -> std::io::Result<Handoff> {
    // From here on a child that ends stays a zombie: a carried one for the new image to see and
    // reap (its pid must not be reused meanwhile), the others reaped just below.
    r.state.supervisor.hold_reaps();
    let listener = r.listener.as_fd().try_clone_to_owned()?;
    let listener_fd = listener.as_raw_fd();
    keep.push(listener);
    let cgroups = r.state.supervisor.handoff_cgroups(keep)?;
    let acp = r.state.acp.export(keep).await;
    let connections = r.state.connections.export(&acp);
    let processes = r.state.processes.export(keep).await?;
    let carried: Vec<u32> = acp
        .instances
        .iter()
        .map(|i| i.child.pid)
        .chain(processes.processes.iter().map(|p| p.child.pid))
        .collect();
    r.state
        .supervisor
        .kill_uncarried(&carried, Duration::from_secs(2))
        .await;
    r.state.supervisor.reap_held_except(&carried);
    Ok(Handoff {
        version: STATE_VERSION,
        token: r.token.map(str::to_string),
        listener_fd,
        // Set by `reload` once the signal thread is held (no stop signal read after that).
        stop_requested: false,
        cgroups,
        acp,
        connections,
        processes,
        fds: keep.iter().map(|f| f.as_raw_fd()).collect(),
        waiters: Vec::new(),
        payloads: 0,
    })
}

/// Runs `<exe> reload-check` with the daemon's own arguments and environment: it loads the
/// configuration as the new image would and says whether it reads this state version.
async fn check(launch: &Launch, with_token: bool) -> Result<(), Refusal> {
    let mut cmd = tokio::process::Command::new(&launch.exe);
    cmd.arg("reload-check")
        .arg("--state-version")
        .arg(STATE_VERSION.to_string());
    if with_token {
        cmd.arg("--with-token");
    }
    cmd.arg("--")
        .args(launch.argv.iter().skip(1))
        .env_clear()
        .envs(launch.env.iter().cloned());
    let out = crate::supervisor::run_to_completion(cmd, CHECK_TIMEOUT)
        .await
        .map_err(|source| Refusal::CannotRun {
            exe: launch.exe.clone(),
            source,
        })?;
    if out.status.success() {
        return Ok(());
    }
    // The check's stderr is never forwarded: a binary that quotes the configuration (an older
    // one quoted the offending TOML line, `token = "…` included) would leak it to the waiter and
    // the log. Only the problems it lists on stdout, already without values, are said.
    let problems = serde_json::from_slice::<CheckReport>(&out.stdout)
        .map(|r| r.problems)
        .unwrap_or_default()
        .into_iter()
        .map(|p| redact_values(&p))
        .collect::<Vec<_>>();
    let exe = launch.exe.clone();
    Err(match out.status.code() {
        Some(65) => Refusal::StateVersion { exe },
        Some(78) if !problems.is_empty() => Refusal::Config(problems),
        Some(78) => Refusal::ConfigUnexplained { exe },
        _ => Refusal::CheckFailed {
            exe,
            status: out.status,
        },
    })
}

/// What `reload-check` prints on stdout when the configuration is refused.
#[derive(serde::Serialize, serde::Deserialize)]
struct CheckReport {
    problems: Vec<String>,
}

/// A configuration error as a refusal may say it: every `quoted` piece that is not a setting's
/// name (a value, a piece of the file) becomes `…`; the file, line and column stay.
fn redact_values(msg: &str) -> String {
    let mut out = String::with_capacity(msg.len());
    let mut parts = msg.split('`');
    if let Some(first) = parts.next() {
        out.push_str(first);
    }
    let rest: Vec<&str> = parts.collect();
    // Pieces alternate: inside a quote, outside, inside, …; an unpaired last quote is dropped.
    let mut i = 0;
    while i < rest.len() {
        let inside = rest[i];
        if i + 1 < rest.len() {
            out.push('`');
            out.push_str(if crate::config::is_setting_name(inside) {
                inside
            } else {
                "…"
            });
            out.push('`');
            out.push_str(rest[i + 1]);
        }
        i += 2;
    }
    // Controls (a newline could start a line of the file) are dropped; long output is cut.
    out.chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .take(600)
        .collect()
}

/// `sandbox-agent reload-check`: loads the configuration from `args` as the daemon would and
/// checks the state version. Exit 0: fine; 65: version not read; 78: configuration; 64: usage.
pub fn check_main(
    state_version: u32,
    with_token: bool,
    args: Vec<OsString>,
) -> std::process::ExitCode {
    use clap::Parser;
    if !accepts(state_version) {
        eprintln!(
            "state version {state_version} is not read by this binary ({OLDEST_ACCEPTED}..={STATE_VERSION})"
        );
        return std::process::ExitCode::from(65);
    }
    let argv = std::iter::once(OsString::from("sandbox-agent")).chain(args);
    let cli = match crate::cli::Cli::try_parse_from(argv) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("{e}");
            return std::process::ExitCode::from(64);
        }
    };
    let mut server = match cli.command {
        Some(crate::cli::Command::Server(a)) => *a,
        None => cli.server.0,
        Some(_) => {
            eprintln!("the daemon's arguments do not start a server");
            return std::process::ExitCode::from(64);
        }
    };
    if with_token && server.token.is_none() {
        // Stands for the carried token, whose value is never passed to this check.
        server.token = Some("carried".into());
    }
    match crate::config::Config::load(&server) {
        Ok(_) => {
            println!(
                "{{\"version\":\"{}\",\"stateVersions\":[{OLDEST_ACCEPTED},{STATE_VERSION}]}}",
                env!("CARGO_PKG_VERSION")
            );
            std::process::ExitCode::SUCCESS
        }
        Err(e) => {
            // The full text for a person running the check; the daemon reads only stdout.
            eprint!("{e}");
            let report = CheckReport {
                problems: e.0.iter().map(|p| redact_values(&p.to_string())).collect(),
            };
            if let Ok(json) = serde_json::to_string(&report) {
                println!("{json}");
            }
            std::process::ExitCode::from(78)
        }
    }
}

fn memfd() -> std::io::Result<std::fs::File> {
    crate::sys::memfd("sandbox-agent-handoff")
}

/// Executes the new image; returns only on failure. The stop and reload signals are blocked in
/// every thread (`signals::block`): one that arrives during the exec stays pending for the new
/// image.
fn exec(launch: &Launch, handoff_fd: RawFd) -> std::io::Error {
    let cstr = |b: &[u8]| CString::new(b).map_err(|_| std::io::Error::other("NUL in argument"));
    let prepared = (|| -> std::io::Result<(CString, Vec<CString>, Vec<CString>)> {
        let path = cstr(launch.exe.as_os_str().as_bytes())?;
        let argv = launch
            .argv
            .iter()
            .map(|a| cstr(a.as_bytes()))
            .collect::<Result<Vec<_>, _>>()?;
        let mut env = Vec::with_capacity(launch.env.len() + 1);
        for (k, v) in &launch.env {
            let mut kv = k.as_bytes().to_vec();
            kv.push(b'=');
            kv.extend_from_slice(v.as_bytes());
            env.push(cstr(&kv)?);
        }
        env.push(cstr(format!("{HANDOFF_FD_VAR}={handoff_fd}").as_bytes())?);
        Ok((path, argv, env))
    })();
    let (path, argv, env) = match prepared {
        Ok(p) => p,
        Err(e) => return e,
    };
    match nix::unistd::execve(&path, &argv, &env) {
        Err(e) => std::io::Error::from(e),
        Ok(never) => match never {},
    }
}

/// A hand-off received by the new image, with the descriptors it kept.
pub struct Received {
    pub handoff: Handoff,
    open: BTreeSet<i32>,
}

impl Received {
    /// Takes descriptor `n` of the hand-off (once), close-on-exec again.
    pub fn take(&mut self, n: i32) -> std::io::Result<OwnedFd> {
        if !self.open.remove(&n) {
            return Err(std::io::Error::other(format!(
                "descriptor {n} is not in the hand-off (or taken twice)"
            )));
        }
        let fd = crate::sys::inherited_fd(n)?;
        fcntl(fd.as_fd(), FcntlArg::F_SETFD(FdFlag::FD_CLOEXEC)).map_err(std::io::Error::from)?;
        Ok(fd)
    }

    /// Closes every kept descriptor nobody took (e.g. of a child that could not be adopted).
    pub fn close_rest(&mut self) {
        for n in std::mem::take(&mut self.open) {
            drop(crate::sys::inherited_fd(n));
        }
    }
}

/// Reads the hand-off from descriptor `value` (the variable's value). Call at the top of
/// `main`, before any other descriptor is opened.
pub fn receive(value: &str) -> Result<Received, HandoffError> {
    let n: i32 = value.parse().ok().filter(|n| *n >= 3).ok_or_else(|| {
        HandoffError::Damaged(format!("{HANDOFF_FD_VAR}={value} is not a descriptor"))
    })?;
    let f = std::fs::File::from(crate::sys::inherited_fd(n)?);
    let handoff = wire::read(f)?;
    let open = handoff.fds.iter().copied().collect();
    Ok(Received { handoff, open })
}

/// Tests of the services: their part of a hand-off written and read back as a reload does.
#[cfg(test)]
pub(crate) fn processes_through_a_memfd(processes: ProcessesState) -> ProcessesState {
    let mut h = Handoff {
        version: STATE_VERSION,
        token: None,
        listener_fd: 3,
        stop_requested: false,
        cgroups: CgroupsState::default(),
        acp: AcpState::default(),
        connections: Vec::new(),
        processes,
        fds: Vec::new(),
        waiters: Vec::new(),
        payloads: 0,
    };
    let f = memfd().expect("memfd");
    wire::write(&mut h, &f).expect("write");
    wire::read(f).expect("read").processes
}

#[cfg(test)]
mod tests;
