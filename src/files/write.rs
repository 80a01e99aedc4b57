//! `PUT /v1/fs/file`: the body streams into a temporary file beside the target, which is fsynced
//! and renamed over the target only once the whole body arrived. Invariant: on any failure
//! (client gone, over the limit, full disk) the old file is untouched and the temporary removed.

use std::ffi::{OsStr, OsString};
use std::io::Write;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering};

use nix::errno::Errno;
use nix::fcntl::{AtFlags, OFlag};
use nix::sys::stat::{Mode, SFlag};
use nix::unistd::UnlinkatFlags;
use tokio::sync::mpsc;

use super::body::{self, CHANNEL_CHUNKS, Chunk, PumpEnd};
use super::{BodyStream, FileError, FileService, WriteOutcome, blocking, shown};

/// How much written data may accumulate before its writeback is started.
const WRITEBACK_STEP: u64 = 8 << 20;

/// A temporary name in `dir`, removed on drop unless `keep` was called.
pub(super) struct TempEntry<'a> {
    pub dir: &'a OwnedFd,
    pub name: OsString,
    kept: bool,
}

impl<'a> TempEntry<'a> {
    pub fn new(dir: &'a OwnedFd, stem: &str) -> Self {
        static SEQ: AtomicU64 = AtomicU64::new(0);
        let name = format!(
            ".sandbox-agent-{stem}-{}-{}",
            std::process::id(),
            SEQ.fetch_add(1, Ordering::Relaxed)
        );
        TempEntry {
            dir,
            name: name.into(),
            kept: false,
        }
    }

    pub fn keep(mut self) {
        self.kept = true;
    }
}

impl Drop for TempEntry<'_> {
    fn drop(&mut self) {
        if !self.kept {
            let _ = nix::unistd::unlinkat(
                self.dir.as_fd(),
                self.name.as_os_str(),
                UnlinkatFlags::NoRemoveDir,
            );
        }
    }
}

/// The permission bits of an existing regular file, so a rewrite keeps them (executables stay
/// executable). setuid/setgid/sticky are dropped: new content must not inherit a privilege.
fn existing_mode(
    dir: &OwnedFd,
    name: &OsStr,
    shown_path: &std::path::Path,
) -> Result<Option<Mode>, FileError> {
    match nix::sys::stat::fstatat(dir.as_fd(), name, AtFlags::AT_SYMLINK_NOFOLLOW) {
        Ok(st) => {
            let kind = SFlag::from_bits_truncate(st.st_mode & SFlag::S_IFMT.bits());
            if kind == SFlag::S_IFDIR {
                return Err(FileError::WrongKind {
                    path: shown_path.to_path_buf(),
                    expected: "is a directory",
                });
            }
            if kind == SFlag::S_IFREG {
                Ok(Some(Mode::from_bits_truncate(st.st_mode & 0o777)))
            } else {
                Ok(None)
            }
        }
        Err(Errno::ENOENT) => Ok(None),
        Err(e) => Err(FileError::from_errno("stat", shown_path, e)),
    }
}

impl FileService {
    /// Writes `body` to `path` atomically; `declared` is the Content-Length, checked up front.
    pub async fn write_file(
        &self,
        path: &str,
        body: BodyStream,
        declared: Option<u64>,
    ) -> Result<WriteOutcome, FileError> {
        let target = self.policy.resolve(path)?;
        let limit = self.upload_limit;
        if let (Some(limit), Some(n)) = (limit, declared) {
            if n > limit {
                return Err(FileError::TooLarge { limit });
            }
        }
        let (tx, rx) = mpsc::channel::<Chunk>(CHANNEL_CHUNKS);
        let policy = self.policy.clone();
        let abs = target.abs.clone();
        let writer =
            tokio::task::spawn_blocking(move || write_blocking(&policy, &target, rx, declared));
        let pumped = body::pump(body, tx, limit).await;
        // A panic in the writer goes on unwinding: the edge answers a plain 500.
        let written = writer
            .await
            .unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic()));
        match pumped {
            // The writer's answer (success, or why it stopped reading) is the truth.
            Ok(_) | Err(PumpEnd::ReceiverGone) => written.map(|n| WriteOutcome {
                path: shown(&abs),
                bytes_written: n,
            }),
            // The body failed or exceeded the limit: the writer saw no `End` and removed its
            // temporary file; report the body's problem.
            Err(PumpEnd::Failed(e)) => Err(e),
        }
    }
}

fn write_blocking(
    policy: &super::PathPolicy,
    target: &super::SandboxPath,
    rx: mpsc::Receiver<Chunk>,
    declared: Option<u64>,
) -> Result<u64, FileError> {
    let (dir, name) = policy.open_parent(target, true)?;
    let mode = existing_mode(&dir, &name, &target.abs)?;
    let temp = TempEntry::new(&dir, "write");
    let fd = nix::fcntl::openat(
        dir.as_fd(),
        temp.name.as_os_str(),
        OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_WRONLY | OFlag::O_CLOEXEC | OFlag::O_NOFOLLOW,
        Mode::from_bits_truncate(0o666),
    )
    .map_err(|e| FileError::from_errno("create", &target.abs, e))?;
    let mut file = std::fs::File::from(fd);
    if let Some(mode) = mode {
        let _ = nix::sys::stat::fchmod(file.as_fd(), mode);
    }
    // Reserve the declared size up front: a body that cannot fit is refused (507) before it is
    // received, and the blocks are allocated in one go. KEEP_SIZE leaves the length to the data.
    // Filesystems without fallocate (EOPNOTSUPP) simply allocate as the data arrives.
    if let Some(len) = declared.filter(|&l| l > 0) {
        let reserved = nix::fcntl::fallocate(
            file.as_fd(),
            nix::fcntl::FallocateFlags::FALLOC_FL_KEEP_SIZE,
            0,
            len.min(i64::MAX as u64) as i64,
        );
        if let Err(e @ (Errno::ENOSPC | Errno::EDQUOT | Errno::EFBIG)) = reserved {
            return Err(FileError::from_errno("allocate", &target.abs, e));
        }
    }
    let mut rx = rx;
    let mut n: u64 = 0;
    let mut flushed: u64 = 0;
    loop {
        match rx.blocking_recv() {
            Some(Chunk::Data(b)) => {
                file.write_all(&b)
                    .map_err(|e| FileError::from_io("write", &target.abs, e))?;
                n += b.len() as u64;
                // Keep writeback running behind the incoming body instead of leaving a whole
                // file of dirty pages to the final fsync.
                if n - flushed >= WRITEBACK_STEP {
                    let _ = crate::sys::start_writeback(file.as_fd(), flushed, n - flushed);
                    flushed = n;
                }
            }
            Some(Chunk::End) => break,
            // The request ended without its body: drop the temporary, keep the old file.
            None => {
                return Err(FileError::Body(std::io::Error::other(
                    "the request body ended early",
                )));
            }
        }
    }
    file.sync_all()
        .map_err(|e| FileError::from_io("fsync", &target.abs, e))?;
    drop(file);
    nix::fcntl::renameat(
        dir.as_fd(),
        temp.name.as_os_str(),
        dir.as_fd(),
        name.as_os_str(),
    )
    .map_err(|e| FileError::from_errno("rename", &target.abs, e))?;
    temp.keep();
    // The rename is durable only once the directory itself is synced.
    let _ = nix::unistd::fsync(dir.as_fd());
    Ok(n)
}

impl FileService {
    /// Writes a small buffer atomically (config files); same guarantees as [`Self::write_file`].
    pub async fn write_small(
        &self,
        path: super::SandboxPath,
        data: Vec<u8>,
    ) -> Result<(), FileError> {
        let policy = self.policy.clone();
        let len = data.len() as u64;
        blocking(move || {
            let (tx, rx) = mpsc::channel::<Chunk>(2);
            tx.try_send(Chunk::Data(data.into()))
                .and_then(|_| tx.try_send(Chunk::End))
                .map_err(|_| FileError::Invalid {
                    reason: "internal channel full".into(),
                })?;
            drop(tx);
            write_blocking(&policy, &path, rx, Some(len)).map(|_| ())
        })
        .await
    }
}
