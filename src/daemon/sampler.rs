//! The sampler of the per-instance process figures `/metrics` and `GET /v1/acp` report: it reads the ACP service's
//! instances (procfs and cgroup files, on the blocking pool) every `metrics::SAMPLE_EVERY` and
//! hands the figures to the metrics recorders and keeps them in the ACP service for listings; the
//! same for `GET /v1/processes` and the process service. It lives with the composition root because it is
//! the one part of metrics that reads a service; the recorders stay a leaf every layer may call.

use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use crate::acp::AcpService;
use crate::metrics::{InstanceFigures, SAMPLE_EVERY};
use crate::processes::ProcessService;

/// Samples the figures of every instance and running process every `SAMPLE_EVERY` until `stop`.
pub fn spawn(acp: Arc<AcpService>, processes: Arc<ProcessService>, stop: CancellationToken) {
    tokio::spawn(async move {
        loop {
            // Without instances nothing is read (and no blocking-pool thread woken for it).
            let rows = acp.sample().await;
            let figures: Vec<InstanceFigures> = rows
                .into_iter()
                .filter_map(|r| {
                    Some(InstanceFigures {
                        memory_bytes: r.rss_bytes?,
                        cpu_seconds: r.cpu_ms? as f64 / 1000.0,
                        processes: r.processes.unwrap_or(0),
                        server_id: r.server_id,
                        agent: r.agent,
                    })
                })
                .collect();
            crate::metrics::set_sampled(figures);
            processes.sample().await;
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep(SAMPLE_EVERY) => {}
            }
        }
    });
}
