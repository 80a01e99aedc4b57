//! The composition root: every service built from the config around the daemon's supervisor,
//! and stopped again at shutdown. Handlers see the result as `http::AppState`; only the daemon
//! builds or stops it.

use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use crate::config::Config;
use crate::http::AppState;

impl AppState {
    /// Builds every service from the config around the daemon's `supervisor` (made first, so
    /// the signal handler can reach it). `shutdown` is this state's node of the daemon's
    /// cancellation tree; each service gets a child of it. Fails on bad operator input (e.g.
    /// the agents file).
    pub async fn build(
        config: Arc<Config>,
        supervisor: Arc<crate::supervisor::Supervisor>,
        shutdown: CancellationToken,
        data_dir_problem: Option<String>,
        tasks: tokio_util::task::TaskTracker,
    ) -> anyhow::Result<Self> {
        let agents = Arc::new(
            crate::agents::Agents::new(config.clone())?.with_agent_home(supervisor.agent_home()),
        );
        let acp = Arc::new(crate::acp::AcpService::new(
            config.clone(),
            supervisor.clone(),
            agents.clone(),
            shutdown.child_token(),
        ));
        let connections = Arc::new(crate::acp::Connections::new(
            acp.clone(),
            agents.clone(),
            &config,
        ));
        let files = Arc::new(crate::files::FileService::new(&config)?);
        let config_store = Arc::new(crate::config_store::ConfigStore::new(files.clone()));
        let processes = Arc::new(crate::processes::ProcessService::new(
            &config,
            supervisor.clone(),
            shutdown.child_token(),
        ));
        // The per-instance process figures of `/metrics`, read off the runtime thread.
        crate::metrics::spawn_sampler(acp.clone(), shutdown.child_token());
        Ok(AppState(Arc::new(crate::http::Services {
            data_dir_problem,
            config,
            shutdown,
            supervisor,
            agents,
            acp,
            connections,
            files,
            config_store,
            processes,
            tasks,
        })))
    }

    /// Stops every agent (TERM, grace, KILL) before `deadline`.
    pub async fn stop_all(&self, deadline: tokio::time::Instant) {
        self.acp.stop_all(deadline).await;
        // Whatever the proxy did not stop (e.g. an agent still starting) and the cgroup subtree.
        self.supervisor.stop_all(deadline).await;
    }
}
