//! `GET /v1/acp`: the instances and their processes.

use super::supervisor::ExitReason;
use crate::acp::{ServerInfo as Info, Status};

/// What `GET /v1/acp` says of the process: `starting` until it runs, `exited` once its whole
/// tree is gone (or it never started), `running` in between — also while an agent that closed
/// its stdout is being stopped (it can no longer answer, but it still exists).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum ServerStatus {
    Starting,
    Running,
    Exited,
}

impl From<Status> for ServerStatus {
    fn from(s: Status) -> Self {
        match s {
            Status::Starting => Self::Starting,
            Status::Running => Self::Running,
            Status::Exited => Self::Exited,
        }
    }
}

/// One row of `GET /v1/acp`.
#[derive(Debug, Clone, serde::Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ServerInfo {
    pub server_id: String,
    pub agent: String,
    pub created_at_ms: u64,
    pub status: ServerStatus,
    pub pid: Option<u32>,
    pub exit_code: Option<i32>,
    pub signal: Option<i32>,
    pub exit_reason: Option<ExitReason>,
    pub last_event_id: u64,
    pub subscribers: usize,
    pub pending_requests: usize,
    pub invalid_stdout_lines: u64,
    pub rss_bytes: Option<u64>,
    pub cpu_ms: Option<u64>,
    pub processes: Option<u64>,
    pub open_fds: Option<u64>,
    /// The sessions created or loaded through the daemon with a `cwd` inside a git repository,
    /// each with the HEAD at that moment (`gitBase`; docs/workspace.md).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub sessions: Vec<SessionGitBase>,
    /// The OpenCode session this instance backs (`/opencode/*`, docs/opencode.md), if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub opencode: Option<OpenCodeLink>,
}

/// The OpenCode session an instance backs: its id (`ses_…`) and title.
#[derive(Debug, Clone, serde::Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct OpenCodeLink {
    pub session_id: String,
    pub title: String,
}

/// A session's working directory and the commit its repository was at when it began.
#[derive(Debug, Clone, serde::Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct SessionGitBase {
    pub session_id: String,
    pub cwd: String,
    pub git_base: String,
}

impl From<Info> for ServerInfo {
    fn from(i: Info) -> Self {
        Self {
            server_id: i.server_id,
            agent: i.agent,
            created_at_ms: i.created_at_ms,
            status: i.status.into(),
            pid: i.pid,
            exit_code: i.exit_code,
            signal: i.signal,
            exit_reason: i.exit_reason.map(Into::into),
            last_event_id: i.last_event_id,
            subscribers: i.subscribers,
            pending_requests: i.pending_requests,
            invalid_stdout_lines: i.invalid_stdout_lines,
            rss_bytes: i.rss_bytes,
            cpu_ms: i.cpu_ms,
            processes: i.processes,
            open_fds: i.open_fds,
            sessions: Vec::new(),
            opencode: None,
        }
    }
}
