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
        Ok(Forked::Parent { child }) => Some(ExitCode::from(supervise(child, &set))),
        Err(e) => {
            eprintln!("sandbox-agent: init: fork failed: {e}");
            Some(ExitCode::from(71))
        }
    }
}

/// The init loop: wait for a signal; forward it, or reap on SIGCHLD. Returns the daemon's status
/// as an exit code (128 + signal when it was killed).
fn supervise(daemon: Pid, set: &SigSet) -> u8 {
    loop {
        let sig = match set.wait() {
            Ok(sig) => sig,
            Err(Errno::EINTR) => continue,
            Err(e) => {
                eprintln!("sandbox-agent: init: sigwait failed: {e}");
                return 71;
            }
        };
        if sig != Signal::SIGCHLD {
            // The daemon may already be gone; ESRCH is then expected and harmless.
            let _ = kill(daemon, sig);
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
