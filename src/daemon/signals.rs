//! Stop signals. The first SIGTERM/SIGINT/SIGQUIT starts a graceful stop; a second one ends the
//! process at once (after killing every agent process group, so nothing is orphaned). SIGHUP
//! asks for an in-place reload (`daemon/reload.rs`).

use signal_hook::consts::{SIGHUP, SIGINT, SIGQUIT, SIGTERM};
use signal_hook::iterator::Signals;
use tokio_util::sync::CancellationToken;

/// Installs the handlers; the first stop signal cancels `root` (the root of the daemon's
/// shutdown tree). `on_second` runs on a second stop signal, just before the process exits with
/// 128 + signal.
///
/// The signals are read on a thread of their own, not as a task: the emergency stop must work
/// when the runtime is wedged (a task that never yields, a blocked worker), which is exactly when
/// an operator sends the second signal. Cancelling a token and logging never block.
pub fn install(
    root: CancellationToken,
    on_second: impl Fn() + Send + 'static,
    on_hup: impl Fn() + Send + 'static,
) -> std::io::Result<()> {
    let mut signals = Signals::new([SIGTERM, SIGINT, SIGQUIT, SIGHUP])?;
    // After a reload's exec these signals arrive blocked (so that none was lost, or acted on
    // by default, before the handlers above existed): take them from here on. Threads made
    // later by this one inherit the unblocked mask.
    let set = super::reload::handled_signals();
    let _ = nix::sys::signal::pthread_sigmask(
        nix::sys::signal::SigmaskHow::SIG_UNBLOCK,
        Some(&set),
        None,
    );
    std::thread::Builder::new()
        .name("signals".into())
        .spawn(move || {
            for sig in signals.forever() {
                if sig == SIGHUP {
                    if root.is_cancelled() {
                        tracing::info!("SIGHUP received while stopping; ignored");
                        super::reload::tell_waiter("refused\nthe daemon is stopping");
                    } else {
                        tracing::info!("SIGHUP received: reloading in place");
                        on_hup();
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
    Ok(())
}

fn signal_name(sig: i32) -> &'static str {
    match sig {
        SIGTERM => "SIGTERM",
        SIGINT => "SIGINT",
        SIGQUIT => "SIGQUIT",
        _ => "signal",
    }
}
