//! What the process API refuses or fails with (mapped to problem+json by `http::error`).

use super::INPUT_TIMEOUT;
use crate::supervisor::SpawnError;

#[derive(Debug, thiserror::Error)]
pub enum ProcessError {
    #[error("{0}")]
    Invalid(String),
    #[error("no process {id}")]
    NotFound { id: String },
    #[error("process {id}: {reason}")]
    Conflict { id: String, reason: &'static str },
    #[error("{limit} processes are running already (maxConcurrentProcesses)")]
    TooManyProcesses { limit: usize },
    #[error(
        "the output logs of all processes would exceed {total} bytes (--process-max-total-log-bytes); delete exited processes"
    )]
    LogBudget { total: u64 },
    #[error("{limit} readers follow process {id} already")]
    TooManyReaders { id: String, limit: usize },
    #[error("the input is larger than {limit} bytes (maxInputBytesPerRequest)")]
    InputTooLarge { limit: u64 },
    #[error("process {id} did not take its input within {}s", INPUT_TIMEOUT.as_secs())]
    InputTimeout { id: String },
    #[error("{source}")]
    Spawn {
        command: String,
        #[source]
        source: SpawnError,
    },
    #[error("{0}")]
    Io(String),
    #[error("the daemon is shutting down")]
    ShuttingDown,
    /// A `run` still going when a reload's drain ended: stopped, since its answer cannot
    /// outlive the connection the old image holds.
    #[error(
        "the daemon reloaded while the program ran (it was still running when the reload's \
         drain ended) and it was stopped; run it again"
    )]
    CutByReload { command: String },
}

impl ProcessError {
    /// True when a failed start is the request's fault (no such program or directory, not
    /// executable, not a program, a name too long) rather than the machine's.
    pub fn is_bad_command(&self) -> bool {
        match self {
            ProcessError::Spawn {
                source: SpawnError::Exec { source, .. },
                ..
            } => {
                matches!(
                    source.kind(),
                    std::io::ErrorKind::NotFound | std::io::ErrorKind::PermissionDenied
                ) || source.raw_os_error().is_some_and(|e| {
                    // What the request named cannot be executed: a name or path too long, a
                    // file in the middle of the path, a symlink loop, a file that is not a
                    // program, arguments and environment too large.
                    [
                        libc::ENAMETOOLONG,
                        libc::ENOTDIR,
                        libc::ELOOP,
                        libc::ENOEXEC,
                        libc::E2BIG,
                        libc::EISDIR,
                    ]
                    .contains(&e)
                })
            }
            _ => false,
        }
    }
}
