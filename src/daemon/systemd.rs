//! The systemd side of the lifecycle: sd-notify (READY, STATUS, WATCHDOG, STOPPING) and socket
//! activation (LISTEN_FDS). Every function is a no-op where systemd did not ask for it, so the
//! same code path runs in a container, a terminal and a test harness with its own NOTIFY_SOCKET.

use std::net::SocketAddr;
use std::time::Duration;

use sd_notify::NotifyState;

use crate::config::SystemdEnv;

pub fn notify_ready(addr: SocketAddr) {
    let status = format!("listening on http://{addr}");
    if let Err(e) = sd_notify::notify(&[NotifyState::Ready, NotifyState::Status(&status)]) {
        tracing::warn!(error = %e, "cannot send READY=1 to the service manager");
    }
}

/// A reload begins (systemd's reload protocol: `RELOADING=1` with the monotonic time).
pub fn notify_reloading() {
    let mut states = vec![NotifyState::Reloading, NotifyState::Status("reloading")];
    if let Ok(now) = NotifyState::monotonic_usec_now() {
        states.push(now);
    }
    let _ = sd_notify::notify(&states);
}

/// A reload did not happen: the old image serves on (READY=1 ends the reload for systemd).
/// `STATUS=` is world-readable (`systemctl status`): it never carries the reason, which goes to
/// the waiting `sandbox-agent reload` and the daemon's log.
pub fn notify_reload_failed() {
    let status = "reload failed, still serving the previous image (the reason is in the log)";
    let _ = sd_notify::notify(&[NotifyState::Ready, NotifyState::Status(status)]);
}

pub fn notify_status(status: &str) {
    let _ = sd_notify::notify(&[NotifyState::Status(status)]);
}

pub fn notify_stopping() {
    let _ = sd_notify::notify(&[NotifyState::Stopping, NotifyState::Status("stopping")]);
}

pub fn notify_watchdog() {
    let _ = sd_notify::notify(&[NotifyState::Watchdog]);
}

/// The interval at which to probe and pet the watchdog, when it is meant for us: a quarter of
/// WATCHDOG_USEC. The probe runs on the runtime thread it checks, so a stall can make one probe
/// time out just after the runtime recovered; at a quarter, one failed probe only skips one ping
/// and a restart needs the daemon unable to answer for about half of WatchdogSec or more.
pub fn watchdog_interval(env: &SystemdEnv) -> Option<Duration> {
    let usec: u64 = env.watchdog_usec.as_deref()?.parse().ok()?;
    if usec == 0 {
        return None;
    }
    if let Some(pid) = env.watchdog_pid.as_deref()
        && pid.parse::<u32>().ok()? != std::process::id()
    {
        return None;
    }
    Some(Duration::from_micros(usec / 4))
}

/// The socket passed by socket activation, if LISTEN_FDS/LISTEN_PID say there is one for us.
/// `parent_init` is the pid of our own init process when it forked us (the variables were meant
/// for the process systemd started, which is then our parent).
pub fn take_activated_listener(
    env: &SystemdEnv,
    parent_init: Option<u32>,
) -> std::io::Result<Option<std::net::TcpListener>> {
    let Some(count) = env.listen_fds.as_deref() else {
        return Ok(None);
    };
    let count: i32 = count.parse().map_err(|_| {
        std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("LISTEN_FDS={count} is not a number"),
        )
    })?;
    if let Some(pid) = env.listen_pid.as_deref() {
        let pid: u32 = pid.parse().unwrap_or(0);
        if pid != std::process::id() && Some(pid) != parent_init {
            // Meant for another process (we inherited the variables): ignore them.
            return Ok(None);
        }
    }
    if count < 1 {
        return Ok(None);
    }
    if count > 1 {
        tracing::warn!(
            count,
            "socket activation passed several sockets; serving on the first"
        );
    }
    let listener = crate::sys::take_activated_listener()?;
    listener.set_nonblocking(true)?;
    Ok(Some(listener))
}
