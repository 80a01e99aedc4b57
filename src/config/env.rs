//! The process environment beyond the settings: what agents inherit (`agent_base_env`), the
//! OpenTelemetry variables, systemd's, the reload's hand-off variable and the environment a
//! reload re-executes with. **Invariant:** an agent never inherits the systemd protocol's
//! variables nor any `SANDBOX_AGENT_*` (the token among them).

use std::ffi::OsString;
use std::path::PathBuf;

use super::declare::Ctx;
use super::error::ConfigError;
use super::types::{SystemdEnv, TraceSampler};

/// Variables an agent never inherits: the systemd protocol (which would let an agent notify or
/// pet the watchdog in our name) and every setting of ours (the token among them).
pub(super) fn never_passed(name: &str) -> bool {
    const EXACT: &[&str] = &["NOTIFY_SOCKET", "JOURNAL_STREAM", "INVOCATION_ID"];
    const PREFIX: &[&str] = &["LISTEN_", "WATCHDOG_", "SANDBOX_AGENT_"];
    EXACT.contains(&name) || PREFIX.iter().any(|p| name.starts_with(p))
}

fn pass_matches_explicitly(patterns: &[String], name: &str) -> bool {
    patterns
        .iter()
        .any(|p| p != "*" && pass_matches(std::slice::from_ref(p), name))
}

pub(super) fn pass_matches(patterns: &[String], name: &str) -> bool {
    patterns.iter().any(|p| match p.strip_suffix('*') {
        Some(prefix) => name.starts_with(prefix),
        None => p == name,
    })
}

/// The daemon's environment as agents inherit it, filtered by `--agent-env-pass`.
pub(super) fn agent_base_env(
    env: &[(OsString, OsString)],
    pass: &[String],
) -> Vec<(OsString, OsString)> {
    env.iter()
        .filter(|(k, _)| {
            let name = k.to_string_lossy();
            !never_passed(&name)
                && if name.starts_with("OTEL_") {
                    // The daemon's own tracing settings reach agents only when the operator
                    // names them (a bare `*` does not): an agent gets the trace context in each
                    // request's `_meta.traceparent` instead.
                    pass_matches_explicitly(pass, &name)
                } else {
                    pass_matches(pass, &name)
                }
        })
        .cloned()
        .collect()
}

pub(super) fn systemd(cx: &Ctx) -> SystemdEnv {
    let string_var = |name: &str| cx.var(name).map(|v| v.to_string_lossy().into_owned());
    SystemdEnv {
        notify_socket: cx.var("NOTIFY_SOCKET"),
        listen_fds: string_var("LISTEN_FDS"),
        listen_pid: string_var("LISTEN_PID"),
        watchdog_usec: string_var("WATCHDOG_USEC"),
        watchdog_pid: string_var("WATCHDOG_PID"),
        journal_stream: string_var("JOURNAL_STREAM"),
    }
}

/// Where traces go, by whom they are made, and which are kept: `--otlp-endpoint` (a base URL),
/// else the standard `OTEL_*` variables. Problems go to `errors`.
pub(super) struct Tracing {
    pub endpoint: Option<String>,
    pub service_name: String,
    pub sampler: TraceSampler,
}

pub(super) fn tracing(
    cx: &Ctx,
    otlp_endpoint: Option<&str>,
    errors: &mut Vec<ConfigError>,
) -> Tracing {
    let otel_var = |name: &str| {
        cx.var(name)
            .map(|v| v.to_string_lossy().trim().to_string())
            .filter(|v| !v.is_empty())
    };
    let endpoint = otlp_endpoint
        .map(traces_url)
        .or_else(|| otel_var("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"))
        .or_else(|| otel_var("OTEL_EXPORTER_OTLP_ENDPOINT").map(|base| traces_url(&base)));
    if let Some(url) = &endpoint
        && !(url.starts_with("http://") || url.starts_with("https://"))
    {
        errors.push(ConfigError::OtlpEndpoint { url: url.clone() });
    }
    let sampler = match TraceSampler::parse(
        otel_var("OTEL_TRACES_SAMPLER").as_deref(),
        otel_var("OTEL_TRACES_SAMPLER_ARG").as_deref(),
    ) {
        Ok(s) => s,
        Err(e) => {
            errors.push(ConfigError::TraceSampler(e));
            TraceSampler::ParentBased(1.0)
        }
    };
    Tracing {
        endpoint,
        service_name: otel_var("OTEL_SERVICE_NAME").unwrap_or_else(|| "sandbox-agent".to_string()),
        sampler,
    }
}

/// The OTLP/HTTP traces URL of a collector base URL.
fn traces_url(base: &str) -> String {
    format!("{}/v1/traces", base.trim_end_matches('/'))
}

/// The variable through which a daemon that re-executes itself for a reload tells its new image
/// which descriptor holds the hand-off (docs/upgrades.md, "Reload"). Never set by operators.
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

/// The daemon's own binary: `current_exe` after the binary was replaced on disk reads
/// "<path> (deleted)", and the path the daemon was started from is the part before the suffix
/// (where the new binary now is).
pub(super) fn own_exe() -> PathBuf {
    use std::os::unix::ffi::OsStrExt;
    let Ok(p) = std::env::current_exe() else {
        return PathBuf::from("/proc/self/exe");
    };
    let b = p.as_os_str().as_bytes();
    match b.strip_suffix(b" (deleted)") {
        Some(rest) => PathBuf::from(std::ffi::OsStr::from_bytes(rest)),
        None => p,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
