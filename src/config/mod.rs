//! One `Config`, built once at start-up from flags, environment, the optional TOML file and the
//! built-in defaults (in that order of precedence). Every bad value and every unknown file key is
//! collected and reported together, so an operator fixes a config file in one pass.
//! This is the only module that reads the process environment (systemd's variables included).

use std::ffi::OsString;
use std::fmt;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::cli::ServerArgs;

mod client;
mod parse;
mod sources;

pub use client::ClientTarget;
use parse::*;
pub use parse::{normalise_log_filter, normalise_origin, parse_duration, parse_size};
use sources::*;
pub use sources::{env_name, env_value_error};

/// The public ACP registry, used unless `--acp-registry-url` says otherwise.
pub const DEFAULT_ACP_REGISTRY_URL: &str =
    "https://cdn.agentclientprotocol.com/registry/v1/latest/registry.json";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogFormat {
    Auto,
    Journald,
    Text,
    Json,
}

/// What systemd (or a socket-activating supervisor) told us through the environment.
#[derive(Debug, Clone, Default)]
pub struct SystemdEnv {
    pub notify_socket: Option<OsString>,
    pub listen_fds: Option<String>,
    pub listen_pid: Option<String>,
    pub watchdog_usec: Option<String>,
    pub watchdog_pid: Option<String>,
    pub journal_stream: Option<String>,
}

#[derive(Clone)]
pub struct Config {
    pub host: IpAddr,
    pub port: u16,
    /// `None` means no authentication.
    pub token: Option<String>,
    /// The daemon's own binary, by the path it was started from (resolved once, at start): the
    /// built-in mock agent and a reload execute it. Not `/proc/self/exe`, which names a deleted
    /// file once a package upgrade has replaced the binary.
    pub exe: PathBuf,
    pub data_dir: PathBuf,
    pub work_dir: PathBuf,
    pub fs_root: Option<PathBuf>,
    pub request_timeout: Duration,
    pub shutdown_grace: Duration,
    pub agent_grace: Duration,
    pub event_buffer: usize,
    pub event_buffer_bytes: u64,
    /// `--state-dir`: durable state (event logs, sessions, processes); `None` = memory only.
    pub state_dir: Option<PathBuf>,
    /// `--opencode-store`: where OpenCode sessions are kept without a state dir.
    pub opencode_store: Option<PathBuf>,
    pub state_sync: StateSync,
    pub state_max_bytes: u64,
    pub state_total_bytes: u64,
    pub keepalive: Duration,
    pub body_limit: u64,
    /// `None`: no limit.
    pub upload_limit: Option<u64>,
    pub upload_max_entries: u64,
    pub max_line: u64,
    pub agent_memory_max: Option<u64>,
    pub agent_pids_max: Option<u64>,
    pub agent_cpu_max: Option<f64>,
    pub agent_user: Option<String>,
    pub agent_env_pass: Vec<String>,
    pub agent_env: Vec<(String, String)>,
    pub agents_file: Option<PathBuf>,
    pub require_preinstall: bool,
    pub jsonrpc_errors: bool,
    pub acp_registry_url: String,
    pub log_format: LogFormat,
    pub log_level: String,
    /// One INFO line per request (`--access-log`); otherwise only errors, refusals and slow ones.
    pub access_log: bool,
    /// Requests slower than this to their answer head are logged without `access_log`.
    pub slow_request: Duration,
    pub init: bool,
    /// The daemon's environment at start-up, minus everything an agent must never see.
    pub agent_base_env: Vec<(OsString, OsString)>,
    pub systemd: SystemdEnv,
    /// Debug builds only, for the emergency stop's test: after the first stop signal, every
    /// runtime worker is blocked (`SANDBOX_AGENT_TEST_WEDGE_ON_STOP=1`). Always false in release.
    pub test_wedge_on_stop: bool,
    /// Debug builds only, for the reload's signal test: a reload sleeps this long just before
    /// its exec, with the signals held (`SANDBOX_AGENT_TEST_RELOAD_PAUSE_MS`). None in release.
    pub test_reload_pause: Option<Duration>,
    pub agent_cgroups: AgentCgroups,
    // --- harden-edge ---
    /// Host names (lower case, maybe with `:port`) accepted besides loopback and `host`.
    pub allowed_hosts: Vec<String>,
    /// Origins (`scheme://host[:port]`, lower case) allowed besides the daemon's own.
    pub allowed_origins: Vec<String>,
    pub header_read_timeout: Duration,
    pub idle_timeout: Duration,
    pub max_connections: usize,
    /// Threads of the async runtime (1: the current-thread runtime).
    pub worker_threads: usize,
    // --- Runtime caps (see docs/operations.md "Limits and timeouts").
    pub max_agents: usize,
    pub max_subscribers: usize,
    pub max_subscribers_total: usize,
    pub stdin_queue: u64,
    pub stdin_queue_total: u64,
    pub acp_inflight_bytes: u64,
    pub agents_memory_max: Option<u64>,
    pub agents_pids_max: Option<u64>,
    pub log_queue_bytes: u64,
    pub journal_socket: PathBuf,
    /// Where traces go (the full OTLP/HTTP traces URL); `None`: tracing is off.
    pub otlp_traces_endpoint: Option<String>,
    /// `OTEL_SERVICE_NAME` (default `sandbox-agent`).
    pub otel_service_name: String,
    /// `OTEL_TRACES_SAMPLER` and `OTEL_TRACES_SAMPLER_ARG`.
    pub otel_sampler: TraceSampler,
    pub agent_stderr_lines: u64,
    pub agent_stderr_bytes: u64,
    // --- harden-files ---
    /// Idle timeout of a file transfer's body (either direction).
    pub transfer_timeout: Duration,
    /// Blocking disk steps of file transfers running at once (a transfer waiting on the network
    /// holds none).
    pub transfer_max: usize,
    /// Watch streams (`GET /v1/fs/watch`) at once.
    pub max_watches: usize,
    /// Directories (kernel watches) all watch streams hold together.
    pub watch_max_dirs: usize,
    /// Bytes of changes queued for one watch stream's reader.
    pub watch_queue_bytes: usize,
    /// Bytes per second a file transfer's request body must average after the transfer
    /// timeout's grace (0: no minimum).
    pub body_min_rate: u64,
    pub registry_max_bytes: u64,
    pub require_checksums: bool,
    /// An RFD transport connection with no reader for this long is stopped.
    pub acp_connection_idle: Duration,
    // ---- Process API ----
    pub process_max_concurrent: usize,
    pub process_max_log_bytes: u64,
    pub process_max_total_log_bytes: u64,
    pub process_max_output_bytes: u64,
    pub process_run_timeout: Duration,
    pub process_max_run_timeout: Duration,
    pub process_max_input_bytes: u64,
    /// Children kept started ahead in their own cgroups, waiting to exec the next agent or
    /// process (0: every start joins its cgroup itself).
    pub warm_spawns: usize,
}

/// Upper bound of `--warm-spawns` (each is an idle process and its cgroups).
pub const MAX_WARM_SPAWNS: usize = 64;

/// Which cgroup hierarchy agents are placed in (`--agent-cgroups`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AgentCgroups {
    /// v1 controllers when mounted, else the v2 hierarchy, else none.
    Auto,
    V1,
    V2,
    /// No cgroups; rlimits only.
    Off,
}

impl fmt::Debug for Config {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Hand-written so that the token can never reach a log line through `{:?}`.
        f.debug_struct("Config")
            .field("host", &self.host)
            .field("port", &self.port)
            .field("token", &self.token.as_ref().map(|_| "<redacted>"))
            .field("data_dir", &self.data_dir)
            .field("work_dir", &self.work_dir)
            .field("fs_root", &self.fs_root)
            .field("request_timeout", &self.request_timeout)
            .field("shutdown_grace", &self.shutdown_grace)
            .finish_non_exhaustive()
    }
}

/// Every problem found while building the config.
#[derive(Debug)]
pub struct ConfigErrors(pub Vec<String>);

impl fmt::Display for ConfigErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "invalid configuration ({} problem(s)):", self.0.len())?;
        for e in &self.0 {
            writeln!(f, "  - {e}")?;
        }
        Ok(())
    }
}

impl std::error::Error for ConfigErrors {}

/// Variables an agent never inherits: the systemd protocol (which would let an agent notify or
/// pet the watchdog in our name) and every setting of ours (the token among them).
/// Which traces are recorded (OpenTelemetry's standard samplers).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum TraceSampler {
    /// `traceidratio` (`always_on` = 1, `always_off` = 0): a fraction of traces, whatever the
    /// client's `traceparent` says.
    Ratio(f64),
    /// `parentbased_*` (the default, `parentbased_always_on`): a request with a `traceparent`
    /// follows its sampled flag; a new trace is sampled at this ratio.
    ParentBased(f64),
}

impl TraceSampler {
    pub fn parse(name: Option<&str>, arg: Option<&str>) -> Result<TraceSampler, String> {
        let ratio = || -> Result<f64, String> {
            match arg {
                None => Ok(1.0),
                Some(a) => a
                    .parse::<f64>()
                    .ok()
                    .filter(|r| (0.0..=1.0).contains(r))
                    .ok_or_else(|| {
                        format!("OTEL_TRACES_SAMPLER_ARG `{a}` is not a ratio in [0, 1]")
                    }),
            }
        };
        Ok(match name.unwrap_or("parentbased_always_on") {
            "always_on" => TraceSampler::Ratio(1.0),
            "always_off" => TraceSampler::Ratio(0.0),
            "traceidratio" => TraceSampler::Ratio(ratio()?),
            "parentbased_always_on" => TraceSampler::ParentBased(1.0),
            "parentbased_always_off" => TraceSampler::ParentBased(0.0),
            "parentbased_traceidratio" => TraceSampler::ParentBased(ratio()?),
            other => {
                return Err(format!(
                    "`{other}` is not one of always_on, always_off, traceidratio, \
                     parentbased_always_on, parentbased_always_off, parentbased_traceidratio"
                ));
            }
        })
    }
}

/// The OTLP/HTTP traces URL of a collector base URL.
fn traces_url(base: &str) -> String {
    format!("{}/v1/traces", base.trim_end_matches('/'))
}

fn never_passed(name: &str) -> bool {
    const EXACT: &[&str] = &["NOTIFY_SOCKET", "JOURNAL_STREAM", "INVOCATION_ID"];
    const PREFIX: &[&str] = &["LISTEN_", "WATCHDOG_", "SANDBOX_AGENT_"];
    EXACT.contains(&name) || PREFIX.iter().any(|p| name.starts_with(p))
}

fn pass_matches_explicitly(patterns: &[String], name: &str) -> bool {
    patterns
        .iter()
        .any(|p| p != "*" && pass_matches(std::slice::from_ref(p), name))
}

fn pass_matches(patterns: &[String], name: &str) -> bool {
    patterns.iter().any(|p| match p.strip_suffix('*') {
        Some(prefix) => name.starts_with(prefix),
        None => p == name,
    })
}

impl Config {
    /// Builds the config from parsed flags (which already include the environment) and the
    /// optional file they name; `env` is the process environment.
    pub fn load(args: &ServerArgs) -> Result<Config, ConfigErrors> {
        Self::load_with_env(args, std::env::vars_os().collect())
    }

    pub fn load_with_env(
        args: &ServerArgs,
        env: Vec<(OsString, OsString)>,
    ) -> Result<Config, ConfigErrors> {
        let mut errors = Vec::new();
        let mut file = match &args.config {
            Some(path) => FileValues::load(path, &mut errors),
            None => FileValues::empty(),
        };
        let file_path = file.path.clone();
        let env_get = |name: &str| -> Option<OsString> {
            env.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone())
        };
        // Names where a bad value came from: the file's key, the variable the user set (when
        // it holds that very value), or the flag.
        let origin = |flag: &str, from_file: bool, file: &Path, raw: Option<&str>| -> String {
            let var = env_name(flag);
            // A list variable holds the bad item among others, comma-separated.
            let from_env = !from_file
                && raw.is_some_and(|raw| {
                    env_get(&var).is_some_and(|v| {
                        v.to_str()
                            .is_some_and(|v| v == raw || v.split(',').any(|i| i.trim() == raw))
                    })
                });
            origin(flag, from_file, from_env, file)
        };

        // A string-valued setting: flag/env first, then the file, parsed by `parse`.
        macro_rules! setting {
            ($field:ident, $flag:literal, $parse:expr, $default:expr) => {{
                // Always take the key out of the file, so that a key a flag overrides is
                // still known (and still validated).
                let in_file = file.take_string(stringify!($field), &mut errors);
                let (raw, from_file) = match args.$field.clone() {
                    Some(v) => (Some(v.to_string()), false),
                    None => (in_file, true),
                };
                match raw {
                    Some(raw) => match $parse(raw.as_str()) {
                        Ok(v) => v,
                        Err(e) => {
                            errors.push(format!(
                                "{}: {}",
                                origin($flag, from_file, &file_path, Some(raw.as_str())),
                                e
                            ));
                            $default
                        }
                    },
                    None => $default,
                }
            }};
        }
        macro_rules! flag {
            ($field:ident) => {{
                let from_file = file.take_bool(stringify!($field), &mut errors);
                args.$field || from_file.unwrap_or(false)
            }};
        }
        macro_rules! path {
            ($field:ident) => {{
                let in_file = file.take_string(stringify!($field), &mut errors);
                args.$field.clone().or_else(|| in_file.map(PathBuf::from))
            }};
        }

        let host: IpAddr = setting!(host, "host", parse_host, IpAddr::from([127, 0, 0, 1]));
        let port: u16 = setting!(
            port,
            "port",
            |s: &str| s
                .parse::<u16>()
                .map_err(|_| format!("`{s}` is not a port (0-65535)")),
            2468
        );
        let token: Option<String> = setting!(
            token,
            "token",
            |s: &str| if s.is_empty() {
                Err("the token is empty".to_string())
            } else {
                Ok(Some(s.to_string()))
            },
            None
        );
        let no_token = flag!(no_token);
        let data_dir = path!(data_dir);
        let work_dir = path!(work_dir);
        let fs_root = path!(fs_root);
        let dur = |s: &str| parse_duration(s);
        let request_timeout = setting!(
            request_timeout,
            "request-timeout",
            dur,
            Duration::from_secs(600)
        );
        let shutdown_grace = setting!(
            shutdown_grace,
            "shutdown-grace",
            dur,
            Duration::from_secs(10)
        );
        let agent_grace = setting!(agent_grace, "agent-grace", dur, Duration::from_secs(5));
        let keepalive = setting!(keepalive, "keepalive", dur, Duration::from_secs(15));
        let positive_count = |s: &str| match s.trim().parse::<usize>() {
            Ok(n) if n > 0 => Ok(n),
            _ => Err(format!("`{s}` is not a positive whole number")),
        };
        let event_buffer = setting!(event_buffer, "event-buffer", positive_count, 4096);
        let size_required = |s: &str| match parse_size(s) {
            Ok(Some(n)) if n > 0 => Ok(n),
            Ok(_) => Err(format!("`{s}` must be a positive size")),
            Err(e) => Err(e),
        };
        let event_buffer_bytes = setting!(
            event_buffer_bytes,
            "event-buffer-bytes",
            size_required,
            16 << 20
        );
        let state_dir = {
            let in_file = file.take_string("state_dir", &mut errors);
            args.state_dir
                .clone()
                .map(PathBuf::from)
                .or_else(|| in_file.map(PathBuf::from))
        };
        let opencode_store = {
            let in_file = file.take_string("opencode_store", &mut errors);
            args.opencode_store
                .clone()
                .map(PathBuf::from)
                .or_else(|| in_file.map(PathBuf::from))
                // The reference implementation's variable, for its compatibility suite.
                .or_else(|| env_get("OPENCODE_COMPAT_DB_PATH").map(PathBuf::from))
        };
        let state_sync = setting!(
            state_sync,
            "state-sync",
            StateSync::parse,
            StateSync::Batch(Duration::from_millis(100))
        );
        let state_max_bytes = setting!(state_max_bytes, "state-max-bytes", size_required, 64 << 20);
        let state_total_bytes = setting!(
            state_total_bytes,
            "state-total-bytes",
            size_required,
            1 << 30
        );
        let body_limit = setting!(body_limit, "body-limit", size_required, 32 << 20);
        let upload_limit = setting!(upload_limit, "upload-limit", parse_size, Some(64 << 30));
        let upload_max_entries = setting!(
            upload_max_entries,
            "upload-max-entries",
            |s: &str| s
                .trim()
                .parse::<u64>()
                .map_err(|_| format!("`{s}` is not a whole number")),
            1_000_000
        );
        let max_line = setting!(max_line, "max-line", size_required, 16 << 20);
        let agent_memory_max = setting!(
            agent_memory_max,
            "agent-memory-max",
            parse_size,
            Some(4 << 30)
        );
        let agent_pids_max = setting!(
            agent_pids_max,
            "agent-pids-max",
            parse_count_or_max,
            Some(1024)
        );
        let agent_cpu_max = setting!(agent_cpu_max, "agent-cpu-max", parse_cpu, None);
        let agent_user: Option<String> = setting!(
            agent_user,
            "agent-user",
            |s: &str| Ok::<_, String>(Some(s.to_string())),
            None
        );
        let pass_in_file = file.take_list("agent_env_pass", &mut errors);
        let agent_env_pass = match args.agent_env_pass.clone() {
            Some(v) => v,
            None => pass_in_file.unwrap_or_else(|| vec!["*".into()]),
        };
        let env_in_file = file.take_list("agent_env", &mut errors);
        let (agent_env_raw, env_from_file) = match args.agent_env.clone() {
            Some(v) => (v, false),
            None => (env_in_file.unwrap_or_default(), true),
        };
        let mut agent_env = Vec::new();
        for kv in agent_env_raw.iter().filter(|s| !s.is_empty()) {
            match kv.split_once('=') {
                Some((k, v)) if !k.is_empty() => agent_env.push((k.to_string(), v.to_string())),
                _ => errors.push(format!(
                    "{}: `{kv}` is not KEY=VALUE",
                    origin("agent-env", env_from_file, &file_path, Some(kv))
                )),
            }
        }
        let agents_file = path!(agents_file);
        let require_preinstall = flag!(require_preinstall);
        let jsonrpc_errors = flag!(jsonrpc_errors);
        let acp_registry_url: String = setting!(
            acp_registry_url,
            "acp-registry-url",
            |s: &str| if s.starts_with("http://")
                || s.starts_with("https://")
                || s.starts_with("file://")
            {
                Ok(s.to_string())
            } else {
                Err(format!("`{s}` is not an http(s):// or file:// URL"))
            },
            DEFAULT_ACP_REGISTRY_URL.to_string()
        );
        let acp_connection_idle = setting!(
            acp_connection_idle,
            "acp-connection-idle",
            dur,
            Duration::from_secs(30)
        );
        let log_format = setting!(
            log_format,
            "log-format",
            |s: &str| match s {
                "auto" => Ok(LogFormat::Auto),
                "journald" => Ok(LogFormat::Journald),
                "text" => Ok(LogFormat::Text),
                "json" => Ok(LogFormat::Json),
                _ => Err(format!("`{s}` is not one of auto, journald, text, json")),
            },
            LogFormat::Auto
        );
        let log_level: String = setting!(
            log_level,
            "log-level",
            normalise_log_filter,
            "info".to_string()
        );
        let access_log = flag!(access_log);
        let slow_request = setting!(slow_request, "slow-request", dur, Duration::from_secs(1));
        let init = flag!(init);
        // --- harden-edge ---
        let token_file = path!(token_file);
        let allowed_hosts = list_setting(
            args.allowed_hosts.clone(),
            file.take_list("allowed_hosts", &mut errors),
        );
        let allowed_origins = list_setting(
            args.allowed_origins.clone(),
            file.take_list("allowed_origins", &mut errors),
        );
        let mut origins = Vec::new();
        for o in allowed_origins {
            match normalise_origin(&o) {
                Ok(o) => origins.push(o),
                Err(e) => errors.push(format!(
                    "{}: {e}",
                    origin("allowed-origins", false, &file_path, Some(o.as_str()))
                )),
            }
        }
        let allowed_origins = origins;
        let allowed_hosts: Vec<String> = allowed_hosts
            .iter()
            .map(|h| h.trim().to_ascii_lowercase())
            .collect();
        let header_read_timeout = setting!(
            header_read_timeout,
            "header-read-timeout",
            positive_duration,
            Duration::from_secs(10)
        );
        let idle_timeout = setting!(
            idle_timeout,
            "idle-timeout",
            positive_duration,
            Duration::from_secs(60)
        );
        let max_connections = setting!(
            max_connections,
            "max-connections",
            positive_count,
            default_max_connections()
        );
        let worker_threads = setting!(
            worker_threads,
            "worker-threads",
            |s: &str| if s.trim().eq_ignore_ascii_case("auto") {
                Ok(default_worker_threads())
            } else {
                positive_count(s)
            },
            default_worker_threads()
        );
        let agent_cgroups = setting!(
            agent_cgroups,
            "agent-cgroups",
            |s: &str| match s.trim().to_ascii_lowercase().as_str() {
                "auto" => Ok(AgentCgroups::Auto),
                "v1" => Ok(AgentCgroups::V1),
                "v2" => Ok(AgentCgroups::V2),
                "off" | "none" => Ok(AgentCgroups::Off),
                _ => Err(format!("`{s}` is not one of auto, v1, v2, off")),
            },
            AgentCgroups::Auto
        );
        // --- harden-files ---
        let transfer_timeout = setting!(
            transfer_timeout,
            "transfer-timeout",
            |s: &str| match parse_duration(s) {
                Ok(d) if !d.is_zero() => Ok(d),
                Ok(_) => Err(format!("`{s}` must be longer than zero")),
                Err(e) => Err(e),
            },
            Duration::from_secs(30)
        );
        let transfer_max = setting!(transfer_max, "transfer-max", positive_count, 256);
        let max_watches = setting!(max_watches, "max-watches", positive_count, 64);
        let watch_max_dirs = setting!(watch_max_dirs, "watch-max-dirs", positive_count, 65_536);
        let watch_queue_bytes = setting!(
            watch_queue,
            "watch-queue",
            |s: &str| size_required(s).map(|n| usize::try_from(n).unwrap_or(usize::MAX)),
            1 << 20
        );
        let body_min_rate = setting!(
            body_min_rate,
            "body-min-rate",
            |s: &str| match parse_size(s) {
                Ok(Some(n)) => Ok(n),
                Ok(None) => Err(format!("`{s}` must be a size (0 turns the minimum off)")),
                Err(e) => Err(e),
            },
            1024
        );
        let registry_max_bytes = setting!(
            registry_max_bytes,
            "registry-max-bytes",
            size_required,
            16 << 20
        );
        let require_checksums = flag!(require_checksums);

        // --- Runtime caps.
        let max_agents = setting!(max_agents, "max-agents", positive_count, 64);
        let max_subscribers = setting!(max_subscribers, "max-subscribers", positive_count, 64);
        let max_subscribers_total = setting!(
            max_subscribers_total,
            "max-subscribers-total",
            positive_count,
            1024
        );
        let stdin_queue = setting!(stdin_queue, "stdin-queue", size_required, 64 << 20);
        let stdin_queue_total = setting!(
            stdin_queue_total,
            "stdin-queue-total",
            size_required,
            256 << 20
        );
        let acp_inflight_bytes = setting!(
            acp_inflight_bytes,
            "acp-inflight-bytes",
            size_required,
            256 << 20
        );
        let agents_memory_max = setting!(agents_memory_max, "agents-memory-max", parse_size, None);
        let agents_pids_max =
            setting!(agents_pids_max, "agents-pids-max", parse_count_or_max, None);
        let log_queue_bytes = setting!(log_queue, "log-queue", size_required, 8 << 20);
        let journal_socket =
            path!(journal_socket).unwrap_or_else(|| PathBuf::from("/run/systemd/journal/socket"));
        // Traces: our flag/variable/key, else the standard OpenTelemetry variables.
        let otel_var = |name: &str| {
            env_get(name)
                .map(|v| v.to_string_lossy().trim().to_string())
                .filter(|v| !v.is_empty())
        };
        let otlp_endpoint_in_file = file.take_string("otlp_endpoint", &mut errors);
        let otlp_traces_endpoint = args
            .otlp_endpoint
            .clone()
            .or(otlp_endpoint_in_file)
            .filter(|v| !v.is_empty())
            .map(|base| traces_url(&base))
            .or_else(|| otel_var("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"))
            .or_else(|| otel_var("OTEL_EXPORTER_OTLP_ENDPOINT").map(|base| traces_url(&base)));
        if let Some(url) = &otlp_traces_endpoint
            && !(url.starts_with("http://") || url.starts_with("https://"))
        {
            errors.push(format!(
                "the OTLP endpoint `{url}` is not an http:// or https:// URL"
            ));
        }
        let otel_service_name =
            otel_var("OTEL_SERVICE_NAME").unwrap_or_else(|| "sandbox-agent".to_string());
        let otel_sampler = match TraceSampler::parse(
            otel_var("OTEL_TRACES_SAMPLER").as_deref(),
            otel_var("OTEL_TRACES_SAMPLER_ARG").as_deref(),
        ) {
            Ok(s) => s,
            Err(e) => {
                errors.push(format!("OTEL_TRACES_SAMPLER: {e}"));
                TraceSampler::ParentBased(1.0)
            }
        };
        let agent_stderr_lines = setting!(
            agent_stderr_lines,
            "agent-stderr-lines",
            |s: &str| positive_count(s).map(|n| n as u64),
            100
        );
        let agent_stderr_bytes = setting!(
            agent_stderr_bytes,
            "agent-stderr-bytes",
            size_required,
            64 << 10
        );
        // ---- Process API ----
        let process_max_concurrent = setting!(
            process_max_concurrent,
            "process-max-concurrent",
            positive_count,
            64
        );
        let process_max_log_bytes = setting!(
            process_max_log_bytes,
            "process-max-log-bytes",
            size_required,
            4 << 20
        );
        let process_max_total_log_bytes = setting!(
            process_max_total_log_bytes,
            "process-max-total-log-bytes",
            size_required,
            256 << 20
        );
        let process_max_output_bytes = setting!(
            process_max_output_bytes,
            "process-max-output-bytes",
            size_required,
            1 << 20
        );
        let process_run_timeout = setting!(
            process_run_timeout,
            "process-run-timeout",
            dur,
            Duration::from_secs(30)
        );
        let process_max_run_timeout = setting!(
            process_max_run_timeout,
            "process-max-run-timeout",
            dur,
            Duration::from_secs(300)
        );
        let process_max_input_bytes = setting!(
            process_max_input_bytes,
            "process-max-input-bytes",
            size_required,
            64 << 10
        );
        let warm_spawns = setting!(
            warm_spawns,
            "warm-spawns",
            |s: &str| match s.trim().parse::<usize>() {
                Ok(n) if n <= MAX_WARM_SPAWNS => Ok(n),
                _ => Err(format!(
                    "`{s}` is not a whole number from 0 to {MAX_WARM_SPAWNS}"
                )),
            },
            4
        );
        if process_max_log_bytes > process_max_total_log_bytes {
            errors.push(
                "--process-max-log-bytes is larger than --process-max-total-log-bytes".to_string(),
            );
        }

        // The config file may not name itself, and nothing else is known.
        file.map.remove("config");
        for (key, value) in &file.map {
            errors.push(unknown_key_message(key, value, &file_path));
        }

        let token = match (token, token_file) {
            (Some(t), _) => Some(t),
            (None, Some(path)) => match read_token_file(&path) {
                Ok(t) => Some(t),
                Err(e) => {
                    errors.push(format!("--token-file {}: {e}", path.display()));
                    None
                }
            },
            (None, None) => None,
        };
        if !is_loopback(&host) && token.is_none() && !no_token {
            errors.push(format!(
                "refusing to listen on {host} without authentication: pass --token <TOKEN> \
                 (or SANDBOX_AGENT_TOKEN), or --no-token to serve without one"
            ));
        }

        let cwd = std::env::current_dir().unwrap_or_else(|_| PathBuf::from("/"));
        let work_dir = match work_dir {
            Some(p) => {
                let p = cwd.join(p);
                if !p.is_dir() {
                    errors.push(format!("--work-dir {}: not a directory", p.display()));
                }
                p
            }
            None => cwd.clone(),
        };
        let fs_root = match fs_root {
            Some(p) => match cwd.join(&p).canonicalize() {
                Ok(c) if c.is_dir() => Some(c),
                Ok(c) => {
                    errors.push(format!("--fs-root {}: not a directory", c.display()));
                    None
                }
                Err(e) => {
                    errors.push(format!("--fs-root {}: {e}", p.display()));
                    None
                }
            },
            None => None,
        };
        let data_dir = data_dir.map(|p| cwd.join(p)).unwrap_or_else(|| {
            if let Some(state) = env_get("STATE_DIRECTORY") {
                // systemd's StateDirectory= may list several, separated by ':'.
                let first = state
                    .to_string_lossy()
                    .split(':')
                    .next()
                    .unwrap_or("")
                    .to_string();
                if !first.is_empty() {
                    return PathBuf::from(first);
                }
            }
            match env_get("HOME") {
                Some(home) if !home.is_empty() => {
                    PathBuf::from(home).join(".local/share/sandbox-agent")
                }
                _ => PathBuf::from("/var/lib/sandbox-agent"),
            }
        });
        let agents_file = agents_file.map(|p| cwd.join(p));

        if !errors.is_empty() {
            return Err(ConfigErrors(errors));
        }

        let string_var = |name: &str| env_get(name).map(|v| v.to_string_lossy().into_owned());
        let systemd = SystemdEnv {
            notify_socket: env_get("NOTIFY_SOCKET"),
            listen_fds: string_var("LISTEN_FDS"),
            listen_pid: string_var("LISTEN_PID"),
            watchdog_usec: string_var("WATCHDOG_USEC"),
            watchdog_pid: string_var("WATCHDOG_PID"),
            journal_stream: string_var("JOURNAL_STREAM"),
        };
        let test_wedge_on_stop = cfg!(debug_assertions)
            && env_get("SANDBOX_AGENT_TEST_WEDGE_ON_STOP").is_some_and(|v| v == "1");
        let test_reload_pause = env_get("SANDBOX_AGENT_TEST_RELOAD_PAUSE_MS")
            .filter(|_| cfg!(debug_assertions))
            .and_then(|v| v.to_str()?.parse::<u64>().ok())
            .map(|ms| Duration::from_millis(ms.min(10_000)));
        let agent_base_env = env
            .into_iter()
            .filter(|(k, _)| {
                let name = k.to_string_lossy();
                !never_passed(&name)
                    && if name.starts_with("OTEL_") {
                        // The daemon's own tracing settings reach agents only when the
                        // operator names them (a bare `*` does not): an agent gets the trace
                        // context in each request's `_meta.traceparent` instead.
                        pass_matches_explicitly(&agent_env_pass, &name)
                    } else {
                        pass_matches(&agent_env_pass, &name)
                    }
            })
            .collect();

        Ok(Config {
            host,
            port,
            token: if no_token { None } else { token },
            exe: std::env::current_exe()
                .map(strip_deleted)
                .unwrap_or_else(|_| PathBuf::from("/proc/self/exe")),
            data_dir,
            work_dir,
            fs_root,
            request_timeout,
            shutdown_grace,
            agent_grace,
            event_buffer,
            event_buffer_bytes,
            // An empty value (e.g. `SANDBOX_AGENT_STATE_DIR=` to override the packaged unit)
            // turns durable state off.
            state_dir: state_dir
                .filter(|p| !p.as_os_str().is_empty())
                .map(|p| cwd.join(p)),
            opencode_store: opencode_store
                .filter(|p| !p.as_os_str().is_empty())
                .map(|p| cwd.join(p)),
            state_sync,
            state_max_bytes,
            state_total_bytes,
            keepalive,
            body_limit,
            upload_limit,
            upload_max_entries,
            max_line,
            agent_memory_max,
            agent_pids_max,
            agent_cpu_max,
            agent_user,
            agent_env_pass,
            agent_env,
            agents_file,
            require_preinstall,
            jsonrpc_errors,
            acp_registry_url,
            log_format,
            log_level,
            access_log,
            slow_request,
            init,
            agent_base_env,
            systemd,
            test_wedge_on_stop,
            test_reload_pause,
            agent_cgroups,
            allowed_hosts,
            allowed_origins,
            header_read_timeout,
            idle_timeout,
            max_connections,
            worker_threads,
            max_agents,
            max_subscribers,
            max_subscribers_total,
            stdin_queue,
            stdin_queue_total,
            acp_inflight_bytes,
            agents_memory_max,
            agents_pids_max,
            log_queue_bytes,
            journal_socket,
            otlp_traces_endpoint,
            otel_service_name,
            otel_sampler,
            agent_stderr_lines,
            agent_stderr_bytes,
            transfer_timeout,
            transfer_max,
            max_watches,
            watch_max_dirs,
            watch_queue_bytes,
            body_min_rate,
            registry_max_bytes,
            require_checksums,
            acp_connection_idle,
            process_max_concurrent,
            process_max_log_bytes,
            process_max_total_log_bytes,
            process_max_output_bytes,
            process_run_timeout,
            process_max_run_timeout,
            process_max_input_bytes,
            warm_spawns,
        })
    }

    /// A config with every default, for unit tests and benches.
    pub fn defaults() -> Config {
        Self::load_with_env(&ServerArgs::default(), Vec::new()).expect("defaults are valid")
    }
}

/// The variable through which a daemon that re-executes itself for a reload tells its new image
/// which descriptor holds the hand-off (docs/operations.md, "Reload"). Never set by operators.
pub const HANDOFF_FD_VAR: &str = "SANDBOX_AGENT_HANDOFF_FD";

/// Reads and removes `HANDOFF_FD_VAR`, so that nothing started later (agents, tools) sees it.
/// Call first thing in `main`, while the process has one thread.
pub fn take_handoff_fd() -> Option<String> {
    let value = std::env::var(HANDOFF_FD_VAR).ok();
    if value.is_some() {
        crate::sys::remove_env_single_threaded(HANDOFF_FD_VAR);
    }
    value
}

/// The environment the daemon was started with, as a reload re-executes it: every variable but
/// the token (which the reload carries itself) and the hand-off's own.
pub fn launch_env() -> Vec<(OsString, OsString)> {
    std::env::vars_os()
        .filter(|(k, _)| k != "SANDBOX_AGENT_TOKEN" && k != HANDOFF_FD_VAR)
        .collect()
}

/// `current_exe` after the binary was replaced on disk reads "<path> (deleted)": the path the
/// daemon was started from is the part before the suffix (where the new binary now is).
fn strip_deleted(p: PathBuf) -> PathBuf {
    use std::os::unix::ffi::OsStrExt;
    let b = p.as_os_str().as_bytes();
    match b.strip_suffix(b" (deleted)") {
        Some(rest) => PathBuf::from(std::ffi::OsStr::from_bytes(rest)),
        None => p,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check_size(input: &str, expected: Result<Option<u64>, ()>) {
        assert_eq!(parse_size(input).map_err(|_| ()), expected, "{input}");
    }

    #[test]
    fn sizes() {
        check_size("256M", Ok(Some(256 << 20)));
        check_size("1G", Ok(Some(1 << 30)));
        check_size("1.5GiB", Ok(Some(3 << 29)));
        check_size("4096", Ok(Some(4096)));
        check_size("max", Ok(None));
        check_size("12Q", Err(()));
        check_size("", Err(()));
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("30s"), Ok(Duration::from_secs(30)));
        assert_eq!(parse_duration("5m"), Ok(Duration::from_secs(300)));
        assert_eq!(parse_duration("2"), Ok(Duration::from_secs(2)));
        assert!(parse_duration("soon").is_err());
    }

    #[test]
    fn secrets_never_pass() {
        let pass = vec!["*".to_string()];
        for name in [
            "NOTIFY_SOCKET",
            "LISTEN_FDS",
            "WATCHDOG_USEC",
            "SANDBOX_AGENT_TOKEN",
        ] {
            assert!(never_passed(name), "{name}");
        }
        assert!(!never_passed("PATH"));
        assert!(pass_matches(&pass, "ANTHROPIC_API_KEY"));
        assert!(pass_matches(&["LC_*".to_string()], "LC_ALL"));
        assert!(!pass_matches(&["PATH".to_string()], "PATHX"));
    }

    #[test]
    fn otel_settings_come_from_the_standard_variables_and_stay_away_from_agents() {
        let env = |pairs: &[(&str, &str)]| -> Vec<(OsString, OsString)> {
            pairs
                .iter()
                .map(|(k, v)| ((*k).into(), (*v).into()))
                .collect()
        };
        let c = Config::load_with_env(
            &ServerArgs::default(),
            env(&[
                ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318/"),
                ("OTEL_SERVICE_NAME", "box-7"),
                ("OTEL_TRACES_SAMPLER", "traceidratio"),
                ("OTEL_TRACES_SAMPLER_ARG", "0.25"),
                ("PATH", "/bin"),
            ]),
        )
        .expect("valid");
        assert_eq!(
            c.otlp_traces_endpoint.as_deref(),
            Some("http://collector:4318/v1/traces")
        );
        assert_eq!(c.otel_service_name, "box-7");
        assert_eq!(c.otel_sampler, TraceSampler::Ratio(0.25));
        let names: Vec<_> = c.agent_base_env.iter().map(|(k, _)| k.clone()).collect();
        assert!(names.contains(&OsString::from("PATH")));
        assert!(
            !names
                .iter()
                .any(|n| n.to_string_lossy().starts_with("OTEL_"))
        );
        // Named explicitly, they pass.
        let args = ServerArgs {
            agent_env_pass: Some(vec!["PATH".into(), "OTEL_*".into()]),
            ..ServerArgs::default()
        };
        let c = Config::load_with_env(
            &args,
            env(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318")]),
        )
        .expect("valid");
        assert_eq!(c.agent_base_env.len(), 1);
        // Off by default; a bad sampler is a configuration error.
        let off = Config::load_with_env(&ServerArgs::default(), Vec::new()).expect("valid");
        assert_eq!(off.otlp_traces_endpoint, None);
        assert!(
            Config::load_with_env(
                &ServerArgs::default(),
                env(&[("OTEL_TRACES_SAMPLER", "sometimes")])
            )
            .is_err()
        );
    }

    #[test]
    fn agent_cgroups_modes() {
        assert_eq!(Config::defaults().agent_cgroups, AgentCgroups::Auto);
        for (raw, mode) in [
            ("v1", AgentCgroups::V1),
            ("V2", AgentCgroups::V2),
            ("off", AgentCgroups::Off),
        ] {
            let args = ServerArgs {
                agent_cgroups: Some(raw.into()),
                ..ServerArgs::default()
            };
            let config = Config::load_with_env(&args, Vec::new()).expect("valid");
            assert_eq!(config.agent_cgroups, mode);
        }
        let bad = ServerArgs {
            agent_cgroups: Some("v3".into()),
            ..ServerArgs::default()
        };
        let err = Config::load_with_env(&bad, Vec::new()).expect_err("rejected");
        assert!(err.to_string().contains("agent-cgroups"), "{err}");
    }
}

/// `--state-sync`: when the state dir's appends are made durable (`fdatasync`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StateSync {
    /// After every batch the writer takes (each event, when they come one by one).
    Every,
    /// At most this long after an append.
    Batch(Duration),
    /// Never by us: the kernel writes back when it wants (about 30 s on Linux).
    Os,
}

impl StateSync {
    pub fn parse(s: &str) -> Result<StateSync, String> {
        match s.trim() {
            "every" => Ok(StateSync::Every),
            "os" => Ok(StateSync::Os),
            other => match other.strip_prefix("batch:") {
                Some(ms) => match ms.trim().parse::<u64>() {
                    Ok(n) if (1..=60_000).contains(&n) => {
                        Ok(StateSync::Batch(Duration::from_millis(n)))
                    }
                    _ => Err(format!("`{s}`: batch:<ms> takes 1 to 60000 milliseconds")),
                },
                None => Err(format!(
                    "`{s}` is not a sync policy (every, batch:<ms>, os)"
                )),
            },
        }
    }
}
