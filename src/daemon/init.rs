//! The tiny synchronous init used when the daemon is PID 1 (a container entrypoint) or runs with
//! `--init`. `main` forks before any thread or runtime exists; the parent stays here, forwards
//! every signal to the daemon child and reaps every process that reaches it, then exits with the
//! daemon's status. A `waitpid(-1)` loop would steal exit statuses from tokio's child waiters,
//! which is why it must live in a process of its own.

use std::process::ExitCode;

use nix::errno::Errno;
use nix::sys::signal::{SigSet, SigmaskHow, Signal, kill, sigprocmask};
use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
use nix::unistd::Pid;

use crate::sys::{Forked, fork_single_threaded};

/// Signals the init forwards to the daemon (SIGCHLD it handles itself).
const FORWARDED: &[Signal] = &[
    Signal::SIGTERM,
    Signal::SIGINT,
    Signal::SIGHUP,
    Signal::SIGQUIT,
    Signal::SIGUSR1,
    Signal::SIGUSR2,
    Signal::SIGWINCH,
    Signal::SIGALRM,
];

/// Forks. In the child (the daemon) returns `None` with the signal mask restored; in the parent
/// runs the init loop and returns the exit code to end the process with.
pub fn split_off_daemon(pid1: bool) -> Option<ExitCode> {
    let mut set = SigSet::empty();
    for s in FORWARDED {
        set.add(*s);
    }
    set.add(Signal::SIGCHLD);
    // Block first, so that a signal arriving between fork and the loop is queued, not lost.
    let mut old = SigSet::empty();
    if let Err(e) = sigprocmask(SigmaskHow::SIG_BLOCK, Some(&set), Some(&mut old)) {
        eprintln!("sandbox-agent: init: cannot block signals: {e}");
        return Some(ExitCode::from(71));
    }
    if !pid1 {
        // Not PID 1 but asked to act as init: become the reaper of our descendants' orphans.
        if let Err(e) = nix::sys::prctl::set_child_subreaper(true) {
            eprintln!("sandbox-agent: init: cannot become a subreaper: {e}");
        }
    }
    match fork_single_threaded() {
        Ok(Forked::Child) => {
            let _ = sigprocmask(SigmaskHow::SIG_SETMASK, Some(&old), None);
            None
        }
        Ok(Forked::Parent { child }) => {
            // Named apart from the daemon, so that `reload --pid <this pid>` expects the answer
            // from the daemon child (`daemon/reload/waiter.rs`).
            if let Ok(name) = std::ffi::CString::new(crate::daemon::reload::INIT_COMM) {
                let _ = nix::sys::prctl::set_name(&name);
            }
            Some(ExitCode::from(supervise(child, &set)))
        }
        Err(e) => {
            eprintln!("sandbox-agent: init: fork failed: {e}");
            Some(ExitCode::from(71))
        }
    }
}

/// The init loop: wait for a signal; forward it, or reap on SIGCHLD. Returns the daemon's status
/// as an exit code (128 + signal when it was killed).
fn supervise(daemon: Pid, set: &SigSet) -> u8 {
    // A signalfd rather than sigwait: a reload's waiter sends SIGHUP with a value
    // (`sigqueue`), which must reach the daemon unchanged.
    let sfd = match nix::sys::signalfd::SignalFd::with_flags(
        set,
        nix::sys::signalfd::SfdFlags::SFD_CLOEXEC,
    ) {
        Ok(f) => f,
        Err(e) => {
            eprintln!("sandbox-agent: init: signalfd failed: {e}");
            return 71;
        }
    };
    loop {
        let info = match sfd.read_signal() {
            Ok(Some(info)) => info,
            Ok(None) | Err(Errno::EINTR) => continue,
            Err(e) => {
                eprintln!("sandbox-agent: init: reading signals failed: {e}");
                return 71;
            }
        };
        let Ok(sig) = Signal::try_from(info.ssi_signo as i32) else {
            continue;
        };
        if sig != Signal::SIGCHLD {
            // The daemon may already be gone; ESRCH is then expected and harmless.
            if info.ssi_code == libc::SI_QUEUE {
                let _ = crate::sys::sigqueue(daemon.as_raw(), sig, info.ssi_ptr);
            } else {
                let _ = kill(daemon, sig);
            }
            continue;
        }
        // SIGCHLD coalesces: one delivery may stand for many exits, so reap until none is left.
        loop {
            match waitpid(None, Some(WaitPidFlag::WNOHANG)) {
                Ok(WaitStatus::Exited(pid, code)) if pid == daemon => return code as u8,
                Ok(WaitStatus::Signaled(pid, sig, _)) if pid == daemon => return 128 + sig as u8,
                Ok(WaitStatus::StillAlive) | Err(Errno::ECHILD) => break,
                Ok(_) => continue,
                Err(Errno::EINTR) => continue,
                Err(e) => {
                    eprintln!("sandbox-agent: init: waitpid failed: {e}");
                    break;
                }
            }
        }
    }
}
