//! The composition root: every service built from the config around the daemon's supervisor,
//! and stopped again at shutdown. Handlers see the result as `http::AppState`; only the daemon
//! builds or stops it.

use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use crate::config::Config;
use crate::http::AppState;

/// Why the services could not be built: bad operator input, or a state dir that is not ours.
/// Each keeps its service's own message.
#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    /// The agents file (`--agents-file`) or a built-in entry is invalid.
    #[error(transparent)]
    Agents(#[from] crate::agents::catalog::CatalogError),
    /// The state dir is another daemon's (locked) or not a state dir.
    #[error(transparent)]
    State(#[from] crate::state::StateError),
    /// The file service's root cannot be used.
    #[error(transparent)]
    Files(std::io::Error),
    /// The workspace (git, search, ports) cannot be set up.
    #[error(transparent)]
    Workspace(std::io::Error),
}

impl AppState {
    /// Builds every service from the config around the daemon's `supervisor` (made first, so
    /// the signal handler can reach it). `shutdown` ends the streams (SSE, WebSockets,
    /// terminals: cancelled at shutdown and when a reload quiesces); `services` is the services'
    /// node of the daemon's cancellation tree (cancelled at shutdown only: a reload keeps them
    /// running), each service gets a child of it. Fails on bad operator input (e.g. the agents
    /// file).
    pub async fn build(
        config: Arc<Config>,
        supervisor: Arc<crate::supervisor::Supervisor>,
        shutdown: CancellationToken,
        services: CancellationToken,
        data_dir_problem: Option<String>,
        tasks: tokio_util::task::TaskTracker,
    ) -> Result<Self, BuildError> {
        let agents = Arc::new(
            crate::agents::Agents::new(config.clone())?.with_agent_home(supervisor.agent_home()),
        );
        let mut state = match &config.state_dir {
            Some(dir) => {
                let (c, d) = (config.clone(), dir.clone());
                match crate::sys::blocking(move || crate::state::StateStore::open(&c, &d)).await {
                    Ok(s) => Some(s),
                    // Another daemon's dir, or not a state dir at all: refuse to start.
                    Err(e) if e.is_refusal() => return Err(BuildError::State(e)),
                    // The API never stops for the state dir: memory only, and health says so.
                    Err(e) => {
                        tracing::warn!(error = %format!("{e:#}"),
                            "cannot use the state dir: state is kept in memory only");
                        None
                    }
                }
            }
            None => None,
        };
        let mut acp = crate::acp::AcpService::new(
            config.clone(),
            supervisor.clone(),
            agents.clone(),
            services.child_token(),
        );
        if let Some((store, recovered)) = &mut state {
            acp = acp.with_state(store.clone(), std::mem::take(&mut recovered.acp));
        }
        let acp = Arc::new(acp);
        let connections = Arc::new(crate::acp::Connections::new(
            acp.clone(),
            agents.clone(),
            &config,
        ));
        let files = Arc::new(crate::files::FileService::new(&config).map_err(BuildError::Files)?);
        if data_dir_problem.is_none() {
            sweep_temporaries(&config.data_dir);
        }
        let config_store = Arc::new(crate::config_store::ConfigStore::new(files.clone()));
        let mut processes = crate::processes::ProcessService::new(
            &config,
            supervisor.clone(),
            services.child_token(),
        );
        if let Some((store, recovered)) = &mut state {
            processes =
                processes.with_state(store.clone(), std::mem::take(&mut recovered.processes));
        }
        let processes = Arc::new(processes);
        let workspace = Arc::new(
            crate::workspace::Workspace::new(
                files.policy().clone(),
                processes.clone(),
                acp.clone(),
                services.child_token(),
            )
            .map_err(BuildError::Workspace)?,
        );
        let opencode = {
            let (c, a, g) = (config.clone(), acp.clone(), agents.clone());
            let dir = match &state {
                Some((s, _)) => Some(s.dir().join("opencode")),
                None => config.opencode_store.clone(),
            };
            // Only a store is read from disk (on the blocking pool, which nothing else needs
            // at start otherwise).
            Arc::new(match dir {
                Some(dir) => {
                    crate::sys::blocking(move || {
                        crate::opencode::OpenCode::new(c, a, g, Some(&dir))
                    })
                    .await
                }
                None => crate::opencode::OpenCode::new(c, a, g, None),
            })
        };
        let desktop = Arc::new(crate::desktop::DesktopService::new(
            &config,
            supervisor.clone(),
        ));
        let browser = Arc::new(crate::browser::BrowserService::new(
            &config,
            supervisor.clone(),
        ));
        // The process figures of `/metrics` and the listings, read off the runtime thread.
        super::sampler::spawn(acp.clone(), processes.clone(), services.child_token());
        Ok(AppState(Arc::new(crate::services::Services {
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
            workspace,
            opencode,
            desktop,
            browser,
            state: state.map(|(s, _)| s),
            tasks,
        })))
    }

    /// Stops every agent (TERM, grace, KILL) before `deadline`.
    pub async fn stop_all(&self, deadline: tokio::time::Instant) {
        if let Some(store) = &self.state {
            store.set_stopping();
        }
        self.acp.stop_all(deadline).await;
        // The desktop's recording is finished cleanly before the supervisor ends the rest.
        self.desktop.shutdown().await;
        self.browser.shutdown().await;
        // Whatever the proxy did not stop (e.g. an agent still starting) and the cgroup subtree.
        self.supervisor.stop_all(deadline).await;
        let opencode = self.opencode.clone();
        crate::sys::blocking(move || opencode.flush_blocking(std::time::Duration::from_secs(2)))
            .await;
        // Whatever the state writer still holds reaches the disk before the process ends.
        if let Some(store) = self.state.clone() {
            let left = deadline
                .saturating_duration_since(tokio::time::Instant::now())
                .max(std::time::Duration::from_millis(500));
            crate::sys::blocking(move || store.flush_blocking(left)).await;
        }
    }
}

/// Removes the temporaries a crashed run left in users' trees (listed in its journal) and opens
/// this run's journal. Never stops the start: without a journal, only a crash's leftovers stay.
/// Runs on the start-up path itself, before anything is served (a few file operations, bounded
/// by the temporaries alive at the crash): the blocking pool stays unused until a request needs
/// it.
fn sweep_temporaries(data_dir: &std::path::Path) {
    match crate::files::journal::start(data_dir) {
        Ok(s) if s.removed + s.left > 0 => tracing::warn!(
            removed = s.removed,
            left_alone = s.left,
            journals = s.journals,
            "removed the temporaries of transfers a crashed run left in users' trees"
        ),
        // A reload's previous image (its journal released by the exec), or nothing to do.
        Ok(s) => tracing::debug!(journals = s.journals, "temporaries journals swept"),
        Err(e) => tracing::warn!(
            error = %e,
            "cannot keep the temporaries journal in the data dir: a temporary a crash leaves in \
             a user's tree will not be removed at the next start"
        ),
    }
}
