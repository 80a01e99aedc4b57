//! One scrape: a snapshot of every figure, encoded by prometheus-client as OpenMetrics or as the
//! Prometheus text format (0.0.4).

use std::sync::atomic::Ordering::Relaxed;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, NoLabelSet};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::exemplar::Exemplar;
use prometheus_client::registry::Registry;

use super::{ACP_METHODS, COUNTERS, InstanceFigures, Limit};

/// The content type of OpenMetrics text.
pub const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";
/// The content type of the Prometheus text format.
pub const PROMETHEUS_TEXT: &str = prometheus_client::encoding::prometheus_text::CONTENT_TYPE;

/// The figures read at scrape time from the services (the rest come from `COUNTERS`).
#[derive(Debug, Default)]
pub struct Live {
    /// Instances per state: starting, running, exited.
    pub instances: [u64; 3],
    /// Process API records per state: running, exited.
    pub processes: [u64; 2],
    pub sse_subscribers: u64,
    pub instance_figures: Vec<InstanceFigures>,
}

/// The daemon's own process figures, from `/proc/self`.
#[derive(Debug, Default)]
pub struct SelfFigures {
    pub resident_bytes: u64,
    pub virtual_bytes: u64,
    pub cpu_seconds: f64,
    pub open_fds: u64,
    pub max_fds: u64,
    pub start_time_seconds: f64,
    pub threads: u64,
}

impl SelfFigures {
    /// Reads `/proc/self/stat`, `/proc/stat` (boot time), `/proc/self/fd` and the open-file
    /// limit. Blocking (procfs): call it on the blocking pool.
    pub fn read() -> SelfFigures {
        let mut f = SelfFigures::default();
        if let Ok(text) = std::fs::read_to_string("/proc/self/stat")
            && let Some(rest) = text.rfind(')').map(|i| &text[i + 1..])
        {
            let fields: Vec<&str> = rest.split_whitespace().collect();
            // 1-based field n of the whole line is fields[n - 3] here.
            let at = |n: usize| fields.get(n - 3).and_then(|v| v.parse::<u64>().ok());
            let ticks = crate::sys::clock_ticks().max(1) as f64;
            f.cpu_seconds = (at(14).unwrap_or(0) + at(15).unwrap_or(0)) as f64 / ticks;
            f.threads = at(20).unwrap_or(0);
            let start_ticks = at(22).unwrap_or(0) as f64;
            f.virtual_bytes = at(23).unwrap_or(0);
            f.resident_bytes = at(24).unwrap_or(0) * crate::sys::page_size();
            let boot = std::fs::read_to_string("/proc/stat").ok().and_then(|s| {
                s.lines()
                    .find_map(|l| l.strip_prefix("btime ")?.trim().parse::<u64>().ok())
            });
            f.start_time_seconds = boot.unwrap_or(0) as f64 + start_ticks / ticks;
        }
        f.open_fds = std::fs::read_dir("/proc/self/fd").map_or(0, |d| d.count() as u64);
        f.max_fds = nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE)
            .map_or(0, |(soft, _)| soft);
        f
    }
}

/// Everything one scrape encodes.
#[derive(Debug)]
struct Snapshot {
    live: Live,
    me: SelfFigures,
}

type Ex = Exemplar<NoLabelSet, f64>;

fn counter(
    enc: &mut DescriptorEncoder<'_>,
    name: &str,
    help: &str,
    v: u64,
) -> Result<(), std::fmt::Error> {
    enc.encode_descriptor(name, help, None, MetricType::Counter)?
        .encode_counter::<NoLabelSet, _, f64>(&v, None::<&Ex>)
}

fn gauge<V: prometheus_client::encoding::EncodeGaugeValue>(
    enc: &mut DescriptorEncoder<'_>,
    name: &str,
    help: &str,
    v: V,
) -> Result<(), std::fmt::Error> {
    enc.encode_descriptor(name, help, None, MetricType::Gauge)?
        .encode_gauge(&v)
}

impl Collector for Snapshot {
    fn encode(&self, mut enc: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        let live = &self.live;
        {
            let mut m = enc.encode_descriptor(
                "sandbox_agent_build_info",
                "The daemon's version (always 1).",
                None,
                MetricType::Gauge,
            )?;
            m.encode_family(&[("version", env!("CARGO_PKG_VERSION"))])?
                .encode_gauge(&1i64)?;
        }
        {
            let mut m = enc.encode_descriptor(
                "sandbox_agent_instances",
                "Agent instances (serverIds) by state.",
                None,
                MetricType::Gauge,
            )?;
            for (state, n) in ["starting", "running", "exited"].iter().zip(live.instances) {
                m.encode_family(&[("state", *state)])?.encode_gauge(&n)?;
            }
        }
        {
            let starts = crate::sys::lock(&COUNTERS.agent_starts).clone();
            let mut m = enc.encode_descriptor(
                "sandbox_agent_agent_starts",
                "Agent processes started, by agent.",
                None,
                MetricType::Counter,
            )?;
            for (agent, n) in &starts {
                m.encode_family(&[("agent", agent.as_str())])?
                    .encode_counter::<NoLabelSet, _, f64>(n, None::<&Ex>)?;
            }
        }
        {
            let exits = crate::sys::lock(&COUNTERS.agent_exits).clone();
            let mut m = enc.encode_descriptor(
                "sandbox_agent_agent_exits",
                "Agent processes ended, by agent and exit reason (exited, crashed, oom, graceful, forced).",
                None,
                MetricType::Counter,
            )?;
            for ((agent, reason), n) in &exits {
                m.encode_family(&[("agent", agent.as_str()), ("reason", reason)])?
                    .encode_counter::<NoLabelSet, _, f64>(n, None::<&Ex>)?;
            }
        }
        {
            let usage = crate::sys::lock(&COUNTERS.usage).clone();
            let mut m = enc.encode_descriptor(
                "sandbox_agent_acp_usage_updates",
                "ACP usage_update session updates received, by agent.",
                None,
                MetricType::Counter,
            )?;
            for (agent, u) in &usage {
                m.encode_family(&[("agent", agent.as_str())])?
                    .encode_counter::<NoLabelSet, _, f64>(&u.updates, None::<&Ex>)?;
            }
            let mut m = enc.encode_descriptor(
                "sandbox_agent_acp_usage_used_tokens",
                "The latest context tokens in use an agent's usage_update reported, by agent.",
                None,
                MetricType::Gauge,
            )?;
            for (agent, u) in &usage {
                if let Some(v) = u.used_tokens {
                    m.encode_family(&[("agent", agent.as_str())])?
                        .encode_gauge(&v)?;
                }
            }
            let mut m = enc.encode_descriptor(
                "sandbox_agent_acp_usage_size_tokens",
                "The latest context window size an agent's usage_update reported, by agent.",
                None,
                MetricType::Gauge,
            )?;
            for (agent, u) in &usage {
                if let Some(v) = u.size_tokens {
                    m.encode_family(&[("agent", agent.as_str())])?
                        .encode_gauge(&v)?;
                }
            }
            let mut m = enc.encode_descriptor(
                "sandbox_agent_acp_usage_cost",
                "The latest session cost an agent's usage_update reported, by agent and currency.",
                None,
                MetricType::Gauge,
            )?;
            for (agent, u) in &usage {
                if let Some((v, cur)) = &u.cost {
                    m.encode_family(&[("agent", agent.as_str()), ("currency", cur.as_str())])?
                        .encode_gauge(v)?;
                }
            }
        }
        let (counts, durations) = super::http::snapshot();
        {
            let mut m = enc.encode_descriptor(
                "sandbox_agent_http_requests",
                "HTTP requests answered, by matched route template, method and status.",
                None,
                MetricType::Counter,
            )?;
            for c in &counts {
                m.encode_family(&[
                    ("route", c.route.as_str()),
                    ("method", c.method),
                    ("status", c.status.as_str()),
                ])?
                .encode_counter::<NoLabelSet, _, f64>(&c.count, None::<&Ex>)?;
            }
        }
        {
            let mut m = enc.encode_descriptor(
                "sandbox_agent_http_request_duration_seconds",
                "Time to the response head, by matched route template and method.",
                None,
                MetricType::Histogram,
            )?;
            for d in &durations {
                m.encode_family(&[("route", d.route.as_str()), ("method", d.method)])?
                    .encode_histogram::<NoLabelSet>(d.sum, d.count, &d.buckets, None)?;
            }
        }
        {
            let mut m = enc.encode_descriptor(
                "sandbox_agent_acp_messages",
                "JSON-RPC messages written to agents (to_agent) and read from them (from_agent).",
                None,
                MetricType::Counter,
            )?;
            for (dir, c) in [
                ("to_agent", &COUNTERS.acp_to_agent),
                ("from_agent", &COUNTERS.acp_from_agent),
            ] {
                m.encode_family(&[("direction", dir)])?
                    .encode_counter::<NoLabelSet, _, f64>(&c.load(Relaxed), None::<&Ex>)?;
            }
        }
        {
            let mut m = enc.encode_descriptor(
                "sandbox_agent_acp_request_duration_seconds",
                "Client requests to agents, from the POST to the agent's answer, by ACP method (other for methods outside ACP).",
                None,
                MetricType::Histogram,
            )?;
            for (name, h) in ACP_METHODS.iter().zip(COUNTERS.acp_requests.iter()) {
                if h.count() == 0 {
                    continue;
                }
                let (sum, count, buckets) = h.snapshot();
                m.encode_family(&[("method", *name)])?
                    .encode_histogram::<NoLabelSet>(sum, count, &buckets, None)?;
            }
        }
        gauge(
            &mut enc,
            "sandbox_agent_sse_subscribers",
            "Open SSE streams of ACP instances (with the RFD transport's session streams, which share their budget).",
            live.sse_subscribers,
        )?;
        gauge(
            &mut enc,
            "sandbox_agent_websocket_connections",
            "Open WebSockets (ACP, RFD transport, terminals, watch streams).",
            COUNTERS.websockets.load(Relaxed).max(0),
        )?;
        {
            let mut m = enc.encode_descriptor(
                "sandbox_agent_refusals",
                "Requests or connections refused by a cap of the limits table, by limit.",
                None,
                MetricType::Counter,
            )?;
            for l in Limit::ALL {
                let n = COUNTERS.refusals[l as usize].load(Relaxed);
                m.encode_family(&[("limit", l.label())])?
                    .encode_counter::<NoLabelSet, _, f64>(&n, None::<&Ex>)?;
            }
        }
        {
            let mut mem = enc.encode_descriptor(
                "sandbox_agent_agent_memory_bytes",
                "Memory of an instance's process tree (its cgroup, or the resident memory of its process group), sampled every 2 s.",
                None,
                MetricType::Gauge,
            )?;
            for f in &live.instance_figures {
                mem.encode_family(&[
                    ("server_id", f.server_id.as_str()),
                    ("agent", f.agent.as_str()),
                ])?
                .encode_gauge(&f.memory_bytes)?;
            }
        }
        {
            let mut cpu = enc.encode_descriptor(
                "sandbox_agent_agent_cpu_seconds",
                "CPU time of an instance's process tree, sampled every 2 s.",
                None,
                MetricType::Counter,
            )?;
            for f in &live.instance_figures {
                cpu.encode_family(&[
                    ("server_id", f.server_id.as_str()),
                    ("agent", f.agent.as_str()),
                ])?
                .encode_counter::<NoLabelSet, _, f64>(&f.cpu_seconds, None::<&Ex>)?;
            }
        }
        {
            let mut procs = enc.encode_descriptor(
                "sandbox_agent_agent_processes",
                "Processes of an instance's tree, sampled every 2 s.",
                None,
                MetricType::Gauge,
            )?;
            for f in &live.instance_figures {
                procs
                    .encode_family(&[
                        ("server_id", f.server_id.as_str()),
                        ("agent", f.agent.as_str()),
                    ])?
                    .encode_gauge(&f.processes)?;
            }
        }
        {
            let mut m = enc.encode_descriptor(
                "sandbox_agent_processes",
                "Process API records (/v1/processes) by state.",
                None,
                MetricType::Gauge,
            )?;
            for (state, n) in ["running", "exited"].iter().zip(live.processes) {
                m.encode_family(&[("state", *state)])?.encode_gauge(&n)?;
            }
        }
        counter(
            &mut enc,
            "sandbox_agent_log_records_dropped",
            "Log records dropped because the log writer could not keep up.",
            COUNTERS.log_records_dropped.load(Relaxed),
        )?;
        counter(
            &mut enc,
            "sandbox_agent_file_transfer_received_bytes",
            "File bytes received from clients (writes, uploads).",
            COUNTERS.transfer_in.load(Relaxed),
        )?;
        counter(
            &mut enc,
            "sandbox_agent_file_transfer_sent_bytes",
            "File bytes sent to clients (reads).",
            COUNTERS.transfer_out.load(Relaxed),
        )?;
        counter(
            &mut enc,
            "sandbox_agent_installer_downloads",
            "Downloads the agent installer started (archives, binaries).",
            COUNTERS.install_downloads.load(Relaxed),
        )?;
        counter(
            &mut enc,
            "sandbox_agent_installer_failures",
            "Agent installs that failed (download, checksum, unpacking, npm).",
            COUNTERS.install_failures.load(Relaxed),
        )?;
        let me = &self.me;
        gauge(
            &mut enc,
            "process_resident_memory_bytes",
            "Resident memory of the daemon.",
            me.resident_bytes,
        )?;
        gauge(
            &mut enc,
            "process_virtual_memory_bytes",
            "Virtual memory of the daemon.",
            me.virtual_bytes,
        )?;
        enc.encode_descriptor(
            "process_cpu_seconds",
            "User and system CPU time of the daemon.",
            None,
            MetricType::Counter,
        )?
        .encode_counter::<NoLabelSet, _, f64>(&me.cpu_seconds, None::<&Ex>)?;
        gauge(
            &mut enc,
            "process_open_fds",
            "Open file descriptors of the daemon.",
            me.open_fds,
        )?;
        gauge(
            &mut enc,
            "process_max_fds",
            "The daemon's open-file limit.",
            me.max_fds,
        )?;
        gauge(
            &mut enc,
            "process_start_time_seconds",
            "Start time of the daemon, seconds since the Unix epoch.",
            me.start_time_seconds,
        )?;
        gauge(
            &mut enc,
            "process_threads",
            "Threads of the daemon.",
            me.threads,
        )?;
        Ok(())
    }
}

/// Encodes a snapshot: OpenMetrics when `openmetrics`, else the Prometheus text format.
/// Blocking (it reads `/proc/self`): call it on the blocking pool.
pub fn encode(live: Live, openmetrics: bool) -> String {
    let mut registry = Registry::default();
    registry.register_collector(Box::new(Snapshot {
        live,
        me: SelfFigures::read(),
    }));
    let mut out = String::with_capacity(16 * 1024);
    let done = if openmetrics {
        prometheus_client::encoding::text::encode(&mut out, &registry)
    } else {
        prometheus_client::encoding::prometheus_text::encode(&mut out, &registry)
    };
    if done.is_err() {
        tracing::warn!("encoding the metrics failed");
    }
    out
}
