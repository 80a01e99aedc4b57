//! The workspace service behind `/v1/git/*`, `/v1/fs/glob`, `/v1/fs/grep`, `/v1/ports*` and
//! `/preview/*` (no HTTP types here but the proxy's): what an agent changed (git), where things
//! are (search) and what it runs (ports, the proxy and preview links). Every path a client
//! names is resolved beneath the fs root by the files service's `PathPolicy`.

pub mod git;
pub mod ports;
pub mod preview;
pub mod proxy;
pub mod search;
pub mod sessions;

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

pub use git::GitError;

/// How long one git call may take (a clone: [`CLONE_TIMEOUT`]).
pub const GIT_TIMEOUT: Duration = Duration::from_secs(60);
pub const CLONE_TIMEOUT: Duration = Duration::from_secs(600);

pub struct Workspace {
    pub git: git::Git,
    pub ports: Arc<ports::Ports>,
    pub previews: preview::PreviewKeys,
    /// `gitBase` of each ACP session (`GET /v1/acp`).
    pub sessions: sessions::SessionBases,
    /// Searches walking at once (each walk uses a thread per CPU).
    pub search_slots: Arc<tokio::sync::Semaphore>,
}

impl Workspace {
    pub fn new(
        policy: Arc<crate::files::PathPolicy>,
        processes: Arc<crate::processes::ProcessService>,
        acp: Arc<crate::acp::AcpService>,
        shutdown: CancellationToken,
    ) -> std::io::Result<Self> {
        Ok(Workspace {
            git: git::Git {
                policy,
                runner: git::GitRunner {
                    timeout: GIT_TIMEOUT,
                    clone_timeout: CLONE_TIMEOUT,
                    slots: Arc::new(tokio::sync::Semaphore::new(git::MAX_CONCURRENT)),
                },
            },
            ports: Arc::new(ports::Ports::new(processes, acp, shutdown)),
            previews: preview::PreviewKeys::generate()?,
            sessions: sessions::SessionBases::default(),
            search_slots: Arc::new(tokio::sync::Semaphore::new(search::MAX_CONCURRENT)),
        })
    }

    pub fn policy(&self) -> &Arc<crate::files::PathPolicy> {
        &self.git.policy
    }
}
