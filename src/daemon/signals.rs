//! Stop signals. The first SIGTERM/SIGINT/SIGQUIT starts a graceful stop; a second one ends the
//! process at once (after killing every agent process group, so nothing is orphaned). SIGHUP
//! asks for an in-place reload (`daemon/reload.rs`).
//!
//! The signals are blocked in every thread of the daemon ([`block`], before the first thread
//! exists) and taken from a signalfd by one thread of their own. No signal handler exists, so a
//! signal is never "taken" by a thread that then cannot act on it: one that no thread reads
//! stays pending in the kernel. A reload uses that: [`Gate::hold`] stops the reading, and a stop
//! signal that arrives from then until the exec reaches the new image, which reads it at once.
//! (A handler-based design lost one in that window: the old image took it, then exec'd.)

use std::io::{Read, Write};
use std::os::fd::AsFd;
use std::os::unix::net::UnixStream;
use std::sync::Mutex;
use std::time::Duration;

use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sys::signal::{SigSet, SigmaskHow, Signal, pthread_sigmask};
use nix::sys::signalfd::{SfdFlags, SignalFd};
use tokio_util::sync::CancellationToken;

/// The stop and reload signals.
pub fn handled() -> SigSet {
    let mut set = SigSet::empty();
    for s in [
        Signal::SIGTERM,
        Signal::SIGINT,
        Signal::SIGQUIT,
        Signal::SIGHUP,
    ] {
        set.add(s);
    }
    set
}

/// Blocks the handled signals in the calling thread, and so in every thread it makes later.
/// Call while the process has one thread. Children start with an empty mask (the standard
/// library's spawn resets it), so agents and processes get these signals as usual.
pub fn block() -> std::io::Result<()> {
    pthread_sigmask(SigmaskHow::SIG_BLOCK, Some(&handled()), None).map_err(std::io::Error::from)
}

/// Undoes [`block`] for a command that is not the daemon (called before any thread exists).
pub fn unblock() -> std::io::Result<()> {
    pthread_sigmask(SigmaskHow::SIG_UNBLOCK, Some(&handled()), None).map_err(std::io::Error::from)
}

/// What a reload holds to keep the signals pending across its exec.
pub struct Gate {
    control: Mutex<UnixStream>,
}

/// How long [`Gate::hold`] waits for the signal thread (which only ever runs a few
/// non-blocking steps between two polls).
const HOLD_TIMEOUT: Duration = Duration::from_secs(2);

impl Gate {
    /// Stops the signal thread from taking signals; returns once it has acknowledged, after
    /// acting on every signal it had taken. Blocking (a thread hop; call off the runtime).
    pub fn hold(&self) -> std::io::Result<()> {
        let mut c = self
            .control
            .lock()
            .map_err(|_| std::io::Error::other("the signal gate is poisoned"))?;
        c.set_read_timeout(Some(HOLD_TIMEOUT))?;
        c.write_all(b"h")?;
        let mut ack = [0u8; 1];
        c.read_exact(&mut ack)?;
        Ok(())
    }

    /// Lets the signal thread take signals again (the exec failed).
    pub fn release(&self) {
        if let Ok(mut c) = self.control.lock() {
            let _ = c.write_all(b"r");
        }
    }
}

/// Starts the signal thread; the first stop signal cancels `root` (the root of the daemon's
/// shutdown tree). `on_second` runs on a second stop signal, just before the process exits with
/// 128 + signal. The handled signals must already be [`block`]ed in every thread.
///
/// The signals are read on a thread of their own, not as a task: the emergency stop must work
/// when the runtime is wedged (a task that never yields, a blocked worker), which is exactly when
/// an operator sends the second signal. Cancelling a token and logging never block.
pub fn install(
    root: CancellationToken,
    on_second: impl Fn() + Send + 'static,
    on_hup: impl Fn(u64) + Send + 'static,
) -> std::io::Result<Gate> {
    let sfd = SignalFd::with_flags(&handled(), SfdFlags::SFD_CLOEXEC)?;
    let (ours, theirs) = UnixStream::pair()?;
    std::thread::Builder::new()
        .name("signals".into())
        .spawn(move || {
            let mut control = Some(theirs);
            loop {
                let (signal_ready, control_ready) = match wait(&sfd, control.as_ref()) {
                    Ok(r) => r,
                    Err(e) => {
                        tracing::error!(error = %e, "the signal thread cannot poll; signals are no longer read");
                        return;
                    }
                };
                if control_ready && let Some(c) = control.as_mut() {
                    // Every signal taken so far has been acted on (this thread does it inline).
                    if !held(c) {
                        control = None;
                    }
                    continue;
                }
                if !signal_ready {
                    continue;
                }
                let Ok(Some(info)) = sfd.read_signal() else {
                    continue;
                };
                let sig = info.ssi_signo as i32;
                if sig == Signal::SIGHUP as i32 {
                    // `sandbox-agent reload` names its answer socket in the signal's value.
                    let ticket = if info.ssi_code == libc::SI_QUEUE {
                        info.ssi_ptr
                    } else {
                        0
                    };
                    if root.is_cancelled() {
                        tracing::info!("SIGHUP received while stopping; ignored");
                        super::reload::tell(
                            &[ticket],
                            &super::reload::Outcome::Refused("the daemon is stopping".into()),
                        );
                    } else {
                        tracing::info!("SIGHUP received: reloading in place");
                        on_hup(ticket);
                    }
                    continue;
                }
                let name = signal_name(sig);
                if !root.is_cancelled() {
                    tracing::info!(
                        signal = name,
                        "stop signal received; shutting down gracefully"
                    );
                    root.cancel();
                } else {
                    tracing::warn!(signal = name, "second stop signal; exiting now");
                    on_second();
                    std::process::exit(128 + sig);
                }
            }
        })?;
    Ok(Gate {
        control: Mutex::new(ours),
    })
}

/// Polls the signalfd and the gate's socket: (a signal is ready, the gate wrote).
fn wait(sfd: &SignalFd, control: Option<&UnixStream>) -> nix::Result<(bool, bool)> {
    let mut fds = vec![PollFd::new(sfd.as_fd(), PollFlags::POLLIN)];
    if let Some(c) = control {
        fds.push(PollFd::new(c.as_fd(), PollFlags::POLLIN));
    }
    match poll(&mut fds, PollTimeout::NONE) {
        Ok(_) => {}
        Err(nix::errno::Errno::EINTR) => return Ok((false, false)),
        Err(e) => return Err(e),
    }
    let ready = |f: &PollFd| f.revents().is_some_and(|r| !r.is_empty());
    Ok((ready(&fds[0]), fds.get(1).is_some_and(ready)))
}

/// Serves one request of the gate: a hold is acknowledged, then no signal is read until the
/// release. False when the gate is gone (its owner returned): signals are read on, ungated.
fn held(c: &mut UnixStream) -> bool {
    let mut b = [0u8; 1];
    match c.read(&mut b) {
        Ok(1) if b[0] == b'h' => {}
        Ok(1) => return true,
        _ => return false,
    }
    if c.write_all(b"k").is_err() {
        return false;
    }
    // Held: the signals stay pending until the release (or for the next image, after the exec).
    matches!(c.read(&mut b), Ok(1))
}

fn signal_name(sig: i32) -> &'static str {
    match Signal::try_from(sig) {
        Ok(Signal::SIGTERM) => "SIGTERM",
        Ok(Signal::SIGINT) => "SIGINT",
        Ok(Signal::SIGQUIT) => "SIGQUIT",
        _ => "signal",
    }
}
