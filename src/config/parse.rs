//! The parsers of setting values (durations, sizes, hosts, origins, log filters, the token
//! file) and the defaults that depend on the machine (connection cap, worker threads).

use std::net::IpAddr;
use std::path::Path;
use std::time::Duration;

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

/// A `--host` value: an IP address, or a name whose every address is loopback (such as
/// `localhost`), which becomes its first IPv4 address (else its first). Other names are refused
/// with the address to use instead, since the daemon binds one address.
pub(super) fn parse_host(s: &str) -> Result<IpAddr, String> {
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

pub(super) fn parse_count_or_max(s: &str) -> Result<Option<u64>, String> {
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

pub(super) fn parse_cpu(s: &str) -> Result<Option<f64>, String> {
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

/// A list setting: the flag (or its variable) wins over the file; empty items are dropped.
pub(super) fn list_setting(flag: Option<Vec<String>>, file: Option<Vec<String>>) -> Vec<String> {
    flag.or(file)
        .unwrap_or_default()
        .into_iter()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .collect()
}

pub(super) fn positive_duration(s: &str) -> Result<Duration, String> {
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
pub(super) fn read_token_file(path: &Path) -> Result<String, String> {
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

pub(super) fn is_loopback(ip: &IpAddr) -> bool {
    ip.is_loopback()
}
