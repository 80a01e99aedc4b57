//! The parsers of setting values (durations, sizes, hosts, origins, log filters, paths, the
//! token file) and the defaults that depend on the machine (connection cap, worker threads, the
//! data directory). Each refuses with an `InvalidValue` that quotes the value.

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::declare::Ctx;
use super::error::InvalidValue;

type Parsed<T> = Result<T, InvalidValue>;

/// The spellings of a level that people type, in any case, as the filter's own names.
pub(super) fn canonical_level(s: &str) -> Option<&'static str> {
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
pub fn normalise_log_filter(s: &str) -> Parsed<String> {
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
        return Err("the filter is empty; use a level like `info` or `warn`".into());
    }
    if let Err(e) = tracing_subscriber::EnvFilter::try_new(&filter) {
        return Err(
            format!("`{s}` is not a log filter like `info` or `sandbox_agent=debug`: {e}").into(),
        );
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
        )
        .into()),
    }
}

/// A `--host` value: an IP address, or a name whose every address is loopback (such as
/// `localhost`), which becomes its first IPv4 address (else its first). Other names are refused
/// with the address to use instead, since the daemon binds one address.
pub(super) fn parse_host(s: &str) -> Parsed<IpAddr> {
    let t = s.trim();
    if let Ok(ip) = t
        .trim_start_matches('[')
        .trim_end_matches(']')
        .parse::<IpAddr>()
    {
        return Ok(ip);
    }
    let refuse = |why: &str| -> InvalidValue {
        format!(
            "`{s}` is not an IP address{why}; give the address to listen on, e.g. 127.0.0.1 \
             (this machine only) or 0.0.0.0 (every interface)"
        )
        .into()
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
pub fn parse_duration(s: &str) -> Parsed<Duration> {
    let s = s.trim();
    if let Ok(secs) = s.parse::<u64>() {
        return Ok(Duration::from_secs(secs));
    }
    humantime::parse_duration(s)
        .map_err(|e| format!("`{s}` is not a duration like 30s or 5m: {e}").into())
}

/// Parses `256M`, `1G`, `512k`, `1.5GiB`, plain bytes; `max`/`none`/`unlimited` give `None`.
pub fn parse_size(s: &str) -> Parsed<Option<u64>> {
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
        .map_err(|_| InvalidValue(format!("`{s}` is not a size like 256M or 1G")))?;
    let mult: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => 1 << 10,
        "m" | "mb" | "mib" => 1 << 20,
        "g" | "gb" | "gib" => 1 << 30,
        "t" | "tb" | "tib" => 1 << 40,
        _ => return Err(format!("`{s}` has an unknown size unit (use K, M, G or T)").into()),
    };
    Ok(Some((num * mult as f64) as u64))
}

pub(super) fn parse_count_or_max(s: &str) -> Parsed<Option<u64>> {
    let t = s.trim();
    if matches!(
        t.to_ascii_lowercase().as_str(),
        "max" | "none" | "unlimited"
    ) {
        return Ok(None);
    }
    t.parse::<u64>()
        .map(Some)
        .map_err(|_| format!("`{s}` is not a whole number or `max`").into())
}

pub(super) fn parse_cpu(s: &str) -> Parsed<Option<f64>> {
    let t = s.trim();
    if matches!(
        t.to_ascii_lowercase().as_str(),
        "max" | "none" | "unlimited"
    ) {
        return Ok(None);
    }
    match t.parse::<f64>() {
        Ok(v) if v > 0.0 && v.is_finite() => Ok(Some(v)),
        _ => Err(format!("`{s}` is not a positive number of cores or `max`").into()),
    }
}

pub(super) fn positive_duration(s: &str) -> Parsed<Duration> {
    match parse_duration(s)? {
        d if d.is_zero() => Err(format!("`{s}` must be longer than zero").into()),
        d => Ok(d),
    }
}

/// `scheme://host[:port]` in lower case, without a trailing slash; `*` stays `*`.
pub fn normalise_origin(s: &str) -> Parsed<String> {
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
        _ => Err(format!("`{s}` is not an origin like https://example.com:8443").into()),
    }
}

/// Half the soft open-file limit (each connection is one descriptor, agents and files need the
/// rest), at most 4096 and at least 16.
pub(super) fn default_max_connections() -> usize {
    let soft = nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE)
        .map(|(soft, _)| soft)
        .unwrap_or(1024);
    (soft / 2).clamp(16, 4096) as usize
}

/// One runtime thread up to 7 CPUs, then one per 4 CPUs, at most 4 (measured in
/// docs/performance.md: a second worker costs more in cross-thread wake-ups than it gains until
/// the proxy's own work saturates one core).
pub(super) fn default_worker_threads() -> usize {
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    (cpus / 4).clamp(1, 4)
}

/// Reads the token once; surrounding whitespace (a trailing newline) is not part of it.
pub(super) fn read_token_file(path: &Path) -> Parsed<String> {
    let raw = std::fs::read(path).map_err(|e| InvalidValue(e.to_string()))?;
    let text = String::from_utf8(raw).map_err(|_| InvalidValue::from("the token is not UTF-8"))?;
    let token = text.trim();
    if token.is_empty() {
        return Err("the file is empty".into());
    }
    if token.contains(['\n', '\r']) || token.chars().any(char::is_control) {
        return Err("the token spans several lines or holds control characters".into());
    }
    Ok(token.to_string())
}

/// `--port`: as clap reads it from a flag, for the file's values.
pub(super) fn parse_port(s: &str) -> Parsed<u16> {
    s.parse::<u16>()
        .map_err(|_| format!("`{s}` is not a port (0-65535)").into())
}

pub(super) fn non_empty_token(s: &str) -> Parsed<Option<String>> {
    if s.is_empty() {
        Err("the token is empty".into())
    } else {
        Ok(Some(s.to_string()))
    }
}

pub(super) fn positive_count(s: &str) -> Parsed<usize> {
    match s.trim().parse::<usize>() {
        Ok(n) if n > 0 => Ok(n),
        _ => Err(format!("`{s}` is not a positive whole number").into()),
    }
}

pub(super) fn whole_number(s: &str) -> Parsed<u64> {
    s.trim()
        .parse::<u64>()
        .map_err(|_| format!("`{s}` is not a whole number").into())
}

/// A size that must be given (not `max`) and above zero.
pub(super) fn size_required(s: &str) -> Parsed<u64> {
    match parse_size(s)? {
        Some(n) if n > 0 => Ok(n),
        _ => Err(format!("`{s}` must be a positive size").into()),
    }
}

/// A size that must be given and above zero, for a count of bytes held in memory.
pub(super) fn size_required_usize(s: &str) -> Parsed<usize> {
    size_required(s).map(|n| usize::try_from(n).unwrap_or(usize::MAX))
}

/// `--body-min-rate`: a size, where 0 turns the minimum off.
pub(super) fn min_rate(s: &str) -> Parsed<u64> {
    match parse_size(s)? {
        Some(n) => Ok(n),
        None => Err(format!("`{s}` must be a size (0 turns the minimum off)").into()),
    }
}

/// Upper bound of `--warm-spawns` (each is an idle process and its cgroups).
pub const MAX_WARM_SPAWNS: usize = 64;

pub(super) fn warm_spawns(s: &str) -> Parsed<usize> {
    match s.trim().parse::<usize>() {
        Ok(n) if n <= MAX_WARM_SPAWNS => Ok(n),
        _ => Err(format!("`{s}` is not a whole number from 0 to {MAX_WARM_SPAWNS}").into()),
    }
}

/// `--worker-threads`: a positive count or `auto` (`default_worker_threads`).
pub(super) fn worker_threads(s: &str) -> Parsed<usize> {
    if s.trim().eq_ignore_ascii_case("auto") {
        Ok(default_worker_threads())
    } else {
        positive_count(s)
    }
}

/// One `--agent-env` item.
pub(super) fn key_value(kv: &str) -> Parsed<(String, String)> {
    match kv.split_once('=') {
        Some((k, v)) if !k.is_empty() => Ok((k.to_string(), v.to_string())),
        _ => Err(format!("`{kv}` is not KEY=VALUE").into()),
    }
}

pub(super) fn registry_url(s: &str) -> Parsed<String> {
    if s.starts_with("http://") || s.starts_with("https://") || s.starts_with("file://") {
        Ok(s.to_string())
    } else {
        Err(format!("`{s}` is not an http(s):// or file:// URL").into())
    }
}

pub(super) fn beneath_cwd(p: PathBuf, cx: &Ctx) -> Parsed<PathBuf> {
    Ok(cx.cwd.join(p))
}

/// `--work-dir`: an existing directory.
pub(super) fn work_dir(p: PathBuf, cx: &Ctx) -> Parsed<PathBuf> {
    let p = cx.cwd.join(p);
    if p.is_dir() {
        Ok(p)
    } else {
        Err(format!("{}: not a directory", p.display()).into())
    }
}

/// `--fs-root`: an existing directory, by its canonical path (symlinks resolved once).
pub(super) fn fs_root(p: PathBuf, cx: &Ctx) -> Parsed<Option<PathBuf>> {
    match cx.cwd.join(&p).canonicalize() {
        Ok(c) if c.is_dir() => Ok(Some(c)),
        Ok(c) => Err(format!("{}: not a directory", c.display()).into()),
        Err(e) => Err(format!("{}: {e}", p.display()).into()),
    }
}

/// `--state-dir`: an empty value (e.g. `SANDBOX_AGENT_STATE_DIR=` to override the packaged
/// unit) turns durable state off.
pub(super) fn state_dir(p: PathBuf, cx: &Ctx) -> Parsed<Option<PathBuf>> {
    Ok((!p.as_os_str().is_empty()).then(|| cx.cwd.join(p)))
}

/// systemd's `StateDirectory=` (the first, when it lists several), else the user's data
/// directory, else `/var/lib/sandbox-agent`.
pub(super) fn default_data_dir(cx: &Ctx) -> PathBuf {
    if let Some(state) = cx.var("STATE_DIRECTORY") {
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
    match cx.var("HOME") {
        Some(home) if !home.is_empty() => PathBuf::from(home).join(".local/share/sandbox-agent"),
        _ => PathBuf::from("/var/lib/sandbox-agent"),
    }
}
