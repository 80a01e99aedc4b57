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
use std::io::{Read, Seek, Write};
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

/// The version of the hand-off this binary writes. 2: RFD connections are carried
/// (`connections`); a version-1 hand-off (none) is still read.
pub const STATE_VERSION: u32 = 2;
/// The oldest version this binary reads (a newer binary must read the previous one's state).
pub const OLDEST_ACCEPTED: u32 = 1;

/// How long a reload waits for requests in flight (and connections to close) before the exec.
pub const DRAIN: Duration = Duration::from_secs(5);
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
}

impl Handoff {
    pub fn to_json(&self) -> Vec<u8> {
        serde_json::to_vec(self).unwrap_or_default()
    }

    /// Parses a hand-off, refusing a version this binary does not read.
    pub fn from_json(bytes: &[u8]) -> Result<Handoff, String> {
        #[derive(serde::Deserialize)]
        struct Head {
            version: u32,
        }
        let head: Head = serde_json::from_slice(bytes)
            .map_err(|e| format!("the hand-off is not readable: {e}"))?;
        if !accepts(head.version) {
            return Err(format!(
                "hand-off state version {} is not one this binary reads ({OLDEST_ACCEPTED}..={STATE_VERSION})",
                head.version
            ));
        }
        serde_json::from_slice(bytes).map_err(|e| format!("the hand-off is not readable: {e}"))
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
        let exe = std::env::current_exe()
            .map(|p| {
                use std::os::unix::ffi::OsStrExt;
                match p.as_os_str().as_bytes().strip_suffix(b" (deleted)") {
                    Some(rest) => PathBuf::from(std::ffi::OsStr::from_bytes(rest)),
                    None => p,
                }
            })
            .unwrap_or_else(|_| PathBuf::from("/proc/self/exe"));
        Launch {
            exe,
            argv: strip_token(std::env::args_os().collect()),
            env: crate::config::launch_env(),
        }
    }
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
}

/// Why a reload did not happen.
pub enum Failed {
    /// Nothing changed: the old image serves on.
    Refused(String),
    /// Past the quiesce: the daemon cannot go on serving and stops gracefully.
    Fatal(String),
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
        return Failed::Refused("the daemon is stopping".into());
    }
    let memfd = match memfd() {
        Ok(f) => f,
        Err(e) => return Failed::Refused(format!("cannot create the hand-off memfd: {e}")),
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
        tracing::warn!(
            open = r.tasks.len(),
            "reload: requests still in flight after the drain; their connections are cut"
        );
    }
    r.state.supervisor.close_warm().await;
    // With a state dir, what its writer still holds reaches the disk before the exec ends the
    // writer thread (the new image appends after it).
    if let Some(store) = r.state.state.clone() {
        crate::sys::blocking(move || store.flush_blocking(Duration::from_secs(2))).await;
    }
    let opencode = r.state.opencode.clone();
    crate::sys::blocking(move || opencode.flush_blocking(Duration::from_secs(2))).await;
    let mut keep: Vec<OwnedFd> = Vec::new();
    let handoff = match export(&r, &mut keep).await {
        Ok(h) => h,
        Err(e) => return Failed::Fatal(format!("cannot write the hand-off: {e}")),
    };
    let carried = (
        handoff.acp.instances.len(),
        handoff.processes.processes.len(),
    );
    for fd in keep.iter().map(|f| f.as_fd()).chain([memfd.as_fd()]) {
        if let Err(e) = fcntl(fd, FcntlArg::F_SETFD(FdFlag::empty())) {
            return Failed::Fatal(format!("cannot keep a descriptor across the exec: {e}"));
        }
    }
    tracing::info!(
        agents = carried.0,
        processes = carried.1,
        quiesce_ms = started.elapsed().as_millis() as u64,
        "reload: executing the new image"
    );
    crate::daemon::systemd::notify_watchdog();
    // The log writer is a thread the exec ends: what it still holds (this line included) is
    // written first.
    crate::sys::blocking(|| crate::logging::flush(Duration::from_millis(500))).await;
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
    let mut handoff = handoff;
    handoff.stop_requested = r.root.is_cancelled();
    if let Err(e) = write_memfd(&memfd, &handoff.to_json()) {
        release();
        return Failed::Fatal(format!("cannot write the hand-off: {e}"));
    }
    if let Some(pause) = r.state.config.test_reload_pause {
        // Debug builds only: the window in which a stop signal must stay pending.
        std::thread::sleep(pause);
    }
    let e = exec(r.launch, memfd.as_raw_fd());
    release();
    Failed::Fatal(format!("cannot execute {}: {e}", r.launch.exe.display()))
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
    })
}

/// Runs `<exe> reload-check` with the daemon's own arguments and environment: it loads the
/// configuration as the new image would and says whether it reads this state version.
async fn check(launch: &Launch, with_token: bool) -> Result<(), String> {
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
        .map_err(|e| format!("the new binary {} cannot run: {e}", launch.exe.display()))?;
    if out.status.success() {
        return Ok(());
    }
    let stderr = String::from_utf8_lossy(&out.stderr);
    let stderr = stderr.trim();
    let why = match out.status.code() {
        Some(65) => format!("the new binary does not read this state: {stderr}"),
        Some(78) => format!("the configuration is not valid: {stderr}"),
        _ => format!(
            "the new binary's check failed ({}): {}",
            out.status,
            stderr.chars().take(2000).collect::<String>()
        ),
    };
    Err(why)
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
        None => cli.server,
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
            eprint!("{e}");
            std::process::ExitCode::from(78)
        }
    }
}

fn memfd() -> std::io::Result<std::fs::File> {
    crate::sys::memfd("sandbox-agent-handoff")
}

fn write_memfd(mut f: &std::fs::File, bytes: &[u8]) -> std::io::Result<()> {
    f.set_len(0)?;
    f.rewind()?;
    f.write_all(bytes)?;
    f.rewind()?;
    Ok(())
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
pub fn receive(value: &str) -> Result<Received, String> {
    let n: i32 = value
        .parse()
        .map_err(|_| format!("{HANDOFF_FD_VAR}={value} is not a descriptor"))?;
    if n < 3 {
        return Err(format!("{HANDOFF_FD_VAR}={value} is not a descriptor"));
    }
    let mut f = std::fs::File::from(
        crate::sys::inherited_fd(n).map_err(|e| format!("the hand-off descriptor {n}: {e}"))?,
    );
    let mut bytes = Vec::new();
    f.read_to_end(&mut bytes)
        .map_err(|e| format!("cannot read the hand-off: {e}"))?;
    drop(f);
    let handoff = Handoff::from_json(&bytes)?;
    let open = handoff.fds.iter().copied().collect();
    Ok(Received { handoff, open })
}

/// The abstract socket name a `sandbox-agent reload --pid PID` waits on for daemon `pid`'s
/// outcome (abstract: nothing on disk, gone with the waiter, and a send with no waiter fails).
fn waiter_name(pid: u32) -> String {
    format!("sandbox-agent/reload/{pid}")
}

/// Tells a waiting `sandbox-agent reload` how the reload ended: `ready`, or `refused`/`failed`
/// with the reason on the next line. Sent for this pid and for the parent's (a container's
/// init, which forwards the SIGHUP it was sent); with no waiter the send fails, silently.
pub fn tell_waiter(outcome: &str) {
    use std::os::linux::net::SocketAddrExt;
    let Ok(sock) = std::os::unix::net::UnixDatagram::unbound() else {
        return;
    };
    let _ = sock.set_nonblocking(true);
    let msg = outcome.as_bytes();
    let msg = &msg[..msg.len().min(4000)];
    for pid in [std::process::id(), std::os::unix::process::parent_id()] {
        if let Ok(addr) = std::os::unix::net::SocketAddr::from_abstract_name(waiter_name(pid)) {
            let _ = sock.send_to_addr(msg, &addr);
        }
    }
}

/// `sandbox-agent reload --pid PID`: sends SIGHUP to the daemon and waits until the reload
/// has ended (the `ExecReload=` of the unit, so that `systemctl reload` returns when the new
/// image serves and fails when the reload was refused). Exit 0: the new image serves; 1: the
/// reload was refused or failed (the reason on stderr), or no answer within `timeout` (a daemon
/// from before this notification, or one that is stopping); 64: usage.
pub fn wait_main(pid: u32, timeout: &str) -> std::process::ExitCode {
    use std::os::linux::net::SocketAddrExt;
    use std::process::ExitCode;
    let timeout = match humantime::parse_duration(timeout) {
        Ok(t) if !t.is_zero() => t,
        _ => {
            eprintln!("sandbox-agent reload: --timeout {timeout:?} is not a duration like 25s");
            return ExitCode::from(64);
        }
    };
    let Ok(target) = i32::try_from(pid) else {
        eprintln!("sandbox-agent reload: --pid {pid} is not a process id");
        return ExitCode::from(64);
    };
    let sock = std::os::unix::net::SocketAddr::from_abstract_name(waiter_name(pid))
        .and_then(|a| std::os::unix::net::UnixDatagram::bind_addr(&a));
    let sock = sock.and_then(|s| {
        nix::sys::socket::setsockopt(&s, nix::sys::socket::sockopt::PassCred, &true)?;
        Ok(s)
    });
    let sock = match sock {
        Ok(s) => s,
        Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => {
            eprintln!("sandbox-agent reload: another reload of pid {pid} is already waiting");
            return ExitCode::FAILURE;
        }
        Err(e) => {
            eprintln!("sandbox-agent reload: cannot open the answer socket: {e}");
            return ExitCode::FAILURE;
        }
    };
    if let Err(e) = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(target),
        nix::sys::signal::Signal::SIGHUP,
    ) {
        eprintln!("sandbox-agent reload: cannot signal pid {pid}: {e}");
        return ExitCode::FAILURE;
    }
    let deadline = std::time::Instant::now() + timeout;
    let mut buf = [0u8; 4096];
    loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        if left.is_zero() || sock.set_read_timeout(Some(left)).is_err() {
            eprintln!(
                "sandbox-agent reload: no answer from pid {pid} within {}: the daemon may be \
                 too old to answer, stopping, or still reloading",
                humantime::format_duration(timeout)
            );
            return ExitCode::FAILURE;
        }
        let (n, sender) = match recv_with_sender(&sock, &mut buf) {
            Ok(got) => got,
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock
                        | std::io::ErrorKind::TimedOut
                        | std::io::ErrorKind::Interrupted
                ) =>
            {
                continue;
            }
            Err(e) => {
                eprintln!("sandbox-agent reload: waiting for the answer: {e}");
                return ExitCode::FAILURE;
            }
        };
        // Only the daemon (or, through a container's init, its child) may answer: any local
        // process can send to an abstract name, and a forged "ready" would end the wait early.
        if !sender.is_some_and(|s| s == pid || parent_of(s) == Some(pid)) {
            continue;
        }
        let text = String::from_utf8_lossy(&buf[..n]);
        let (outcome, why) = text.split_once('\n').unwrap_or((&text, ""));
        match outcome {
            "ready" => return ExitCode::SUCCESS,
            "refused" | "failed" => {
                eprintln!("sandbox-agent reload: {outcome}: {why}");
                return ExitCode::FAILURE;
            }
            // Not an answer of ours: keep waiting.
            _ => continue,
        }
    }
}

/// One datagram and the pid of the process that sent it (the kernel's `SCM_CREDENTIALS`, which
/// a sender cannot forge without privileges).
fn recv_with_sender(
    sock: &std::os::unix::net::UnixDatagram,
    buf: &mut [u8],
) -> std::io::Result<(usize, Option<u32>)> {
    use nix::sys::socket::{ControlMessageOwned, MsgFlags, UnixAddr, UnixCredentials, recvmsg};
    let mut iov = [std::io::IoSliceMut::new(buf)];
    let mut space = nix::cmsg_space!(UnixCredentials);
    let msg = recvmsg::<UnixAddr>(
        sock.as_raw_fd(),
        &mut iov,
        Some(&mut space),
        MsgFlags::empty(),
    )?;
    let sender = msg.cmsgs()?.find_map(|c| match c {
        ControlMessageOwned::ScmCredentials(cred) => u32::try_from(cred.pid()).ok(),
        _ => None,
    });
    Ok((msg.bytes, sender))
}

/// The parent pid of `pid`, if its `/proc` entry can be read.
fn parent_of(pid: u32) -> Option<u32> {
    let st = crate::supervisor::read_stat(i32::try_from(pid).ok()?)?;
    u32::try_from(st.ppid).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::acp::AcpState;
    use crate::processes::ProcessesState;

    fn sample() -> Handoff {
        Handoff {
            version: STATE_VERSION,
            token: Some("t0ken".into()),
            listener_fd: 7,
            stop_requested: false,
            cgroups: CgroupsState::default(),
            acp: AcpState::default(),
            connections: Vec::new(),
            processes: ProcessesState::default(),
            fds: vec![7, 8, 9],
        }
    }

    #[test]
    fn the_hand_off_round_trips() {
        let h = sample();
        assert_eq!(Handoff::from_json(&h.to_json()).unwrap(), h);
    }

    #[test]
    fn versions_outside_the_accepted_range_are_refused() {
        for v in [0, STATE_VERSION + 1] {
            let mut h = sample();
            h.version = v;
            let err = Handoff::from_json(&h.to_json()).unwrap_err();
            assert!(err.contains("is not one this binary reads"), "{err}");
        }
        assert!(accepts(STATE_VERSION) && accepts(OLDEST_ACCEPTED));
    }

    /// Hand-offs written by real daemons (an agent instance, an RFD connection with a session
    /// and queued messages, a running process; from version 2 also an exited instance and an
    /// exited process record), one per state version this binary must read:
    /// `handoff-v1.json` is what the previous release writes. A change that stops an older
    /// hand-off from parsing fails here, before an upgrade's reload would be refused.
    #[test]
    fn hand_offs_of_every_accepted_version_are_read() {
        let fixtures: [(u32, &str); 2] = [
            (1, include_str!("testdata/handoff-v1.json")),
            (2, include_str!("testdata/handoff-v2.json")),
        ];
        assert_eq!(
            fixtures.iter().map(|f| f.0).collect::<Vec<_>>(),
            (OLDEST_ACCEPTED..=STATE_VERSION).collect::<Vec<_>>(),
            "one fixture per accepted version (capture one when STATE_VERSION changes)"
        );
        for (v, json) in fixtures {
            let h =
                Handoff::from_json(json.as_bytes()).unwrap_or_else(|e| panic!("version {v}: {e}"));
            assert_eq!(h.version, v);
            assert_eq!(h.acp.instances.len(), 2, "version {v}");
            assert_eq!(h.processes.processes.len(), 1, "version {v}");
            let frames: usize = h.acp.instances.iter().map(|i| i.events.frames.len()).sum();
            assert!(frames >= 4, "version {v}: the event logs came through");
            // Version 1 carried no RFD connection; from 2 on it is there with its session.
            let expected = if v == 1 { 0 } else { 1 };
            assert_eq!(h.connections.len(), expected, "version {v}");
            if let Some(c) = h.connections.first() {
                assert_eq!(c.sessions.len(), 1);
                assert!(c.routed && c.routed_to >= 3);
            }
            // From 2 on, ended instances and exited process records come along too.
            let ended = usize::from(v >= 2);
            assert_eq!(h.acp.exited.len(), ended, "version {v}");
            assert_eq!(h.processes.exited.len(), ended, "version {v}");
        }
    }

    #[test]
    fn the_token_is_stripped_from_the_arguments() {
        let argv: Vec<OsString> = ["sa", "--port", "1", "--token", "s3", "--token=s4", "--x"]
            .iter()
            .map(OsString::from)
            .collect();
        let got = strip_token(argv);
        assert_eq!(
            got,
            ["sa", "--port", "1", "--x"].map(OsString::from).to_vec()
        );
    }

    #[test]
    fn a_memfd_hand_off_is_read_back_with_its_descriptors() {
        let f = memfd().unwrap();
        let h = sample();
        write_memfd(&f, &h.to_json()).unwrap();
        let n = f.as_raw_fd();
        // `receive` owns (and closes) the descriptor it reads.
        std::mem::forget(f);
        let mut r = receive(&n.to_string()).unwrap();
        assert_eq!(r.handoff, h);
        assert!(
            r.take(5).is_err(),
            "a descriptor not in the hand-off is refused"
        );
        r.open.clear(); // 7, 8, 9 are not really ours in this test
    }
}
