//! The channel between `sandbox-agent reload --pid PID` (the waiter) and the daemon it reloads.
//!
//! The waiter picks a random 64-bit ticket, binds a datagram socket at the abstract name
//! `sandbox-agent/reload/<ticket in hex>` (another name on a clash) and only then sends SIGHUP
//! with the ticket as the signal's value (`sigqueue`). The daemon reads the ticket from its
//! signalfd and sends the outcome to that name only. So:
//! - nobody can squat the name beforehand (it is unpredictable and bound before the signal);
//! - only a process allowed to signal the daemon (its user or root) can make it answer;
//! - the waiter accepts an answer only when the kernel's `SCM_CREDENTIALS` name the daemon's own
//!   pid (translated into the waiter's PID namespace), never a child of it: agents and
//!   `/v1/processes` programs are children and could otherwise forge `ready`.
//!
//! A container's init (`daemon/init.rs`) forwards the signal with its value; the waiter then
//! expects the answer from the init's daemon child (its first child, see [`daemon_behind`]).

use std::os::fd::AsRawFd;
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixDatagram};
use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// The process name (`comm`) of the tiny init (`daemon/init.rs`), so that a waiter given the
/// init's pid knows to expect the answer from its daemon child.
pub const INIT_COMM: &str = "sandbox-init";

/// The subcommands that are not a daemon: `reload --pid` refuses a process started with one.
const NOT_A_DAEMON: &[&str] = &[
    "mock-agent",
    "agents",
    "openapi",
    "spawn-stub",
    "reload-check",
    "reload",
    "status",
    "instances",
    "acp",
    "processes",
    "fs",
    "help",
];

fn waiter_name(ticket: u64) -> String {
    format!("sandbox-agent/reload/{ticket:016x}")
}

/// The name the previous release's waiter listened on (its daemon's pid).
fn legacy_name(pid: u32) -> String {
    format!("sandbox-agent/reload/{pid}")
}

/// After a reload from a daemon of the previous release (a hand-off of version 1 or 2, which
/// carries no ticket): `ready` on the names its waiter listened on, this pid and the parent's
/// (a container's init). Only `ready`, never a reason: nothing can leak through it.
pub fn tell_legacy_ready() {
    let Ok(sock) = UnixDatagram::unbound() else {
        return;
    };
    let _ = sock.set_nonblocking(true);
    for pid in [std::process::id(), std::os::unix::process::parent_id()] {
        if let Ok(addr) = SocketAddr::from_abstract_name(legacy_name(pid)) {
            let _ = sock.send_to_addr(&Outcome::Ready.encode(), &addr);
        }
    }
}

/// The tickets of the waiters of the reload under way (or asked for), shared by the signal
/// thread (which adds them) and the reload (which answers them). Carried across the exec in the
/// hand-off so that the new image says `ready`.
#[derive(Clone, Default)]
pub struct Waiters(Arc<Mutex<Vec<u64>>>);

impl Waiters {
    /// Registers the ticket of a SIGHUP (0: a plain `kill -HUP`, nobody waits).
    pub fn add(&self, ticket: u64) {
        if ticket != 0 {
            let mut w = crate::sys::lock(&self.0);
            // Bounded: a flood of SIGHUPs with tickets cannot grow this without limit.
            if w.len() < 64 && !w.contains(&ticket) {
                w.push(ticket);
            }
        }
    }

    /// Registers tickets taken earlier again (a reload that failed after taking them).
    pub fn add_all(&self, tickets: &[u64]) {
        for t in tickets {
            self.add(*t);
        }
    }

    /// Takes every ticket registered so far.
    pub fn take(&self) -> Vec<u64> {
        std::mem::take(&mut *crate::sys::lock(&self.0))
    }

    /// Answers every waiter registered so far (and forgets them).
    pub fn tell_all(&self, outcome: &Outcome) {
        tell(&self.take(), outcome);
    }
}

/// How a reload ended, as a waiter is told.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    Ready,
    /// Nothing changed; the reason names the problem, never a line of the configuration.
    Refused(String),
    /// Past the point of no return: the daemon stops.
    Failed(String),
}

impl Outcome {
    fn encode(&self) -> Vec<u8> {
        let s = match self {
            Outcome::Ready => "ready".to_string(),
            Outcome::Refused(why) => format!("refused\n{why}"),
            Outcome::Failed(why) => format!("failed\n{why}"),
        };
        let mut b = s.into_bytes();
        b.truncate(4000);
        b
    }

    fn decode(bytes: &[u8]) -> Option<Outcome> {
        let text = String::from_utf8_lossy(bytes);
        let (word, why) = text.split_once('\n').unwrap_or((&text, ""));
        match word {
            "ready" => Some(Outcome::Ready),
            "refused" => Some(Outcome::Refused(why.to_string())),
            "failed" => Some(Outcome::Failed(why.to_string())),
            _ => None,
        }
    }
}

/// Sends `outcome` to the waiters of `tickets`; a waiter that is gone is skipped silently.
pub fn tell(tickets: &[u64], outcome: &Outcome) {
    if tickets.is_empty() {
        return;
    }
    let Ok(sock) = UnixDatagram::unbound() else {
        return;
    };
    let _ = sock.set_nonblocking(true);
    let msg = outcome.encode();
    for t in tickets.iter().filter(|t| **t != 0) {
        if let Ok(addr) = SocketAddr::from_abstract_name(waiter_name(*t)) {
            let _ = sock.send_to_addr(&msg, &addr);
        }
    }
}

/// Why `reload --pid` cannot go on; the exit code follows docs/cli.md.
#[derive(Debug, thiserror::Error)]
pub enum WaitError {
    #[error("--timeout {0:?} is not a duration like 25s")]
    BadTimeout(String),
    #[error("--pid {0} is not a process id")]
    BadPid(u32),
    #[error("there is no process {0}")]
    NoSuchProcess(u32),
    #[error(
        "process {pid} ({name}) is not a sandbox-agent daemon; give --pid the daemon's pid \
         (systemd: $MAINPID; in a container, the init's pid works too)"
    )]
    NotADaemon { pid: u32, name: String },
    #[error("cannot open the answer socket: {0}")]
    Socket(#[source] std::io::Error),
    #[error("cannot signal pid {pid}: {source}")]
    Signal {
        pid: u32,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "no answer from pid {pid} within {timeout}: the daemon may be too old to answer, \
         stopping, or still reloading"
    )]
    NoAnswer { pid: u32, timeout: String },
    #[error("waiting for the answer: {0}")]
    Receive(#[source] std::io::Error),
    #[error("the reload was refused: {0}")]
    Refused(String),
    #[error("the reload failed: {0}")]
    Failed(String),
}

impl WaitError {
    fn exit_code(&self) -> u8 {
        match self {
            WaitError::BadTimeout(_) | WaitError::BadPid(_) | WaitError::NotADaemon { .. } => 64,
            WaitError::NoSuchProcess(_) => 66,
            _ => 1,
        }
    }
}

/// `sandbox-agent reload --pid PID`: sends SIGHUP to the daemon and waits until the reload has
/// ended (the unit's `ExecReload=`). Exit 0: the new image serves; 1: refused, failed or no
/// answer; 64: usage (a bad timeout, a pid that is not a sandbox-agent daemon); 66: no such
/// process.
pub fn wait_main(pid: u32, timeout: &str) -> ExitCode {
    match wait(pid, timeout) {
        Ok(()) => {
            use std::io::IsTerminal;
            if std::io::stdout().is_terminal() {
                println!("reloaded: pid {pid} serves the new image");
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("sandbox-agent reload: {e}");
            ExitCode::from(e.exit_code())
        }
    }
}

fn wait(pid: u32, timeout: &str) -> Result<(), WaitError> {
    let timeout_text = timeout.to_string();
    let timeout = match humantime::parse_duration(timeout) {
        Ok(t) if !t.is_zero() => t,
        _ => return Err(WaitError::BadTimeout(timeout_text)),
    };
    let target = i32::try_from(pid)
        .ok()
        .filter(|p| *p > 0)
        .ok_or(WaitError::BadPid(pid))?;
    let daemon = daemon_behind(pid)?;
    let (sock, ticket) = bind_waiter()?;
    // A daemon of the previous release ignores the ticket and answers on the name of its pid,
    // and its new image says `ready` there too (`tell_legacy_ready`): listened on as well when
    // it is free (a squatter there only costs that fallback; the sender check still holds).
    let legacy = SocketAddr::from_abstract_name(legacy_name(pid))
        .and_then(|a| UnixDatagram::bind_addr(&a))
        .ok()
        .filter(|s| {
            nix::sys::socket::setsockopt(s, nix::sys::socket::sockopt::PassCred, &true).is_ok()
        });
    crate::sys::sigqueue(target, nix::sys::signal::Signal::SIGHUP, ticket)
        .map_err(|source| WaitError::Signal { pid, source })?;
    let deadline = Instant::now() + timeout;
    let mut buf = [0u8; 4096];
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(WaitError::NoAnswer {
                pid,
                timeout: humantime::format_duration(timeout).to_string(),
            });
        }
        let ready = {
            use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
            use std::os::fd::AsFd;
            let mut fds = vec![PollFd::new(sock.as_fd(), PollFlags::POLLIN)];
            if let Some(l) = &legacy {
                fds.push(PollFd::new(l.as_fd(), PollFlags::POLLIN));
            }
            let ms = u16::try_from(left.as_millis().min(1000)).unwrap_or(1000);
            match poll(&mut fds, PollTimeout::from(ms)) {
                Ok(_) => fds
                    .iter()
                    .position(|f| f.revents().is_some_and(|r| r.contains(PollFlags::POLLIN))),
                Err(nix::errno::Errno::EINTR) => None,
                Err(e) => return Err(WaitError::Receive(e.into())),
            }
        };
        let Some(which) = ready else {
            continue;
        };
        let from = match (which, &legacy) {
            (1, Some(l)) => l,
            _ => &sock,
        };
        let (n, sender) = match recv_with_sender(from, &mut buf) {
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
            Err(e) => return Err(WaitError::Receive(e)),
        };
        // Only the daemon itself may answer (the kernel's credentials, not forgeable without
        // privilege); anything else, a child of it included, is ignored.
        if sender != Some(daemon) {
            continue;
        }
        match Outcome::decode(&buf[..n]) {
            Some(Outcome::Ready) => return Ok(()),
            Some(Outcome::Refused(why)) => return Err(WaitError::Refused(why)),
            Some(Outcome::Failed(why)) => return Err(WaitError::Failed(why)),
            None => continue,
        }
    }
}

/// Binds the waiter's socket at a fresh random name (another one on a clash).
fn bind_waiter() -> Result<(UnixDatagram, u64), WaitError> {
    let mut last = None;
    for _ in 0..16 {
        let mut b = [0u8; 8];
        getrandom::getrandom(&mut b)
            .map_err(|e| WaitError::Socket(std::io::Error::other(e.to_string())))?;
        let ticket = u64::from_le_bytes(b);
        if ticket == 0 {
            continue;
        }
        let bound = SocketAddr::from_abstract_name(waiter_name(ticket))
            .and_then(|a| UnixDatagram::bind_addr(&a));
        match bound {
            Ok(s) => {
                nix::sys::socket::setsockopt(&s, nix::sys::socket::sockopt::PassCred, &true)
                    .map_err(|e| WaitError::Socket(e.into()))?;
                return Ok((s, ticket));
            }
            Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => last = Some(e),
            Err(e) => return Err(WaitError::Socket(e)),
        }
    }
    Err(WaitError::Socket(last.unwrap_or_else(|| {
        std::io::Error::other("no free name for the answer socket")
    })))
}

/// The pid whose answer the waiter accepts, after checking that `pid` is a sandbox-agent daemon
/// (or its init): `pid` itself, or, for the init, its daemon child — the oldest of its
/// children, since anything else that became its child (an orphan it reaps) was started by the
/// daemon, so later.
pub fn daemon_behind(pid: u32) -> Result<u32, WaitError> {
    let proc_dir = std::path::PathBuf::from(format!("/proc/{pid}"));
    let comm = match std::fs::read_to_string(proc_dir.join("comm")) {
        Ok(c) => c.trim_end().to_string(),
        Err(_) => return Err(WaitError::NoSuchProcess(pid)),
    };
    let cmdline = std::fs::read(proc_dir.join("cmdline")).unwrap_or_default();
    let args: Vec<&[u8]> = cmdline
        .split(|b| *b == 0)
        .filter(|a| !a.is_empty())
        .collect();
    let own = std::fs::read_to_string("/proc/self/comm")
        .map(|c| c.trim_end().to_string())
        .unwrap_or_else(|_| "sandbox-agent".into());
    // Our own binary's file name too (comm is cut at 15 bytes and names what was exec'd).
    let own_file = std::env::current_exe()
        .ok()
        .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
        .unwrap_or_else(|| own.clone());
    let is_init = comm == INIT_COMM;
    let theirs = exe_name(pid);
    let our_program = is_init
        || comm == own
        || comm == own_file
        || theirs.as_ref().is_some_and(|n| *n == own || *n == own_file);
    let subcommand = args.get(1).map(|a| String::from_utf8_lossy(a).into_owned());
    let daemon_args = subcommand
        .as_deref()
        .is_none_or(|s| !NOT_A_DAEMON.contains(&s));
    if !our_program || !daemon_args {
        let name = args
            .first()
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .unwrap_or(comm);
        return Err(WaitError::NotADaemon { pid, name });
    }
    if !is_init {
        return Ok(pid);
    }
    oldest_child(pid).ok_or(WaitError::NotADaemon {
        pid,
        name: format!("{INIT_COMM} without a daemon"),
    })
}

/// The file name of `/proc/PID/exe` (without a " (deleted)" suffix), when it can be read (not
/// for another user's or a non-dumpable process).
fn exe_name(pid: u32) -> Option<String> {
    let target = std::fs::read_link(format!("/proc/{pid}/exe")).ok()?;
    let name = target.file_name()?.to_string_lossy().into_owned();
    Some(name.trim_end_matches(" (deleted)").to_string())
}

/// The child of `parent` that started first (`/proc` scanned: `ppid`, then `starttime`).
fn oldest_child(parent: u32) -> Option<u32> {
    let mut best: Option<(u64, u32)> = None;
    for e in std::fs::read_dir("/proc").ok()?.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        // Fields after the command name (which may hold spaces and parentheses).
        let Some(rest) = stat.rfind(')').map(|i| &stat[i + 2..]) else {
            continue;
        };
        let fields: Vec<&str> = rest.split(' ').collect();
        // state(0) ppid(1) … starttime is field 22 of the line, 19 after the name.
        let (Some(ppid), Some(start)) = (
            fields.get(1).and_then(|f| f.parse::<u32>().ok()),
            fields.get(19).and_then(|f| f.parse::<u64>().ok()),
        ) else {
            continue;
        };
        if ppid == parent && best.is_none_or(|(s, p)| (start, pid) < (s, p)) {
            best = Some((start, pid));
        }
    }
    best.map(|(_, p)| p)
}

/// One datagram and the pid of the process that sent it (the kernel's `SCM_CREDENTIALS`).
fn recv_with_sender(sock: &UnixDatagram, buf: &mut [u8]) -> std::io::Result<(usize, Option<u32>)> {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outcomes_round_trip_and_unknown_words_are_not_answers() {
        for o in [
            Outcome::Ready,
            Outcome::Refused("the configuration is not valid".into()),
            Outcome::Failed("x".into()),
        ] {
            assert_eq!(Outcome::decode(&o.encode()), Some(o));
        }
        assert_eq!(Outcome::decode(b"readyish"), None);
    }

    #[test]
    fn a_plain_sighup_registers_no_waiter_and_the_list_is_bounded() {
        let w = Waiters::default();
        w.add(0);
        for t in 1..200 {
            w.add(t);
        }
        w.add(5);
        let got = w.take();
        assert_eq!(got.len(), 64);
        assert!(w.take().is_empty());
    }
}
