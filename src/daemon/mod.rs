//! Start-up and shutdown, nothing else: take the listener (socket activation or bind), build the
//! services, serve, tell systemd READY, wait for a stop signal, then drain within the grace
//! period (stop accepting, finish in-flight requests, stop every agent) and return.

pub mod init;
pub mod serve;
pub mod signals;
mod state;
pub mod systemd;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
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
    Config(String),
    #[error("the data directory {} does not exist and cannot be created: {source}", path.display())]
    DataDir {
        path: std::path::PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Other(#[from] anyhow::Error),
}

/// Runs the daemon until a stop signal; `parent_init` is our own init's pid when it forked us.
///
/// Shutdown is one `CancellationToken` tree: the root is cancelled by the first stop signal;
/// the accept loop, every connection and every service hold child tokens of it. Every
/// connection task and the watchdog run on one `TaskTracker`, so the drain is "close the
/// tracker, wait for it" within the grace period; the proxy's agent stops run on its own
/// tracker, waited for the same way (`AcpService::stop_all`). No flag or static takes part.
pub async fn run(config: Arc<Config>, parent_init: Option<u32>) -> Result<(), StartError> {
    let root = CancellationToken::new();
    // The supervisor comes first so that a second stop signal can kill its agents; the handler
    // holds it weakly, so the state's drop still removes the cgroups.
    let supervisor = Arc::new(Supervisor::new(&config));
    let weak = Arc::downgrade(&supervisor);
    signals::install(root.clone(), move || {
        if let Some(s) = weak.upgrade() {
            s.emergency_kill_all();
        }
    })
    .context("install signal handlers")?;
    let data_dir_problem = check_data_dir(&config.data_dir)?;
    let listener = listen(&config, parent_init).await?;
    let addr = listener.local_addr().context("read the bound address")?;

    let tasks = TaskTracker::new();
    let state = AppState::build(
        config.clone(),
        supervisor,
        root.child_token(),
        data_dir_problem,
        tasks.clone(),
    )
    .await
    .map_err(|e| StartError::Config(format!("{e:#}")))?;
    let app = http::router(state.clone());

    let limits = serve::Limits {
        header_read_timeout: config.header_read_timeout,
        idle_timeout: config.idle_timeout,
        max_connections: config.max_connections,
    };
    let server = tokio::spawn(serve::serve(
        listener,
        app,
        limits,
        root.child_token(),
        tasks.clone(),
    ));

    systemd::notify_ready(addr);
    tracing::info!(%addr, version = env!("CARGO_PKG_VERSION"), "listening on http://{addr}");
    if let Some(every) = systemd::watchdog_interval(&config.systemd) {
        tasks.spawn(pet_watchdog(addr, every, root.child_token()));
    }

    root.cancelled().await;
    systemd::notify_stopping();
    if config.test_wedge_on_stop {
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

    let drain_http = async {
        // The accept loop ends at once on cancellation; then no new task can join the tracker.
        if let Err(e) = server.await {
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
    };
    tokio::join!(drain_http, state.stop_all(deadline));
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
        .context("take the socket-activated listener")?
    {
        return TcpListener::from_std(std_listener)
            .context("register the socket-activated listener")
            .map_err(StartError::from);
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
