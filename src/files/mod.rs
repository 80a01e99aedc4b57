//! The host filesystem service behind /v1/fs (no HTTP here). Invariants: every path goes through
//! [`PathPolicy`] (work-dir anchoring, fs-root confinement by the kernel); blocking file work runs
//! on the blocking pool; a write or an upload is visible completely or not at all.

mod body;
mod entries;
pub mod journal;
mod path;
mod read;
mod remove;
#[cfg(test)]
mod tests;
mod upload;
pub mod watch;
mod write;

use std::io;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use nix::errno::Errno;

use crate::config::Config;
use body::Transfers;
pub use body::{BodyStream, rate_deadline};
pub use path::{PathPolicy, SandboxPath};
pub use read::{OpenedFile, stream_range};
pub use remove::remove_dir_all;
pub use upload::Compression;
pub use write::remove_live_temporaries;

/// Everything the filesystem endpoints can fail with; `http/error.rs` maps it to a status.
#[derive(Debug, thiserror::Error)]
pub enum FileError {
    #[error("{}: no such file or directory", path.display())]
    NotFound { path: PathBuf },
    #[error("{}: outside the filesystem root", path.display())]
    OutsideRoot { path: PathBuf },
    #[error("{}: permission denied", path.display())]
    PermissionDenied { path: PathBuf },
    #[error("{}: {expected}", path.display())]
    WrongKind {
        path: PathBuf,
        expected: &'static str,
    },
    #[error("{}: already exists", path.display())]
    AlreadyExists { path: PathBuf },
    #[error("{}: directory is not empty", path.display())]
    NotEmpty { path: PathBuf },
    #[error("{reason}")]
    Invalid { reason: String },
    #[error("the body is larger than the limit of {limit} bytes")]
    TooLarge { limit: u64 },
    #[error("the archive has more than the limit of {limit} entries")]
    TooManyEntries { limit: u64 },
    #[error("archive entry {entry:?} refused: {reason}")]
    UnsafeEntry { entry: String, reason: String },
    #[error("archive entry {entry:?} conflicts with the destination: {reason}")]
    EntryConflict { entry: String, reason: String },
    #[error("the archive is malformed: {0}")]
    BadArchive(#[source] io::Error),
    #[error("{}: no space left on device", path.display())]
    NoSpace { path: PathBuf },
    #[error("range not satisfiable for a file of {size} bytes")]
    RangeNotSatisfiable { size: u64 },
    #[error("reading the request body failed: {0}")]
    Body(#[source] io::Error),
    #[error("the client sent nothing for {}", humantime::format_duration(*idle))]
    Stalled { idle: std::time::Duration },
    #[error(
        "the body arrived slower than the minimum of {min_rate} bytes per second \
         (--body-min-rate, after a grace of --transfer-timeout)"
    )]
    TooSlow { min_rate: u64 },
    #[error("unsupported content type {got:?}; expected one of {expected}")]
    UnsupportedMediaType { got: String, expected: &'static str },
    #[error("{op} {}: {source}", path.display())]
    Io {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

impl FileError {
    /// Maps a system error on `path` to the variant a client can act on.
    pub fn from_errno(op: &'static str, path: &Path, e: Errno) -> Self {
        let path = path.to_path_buf();
        match e {
            Errno::ENOENT => FileError::NotFound { path },
            Errno::EXDEV if op == "open" => FileError::OutsideRoot { path },
            Errno::EACCES | Errno::EPERM => FileError::PermissionDenied { path },
            Errno::ENOTDIR => FileError::WrongKind {
                path,
                expected: "not a directory",
            },
            Errno::EISDIR => FileError::WrongKind {
                path,
                expected: "is a directory",
            },
            Errno::EEXIST => FileError::AlreadyExists { path },
            Errno::ENOTEMPTY => FileError::NotEmpty { path },
            Errno::ENOSPC | Errno::EDQUOT | Errno::EFBIG => FileError::NoSpace { path },
            Errno::ENAMETOOLONG | Errno::ELOOP | Errno::EINVAL => FileError::Invalid {
                reason: format!("{}: {}", path.display(), e.desc()),
            },
            e => FileError::Io {
                op,
                path,
                source: io::Error::from(e),
            },
        }
    }

    pub fn from_io(op: &'static str, path: &Path, e: io::Error) -> Self {
        match e.raw_os_error() {
            Some(n) => Self::from_errno(op, path, Errno::from_raw(n)),
            None => FileError::Io {
                op,
                path: path.to_path_buf(),
                source: e,
            },
        }
    }
}

/// Whether an entry is a file or a directory (`http::wire::files` holds the wire shapes of this
/// module's answers).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EntryType {
    File,
    Directory,
}

/// One entry of a directory listing.
#[derive(Debug, Clone)]
pub struct FsEntry {
    pub name: String,
    pub path: String,
    pub entry_type: EntryType,
    pub size: u64,
    /// RFC 3339, when the file system has it.
    pub modified: Option<String>,
}

/// What a path is.
#[derive(Debug, Clone)]
pub struct FsStat {
    pub path: String,
    pub entry_type: EntryType,
    pub size: u64,
    /// RFC 3339, when the file system has it.
    pub modified: Option<String>,
}

/// A written file.
#[derive(Debug, Clone)]
pub struct WriteOutcome {
    pub path: String,
    pub bytes_written: u64,
}

/// An extracted archive: the first [`UPLOAD_PATHS_SHOWN`] paths.
#[derive(Debug, Clone)]
pub struct UploadOutcome {
    pub paths: Vec<String>,
    pub truncated: bool,
}

/// How many extracted paths an upload answer lists.
pub const UPLOAD_PATHS_SHOWN: usize = 1024;

fn rfc3339(t: io::Result<SystemTime>) -> Option<String> {
    t.ok()
        .map(|t| humantime::format_rfc3339_seconds(t).to_string())
}

fn shown(p: &Path) -> String {
    p.to_string_lossy().into_owned()
}

/// A blocking step that did not finish. A panic goes on unwinding here, so that the edge answers
/// a plain 500 (a JoinError's text would tell the client "task N panicked with …"); a cancelled
/// step (runtime shutting down) is an error without internals.
pub(crate) fn internal(e: tokio::task::JoinError) -> FileError {
    if e.is_panic() {
        std::panic::resume_unwind(e.into_panic());
    }
    tracing::warn!(error = %e, "a blocking file operation was cancelled");
    FileError::Io {
        op: "internal error in",
        path: PathBuf::from("a file operation"),
        source: io::Error::other("cancelled"),
    }
}

/// Runs blocking filesystem work on the blocking pool (never on a reactor thread).
async fn blocking<T, F>(f: F) -> Result<T, FileError>
where
    F: FnOnce() -> Result<T, FileError> + Send + 'static,
    T: Send + 'static,
{
    tokio::task::spawn_blocking(f)
        .await
        .unwrap_or_else(|e| Err(internal(e)))
}

pub struct FileService {
    policy: std::sync::Arc<PathPolicy>,
    upload_limit: Option<u64>,
    upload_max_entries: u64,
    transfers: Transfers,
    /// Where upload-batch bodies are spooled (as unnamed files) before extraction.
    spool_dir: PathBuf,
    /// upload-batch: the uploads that may extract as their body arrives.
    live_extractions: upload::Extractions,
    /// `GET /v1/fs/watch`: the live change feeds.
    pub watches: watch::WatchService,
}

impl FileService {
    /// Opens the filesystem root once; failing here means the configured root vanished.
    pub fn new(config: &Config) -> io::Result<Self> {
        let policy = std::sync::Arc::new(PathPolicy::new(
            config.work_dir.clone(),
            config.fs_root.clone(),
        )?);
        Ok(FileService {
            watches: watch::WatchService::new(
                policy.clone(),
                config.max_watches,
                config.watch_max_dirs,
                config.watch_queue,
                config.transfer_timeout,
            ),
            policy,
            upload_limit: config.upload_limit,
            upload_max_entries: config.upload_max_entries,
            transfers: Transfers::new(
                config.transfer_max,
                config.transfer_timeout,
                config.body_min_rate,
            ),
            spool_dir: config.data_dir.join("tmp"),
            live_extractions: upload::Extractions::new(upload::live_extractions(
                config.max_connections,
            )),
        })
    }

    pub fn policy(&self) -> &std::sync::Arc<PathPolicy> {
        &self.policy
    }
}
