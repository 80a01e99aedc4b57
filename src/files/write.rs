//! `PUT /v1/fs/file`: the body is read on the async side and each complete batch is written to a
//! temporary file beside the target by a short blocking step; the file is fsynced and renamed
//! over the target only once the whole body arrived. Invariants: on any failure (client gone or
//! stalled, over the limit, full disk) the old file is untouched and the temporary removed; a
//! temporary name is random and created with `O_EXCL`, and only what we created is ever removed;
//! disk space is taken only as data arrives (the declared size is checked against free space,
//! never reserved).

use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::io::Write;
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};

use nix::errno::Errno;
use nix::fcntl::{AtFlags, OFlag};
use nix::sys::stat::{Mode, SFlag};
use nix::unistd::UnlinkatFlags;

use super::body::{Batch, BodyReader, Worker, pump};
use super::{BodyStream, FileError, FileService, WriteOutcome, blocking, shown};

/// How much written data may accumulate before its writeback is started.
const WRITEBACK_STEP: u64 = 8 << 20;
/// Attempts at a fresh random temporary name before giving up (each collision is a name some
/// other party created; it is left alone).
const TEMP_ATTEMPTS: usize = 16;

/// A random hidden name: nobody can plant a file under the name we are about to use.
pub(super) fn random_name(stem: &str) -> OsString {
    // Should the entropy source fail, O_EXCL still protects us (see `sys::random_hex`).
    format!(".sandbox-agent-{stem}-{}", crate::sys::random_hex::<12>()).into()
}

/// Every temporary this process holds in a user's tree (a file being written, an upload's
/// staging directory), by (directory, name): a reload's `execve` and the end of a stop run no
/// destructor, so they remove what is still listed first (`remove_live_temporaries`); a crash
/// cannot, so each is also written down in the temporaries journal (`journal.rs`), which the next
/// start sweeps. A process-wide table because a temporary is made deep inside a transfer's
/// blocking step.
static LIVE: std::sync::Mutex<std::collections::BTreeMap<u64, (OwnedFd, OsString)>> =
    std::sync::Mutex::new(std::collections::BTreeMap::new());
static NEXT_LIVE: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// A temporary's entry in `LIVE`, removed on drop.
pub(super) struct Live(u64);

impl Live {
    pub(super) fn register(dir: &OwnedFd, name: &std::ffi::OsStr) -> Option<Live> {
        let dup = dir.try_clone().ok()?;
        let n = NEXT_LIVE.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        super::journal::added(n, &dup, name);
        crate::sys::lock(&LIVE).insert(n, (dup, name.to_os_string()));
        Some(Live(n))
    }
}

impl Drop for Live {
    fn drop(&mut self) {
        crate::sys::lock(&LIVE).remove(&self.0);
        super::journal::removed(self.0);
    }
}

/// Removes every temporary still being written (a transfer a reload or a stop cut): called just
/// before a reload's exec and at the end of a stop. Returns how many it removed.
pub fn remove_live_temporaries() -> usize {
    let live = std::mem::take(&mut *crate::sys::lock(&LIVE));
    let mut removed = 0;
    for (_, (dir, name)) in live {
        if super::remove::remove_tree(&dir, &name).is_ok() {
            removed += 1;
        }
    }
    removed
}

/// A temporary file this process created in `dir`, removed on drop unless `keep` was called.
/// It exists only after a successful `O_CREAT|O_EXCL`, so a name someone else planted is never
/// removed.
pub(super) struct TempEntry {
    pub dir: OwnedFd,
    pub name: OsString,
    kept: bool,
    live: Option<Live>,
}

impl TempEntry {
    /// Creates a fresh temporary regular file in `dir` (a duplicate of the descriptor is kept).
    pub fn create(
        dir: &OwnedFd,
        stem: &str,
        mode: Mode,
        shown_path: &Path,
    ) -> Result<(TempEntry, File), FileError> {
        let dir = dir
            .try_clone()
            .map_err(|e| FileError::from_io("open", shown_path, e))?;
        for _ in 0..TEMP_ATTEMPTS {
            let name = random_name(stem);
            match nix::fcntl::openat(
                dir.as_fd(),
                name.as_os_str(),
                OFlag::O_CREAT
                    | OFlag::O_EXCL
                    | OFlag::O_RDWR
                    | OFlag::O_CLOEXEC
                    | OFlag::O_NOFOLLOW,
                mode,
            ) {
                Ok(fd) => {
                    let live = Live::register(&dir, &name);
                    return Ok((
                        TempEntry {
                            dir,
                            name,
                            kept: false,
                            live,
                        },
                        File::from(fd),
                    ));
                }
                Err(Errno::EEXIST) => continue,
                Err(e) => return Err(FileError::from_errno("create", shown_path, e)),
            }
        }
        Err(FileError::AlreadyExists {
            path: shown_path.to_path_buf(),
        })
    }

    pub fn keep(mut self) {
        self.kept = true;
        self.live = None;
    }
}

impl Drop for TempEntry {
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

/// Free bytes for an unprivileged writer on the filesystem of `dir`.
pub(super) fn free_bytes(dir: &OwnedFd) -> Option<u64> {
    let st = nix::sys::statvfs::fstatvfs(dir.as_fd()).ok()?;
    Some((st.blocks_available() as u64).saturating_mul(st.fragment_size() as u64))
}

/// Refuses (507) a body that declares more than the filesystem has free.
pub(super) fn check_space(
    dir: &OwnedFd,
    declared: Option<u64>,
    shown_path: &Path,
) -> Result<(), FileError> {
    if let (Some(n), Some(free)) = (declared, free_bytes(dir))
        && n > free
    {
        return Err(FileError::NoSpace {
            path: shown_path.to_path_buf(),
        });
    }
    Ok(())
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

/// One PUT in progress: the temporary file and where it goes. Every method is a short blocking
/// step; the value travels between the async side and the blocking pool.
struct PutFile {
    dir: OwnedFd,
    name: OsString,
    shown: PathBuf,
    temp: TempEntry,
    file: File,
    written: u64,
    flushed: u64,
}

impl PutFile {
    fn create(
        policy: &super::PathPolicy,
        target: &super::SandboxPath,
        declared: Option<u64>,
    ) -> Result<PutFile, FileError> {
        let (dir, name) = policy.open_parent(target, true)?;
        let mode = existing_mode(&dir, &name, &target.abs)?;
        check_space(&dir, declared, &target.abs)?;
        let (temp, file) =
            TempEntry::create(&dir, "write", Mode::from_bits_truncate(0o666), &target.abs)?;
        if let Some(mode) = mode {
            let _ = nix::sys::stat::fchmod(file.as_fd(), mode);
        }
        Ok(PutFile {
            dir,
            name,
            shown: target.abs.clone(),
            temp,
            file,
            written: 0,
            flushed: 0,
        })
    }

    fn write(&mut self, data: &[u8]) -> Result<(), FileError> {
        self.file
            .write_all(data)
            .map_err(|e| FileError::from_io("write", &self.shown, e))?;
        self.wrote(data.len())
    }

    fn write_batch(&mut self, batch: &Batch) -> Result<(), FileError> {
        batch
            .write_to(&self.file)
            .map_err(|e| FileError::from_io("write", &self.shown, e))?;
        self.wrote(batch.len())
    }

    fn wrote(&mut self, n: usize) -> Result<(), FileError> {
        self.written += n as u64;
        // Keep writeback running behind the incoming body instead of leaving a whole file of
        // dirty pages to the final fsync.
        if self.written - self.flushed >= WRITEBACK_STEP {
            let _ = crate::sys::start_writeback(
                self.file.as_fd(),
                self.flushed,
                self.written - self.flushed,
            );
            self.flushed = self.written;
        }
        Ok(())
    }

    fn finish(self) -> Result<u64, FileError> {
        self.file
            .sync_all()
            .map_err(|e| FileError::from_io("fsync", &self.shown, e))?;
        drop(self.file);
        nix::fcntl::renameat(
            self.temp.dir.as_fd(),
            self.temp.name.as_os_str(),
            self.dir.as_fd(),
            self.name.as_os_str(),
        )
        .map_err(|e| FileError::from_errno("rename", &self.shown, e))?;
        self.temp.keep();
        // The rename is durable only once the directory itself is synced.
        let _ = nix::unistd::fsync(self.dir.as_fd());
        Ok(self.written)
    }
}

impl FileService {
    /// Writes `body` to `path` atomically; `declared` is the Content-Length, checked up front
    /// against the upload limit and the free space (507 before any byte of the body is read).
    pub async fn write_file(
        &self,
        path: &str,
        body: BodyStream,
        declared: Option<u64>,
    ) -> Result<WriteOutcome, FileError> {
        let _transfer = self.transfers.begin();
        let target = self.policy.resolve(path)?;
        let limit = self.upload_limit;
        if let (Some(limit), Some(n)) = (limit, declared)
            && n > limit
        {
            return Err(FileError::TooLarge { limit });
        }
        let reader = BodyReader::new(body, &self.transfers, limit);
        let policy = self.policy.clone();
        let abs = target.abs.clone();
        let created = self
            .transfers
            .step(move || PutFile::create(&policy, &target, declared))
            .await;
        let put = match created {
            Ok(p) => Worker::new(p),
            Err(e) => {
                reader.linger().await;
                return Err(e);
            }
        };
        // Each batch is written while the next one arrives; a failed write drops (removes) the
        // temporary, and so does a body that fails, before the answer goes out.
        let p = pump(
            reader,
            put,
            &self.transfers,
            |p: &mut PutFile, b: &Batch| p.write_batch(b),
        )
        .await?;
        let n = self.transfers.step(move || p.finish()).await?;
        Ok(WriteOutcome {
            path: shown(&abs),
            bytes_written: n,
        })
    }
}

impl FileService {
    /// Writes a small buffer atomically (config files); same guarantees as [`Self::write_file`].
    pub async fn write_small(
        &self,
        path: super::SandboxPath,
        data: Vec<u8>,
    ) -> Result<(), FileError> {
        let policy = self.policy.clone();
        blocking(move || {
            let mut put = PutFile::create(&policy, &path, Some(data.len() as u64))?;
            put.write(&data)?;
            put.finish().map(|_| ())
        })
        .await
    }
}
