//! One `Config`, built once at start-up from flags, environment, the optional TOML file and the
//! built-in defaults (in that order of precedence). Every bad value and every unknown file key is
//! collected and reported together, so an operator fixes a config file in one pass.
//! This is the only module that reads the process environment (systemd's variables included).

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::fmt;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::cli::ServerArgs;

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
    pub data_dir: PathBuf,
    pub work_dir: PathBuf,
    pub fs_root: Option<PathBuf>,
    pub request_timeout: Duration,
    pub shutdown_grace: Duration,
    pub agent_grace: Duration,
    pub event_buffer: usize,
    pub event_buffer_bytes: u64,
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
fn never_passed(name: &str) -> bool {
    const EXACT: &[&str] = &["NOTIFY_SOCKET", "JOURNAL_STREAM", "INVOCATION_ID"];
    const PREFIX: &[&str] = &["LISTEN_", "WATCHDOG_", "SANDBOX_AGENT_"];
    EXACT.contains(&name) || PREFIX.iter().any(|p| name.starts_with(p))
}

fn pass_matches(patterns: &[String], name: &str) -> bool {
    patterns.iter().any(|p| match p.strip_suffix('*') {
        Some(prefix) => name.starts_with(prefix),
        None => p == name,
    })
}

/// Values from the TOML file, taken key by key so that every bad key is reported.
struct FileValues {
    map: BTreeMap<String, toml::Value>,
    path: PathBuf,
}

impl FileValues {
    fn empty() -> Self {
        FileValues {
            map: BTreeMap::new(),
            path: PathBuf::new(),
        }
    }

    fn load(path: &Path, errors: &mut Vec<String>) -> Self {
        let text = match std::fs::read_to_string(path) {
            Ok(t) => t,
            Err(e) => {
                errors.push(format!("cannot read config file {}: {e}", path.display()));
                return Self::empty();
            }
        };
        let table: toml::Table = match toml::from_str(&text) {
            Ok(t) => t,
            Err(e) => {
                errors.push(format!(
                    "config file {} is not valid TOML: {e}",
                    path.display()
                ));
                return Self::empty();
            }
        };
        let map = table
            .into_iter()
            .map(|(k, v)| (k.replace('-', "_"), v))
            .collect();
        FileValues {
            map,
            path: path.to_path_buf(),
        }
    }

    /// A scalar rendered as the string the command line would have carried.
    fn take_string(&mut self, key: &str, errors: &mut Vec<String>) -> Option<String> {
        let v = self.map.remove(key)?;
        match v {
            toml::Value::String(s) => Some(s),
            toml::Value::Integer(i) => Some(i.to_string()),
            toml::Value::Float(f) => Some(f.to_string()),
            toml::Value::Boolean(b) => Some(b.to_string()),
            other => {
                errors.push(self.bad(
                    key,
                    &format!("expected a string or number, got {}", other.type_str()),
                ));
                None
            }
        }
    }

    fn take_bool(&mut self, key: &str, errors: &mut Vec<String>) -> Option<bool> {
        match self.map.remove(key)? {
            toml::Value::Boolean(b) => Some(b),
            other => {
                errors.push(self.bad(
                    key,
                    &format!("expected true or false, got {}", other.type_str()),
                ));
                None
            }
        }
    }

    fn take_list(&mut self, key: &str, errors: &mut Vec<String>) -> Option<Vec<String>> {
        match self.map.remove(key)? {
            toml::Value::String(s) => Some(s.split(',').map(str::to_owned).collect()),
            toml::Value::Array(items) => {
                let mut out = Vec::new();
                for item in items {
                    match item {
                        toml::Value::String(s) => out.push(s),
                        other => {
                            errors.push(
                                self.bad(
                                    key,
                                    &format!("expected strings, got {}", other.type_str()),
                                ),
                            );
                            return None;
                        }
                    }
                }
                Some(out)
            }
            other => {
                errors.push(self.bad(
                    key,
                    &format!("expected a list of strings, got {}", other.type_str()),
                ));
                None
            }
        }
    }

    fn bad(&self, key: &str, why: &str) -> String {
        format!("config file {}: key `{key}`: {why}", self.path.display())
    }
}

/// The environment variable of a flag: `request-timeout` → `SANDBOX_AGENT_REQUEST_TIMEOUT`.
pub fn env_name(flag: &str) -> String {
    format!(
        "SANDBOX_AGENT_{}",
        flag.trim_start_matches('-')
            .replace('-', "_")
            .to_uppercase()
    )
}

/// Where a value came from, for error messages: the file's key, the variable, or the flag.
fn origin(flag: &str, from_file: bool, from_env: bool, file: &Path) -> String {
    if from_file {
        format!(
            "config file {}: key `{}`",
            file.display(),
            flag.replace('-', "_")
        )
    } else if from_env {
        format!("environment variable {}", env_name(flag))
    } else {
        format!("--{flag}")
    }
}

/// A clap error about a value that came from the environment, reworded to name the variable
/// the user set (clap names the flag, which the user never typed). `None` when the value was
/// on the command line or the error is of another kind.
pub fn env_value_error(e: &clap::Error, argv: &[OsString]) -> Option<String> {
    use clap::error::{ContextKind, ContextValue, ErrorKind};
    if !matches!(
        e.kind(),
        ErrorKind::InvalidValue | ErrorKind::ValueValidation
    ) {
        return None;
    }
    let arg = match e.get(ContextKind::InvalidArg)? {
        ContextValue::String(s) => s.clone(),
        _ => return None,
    };
    let value = match e.get(ContextKind::InvalidValue)? {
        ContextValue::String(s) => s.clone(),
        _ => return None,
    };
    // `--port <PORT>` → `port`
    let flag = arg
        .split_whitespace()
        .next()?
        .trim_start_matches('-')
        .to_string();
    let long = format!("--{flag}");
    let on_command_line = argv.iter().any(|a| {
        let a = a.to_string_lossy();
        a == long || a.starts_with(&format!("{long}="))
    });
    if on_command_line {
        return None;
    }
    let var = env_name(&flag);
    let set = std::env::var_os(&var)?;
    if set.to_string_lossy() != value {
        return None;
    }
    let why = e
        .to_string()
        .lines()
        .next()
        .and_then(|l| l.rsplit_once(": ").map(|(_, why)| why.to_string()))
        .unwrap_or_else(|| "invalid value".to_string());
    Some(format!(
        "environment variable {var}: `{value}` is not valid for --{flag}: {why}"
    ))
}

/// The spellings of a level that people type, in any case, as the filter's own names.
fn canonical_level(s: &str) -> Option<&'static str> {
    Some(match s.trim().to_ascii_lowercase().as_str() {
        "off" | "none" | "quiet" => "off",
        "error" | "err" | "fatal" | "critical" => "error",
        "warn" | "warning" => "warn",
        "info" | "information" | "notice" => "info",
        "debug" | "verbose" => "debug",
        "trace" | "all" => "trace",
        _ => return None,
    })
}

/// Normalises a `--log-level` filter: each level spelling (`warning`, `WARN`, `verbose`) becomes
/// the filter's own name, then the result must be a valid filter that shows our errors — a word
/// the filter does not know as a level is taken by tracing as a module name, which would filter
/// out every line of ours, fatal errors included.
pub fn normalise_log_filter(s: &str) -> Result<String, String> {
    let mut directives = Vec::new();
    for d in s.split(',').map(str::trim).filter(|d| !d.is_empty()) {
        let d = match d.rsplit_once('=') {
            Some((target, level)) if !level.contains([']', '}']) => match canonical_level(level) {
                Some(l) => format!("{target}={l}"),
                None => d.to_string(),
            },
            _ => canonical_level(d).map_or_else(|| d.to_string(), str::to_string),
        };
        directives.push(d);
    }
    let filter = directives.join(",");
    if filter.is_empty() {
        return Err("the filter is empty; use a level like `info` or `warn`".to_string());
    }
    if let Err(e) = tracing_subscriber::EnvFilter::try_new(&filter) {
        return Err(format!(
            "`{s}` is not a log filter like `info` or `sandbox_agent=debug`: {e}"
        ));
    }
    // The most specific directive that applies to the target `sandbox_agent` (a bare level, or
    // a target that is a prefix of it), as tracing picks it; a span/field directive never
    // covers every event.
    let mut best: Option<(usize, &str)> = None;
    for d in &directives {
        if d.contains('[') {
            continue;
        }
        let (target, level) = match d.rsplit_once('=') {
            Some((t, l)) => (t, l),
            None if canonical_level(d).is_some() => ("", d.as_str()),
            None => (d.as_str(), "trace"),
        };
        if !"sandbox_agent".starts_with(target) {
            continue;
        }
        if best.is_none_or(|(len, _)| target.len() >= len) {
            best = Some((target.len(), level));
        }
    }
    match best {
        Some((_, level)) if level != "off" => Ok(filter),
        _ => Err(format!(
            "`{s}` does not show the daemon's own errors, fatal ones included (a word that is \
             not a level is read as a module name); use a level (error, warn, info, debug, \
             trace), optionally with module overrides like `warn,sandbox_agent::acp=debug`"
        )),
    }
}

/// The known key nearest to an unknown one (edit distance at most a third of its length).
fn nearest_key<'a>(unknown: &str, known: &[&'a str]) -> Option<&'a str> {
    fn distance(a: &str, b: &str) -> usize {
        let b: Vec<char> = b.chars().collect();
        let mut prev: Vec<usize> = (0..=b.len()).collect();
        for (i, ca) in a.chars().enumerate() {
            let mut cur = vec![i + 1; b.len() + 1];
            for (j, cb) in b.iter().enumerate() {
                let cost = usize::from(ca != *cb);
                cur[j + 1] = (prev[j] + cost).min(prev[j + 1] + 1).min(cur[j] + 1);
            }
            prev = cur;
        }
        prev[b.len()]
    }
    let max = (unknown.chars().count() / 3).max(1);
    known
        .iter()
        .map(|k| (distance(unknown, k), *k))
        .filter(|(d, _)| *d <= max)
        .min()
        .map(|(_, k)| k)
}

/// Every key the config file accepts: the server's long flags with `_` for `-`.
fn known_file_keys() -> Vec<String> {
    use clap::Args;
    let cmd = ServerArgs::augment_args(clap::Command::new("sandbox-agent"));
    cmd.get_arguments()
        .filter_map(|a| a.get_long())
        .map(|l| l.replace('-', "_"))
        .collect()
}

/// What to say about a key the file does not know.
fn unknown_key_message(key: &str, value: &toml::Value, file: &Path) -> String {
    let base = format!("config file {}: unknown key `{key}`", file.display());
    if value.is_table()
        || (value.is_array()
            && value
                .as_array()
                .is_some_and(|a| a.iter().all(toml::Value::is_table) && !a.is_empty()))
    {
        if matches!(key, "agent" | "agents") {
            return format!(
                "{base}: agents are declared in their own file with `[[agent]]` tables, \
                 passed with --agents-file (see docs/agents.md)"
            );
        }
        return format!("{base}: the config file has no tables, only top-level keys");
    }
    let known = known_file_keys();
    let known: Vec<&str> = known.iter().map(String::as_str).collect();
    match nearest_key(key, &known) {
        Some(k) => format!("{base}; did you mean `{k}`?"),
        None => base,
    }
}

/// A `--host` value: an IP address, or a name whose every address is loopback (such as
/// `localhost`), which becomes its first IPv4 address (else its first). Other names are refused
/// with the address to use instead, since the daemon binds one address.
fn parse_host(s: &str) -> Result<IpAddr, String> {
    let t = s.trim();
    if let Ok(ip) = t
        .trim_start_matches('[')
        .trim_end_matches(']')
        .parse::<IpAddr>()
    {
        return Ok(ip);
    }
    let refuse = |why: &str| {
        format!(
            "`{s}` is not an IP address{why}; give the address to listen on, e.g. 127.0.0.1 \
             (this machine only) or 0.0.0.0 (every interface)"
        )
    };
    if t.is_empty() || t.contains(['/', ' ', ':']) {
        return Err(refuse(""));
    }
    use std::net::ToSocketAddrs;
    let addrs: Vec<IpAddr> = match (t, 0).to_socket_addrs() {
        Ok(a) => a.map(|a| a.ip()).collect(),
        Err(e) => return Err(refuse(&format!(" and does not resolve ({e})"))),
    };
    if addrs.is_empty() {
        return Err(refuse(" and resolves to nothing"));
    }
    if !addrs.iter().all(IpAddr::is_loopback) {
        return Err(refuse(
            " of this machine's loopback (names other than loopback ones are refused: a name may resolve to several addresses)",
        ));
    }
    Ok(addrs
        .iter()
        .find(|a| a.is_ipv4())
        .copied()
        .unwrap_or(addrs[0]))
}

/// Parses `30s`, `5m`, `1h 30m` (humantime); a bare number is seconds.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    if let Ok(secs) = s.parse::<u64>() {
        return Ok(Duration::from_secs(secs));
    }
    humantime::parse_duration(s).map_err(|e| format!("`{s}` is not a duration like 30s or 5m: {e}"))
}

/// Parses `256M`, `1G`, `512k`, `1.5GiB`, plain bytes; `max`/`none`/`unlimited` give `None`.
pub fn parse_size(s: &str) -> Result<Option<u64>, String> {
    let t = s.trim();
    if matches!(
        t.to_ascii_lowercase().as_str(),
        "max" | "none" | "unlimited"
    ) {
        return Ok(None);
    }
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let num: f64 = num
        .parse()
        .map_err(|_| format!("`{s}` is not a size like 256M or 1G"))?;
    let mult: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => 1 << 10,
        "m" | "mb" | "mib" => 1 << 20,
        "g" | "gb" | "gib" => 1 << 30,
        "t" | "tb" | "tib" => 1 << 40,
        _ => return Err(format!("`{s}` has an unknown size unit (use K, M, G or T)")),
    };
    Ok(Some((num * mult as f64) as u64))
}

fn parse_count_or_max(s: &str) -> Result<Option<u64>, String> {
    let t = s.trim();
    if matches!(
        t.to_ascii_lowercase().as_str(),
        "max" | "none" | "unlimited"
    ) {
        return Ok(None);
    }
    t.parse::<u64>()
        .map(Some)
        .map_err(|_| format!("`{s}` is not a whole number or `max`"))
}

fn parse_cpu(s: &str) -> Result<Option<f64>, String> {
    let t = s.trim();
    if matches!(
        t.to_ascii_lowercase().as_str(),
        "max" | "none" | "unlimited"
    ) {
        return Ok(None);
    }
    match t.parse::<f64>() {
        Ok(v) if v > 0.0 && v.is_finite() => Ok(Some(v)),
        _ => Err(format!("`{s}` is not a positive number of cores or `max`")),
    }
}

// --- harden-edge ---

/// A list setting: the flag (or its variable) wins over the file; empty items are dropped.
fn list_setting(flag: Option<Vec<String>>, file: Option<Vec<String>>) -> Vec<String> {
    flag.or(file)
        .unwrap_or_default()
        .into_iter()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .collect()
}

fn positive_duration(s: &str) -> Result<Duration, String> {
    match parse_duration(s)? {
        d if d.is_zero() => Err(format!("`{s}` must be longer than zero")),
        d => Ok(d),
    }
}

/// `scheme://host[:port]` in lower case, without a trailing slash; `*` stays `*`.
pub fn normalise_origin(s: &str) -> Result<String, String> {
    let t = s.trim().trim_end_matches('/').to_ascii_lowercase();
    if t == "*" {
        return Ok(t);
    }
    match t.split_once("://") {
        Some((scheme, rest))
            if !scheme.is_empty() && !rest.is_empty() && !rest.contains(['/', '?', '#']) =>
        {
            Ok(t)
        }
        _ => Err(format!(
            "`{s}` is not an origin like https://example.com:8443"
        )),
    }
}

/// Half the soft open-file limit (each connection is one descriptor, agents and files need the
/// rest), at most 4096 and at least 16.
fn default_max_connections() -> usize {
    let soft = nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE)
        .map(|(soft, _)| soft)
        .unwrap_or(1024);
    (soft / 2).clamp(16, 4096) as usize
}

/// One runtime thread up to 7 CPUs, then one per 4 CPUs, at most 4 (measured in
/// docs/performance.md: a second worker costs more in cross-thread wake-ups than it gains until
/// the proxy's own work saturates one core).
fn default_worker_threads() -> usize {
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    (cpus / 4).clamp(1, 4)
}

/// Reads the token once; surrounding whitespace (a trailing newline) is not part of it.
fn read_token_file(path: &Path) -> Result<String, String> {
    let raw = std::fs::read(path).map_err(|e| e.to_string())?;
    let text = String::from_utf8(raw).map_err(|_| "the token is not UTF-8".to_string())?;
    let token = text.trim();
    if token.is_empty() {
        return Err("the file is empty".to_string());
    }
    if token.contains(['\n', '\r']) || token.chars().any(char::is_control) {
        return Err("the token spans several lines or holds control characters".to_string());
    }
    Ok(token.to_string())
}

fn is_loopback(ip: &IpAddr) -> bool {
    ip.is_loopback()
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
        let agent_base_env = env
            .into_iter()
            .filter(|(k, _)| {
                let name = k.to_string_lossy();
                !never_passed(&name) && pass_matches(&agent_env_pass, &name)
            })
            .collect();

        Ok(Config {
            host,
            port,
            token: if no_token { None } else { token },
            data_dir,
            work_dir,
            fs_root,
            request_timeout,
            shutdown_grace,
            agent_grace,
            event_buffer,
            event_buffer_bytes,
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

/// Where the client commands (`sandbox-agent status`, `acp`, `fs`, …) find the daemon: read
/// from the same flags, variables and config-file keys as the daemon's own address and token.
#[derive(Clone)]
pub struct ClientTarget {
    /// `http://host:port` (or `--url`), without a trailing slash.
    pub base_url: String,
    pub token: Option<String>,
}

impl fmt::Debug for ClientTarget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClientTarget")
            .field("base_url", &self.base_url)
            .field("token", &self.token.as_ref().map(|_| "<redacted>"))
            .finish()
    }
}

impl ClientTarget {
    /// Precedence as for the daemon: flag > environment (both through clap) > config file >
    /// default; `--url` wins over host and port, a token over a token file. Only the four keys
    /// the client needs are read from the file: the rest belong to the daemon, which checks them.
    pub fn load(args: &crate::cli::ClientArgs) -> Result<ClientTarget, ConfigErrors> {
        let mut errors = Vec::new();
        let mut file = match &args.config {
            Some(path) => FileValues::load(path, &mut errors),
            None => FileValues::empty(),
        };
        let file_path = file.path.clone();
        let file_host = file.take_string("host", &mut errors);
        let file_port = file.take_string("port", &mut errors);
        let file_token = file.take_string("token", &mut errors);
        let file_token_file = file.take_string("token_file", &mut errors);

        let base_url = match &args.url {
            Some(url) => {
                let url = url.trim().trim_end_matches('/');
                if url.starts_with("http://") || url.starts_with("https://") {
                    url.to_string()
                } else {
                    errors.push(format!(
                        "--url (or SANDBOX_AGENT_URL): `{url}` is not an http:// or https:// URL"
                    ));
                    String::new()
                }
            }
            None => {
                let host = match (&args.host, file_host) {
                    (Some(h), _) => h.clone(),
                    (None, Some(h)) => h,
                    (None, None) => "127.0.0.1".to_string(),
                };
                let port = match (args.port, file_port) {
                    (Some(p), _) => p,
                    (None, Some(raw)) => raw.parse::<u16>().unwrap_or_else(|_| {
                        errors.push(format!(
                            "{}: `{raw}` is not a port (0-65535)",
                            origin("port", true, false, &file_path)
                        ));
                        0
                    }),
                    (None, None) => 2468,
                };
                if port == 0 && errors.is_empty() {
                    errors.push(
                        "port 0 means \"any free port\" to the daemon: pass the port it reported \
                         (--port or SANDBOX_AGENT_PORT)"
                            .to_string(),
                    );
                }
                format!("http://{}:{port}", client_host(&host))
            }
        };

        let token = match (&args.token, file_token) {
            (Some(t), _) if t.is_empty() => {
                errors.push("--token (or SANDBOX_AGENT_TOKEN): the token is empty".to_string());
                None
            }
            (Some(t), _) => Some(t.clone()),
            (None, Some(t)) if args.token_file.is_none() => Some(t),
            _ => {
                let path = args
                    .token_file
                    .clone()
                    .or_else(|| file_token_file.map(PathBuf::from));
                path.and_then(|path| match read_token_file(&path) {
                    Ok(t) => Some(t),
                    Err(e) => {
                        errors.push(format!("--token-file {}: {e}", path.display()));
                        None
                    }
                })
            }
        };
        if !errors.is_empty() {
            return Err(ConfigErrors(errors));
        }
        Ok(ClientTarget { base_url, token })
    }
}

/// The host part of the daemon's URL: an unspecified address (what a daemon listening on every
/// interface was given) is reached on loopback; IPv6 goes in brackets; a name stays a name.
fn client_host(host: &str) -> String {
    let host = host.trim();
    match host
        .trim_start_matches('[')
        .trim_end_matches(']')
        .parse::<IpAddr>()
    {
        Ok(IpAddr::V4(v4)) if v4.is_unspecified() => "127.0.0.1".to_string(),
        Ok(IpAddr::V6(v6)) if v6.is_unspecified() => "[::1]".to_string(),
        Ok(IpAddr::V4(v4)) => v4.to_string(),
        Ok(IpAddr::V6(v6)) => format!("[{v6}]"),
        Err(_) => host.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check_client_host(input: &str, expected: &str) {
        assert_eq!(client_host(input), expected, "{input}");
    }

    #[test]
    fn client_hosts() {
        check_client_host("127.0.0.1", "127.0.0.1");
        check_client_host("0.0.0.0", "127.0.0.1");
        check_client_host("::", "[::1]");
        check_client_host("[::]", "[::1]");
        check_client_host("::1", "[::1]");
        check_client_host("10.1.2.3", "10.1.2.3");
        check_client_host("localhost", "localhost");
    }

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
