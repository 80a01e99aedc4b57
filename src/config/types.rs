//! The value types of settings that are words (log format, cgroup mode, sync policy, trace
//! sampler) with their parsers, and what systemd told the daemon through the environment.

use std::ffi::OsString;
use std::time::Duration;

use super::error::InvalidValue;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogFormat {
    Auto,
    Journald,
    Text,
    Json,
}

impl LogFormat {
    pub fn parse(s: &str) -> Result<LogFormat, InvalidValue> {
        match s {
            "auto" => Ok(LogFormat::Auto),
            "journald" => Ok(LogFormat::Journald),
            "text" => Ok(LogFormat::Text),
            "json" => Ok(LogFormat::Json),
            _ => Err(format!("`{s}` is not one of auto, journald, text, json").into()),
        }
    }
}

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

impl AgentCgroups {
    pub fn parse(s: &str) -> Result<AgentCgroups, InvalidValue> {
        match s.trim().to_ascii_lowercase().as_str() {
            "auto" => Ok(AgentCgroups::Auto),
            "v1" => Ok(AgentCgroups::V1),
            "v2" => Ok(AgentCgroups::V2),
            "off" | "none" => Ok(AgentCgroups::Off),
            _ => Err(format!("`{s}` is not one of auto, v1, v2, off").into()),
        }
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
    pub fn parse(s: &str) -> Result<StateSync, InvalidValue> {
        match s.trim() {
            "every" => Ok(StateSync::Every),
            "os" => Ok(StateSync::Os),
            other => match other.strip_prefix("batch:") {
                Some(ms) => match ms.trim().parse::<u64>() {
                    Ok(n) if (1..=60_000).contains(&n) => {
                        Ok(StateSync::Batch(Duration::from_millis(n)))
                    }
                    _ => Err(format!("`{s}`: batch:<ms> takes 1 to 60000 milliseconds").into()),
                },
                None => Err(format!("`{s}` is not a sync policy (every, batch:<ms>, os)").into()),
            },
        }
    }
}

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
    pub fn parse(name: Option<&str>, arg: Option<&str>) -> Result<TraceSampler, InvalidValue> {
        let ratio = || -> Result<f64, InvalidValue> {
            match arg {
                None => Ok(1.0),
                Some(a) => a
                    .parse::<f64>()
                    .ok()
                    .filter(|r| (0.0..=1.0).contains(r))
                    .ok_or_else(|| {
                        format!("OTEL_TRACES_SAMPLER_ARG `{a}` is not a ratio in [0, 1]").into()
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
                )
                .into());
            }
        })
    }
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
