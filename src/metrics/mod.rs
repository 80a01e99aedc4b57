//! The daemon's figures for operators (`GET /metrics`, docs/observability.md "Metrics").
//!
//! Counting is split by cost. What happens per request or per message (HTTP requests, ACP
//! messages, ACP request durations, refusals, transfer bytes) is a relaxed atomic add into a
//! table fixed at start (`static`s here, `http::HttpTable` for the routes): no lock, no
//! allocation, no formatting on the request path. What is rare (agent starts and exits, keyed by
//! agent id) goes through a mutex. What is a state rather than an event (instances, processes,
//! subscribers) is read when scraped; the per-instance process figures (memory, CPU, processes),
//! which need procfs or cgroup reads, are sampled every few seconds on the blocking pool by
//! the daemon's sampler (`daemon/sampler.rs`) and a scrape only copies the cache.
//!
//! **Boundary:** a leaf. Every layer calls these recorders; nothing here imports a service (the
//! sampler that reads the ACP service lives with the composition root). Encoding (OpenMetrics or the Prometheus text
//! format) is prometheus-client's, through one `Collector` over a snapshot (`scrape.rs`).

pub mod http;
pub mod scrape;

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering::Relaxed};
use std::time::Duration;

/// A histogram of durations in fixed buckets, all atomics: one observation is two relaxed adds
/// (its bucket and the sum). The count is the sum of the buckets, read when scraped.
pub struct Histogram {
    /// Upper bounds in microseconds, ascending; one more bucket (+Inf) follows.
    bounds_us: &'static [u64],
    /// Observations per bucket (not cumulative); `bounds_us.len() + 1` used.
    buckets: [AtomicU64; MAX_BUCKETS],
    sum_ns: AtomicU64,
}

const MAX_BUCKETS: usize = 16;

impl Histogram {
    pub const fn new(bounds_us: &'static [u64]) -> Histogram {
        assert!(bounds_us.len() < MAX_BUCKETS);
        Histogram {
            bounds_us,
            buckets: [const { AtomicU64::new(0) }; MAX_BUCKETS],
            sum_ns: AtomicU64::new(0),
        }
    }

    pub fn observe(&self, d: Duration) {
        let us = d.as_micros().min(u64::MAX as u128) as u64;
        let i = self
            .bounds_us
            .iter()
            .position(|b| us <= *b)
            .unwrap_or(self.bounds_us.len());
        self.buckets[i].fetch_add(1, Relaxed);
        self.sum_ns
            .fetch_add(d.as_nanos().min(u64::MAX as u128) as u64, Relaxed);
    }

    /// (sum in seconds, count, per-bucket (upper bound in seconds, count)), the last bound +Inf.
    pub fn snapshot(&self) -> (f64, u64, Vec<(f64, u64)>) {
        let mut out = Vec::with_capacity(self.bounds_us.len() + 1);
        let mut count = 0;
        for (i, b) in self.buckets[..=self.bounds_us.len()].iter().enumerate() {
            let n = b.load(Relaxed);
            count += n;
            let le = self
                .bounds_us
                .get(i)
                .map_or(f64::INFINITY, |us| *us as f64 / 1e6);
            out.push((le, n));
        }
        (self.sum_ns.load(Relaxed) as f64 / 1e9, count, out)
    }

    pub fn count(&self) -> u64 {
        self.buckets.iter().map(|b| b.load(Relaxed)).sum()
    }
}

/// Buckets of the ACP request durations: an `initialize` takes milliseconds, a prompt minutes.
const ACP_BOUNDS_US: &[u64] = &[
    5_000,
    25_000,
    100_000,
    250_000,
    1_000_000,
    2_500_000,
    10_000_000,
    30_000_000,
    60_000_000,
    120_000_000,
    300_000_000,
    600_000_000,
];

/// The ACP methods a client sends as requests; anything else is counted as `other`, so a client
/// cannot make a label value up.
pub const ACP_METHODS: &[&str] = &[
    "initialize",
    "authenticate",
    "session/new",
    "session/load",
    "session/list",
    "session/prompt",
    "session/set_mode",
    "session/set_model",
    "session/set_config_option",
    "other",
];

/// The index in `ACP_METHODS` of a request's method, from its raw JSON text (a string, quotes
/// included). Escaped spellings count as `other`.
pub fn acp_method_index(raw: &str) -> u8 {
    let name = raw
        .strip_prefix('"')
        .and_then(|r| r.strip_suffix('"'))
        .unwrap_or("");
    ACP_METHODS[..ACP_METHODS.len() - 1]
        .iter()
        .position(|m| *m == name)
        .unwrap_or(ACP_METHODS.len() - 1) as u8
}

/// Every cap of docs/limits.md's limits table that refuses something, as its `limit` label.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(usize)]
pub enum Limit {
    MaxConnections,
    MaxAgents,
    MaxSubscribers,
    MaxSubscribersTotal,
    StdinQueue,
    StdinQueueTotal,
    AcpInflightBytes,
    BodyLimit,
    BodyMinRate,
    TransferTimeout,
    UploadLimit,
    UploadMaxEntries,
    ConfigEntryBytes,
    MaxWatches,
    WatchMaxDirs,
    ProcessMaxConcurrent,
    ProcessMaxTotalLogBytes,
    ProcessMaxInputBytes,
    ProcessReaders,
    RfdSessions,
    RequestTimeout,
    /// A request head over 64 KiB (431).
    RequestHead,
}

impl Limit {
    pub const ALL: [Limit; 22] = [
        Limit::MaxConnections,
        Limit::MaxAgents,
        Limit::MaxSubscribers,
        Limit::MaxSubscribersTotal,
        Limit::StdinQueue,
        Limit::StdinQueueTotal,
        Limit::AcpInflightBytes,
        Limit::BodyLimit,
        Limit::BodyMinRate,
        Limit::TransferTimeout,
        Limit::UploadLimit,
        Limit::UploadMaxEntries,
        Limit::ConfigEntryBytes,
        Limit::MaxWatches,
        Limit::WatchMaxDirs,
        Limit::ProcessMaxConcurrent,
        Limit::ProcessMaxTotalLogBytes,
        Limit::ProcessMaxInputBytes,
        Limit::ProcessReaders,
        Limit::RfdSessions,
        Limit::RequestTimeout,
        Limit::RequestHead,
    ];

    pub fn label(self) -> &'static str {
        match self {
            Limit::MaxConnections => "max_connections",
            Limit::MaxAgents => "max_agents",
            Limit::MaxSubscribers => "max_subscribers",
            Limit::MaxSubscribersTotal => "max_subscribers_total",
            Limit::StdinQueue => "stdin_queue",
            Limit::StdinQueueTotal => "stdin_queue_total",
            Limit::AcpInflightBytes => "acp_inflight_bytes",
            Limit::BodyLimit => "body_limit",
            Limit::BodyMinRate => "body_min_rate",
            Limit::TransferTimeout => "transfer_timeout",
            Limit::UploadLimit => "upload_limit",
            Limit::UploadMaxEntries => "upload_max_entries",
            Limit::ConfigEntryBytes => "config_entry_bytes",
            Limit::MaxWatches => "max_watches",
            Limit::WatchMaxDirs => "watch_max_dirs",
            Limit::ProcessMaxConcurrent => "process_max_concurrent",
            Limit::ProcessMaxTotalLogBytes => "process_max_total_log_bytes",
            Limit::ProcessMaxInputBytes => "process_max_input_bytes",
            Limit::ProcessReaders => "process_readers",
            Limit::RfdSessions => "rfd_sessions",
            Limit::RequestTimeout => "request_timeout",
            Limit::RequestHead => "request_head",
        }
    }
}

/// The event counters of the whole process (one daemon per process).
pub struct Counters {
    pub acp_to_agent: AtomicU64,
    pub acp_from_agent: AtomicU64,
    pub acp_requests: [Histogram; 10],
    pub refusals: [AtomicU64; Limit::ALL.len()],
    pub transfer_in: AtomicU64,
    pub transfer_out: AtomicU64,
    pub install_downloads: AtomicU64,
    pub install_failures: AtomicU64,
    pub websockets: AtomicI64,
    pub log_records_dropped: AtomicU64,
    /// Starts per agent id (ids are bounded: the catalog plus the operator's agents file).
    pub agent_starts: Mutex<BTreeMap<String, u64>>,
    /// Exits per agent id and `exitReason`.
    pub agent_exits: Mutex<BTreeMap<(String, &'static str), u64>>,
    /// ACP `usage_update` session updates per agent id.
    pub usage: Mutex<BTreeMap<String, Usage>>,
}

/// What the `usage_update`s of one agent's sessions reported.
#[derive(Debug, Clone, Default)]
pub struct Usage {
    /// How many updates arrived.
    pub updates: u64,
    /// The latest `used` (context tokens in use), as reported.
    pub used_tokens: Option<f64>,
    /// The latest `size` (the context window), as reported.
    pub size_tokens: Option<f64>,
    /// The latest `cost.amount` and its `cost.currency` (at most 8 characters kept).
    pub cost: Option<(f64, String)>,
}

pub static COUNTERS: Counters = Counters {
    acp_to_agent: AtomicU64::new(0),
    acp_from_agent: AtomicU64::new(0),
    acp_requests: [const { Histogram::new(ACP_BOUNDS_US) }; 10],
    refusals: [const { AtomicU64::new(0) }; Limit::ALL.len()],
    transfer_in: AtomicU64::new(0),
    transfer_out: AtomicU64::new(0),
    install_downloads: AtomicU64::new(0),
    install_failures: AtomicU64::new(0),
    websockets: AtomicI64::new(0),
    log_records_dropped: AtomicU64::new(0),
    agent_starts: Mutex::new(BTreeMap::new()),
    agent_exits: Mutex::new(BTreeMap::new()),
    usage: Mutex::new(BTreeMap::new()),
};

const _: () = assert!(ACP_METHODS.len() == 10);

/// A log record the log writer's queue had no room for.
pub fn log_record_dropped() {
    COUNTERS.log_records_dropped.fetch_add(1, Relaxed);
}

/// A refusal by `limit`.
pub fn refused(limit: Limit) {
    COUNTERS.refusals[limit as usize].fetch_add(1, Relaxed);
}

/// `n` JSON-RPC messages written to an agent's stdin.
pub fn acp_to_agent(n: u64) {
    COUNTERS.acp_to_agent.fetch_add(n, Relaxed);
}

/// One message read from an agent's stdout.
pub fn acp_from_agent() {
    COUNTERS.acp_from_agent.fetch_add(1, Relaxed);
}

/// A client's request of method `method` (an `ACP_METHODS` index) answered after `d`.
pub fn acp_request(method: u8, d: Duration) {
    let i = usize::from(method).min(ACP_METHODS.len() - 1);
    COUNTERS.acp_requests[i].observe(d);
}

/// File bytes received from clients (writes, uploads).
pub fn transfer_in(n: u64) {
    COUNTERS.transfer_in.fetch_add(n, Relaxed);
}

/// File bytes sent to clients (reads, downloads).
pub fn transfer_out(n: u64) {
    COUNTERS.transfer_out.fetch_add(n, Relaxed);
}

/// A download started by the installer (an agent archive or binary).
pub fn install_download() {
    COUNTERS.install_downloads.fetch_add(1, Relaxed);
}

/// An agent install that failed.
pub fn install_failed() {
    COUNTERS.install_failures.fetch_add(1, Relaxed);
}

pub fn agent_started(agent: &str) {
    let mut m = crate::sys::lock(&COUNTERS.agent_starts);
    match m.get_mut(agent) {
        Some(n) => *n += 1,
        None => {
            m.insert(agent.to_string(), 1);
        }
    }
}

/// An agent ended, for `reason` (the supervisor's `ExitReason::as_str`).
pub fn agent_exited(agent: &str, reason: &'static str) {
    let mut m = crate::sys::lock(&COUNTERS.agent_exits);
    *m.entry((agent.to_string(), reason)).or_insert(0) += 1;
}

/// A `session/update` of an agent `agent` (the update object): counted when it is a
/// `usage_update` (ACP: `used`, `size`, optional `cost {amount, currency}`).
pub fn usage_update(agent: &str, update: &serde_json::Value) {
    if update.get("sessionUpdate").and_then(|v| v.as_str()) != Some("usage_update") {
        return;
    }
    let num = |k: &str| update.get(k).and_then(serde_json::Value::as_f64);
    let cost = update.get("cost").and_then(|c| {
        let amount = c.get("amount").and_then(serde_json::Value::as_f64)?;
        let currency: String = c
            .get("currency")
            .and_then(|v| v.as_str())
            .unwrap_or("")
            .chars()
            .filter(char::is_ascii_alphanumeric)
            .take(8)
            .collect();
        Some((amount, currency))
    });
    let mut m = crate::sys::lock(&COUNTERS.usage);
    let u = match m.get_mut(agent) {
        Some(u) => u,
        None => m.entry(agent.to_string()).or_default(),
    };
    u.updates += 1;
    if let Some(v) = num("used") {
        u.used_tokens = Some(v);
    }
    if let Some(v) = num("size") {
        u.size_tokens = Some(v);
    }
    if cost.is_some() {
        u.cost = cost;
    }
}

/// Held while a WebSocket is open (the `sandbox_agent_websocket_connections` gauge).
pub struct WebSocketOpen(());

impl WebSocketOpen {
    pub fn new() -> WebSocketOpen {
        COUNTERS.websockets.fetch_add(1, Relaxed);
        WebSocketOpen(())
    }
}

impl Default for WebSocketOpen {
    fn default() -> Self {
        Self::new()
    }
}

impl Drop for WebSocketOpen {
    fn drop(&mut self) {
        COUNTERS.websockets.fetch_sub(1, Relaxed);
    }
}

/// One instance's process figures, as last sampled.
#[derive(Debug, Clone)]
pub struct InstanceFigures {
    pub server_id: String,
    pub agent: String,
    pub memory_bytes: u64,
    pub cpu_seconds: f64,
    pub processes: u64,
}

/// The last sample of every live instance's figures.
static SAMPLED: Mutex<Vec<InstanceFigures>> = Mutex::new(Vec::new());

/// How often the daemon's sampler reads the instances' figures.
pub const SAMPLE_EVERY: Duration = Duration::from_secs(2);

/// Replaces the last sample (the daemon's sampler, `daemon/sampler.rs`, reads the instances).
pub fn set_sampled(figures: Vec<InstanceFigures>) {
    *crate::sys::lock(&SAMPLED) = figures;
}

/// The last sample.
pub fn sampled() -> Vec<InstanceFigures> {
    crate::sys::lock(&SAMPLED).clone()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn acp_methods_outside_the_set_are_other() {
        assert_eq!(
            ACP_METHODS[acp_method_index("\"session/prompt\"") as usize],
            "session/prompt"
        );
        assert_eq!(
            ACP_METHODS[acp_method_index("\"initialize\"") as usize],
            "initialize"
        );
        assert_eq!(
            ACP_METHODS[acp_method_index("\"x/made-up\"") as usize],
            "other"
        );
        assert_eq!(ACP_METHODS[acp_method_index("\"other\"") as usize], "other");
        assert_eq!(ACP_METHODS[acp_method_index("12") as usize], "other");
    }

    #[test]
    fn histogram_buckets_and_sum() {
        static H: Histogram = Histogram::new(&[1_000, 10_000]);
        H.observe(Duration::from_micros(500));
        H.observe(Duration::from_micros(1_000));
        H.observe(Duration::from_millis(5));
        H.observe(Duration::from_secs(1));
        let (sum, count, buckets) = H.snapshot();
        assert_eq!(count, 4);
        assert_eq!(buckets, vec![(0.001, 2), (0.01, 1), (f64::INFINITY, 1)]);
        assert!((sum - 1.0065).abs() < 1e-9);
    }
}
