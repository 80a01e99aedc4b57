//! The service handles the daemon's composition root (`daemon/state.rs`) builds and the HTTP
//! handlers consume (through `http::AppState`). It stands below both: `daemon/` builds a
//! `Services`, `http/` only reads one, and neither the services nor this module import either.

use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use crate::config::Config;

/// Every service of one daemon, built once at start (`daemon/state.rs`) and shared by the
/// handlers behind one `Arc` (`http::AppState`).
pub struct Services {
    pub config: Arc<Config>,
    pub shutdown: CancellationToken,
    pub supervisor: Arc<crate::supervisor::Supervisor>,
    pub agents: Arc<crate::agents::Agents>,
    pub acp: Arc<crate::acp::AcpService>,
    /// The ACP RFD transport's connections (each also an instance of `acp`).
    pub connections: Arc<crate::acp::Connections>,
    pub files: Arc<crate::files::FileService>,
    pub config_store: Arc<crate::config_store::ConfigStore>,
    pub processes: Arc<crate::processes::ProcessService>,
    /// git, search, ports, the proxy and preview links (`http/workspace.rs`).
    pub workspace: Arc<crate::workspace::Workspace>,
    /// The OpenCode bridge (`/opencode/*`), over `acp`.
    pub opencode: Arc<crate::opencode::OpenCode>,
    /// The supervised X desktop (`/v1/desktop/*`, `http/desktop.rs`).
    pub desktop: Arc<crate::desktop::DesktopService>,
    /// The supervised Chromium (`/v1/browser/*`, `http/browser.rs`).
    pub browser: Arc<crate::browser::BrowserService>,
    /// `--state-dir`'s store, when there is one.
    pub state: Option<Arc<crate::state::StateStore>>,
    /// Why the data directory cannot be written, as found at start (`None`: it can).
    pub data_dir_problem: Option<String>,
    /// The daemon's tracker of connection tasks: a WebSocket's task (spawned by the upgrade,
    /// outside the connection's own task) holds a token of it, so the shutdown drain waits for
    /// its close frame like for any request in flight.
    pub tasks: tokio_util::task::TaskTracker,
}
