//! What the supervisor reports of a process, on the wire (ACP instances and background processes).

use crate::supervisor as svc;

/// How an agent ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum ExitReason {
    Exited,
    Crashed,
    Oom,
    Graceful,
    Forced,
    #[serde(rename = "daemon_restart")]
    DaemonRestart,
}

impl From<svc::ExitReason> for ExitReason {
    fn from(r: svc::ExitReason) -> Self {
        match r {
            svc::ExitReason::Exited => Self::Exited,
            svc::ExitReason::Crashed => Self::Crashed,
            svc::ExitReason::Oom => Self::Oom,
            svc::ExitReason::Graceful => Self::Graceful,
            svc::ExitReason::Forced => Self::Forced,
            svc::ExitReason::DaemonRestart => Self::DaemonRestart,
        }
    }
}

/// Process figures for the listing, summed over the agent's processes.
#[derive(Debug, Clone, serde::Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ProcessStats {
    pub rss_bytes: u64,
    pub cpu_ms: u64,
    pub processes: u64,
    pub open_fds: u64,
}

impl From<&svc::ProcessStats> for ProcessStats {
    fn from(s: &svc::ProcessStats) -> Self {
        Self {
            rss_bytes: s.rss_bytes,
            cpu_ms: s.cpu_ms,
            processes: s.processes,
            open_fds: s.open_fds,
        }
    }
}
