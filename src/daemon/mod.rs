//! Start-up and shutdown, nothing else: take the listener (socket activation or bind), build the
//! services, serve, tell systemd READY, wait for a stop signal, then drain within the grace
//! period (stop accepting, finish in-flight requests, stop every agent) and return.

#[cfg(test)]
mod handoff_tests;
pub mod init;
mod protocol;
pub mod reload;
mod sampler;
pub mod serve;
pub mod signals;
mod state;
pub use state::BuildError;
pub mod systemd;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::config::Config;
use crate::http::{self, AppState};
use crate::supervisor::Supervisor;

/// Why the daemon could not run; `main` turns each into a documented exit code.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("invalid configuration: {0}")]
    Config(#[source] BuildError),
    #[error("the data directory {} does not exist and cannot be created: {source}", path.display())]
    DataDir {
        path: std::path::PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The state dir is another daemon's (locked) or not a state dir (`--state-dir`).
    #[error(transparent)]
    State(#[from] crate::state::StateError),
    /// A descriptor or a system call the daemon cannot start without (`what` names it).
    #[error("{what}: {source}")]
    Io {
        what: &'static str,
        #[source]
        source: std::io::Error,
    },
}

/// Names the step an I/O error stopped the start at.
fn io(what: &'static str) -> impl FnOnce(std::io::Error) -> StartError {
    move |source| StartError::Io { what, source }
}

/// What `main` hands the daemon for reloads: how it was started, the token given by flag or
/// environment (a reload carries it), and the hand-off when this image is a reload's.
pub struct Reloads {
    pub launch: reload::Launch,
    pub token: Option<String>,
    pub received: Option<reload::Received>,
    /// `--ready-fd`: told the address once listening, then closed (not after a reload).
    pub ready_fd: Option<std::os::fd::OwnedFd>,
}

/// Runs the daemon until a stop signal; `parent_init` is our own init's pid when it forked us.
///
/// Shutdown is one `CancellationToken` tree: the root is cancelled by the first stop signal;
/// the accept loop, every connection and every service hold child tokens of it. Every
/// connection task runs on one `TaskTracker`, so the drain is "close the
/// tracker, wait for it" within the grace period; the proxy's agent stops run on its own
/// tracker, waited for the same way (`AcpService::stop_all`). No flag or static takes part.
/// SIGHUP re-executes the daemon in place (`reload.rs`); only a reload that did not happen
/// returns here.
pub async fn run(
    config: Arc<Config>,
    parent_init: Option<u32>,
    mut reloads: Reloads,
) -> Result<(), StartError> {
    let root = CancellationToken::new();
    let reload_asked = Arc::new(tokio::sync::Notify::new());
    let mut received = reloads.received.take();
    // The supervisor comes first so that a second stop signal can kill its agents; the handler
    // holds it weakly, so the state's drop still removes the cgroups.
    let supervisor = match &mut received {
        Some(r) => {
            let h = r.handoff.cgroups.clone();
            let mut locks = Vec::new();
            for d in &h.dirs {
                if let Some(n) = d.lock_fd {
                    locks.push(
                        r.take(n)
                            .map_err(io("take a cgroup lock of the hand-off"))?,
                    );
                }
            }
            Arc::new(
                Supervisor::adopting(&config, &h, locks)
                    .map_err(io("take over the cgroups of the previous image"))?,
            )
        }
        None => Arc::new(Supervisor::new(&config)),
    };
    let weak = Arc::downgrade(&supervisor);
    let asked = reload_asked.clone();
    let waiters = reload::Waiters::default();
    let hup_waiters = waiters.clone();
    let signal_gate = signals::install(
        root.clone(),
        move || {
            if let Some(s) = weak.upgrade() {
                s.emergency_kill_all();
            }
        },
        move |ticket| {
            hup_waiters.add(ticket);
            asked.notify_one();
        },
    )
    .map_err(io("install signal handlers"))?;
    let data_dir_problem = check_data_dir(&config.data_dir)?;
    let listener = match &mut received {
        Some(r) => {
            let fd = r
                .take(r.handoff.listener_fd)
                .map_err(io("take the listener of the hand-off"))?;
            let std_listener = std::net::TcpListener::from(fd);
            std_listener
                .set_nonblocking(true)
                .map_err(io("the listener of the hand-off"))?;
            TcpListener::from_std(std_listener)
                .map_err(io("register the listener of the hand-off"))?
        }
        None => listen(&config, parent_init).await?,
    };
    let listener = Arc::new(listener);
    let addr = listener
        .local_addr()
        .map_err(io("read the bound address"))?;

    let tasks = TaskTracker::new();
    // Cancelled by the root (shutdown) or by a reload's quiesce: the accept loop, connections
    // and streams end; the services (`root`'s other child) keep running through a reload.
    let drain = root.child_token();
    let state = AppState::build(
        config.clone(),
        supervisor,
        drain.child_token(),
        root.child_token(),
        data_dir_problem,
        tasks.clone(),
    )
    .await
    .map_err(|e| match e {
        BuildError::State(e) => StartError::State(e),
        e => StartError::Config(e),
    })?;
    if let Some(r) = &mut received {
        let acp = std::mem::take(&mut r.handoff.acp);
        let processes = std::mem::take(&mut r.handoff.processes);
        state.acp.adopt(&acp, &mut |n| r.take(n));
        state.connections.adopt(&r.handoff.connections, &acp);
        state.processes.adopt(&processes, &mut |n| r.take(n));
        r.close_rest();
        if r.handoff.stop_requested {
            root.cancel();
        }
    }
    // After any adoption: what a crash cut of a reload's 202s is answered (durable state).
    state.acp.answer_broken_promises();
    let app = http::router(state.clone());

    let limits = serve::Limits {
        header_read_timeout: config.header_read_timeout,
        idle_timeout: config.idle_timeout,
        max_connections: config.max_connections,
    };
    let mut server = Some(tokio::spawn(serve::serve(
        listener.clone(),
        app,
        limits,
        drain.child_token(),
        tasks.clone(),
    )));

    systemd::notify_ready(addr);
    if received.is_some() {
        tracing::info!(%addr, version = env!("CARGO_PKG_VERSION"), "reloaded; listening on http://{addr}");
        if let Some(r) = &received {
            reload::tell(&r.handoff.waiters, &reload::Outcome::Ready);
            if r.handoff.version < 3 {
                // From a daemon of the previous release: its waiter listens by pid.
                reload::tell_legacy_ready();
            }
        }
    } else {
        tracing::info!(%addr, version = env!("CARGO_PKG_VERSION"), "listening on http://{addr}");
    }
    if let Some(fd) = reloads.ready_fd.take() {
        // A pipe whose reader is slow must not hold a runtime thread: written off it.
        let line = ready_line(addr);
        tokio::task::spawn_blocking(move || {
            use std::io::Write as _;
            let mut f = std::fs::File::from(fd);
            if let Err(e) = f.write_all(line.as_bytes()) {
                tracing::warn!(error = %e, "cannot write to --ready-fd");
            }
        });
    }
    drop(received);
    let watchdog = systemd::watchdog_interval(&config.systemd)
        .map(|every| tokio::spawn(pet_watchdog(addr, every, root.child_token())));

    loop {
        tokio::select! {
            _ = root.cancelled() => break,
            _ = reload_asked.notified() => {
                let failed = reload::reload(reload::Reloading {
                    launch: &reloads.launch,
                    token: reloads.token.as_deref(),
                    state: &state,
                    listener: &listener,
                    drain: &drain,
                    server: &mut server,
                    tasks: &tasks,
                    root: &root,
                    signals: &signal_gate,
                    waiters: &waiters,
                })
                .await;
                match failed {
                    reload::Failed::Refused(why) => {
                        tracing::error!(reason = %why, "reload refused; still serving the previous image");
                        systemd::notify_reload_failed();
                        waiters.tell_all(&reload::Outcome::Refused(why.to_string()));
                    }
                    reload::Failed::Fatal(why) => {
                        tracing::error!(reason = %why, "reload failed after the quiesce; stopping");
                        waiters.tell_all(&reload::Outcome::Failed(format!("{why}; the daemon stops")));
                        root.cancel();
                    }
                }
            }
        }
    }
    systemd::notify_stopping();
    if crate::config::test_hooks::wedge_on_stop() {
        // The emergency stop's test: no task runs from here on, so only the signal thread can
        // end the daemon (a second stop signal).
        tracing::warn!("test hook: wedging every runtime worker");
        for _ in 0..config.worker_threads.max(1) {
            tokio::spawn(async { std::thread::sleep(Duration::from_secs(3600)) });
        }
        std::thread::sleep(Duration::from_secs(3600));
    }
    let deadline = Instant::now() + config.shutdown_grace;
    tracing::info!(grace = ?config.shutdown_grace, "stopping: no new connections, draining requests and agents");
    drop(listener);

    let drain_http = async {
        // The accept loop ends at once on cancellation; then no new task can join the tracker.
        if let Some(server) = server.take()
            && let Err(e) = server.await
        {
            tracing::warn!(error = %e, "accept loop failed");
        }
        tasks.close();
        if tokio::time::timeout_at(deadline, tasks.wait())
            .await
            .is_err()
        {
            tracing::warn!(
                open = tasks.len(),
                "connections still open at the end of the grace period; dropping them"
            );
        }
        if let Some(w) = watchdog {
            let _ = w.await;
        }
    };
    tokio::join!(drain_http, state.stop_all(deadline));
    // Transfers still running are cut by the exit: their temporaries go first.
    let cut = crate::sys::blocking(crate::files::remove_live_temporaries).await;
    if cut > 0 {
        tracing::warn!(
            removed = cut,
            "removed the temporaries of transfers the stop cut"
        );
    }
    crate::files::journal::close();
    tracing::info!("stopped");
    Ok(())
}

/// The listener: the socket systemd passed, or a fresh bind of host:port.
/// Makes sure the data directory exists and can be written before anything is served. One
/// that cannot even be created is fatal (no install, upload spool or agent home could ever
/// work); one that exists but refuses writes (a read-only mount, wrong owner) still serves
/// what is installed and the built-in agent, so it is a warning, kept for `/v1/health`.
fn check_data_dir(dir: &std::path::Path) -> Result<Option<String>, StartError> {
    if let Err(source) = std::fs::create_dir_all(dir)
        && !dir.is_dir()
    {
        return Err(StartError::DataDir {
            path: dir.to_path_buf(),
            source,
        });
    }
    let probe = dir.join(format!(".write-check-{}", std::process::id()));
    let written = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&probe)
        .and_then(|_| std::fs::remove_file(&probe));
    match written {
        Ok(()) => Ok(None),
        Err(e) => {
            let problem = format!("{} is not writable: {e}", dir.display());
            tracing::warn!(
                data_dir = %dir.display(),
                error = %e,
                "the data directory is not writable: installing agents and uploads that spool \
                 to disk will fail until it is; installed agents and the mock agent still run"
            );
            Ok(Some(problem))
        }
    }
}

async fn listen(config: &Config, parent_init: Option<u32>) -> Result<TcpListener, StartError> {
    if let Some(std_listener) = systemd::take_activated_listener(&config.systemd, parent_init)
        .map_err(io("take the socket-activated listener"))?
    {
        return TcpListener::from_std(std_listener)
            .map_err(io("register the socket-activated listener"));
    }
    let addr = SocketAddr::new(config.host, config.port);
    TcpListener::bind(addr)
        .await
        .map_err(|source| StartError::Bind { addr, source })
}

/// Pets the systemd watchdog only while the accept loop and router answer: each beat is a real
/// `GET /` over loopback, so a wedged server stops the pings and systemd restarts us. `every` is
/// a quarter of WatchdogSec and each probe gets as long to answer (see
/// `systemd::watchdog_interval` for why a single late probe must not cost a restart).
async fn pet_watchdog(addr: SocketAddr, every: Duration, shutdown: CancellationToken) {
    let probe_addr = match addr {
        SocketAddr::V4(a) if a.ip().is_unspecified() => {
            SocketAddr::from(([127, 0, 0, 1], a.port()))
        }
        SocketAddr::V6(a) if a.ip().is_unspecified() => {
            SocketAddr::from((std::net::Ipv6Addr::LOCALHOST, a.port()))
        }
        other => other,
    };
    let mut ticker = tokio::time::interval(every);
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = ticker.tick() => {}
        }
        match tokio::time::timeout(every, probe(probe_addr)).await {
            Ok(Ok(())) => systemd::notify_watchdog(),
            Ok(Err(e)) => {
                tracing::error!(error = %e, "self-probe failed; not petting the watchdog")
            }
            Err(_) => tracing::error!("self-probe timed out; not petting the watchdog"),
        }
    }
}

async fn probe(addr: SocketAddr) -> std::io::Result<()> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr).await?;
    stream
        .write_all(b"GET / HTTP/1.1\r\nHost: localhost\r\nUser-Agent: sandbox-agent-watchdog\r\nConnection: close\r\n\r\n")
        .await?;
    let mut head = [0u8; 12];
    stream.read_exact(&mut head).await?;
    if &head[..] == b"HTTP/1.1 200" {
        Ok(())
    } else {
        Err(std::io::Error::other(format!(
            "unexpected answer {:?}",
            String::from_utf8_lossy(&head)
        )))
    }
}

/// The line `--ready-fd` receives: `{"url":"http://127.0.0.1:41234","host":"127.0.0.1","port":41234,"pid":42}`.
fn ready_line(addr: std::net::SocketAddr) -> String {
    let url = match addr {
        std::net::SocketAddr::V4(a) => format!("http://{a}"),
        std::net::SocketAddr::V6(a) => format!("http://[{}]:{}", a.ip(), a.port()),
    };
    let mut line = serde_json::json!({
        "url": url,
        "host": addr.ip().to_string(),
        "port": addr.port(),
        "pid": std::process::id(),
    })
    .to_string();
    line.push('\n');
    line
}
