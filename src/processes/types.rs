//! The process API's requests, settings and records as the service takes and gives them (their
//! wire shapes are `http::wire::processes`).

use std::collections::BTreeMap;

use crate::supervisor::{ExitReason, ProcessStats};

/// The runtime settings (`GET/POST /v1/processes/config`; `http::wire::processes` holds the wire
/// shapes of this module's types).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProcessConfig {
    pub max_concurrent_processes: usize,
    pub default_run_timeout_ms: u64,
    pub max_run_timeout_ms: u64,
    pub max_output_bytes: u64,
    pub max_log_bytes_per_process: u64,
    pub max_input_bytes_per_request: u64,
}

/// A background process to start (`POST /v1/processes`).
#[derive(Debug, Clone, Default)]
pub struct CreateRequest {
    pub command: String,
    pub args: Vec<String>,
    pub cwd: Option<String>,
    pub env: BTreeMap<String, String>,
    pub tty: bool,
    pub interactive: bool,
    /// Terminal size for `tty` (default 80×24).
    pub cols: Option<u16>,
    pub rows: Option<u16>,
}

/// A program to run to completion (`POST /v1/processes/run`).
#[derive(Debug, Clone, Default)]
pub struct RunRequest {
    pub command: String,
    pub args: Vec<String>,
    pub cwd: Option<String>,
    pub env: BTreeMap<String, String>,
    pub max_output_bytes: Option<u64>,
    pub timeout_ms: Option<u64>,
}

/// The result of a run.
#[derive(Debug, Clone)]
pub struct RunResponse {
    /// `None` when the run timed out or was ended by a signal.
    pub exit_code: Option<i32>,
    pub exit_signal: Option<i32>,
    pub timed_out: bool,
    pub stdout: String,
    pub stderr: String,
    pub stdout_truncated: bool,
    pub stderr_truncated: bool,
    pub duration_ms: u64,
}

/// A process record, with our exit details and process figures.
#[derive(Debug, Clone, PartialEq)]
pub struct ProcessInfo {
    pub id: String,
    pub command: String,
    pub args: Vec<String>,
    pub cwd: Option<String>,
    pub tty: bool,
    pub interactive: bool,
    /// Always `user` (processes started through this API).
    pub owner: &'static str,
    /// `running`, or `exited` once the whole tree is gone and its output is in the log.
    pub status: &'static str,
    pub pid: Option<u32>,
    pub exit_code: Option<i32>,
    pub exit_signal: Option<i32>,
    pub exit_reason: Option<ExitReason>,
    pub created_at_ms: u64,
    pub exited_at_ms: Option<u64>,
    /// Bytes of output written so far (the offset the next chunk starts at).
    pub log_end: u64,
    pub stats: Option<ProcessStats>,
}
