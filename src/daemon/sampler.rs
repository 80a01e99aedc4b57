//! The sampler of the per-instance process figures `/metrics` reports: it reads the ACP service's
//! instances (procfs and cgroup files, on the blocking pool) every `metrics::SAMPLE_EVERY` and
//! hands the figures to the metrics recorders. It lives with the composition root because it is
//! the one part of metrics that reads a service; the recorders stay a leaf every layer may call.

use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use crate::acp::AcpService;
use crate::metrics::{InstanceFigures, SAMPLE_EVERY};

/// Samples the figures of every instance every `SAMPLE_EVERY` until `stop`.
pub fn spawn(acp: Arc<AcpService>, stop: CancellationToken) {
    tokio::spawn(async move {
        loop {
            // Nothing to read without instances (and no blocking-pool thread woken for it).
            let rows = if acp.status_counts() == [0; 3] {
                Vec::new()
            } else {
                acp.list().await
            };
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
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep(SAMPLE_EVERY) => {}
            }
        }
    });
}
