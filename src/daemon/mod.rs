//! Start-up and shutdown, nothing else: take the listener (socket activation or bind), build the
//! services, serve, tell systemd READY, wait for a stop signal, then drain within the grace
//! period (stop accepting, finish in-flight requests, stop every agent) and return.

pub mod init;
pub mod signals;
pub mod systemd;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use axum::serve::ListenerExt;
use tokio::net::TcpListener;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::config::Config;
use crate::http::{self, AppState};

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
    #[error(transparent)]
    Other(#[from] anyhow::Error),
}

/// Runs the daemon until a stop signal; `parent_init` is our own init's pid when it forked us.
pub async fn run(config: Arc<Config>, parent_init: Option<u32>) -> Result<(), StartError> {
    let stop_signal = {
        let emergency = crate::supervisor::emergency_kill_all;
        signals::install(emergency).context("install signal handlers")?
    };
    let listener = listen(&config, parent_init).await?;
    let addr = listener.local_addr().context("read the bound address")?;

    let shutdown = CancellationToken::new();
    let state = AppState::build(config.clone(), shutdown.clone())
        .await
        .map_err(|e| StartError::Config(format!("{e:#}")))?;
    let app = http::router(state.clone());

    let server_shutdown = shutdown.clone();
    // TCP_NODELAY on every connection: hyper writes whole messages (one `writev` per response
    // head and body, one write per SSE chunk), so Nagle's algorithm can only hold back a small
    // SSE event behind an unacknowledged one until the client's delayed ACK (up to 40 ms on a
    // real network; loopback acknowledges at once, so the benchmark cannot show it).
    let listener = listener.tap_io(|tcp| {
        if let Err(e) = tcp.set_nodelay(true) {
            tracing::debug!(error = %e, "cannot set TCP_NODELAY");
        }
    });
    let server = tokio::spawn(async move {
        axum::serve(listener, app)
            .with_graceful_shutdown(server_shutdown.cancelled_owned())
            .await
    });

    systemd::notify_ready(addr);
    tracing::info!(%addr, version = env!("CARGO_PKG_VERSION"), "listening on http://{addr}");
    if let Some(every) = systemd::watchdog_interval(&config.systemd) {
        tokio::spawn(pet_watchdog(addr, every, shutdown.clone()));
    }

    stop_signal.cancelled().await;
    systemd::notify_stopping();
    let deadline = Instant::now() + config.shutdown_grace;
    tracing::info!(grace = ?config.shutdown_grace, "stopping: no new connections, draining requests and agents");
    shutdown.cancel();

    let drain_http = async {
        match tokio::time::timeout_at(deadline, server).await {
            Ok(Ok(Ok(()))) => {}
            Ok(Ok(Err(e))) => tracing::warn!(error = %e, "http server ended with an error"),
            Ok(Err(e)) => tracing::warn!(error = %e, "http server task failed"),
            Err(_) => tracing::warn!(
                "requests still running at the end of the grace period; dropping them"
            ),
        }
    };
    tokio::join!(drain_http, state.stop_all(deadline));
    tracing::info!("stopped");
    Ok(())
}

/// The listener: the socket systemd passed, or a fresh bind of host:port.
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
/// `GET /` over loopback, so a wedged server stops the pings and systemd restarts us.
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
