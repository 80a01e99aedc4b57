//! `/v1/processes`: the bodies the process service takes and gives, on the wire (the shapes of the
//! published `sandbox-agent` npm SDK). The answers that exist only at one route (lists, log pages,
//! terminal size) are next to their handlers in `http/processes.rs`.

use std::collections::BTreeMap;

use super::supervisor::{ExitReason, ProcessStats};
use crate::processes as svc;

/// Which stream a chunk came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum LogStream {
    Stdout,
    Stderr,
    Pty,
}

impl From<svc::LogStream> for LogStream {
    fn from(s: svc::LogStream) -> Self {
        match s {
            svc::LogStream::Stdout => Self::Stdout,
            svc::LogStream::Stderr => Self::Stderr,
            svc::LogStream::Pty => Self::Pty,
        }
    }
}

/// Which chunks a reader wants (`?stream=`); `Combined` is every stream.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize, utoipa::ToSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum StreamFilter {
    Stdout,
    Stderr,
    Combined,
    Pty,
}

impl From<svc::StreamFilter> for StreamFilter {
    fn from(f: svc::StreamFilter) -> Self {
        match f {
            svc::StreamFilter::Stdout => Self::Stdout,
            svc::StreamFilter::Stderr => Self::Stderr,
            svc::StreamFilter::Combined => Self::Combined,
            svc::StreamFilter::Pty => Self::Pty,
        }
    }
}

impl From<StreamFilter> for svc::StreamFilter {
    fn from(f: StreamFilter) -> Self {
        match f {
            StreamFilter::Stdout => Self::Stdout,
            StreamFilter::Stderr => Self::Stderr,
            StreamFilter::Combined => Self::Combined,
            StreamFilter::Pty => Self::Pty,
        }
    }
}

/// The runtime settings; the wire shape of `GET/POST /v1/processes/config`.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize, utoipa::ToSchema,
)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ProcessConfig {
    pub max_concurrent_processes: usize,
    pub default_run_timeout_ms: u64,
    pub max_run_timeout_ms: u64,
    pub max_output_bytes: u64,
    pub max_log_bytes_per_process: u64,
    pub max_input_bytes_per_request: u64,
}

impl From<svc::ProcessConfig> for ProcessConfig {
    fn from(c: svc::ProcessConfig) -> Self {
        Self {
            max_concurrent_processes: c.max_concurrent_processes,
            default_run_timeout_ms: c.default_run_timeout_ms,
            max_run_timeout_ms: c.max_run_timeout_ms,
            max_output_bytes: c.max_output_bytes,
            max_log_bytes_per_process: c.max_log_bytes_per_process,
            max_input_bytes_per_request: c.max_input_bytes_per_request,
        }
    }
}

impl From<ProcessConfig> for svc::ProcessConfig {
    fn from(c: ProcessConfig) -> Self {
        Self {
            max_concurrent_processes: c.max_concurrent_processes,
            default_run_timeout_ms: c.default_run_timeout_ms,
            max_run_timeout_ms: c.max_run_timeout_ms,
            max_output_bytes: c.max_output_bytes,
            max_log_bytes_per_process: c.max_log_bytes_per_process,
            max_input_bytes_per_request: c.max_input_bytes_per_request,
        }
    }
}

/// `POST /v1/processes`.
#[derive(Debug, Clone, Default, serde::Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct CreateRequest {
    pub command: String,
    #[serde(default)]
    pub args: Vec<String>,
    #[serde(default)]
    pub cwd: Option<String>,
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    #[serde(default)]
    pub tty: bool,
    #[serde(default)]
    pub interactive: bool,
    /// Terminal size for `tty` (default 80×24).
    #[serde(default)]
    pub cols: Option<u16>,
    #[serde(default)]
    pub rows: Option<u16>,
}

impl From<CreateRequest> for svc::CreateRequest {
    fn from(r: CreateRequest) -> Self {
        Self {
            command: r.command,
            args: r.args,
            cwd: r.cwd,
            env: r.env,
            tty: r.tty,
            interactive: r.interactive,
            cols: r.cols,
            rows: r.rows,
        }
    }
}

/// `POST /v1/processes/run`.
#[derive(Debug, Clone, Default, serde::Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct RunRequest {
    pub command: String,
    #[serde(default)]
    pub args: Vec<String>,
    #[serde(default)]
    pub cwd: Option<String>,
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    #[serde(default)]
    pub max_output_bytes: Option<u64>,
    #[serde(default)]
    pub timeout_ms: Option<u64>,
}

impl From<RunRequest> for svc::RunRequest {
    fn from(r: RunRequest) -> Self {
        Self {
            command: r.command,
            args: r.args,
            cwd: r.cwd,
            env: r.env,
            max_output_bytes: r.max_output_bytes,
            timeout_ms: r.timeout_ms,
        }
    }
}

#[derive(Debug, Clone, serde::Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct RunResponse {
    /// `null` when the run timed out or was ended by a signal.
    pub exit_code: Option<i32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub exit_signal: Option<i32>,
    pub timed_out: bool,
    pub stdout: String,
    pub stderr: String,
    pub stdout_truncated: bool,
    pub stderr_truncated: bool,
    pub duration_ms: u64,
}

impl From<svc::RunResponse> for RunResponse {
    fn from(r: svc::RunResponse) -> Self {
        Self {
            exit_code: r.exit_code,
            exit_signal: r.exit_signal,
            timed_out: r.timed_out,
            stdout: r.stdout,
            stderr: r.stderr,
            stdout_truncated: r.stdout_truncated,
            stderr_truncated: r.stderr_truncated,
            duration_ms: r.duration_ms,
        }
    }
}

/// A process record on the wire (`ProcessInfo`), plus our exit details and process figures.
#[derive(Debug, Clone, serde::Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ProcessInfo {
    pub id: String,
    pub command: String,
    pub args: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub cwd: Option<String>,
    pub tty: bool,
    pub interactive: bool,
    /// Always `user` (processes started through this API).
    #[schema(value_type = String, example = "user")]
    pub owner: &'static str,
    /// `running`, or `exited` once the whole tree is gone and its output is in the log.
    #[schema(value_type = String, example = "running")]
    pub status: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub pid: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub exit_code: Option<i32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub exit_signal: Option<i32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub exit_reason: Option<ExitReason>,
    pub created_at_ms: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub exited_at_ms: Option<u64>,
    /// Bytes of output written so far (the offset the next chunk starts at).
    pub log_end: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    pub stats: Option<ProcessStats>,
}

impl From<svc::ProcessInfo> for ProcessInfo {
    fn from(p: svc::ProcessInfo) -> Self {
        Self {
            id: p.id,
            command: p.command,
            args: p.args,
            cwd: p.cwd,
            tty: p.tty,
            interactive: p.interactive,
            owner: p.owner,
            status: p.status,
            pid: p.pid,
            exit_code: p.exit_code,
            exit_signal: p.exit_signal,
            exit_reason: p.exit_reason.map(Into::into),
            created_at_ms: p.created_at_ms,
            exited_at_ms: p.exited_at_ms,
            log_end: p.log_end,
            stats: p.stats.as_ref().map(Into::into),
        }
    }
}
