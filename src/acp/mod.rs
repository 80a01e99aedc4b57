//! The ACP-over-HTTP proxy (spec 002 §3): one agent process per serverId.

use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use crate::agents::Agents;
use crate::config::Config;
use crate::supervisor::Supervisor;

pub struct AcpService {}

impl AcpService {
    pub fn new(
        _config: Arc<Config>,
        _supervisor: Arc<Supervisor>,
        _agents: Arc<Agents>,
        _shutdown: CancellationToken,
    ) -> Self {
        AcpService {}
    }

    /// Stops every instance before `deadline`.
    pub async fn stop_all(&self, _deadline: tokio::time::Instant) {}
}
