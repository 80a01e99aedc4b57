//! `POST /v1/fs/upload-batch`: the body (a tar, plain or gzip) is read on the async side in
//! batches, each taken by a short blocking step. For a plain tar that step also extracts the
//! entries the batch completed ([`archive::TarScan`] says how far the bytes hold whole entries),
//! reading them from the batch in memory and, for an entry begun in an earlier batch, from an
//! anonymous spool file (`O_TMPFILE` under `<data-dir>/tmp`) that holds only the bytes not yet
//! extracted. A gzip body, or a plain one beyond the live-extraction cap, is spooled whole and
//! extracted at the end. Entries land in a staging directory, checked one by one on disk with the
//! rules of [`crate::archive`]; once the whole body arrived and was extracted, the tree is moved
//! into the destination. Invariants: no blocking thread waits for the client; nothing appears at
//! the destination before the whole body arrived (only the hidden staging directory, and the
//! destination's missing parents, exist meanwhile); no entry lands outside the destination
//! (absolute, `..`, device nodes, fifos, links leaving it, paths crossing a symlink are
//! refused); a refused, broken or abandoned upload leaves the destination as it was, directories
//! the upload created included (all or nothing); the spool has no name, so nothing of it
//! survives the request, even a crash; memory stays constant whatever the archive size; no walk
//! recurses on the archive's depth.

use std::ffi::{OsStr, OsString};
use std::io::{self, Seek, SeekFrom};
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};

use nix::errno::Errno;
use nix::fcntl::{OFlag, RenameFlags};
use nix::sys::stat::{Mode, SFlag};
use nix::unistd::UnlinkatFlags;

use crate::archive::{self, ArchiveError};

use super::body::{Batch, BatchReader, BodyReader, Worker, pump};
use super::remove::remove_tree;
use super::{
    BodyStream, FileError, FileService, PathPolicy, SandboxPath, UPLOAD_PATHS_SHOWN, UploadOutcome,
    shown,
};

/// How the body is compressed, as the request said; `None` means sniff the gzip magic.
#[derive(Debug, Clone, Copy)]
pub enum Compression {
    Gzip,
    Sniff,
}

#[derive(Debug, Clone, Copy)]
struct Limits {
    bytes: Option<u64>,
    entries: u64,
}

/// The spooled body: an unnamed file, gone when closed. It holds the body's bytes from the
/// first one not yet extracted, at offset 0.
struct Spool {
    file: std::fs::File,
    shown: PathBuf,
    /// Bytes it holds.
    len: u64,
}

impl Spool {
    fn create(dir: &Path, declared: Option<u64>) -> Result<Spool, FileError> {
        let shown = dir.to_path_buf();
        std::fs::create_dir_all(dir).map_err(|e| FileError::from_io("mkdir", &shown, e))?;
        let dfd = nix::fcntl::open(
            dir,
            OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| FileError::from_errno("open", &shown, e))?;
        super::write::check_space(&dfd, declared, &shown)?;
        let file = match nix::fcntl::openat(
            dfd.as_fd(),
            ".",
            OFlag::O_TMPFILE | OFlag::O_RDWR | OFlag::O_CLOEXEC,
            Mode::from_bits_truncate(0o600),
        ) {
            Ok(fd) => std::fs::File::from(fd),
            // Filesystems without O_TMPFILE: a random name, unlinked at once.
            Err(Errno::EOPNOTSUPP | Errno::EISDIR | Errno::EINVAL) => {
                let (temp, file) = super::write::TempEntry::create(
                    &dfd,
                    "spool",
                    Mode::from_bits_truncate(0o600),
                    &shown,
                )?;
                drop(temp);
                file
            }
            Err(e) => return Err(FileError::from_errno("create", &shown, e)),
        };
        Ok(Spool {
            file,
            shown,
            len: 0,
        })
    }

    /// Appends the batch from byte `from` on.
    fn append(&mut self, batch: &Batch, from: usize) -> Result<(), FileError> {
        batch
            .write_from(from, &self.file)
            .map_err(|e| FileError::from_io("write", &self.shown, e))?;
        self.len += batch.len().saturating_sub(from) as u64;
        Ok(())
    }

    /// Empties the spool (its blocks are freed) for the bytes that follow.
    fn clear(&mut self) -> Result<(), FileError> {
        if self.len > 0 {
            self.file
                .set_len(0)
                .and_then(|()| (&self.file).seek(SeekFrom::Start(0)).map(|_| ()))
                .map_err(|e| FileError::from_io("write", &self.shown, e))?;
            self.len = 0;
        }
        Ok(())
    }
}

impl FileService {
    pub async fn upload_batch(
        &self,
        dest: &str,
        body: BodyStream,
        compression: Compression,
        declared: Option<u64>,
    ) -> Result<UploadOutcome, FileError> {
        let _transfer = self.transfers.begin();
        let dest = self.policy.resolve(dest)?;
        let limits = Limits {
            bytes: self.upload_limit,
            entries: self.upload_max_entries,
        };
        if let (Some(limit), Some(n)) = (limits.bytes, declared)
            && n > limit
        {
            return Err(FileError::TooLarge { limit });
        }
        let reader = BodyReader::new(body, &self.transfers, self.upload_limit);
        let spool_dir = self.spool_dir.clone();
        let created = self
            .transfers
            .step(move || Spool::create(&spool_dir, declared))
            .await;
        let spool = match created {
            Ok(s) => s,
            Err(e) => {
                reader.linger().await;
                return Err(e);
            }
        };
        // A gzip body is extracted once complete; a plain one as its entries arrive, while one
        // of the live extractions is free (each holds a few descriptors between its steps).
        let live = match compression {
            Compression::Gzip => None,
            Compression::Sniff => self.live_extractions.try_take(),
        };
        let upload = Upload {
            spool,
            received: 0,
            scan: live.map(|permit| (archive::TarScan::new(), permit)),
            live: None,
            extracted: 0,
            job: Job {
                policy: self.policy.clone(),
                dest,
                compression,
                limits,
            },
        };
        // Spooled (and extracted as far as whole entries arrived) while the next batch arrives
        // (see `body::pump`).
        let upload = pump(
            reader,
            Worker::new(upload),
            &self.transfers,
            |u: &mut Upload, b: &Batch| u.take(b),
        )
        .await?;
        self.transfers.step(move || upload.finish()).await
    }
}

/// The most parent directories of the destination an upload may create and still extract as its
/// body arrives: with them, a live extraction holds at most 15 descriptors between its steps
/// (the spool, the staging directory and its holder, the target, the extraction's root, a
/// merge's two, the created parents).
const LIVE_MAX_CREATED: usize = 8;

/// How many uploads may extract as their body arrives (`Extractions`), from the connection
/// limit: each holds at most 15 descriptors between its steps (`LIVE_MAX_CREATED`).
pub fn live_extractions(max_connections: usize) -> usize {
    (max_connections / 32).clamp(1, 64)
}

/// Permits for extracting while the body arrives. Without one an upload is spooled whole and
/// extracted at the end, which costs time but no descriptor while the client is slow.
pub struct Extractions {
    pub(super) free: std::sync::Arc<std::sync::atomic::AtomicUsize>,
}

pub struct ExtractionPermit(std::sync::Arc<std::sync::atomic::AtomicUsize>);

impl Drop for ExtractionPermit {
    fn drop(&mut self) {
        self.0.fetch_add(1, std::sync::atomic::Ordering::AcqRel);
    }
}

impl Extractions {
    pub fn new(n: usize) -> Self {
        Extractions {
            free: std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(n)),
        }
    }

    fn try_take(&self) -> Option<ExtractionPermit> {
        use std::sync::atomic::Ordering;
        self.free
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1))
            .ok()
            .map(|_| ExtractionPermit(self.free.clone()))
    }
}

/// What the upload extracts, and where.
struct Job {
    policy: std::sync::Arc<PathPolicy>,
    dest: SandboxPath,
    compression: Compression,
    limits: Limits,
}

/// An upload in progress: it travels between the async side and one blocking step at a time.
struct Upload {
    /// The bytes received and not yet extracted.
    spool: Spool,
    /// Bytes received so far.
    received: u64,
    /// While extracting as the body arrives: how far whole entries have arrived.
    scan: Option<(archive::TarScan, ExtractionPermit)>,
    /// The staging directory and the extraction, once the first whole entries arrived (or at
    /// the end).
    live: Option<Live>,
    /// How far the body has been extracted (the spool holds what follows).
    extracted: u64,
    job: Job,
}

struct Live {
    staging: Staging,
    stream: archive::TarStream,
    /// The destination of a merge, for the final symlink check.
    merge_into: Option<OwnedFd>,
}

impl Upload {
    /// One batch. The whole entries it completes are extracted, from the spool (what came
    /// before it) and the batch in memory; only the bytes of an entry not yet complete are
    /// spooled, so an archive of small files is hardly written twice.
    fn take(&mut self, batch: &Batch) -> Result<(), FileError> {
        let start = self.received;
        self.received += batch.len() as u64;
        let Some((scan, _)) = &mut self.scan else {
            return self.spool.append(batch, 0);
        };
        for part in batch.parts() {
            scan.feed(part);
        }
        let ready = scan.ready();
        if ready <= self.extracted {
            return self.spool.append(batch, 0);
        }
        // The scanner moves only to the end of an entry that this batch completed.
        let Some(in_batch) = ready
            .checked_sub(start)
            .and_then(|n| usize::try_from(n).ok())
            .filter(|n| *n > 0 && *n <= batch.len())
        else {
            return Err(FileError::from_io(
                "extract",
                &self.job.dest.abs,
                io::Error::other("the archive scan lost its place"),
            ));
        };
        if self.live.is_none() {
            let started = Live::start(&self.job)?;
            if started.staging.created.len() > LIVE_MAX_CREATED {
                // Each parent the upload made is held open until the end (to remove it again on
                // failure): too many to hold while the client may stall. Undone at once (on
                // this blocking thread); the body is spooled whole and extracted at the end.
                drop(started);
                self.scan = None;
                return self.spool.append(batch, 0);
            }
            self.live = Some(started);
        }
        let piece = io::Read::chain(
            SpoolAt::new(&self.spool.file, 0, self.spool.len),
            BatchReader::new(batch, in_batch),
        );
        live(&mut self.live, &self.job)?
            .stream
            .feed(piece)
            .map_err(|e| from_archive(e, &self.job.dest.abs))?;
        self.extracted = ready;
        self.spool.clear()?;
        self.spool.append(batch, in_batch)
    }

    /// The whole body arrived: the rest is extracted (all of it when nothing was yet), checked
    /// and moved into place.
    fn finish(mut self) -> Result<UploadOutcome, FileError> {
        let rest = SpoolAt::new(&self.spool.file, 0, self.spool.len);
        let dest = self.job.dest.abs.clone();
        let live_now = live(&mut self.live, &self.job)?;
        let fed = if self.extracted > 0 {
            live_now.stream.feed(rest)
        } else {
            let compression = match self.job.compression {
                Compression::Gzip => archive::Compression::Gzip,
                Compression::Sniff => archive::Compression::Sniff,
            };
            let input =
                archive::decompress(rest, compression).map_err(|e| from_archive(e, &dest))?;
            live_now.stream.feed(input)
        };
        fed.map_err(|e| from_archive(e, &dest))?;
        let Some(live) = self.live.take() else {
            return Err(FileError::from_io(
                "extract",
                &dest,
                io::Error::other("no extraction"),
            ));
        };
        live.complete(&self.job.dest)
    }
}

/// The upload's extraction, started (staging directory made) at its first use.
fn live<'a>(live: &'a mut Option<Live>, job: &Job) -> Result<&'a mut Live, FileError> {
    match live {
        Some(l) => Ok(l),
        None => Ok(live.insert(Live::start(job)?)),
    }
}

impl Live {
    fn start(job: &Job) -> Result<Live, FileError> {
        let staging = prepare(&job.policy, &job.dest)?;
        let open = |fd: &OwnedFd| {
            fd.try_clone()
                .map_err(|e| FileError::from_io("open", &job.dest.abs, e))
        };
        type Checked = (Option<OwnedFd>, Option<archive::Guard<'static>>);
        let (merge_into, guard): Checked = match &staging.target {
            Target::Merge(dfd) => {
                let checked = open(dfd)?;
                (
                    Some(open(dfd)?),
                    Some(Box::new(move |rel: &Path, is_dir: bool, entry: &str| {
                        check_destination(&checked, rel, is_dir, entry)
                    })),
                )
            }
            Target::Rename { .. } => (None, None),
        };
        let limits = archive::Limits {
            bytes: job.limits.bytes,
            entries: job.limits.entries,
            listed: UPLOAD_PATHS_SHOWN,
        };
        let stream = archive::TarStream::new(&staging.fd, limits, guard)
            .map_err(|e| from_archive(e, &job.dest.abs))?;
        Ok(Live {
            staging,
            stream,
            merge_into,
        })
    }

    /// The checks that need the whole tree, then the commit.
    fn complete(mut self, dest: &SandboxPath) -> Result<UploadOutcome, FileError> {
        let extracted = self
            .stream
            .finish()
            .map_err(|e| from_archive(e, &dest.abs))?;
        // For a merge, every symlink must also stay beneath the destination it lands in.
        if let Some(dfd) = &self.merge_into {
            for (link, target) in &extracted.symlinks {
                if archive::escapes(dfd, target) {
                    return Err(FileError::UnsafeEntry {
                        entry: link.to_string_lossy().into_owned(),
                        reason: "its symlink target leaves the destination".into(),
                    });
                }
            }
        }
        commit(&mut self.staging, dest)?;
        Ok(UploadOutcome {
            paths: extracted
                .paths
                .iter()
                .map(|p| shown(&dest.abs.join(p)))
                .collect(),
            truncated: extracted.truncated,
        })
    }
}

/// A run of the spool, read with `pread` (the spool's own offset is where batches are written).
struct SpoolAt<'a> {
    file: &'a std::fs::File,
    pos: u64,
    end: u64,
}

impl<'a> SpoolAt<'a> {
    /// The run `pos..end`, read through a buffer of up to 256 KiB (tar reads a header, the
    /// data, the padding: three small reads an entry otherwise).
    fn new(file: &'a std::fs::File, pos: u64, end: u64) -> io::BufReader<Self> {
        let len = usize::try_from(end.saturating_sub(pos)).unwrap_or(usize::MAX);
        io::BufReader::with_capacity(len.clamp(512, 256 * 1024), SpoolAt { file, pos, end })
    }
}

impl io::Read for SpoolAt<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        use std::os::unix::fs::FileExt;
        let left = usize::try_from(self.end.saturating_sub(self.pos)).unwrap_or(usize::MAX);
        let want = buf.len().min(left);
        if want == 0 {
            return Ok(0);
        }
        let n = self.file.read_at(&mut buf[..want], self.pos)?;
        self.pos += n as u64;
        Ok(n)
    }
}

/// Where extraction happens and how it is committed.
struct Staging {
    /// Directory holding the staging directory.
    holder: OwnedFd,
    name: OsString,
    fd: OwnedFd,
    /// The destination when it already exists (merge), else where to rename the staging dir.
    target: Target,
    /// Ancestors of the destination this upload created, as (parent, name) in creation order;
    /// removed again (only while empty) on failure.
    created: Vec<(OwnedFd, OsString)>,
    committed: bool,
    /// Listed for a reload or a stop that cuts the upload (`write::remove_live_temporaries`).
    _live: Option<super::write::Live>,
}

enum Target {
    Merge(OwnedFd),
    Rename { parent: OwnedFd, name: OsString },
}

impl Drop for Staging {
    fn drop(&mut self) {
        let _ = remove_tree(&self.holder, &self.name);
        if !self.committed {
            // rmdir, deepest first: a directory someone else put files in meanwhile stays (and
            // so do its ancestors).
            for (parent, name) in self.created.iter().rev() {
                if nix::unistd::unlinkat(parent.as_fd(), name.as_os_str(), UnlinkatFlags::RemoveDir)
                    .is_err()
                {
                    break;
                }
            }
        }
    }
}

/// A fresh random hidden name for a staging directory (`mkdirat` refuses an existing one).
fn stage_name() -> OsString {
    super::write::random_name("upload")
}

fn prepare(policy: &PathPolicy, dest: &SandboxPath) -> Result<Staging, FileError> {
    let mkstage = |holder: &OwnedFd, name: &OsStr| -> Result<OwnedFd, FileError> {
        nix::sys::stat::mkdirat(holder.as_fd(), name, Mode::from_bits_truncate(0o777))
            .map_err(|e| FileError::from_errno("mkdir", &dest.abs, e))?;
        nix::fcntl::openat(
            holder.as_fd(),
            name,
            archive::DIR | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| FileError::from_errno("open", &dest.abs, e))
    };
    match policy.open(dest, archive::DIR) {
        Ok(dest_fd) => {
            // Merge: stage inside the destination, so every final rename stays on one filesystem.
            let holder = dest_fd
                .try_clone()
                .map_err(|e| FileError::from_io("open", &dest.abs, e))?;
            let name = stage_name();
            let fd = mkstage(&holder, &name)?;
            let _live = super::write::Live::register(&holder, &name);
            Ok(Staging {
                holder,
                name,
                fd,
                target: Target::Merge(dest_fd),
                created: Vec::new(),
                committed: false,
                _live,
            })
        }
        Err(FileError::NotFound { .. }) => {
            let (parent_rel, dname) = dest.split()?;
            // Remember the ancestors this upload creates so a failure removes them again.
            let mut created = Vec::new();
            let parent_abs = dest.abs.parent().unwrap_or(Path::new("/")).to_path_buf();
            let rollback = |created: &[(OwnedFd, OsString)]| {
                for (p, n) in created.iter().rev() {
                    let _ =
                        nix::unistd::unlinkat(p.as_fd(), n.as_os_str(), UnlinkatFlags::RemoveDir);
                }
            };
            let staged = policy
                .create_dirs_tracked(&parent_rel, &parent_abs, &mut created)
                .and_then(|parent| {
                    let holder = parent
                        .try_clone()
                        .map_err(|e| FileError::from_io("open", &dest.abs, e))?;
                    let name = stage_name();
                    let fd = mkstage(&holder, &name)?;
                    Ok((parent, holder, name, fd))
                });
            let (parent, holder, name, fd) = match staged {
                Ok(v) => v,
                Err(e) => {
                    rollback(&created);
                    return Err(e);
                }
            };
            let _live = super::write::Live::register(&holder, &name);
            Ok(Staging {
                holder,
                name,
                fd,
                target: Target::Rename {
                    parent,
                    name: dname,
                },
                created,
                committed: false,
                _live,
            })
        }
        Err(FileError::WrongKind { .. }) => Err(FileError::WrongKind {
            path: dest.abs.clone(),
            expected: "is not a directory",
        }),
        Err(e) => Err(e),
    }
}

/// In merge mode, checks the destination so the final moves cannot fail or escape: no parent
/// of the entry may be a symlink or a non-directory, and kinds must agree at the final name.
fn check_destination(
    dest: &OwnedFd,
    rel: &Path,
    is_dir: bool,
    entry: &str,
) -> Result<(), ArchiveError> {
    let refused = |reason: &str| ArchiveError::Refused {
        entry: entry.to_string(),
        reason: reason.to_string(),
    };
    let conflict = |reason: &str| ArchiveError::Conflict {
        entry: entry.to_string(),
        reason: reason.to_string(),
    };
    let parent = rel.parent().unwrap_or(Path::new(""));
    let name = rel.file_name().unwrap_or_default();
    let pfd = match archive::open_dir_beneath(dest, parent) {
        Ok(fd) => fd,
        Err(Errno::ENOENT) => return Ok(()),
        Err(Errno::ELOOP) | Err(Errno::EXDEV) => {
            return Err(refused("its path crosses a symlink in the destination"));
        }
        Err(Errno::ENOTDIR) => return Err(conflict("a parent exists and is not a directory")),
        Err(e) => {
            return Err(ArchiveError::Io {
                op: "open",
                path: rel.to_path_buf(),
                source: e.into(),
            });
        }
    };
    match archive::lkind(&pfd, name) {
        Ok(SFlag::S_IFDIR) if !is_dir => Err(conflict("a directory exists with this name")),
        Ok(SFlag::S_IFLNK) if is_dir => Err(refused("a symlink exists with this name")),
        Ok(k) if is_dir && k != SFlag::S_IFDIR => Err(conflict("a file exists with this name")),
        _ => Ok(()),
    }
}

/// The archive's refusal as the filesystem service reports it (paths made absolute).
fn from_archive(e: ArchiveError, dest: &Path) -> FileError {
    match e {
        ArchiveError::Malformed(e) => FileError::BadArchive(e),
        ArchiveError::Refused { entry, reason } => FileError::UnsafeEntry { entry, reason },
        ArchiveError::Conflict { entry, reason } => FileError::EntryConflict { entry, reason },
        ArchiveError::TooLarge { limit } => FileError::TooLarge { limit },
        ArchiveError::TooManyEntries { limit } => FileError::TooManyEntries { limit },
        ArchiveError::Io { op, path, source } => FileError::from_io(op, &dest.join(path), source),
    }
}

/// Moves the staged tree into place: one rename when the destination did not exist, else a
/// merge where staged directories that already exist are descended into and everything else is
/// renamed over its destination name.
fn commit(staging: &mut Staging, dest: &SandboxPath) -> Result<(), FileError> {
    match &staging.target {
        Target::Rename { parent, name } => {
            nix::fcntl::renameat2(
                staging.holder.as_fd(),
                staging.name.as_os_str(),
                parent.as_fd(),
                name.as_os_str(),
                RenameFlags::RENAME_NOREPLACE,
            )
            .map_err(|e| FileError::from_errno("rename", &dest.abs, e))?;
        }
        Target::Merge(dfd) => {
            let sfd = staging
                .fd
                .try_clone()
                .map_err(|e| FileError::from_io("open", &dest.abs, e))?;
            merge(&sfd, dfd, &dest.abs, Some(staging.name.as_os_str()))?;
        }
    }
    staging.committed = true;
    Ok(())
}

/// Moves everything in `src` into `dst`, descending into directories that exist on both sides.
/// Iterative, with a stack of paths relative to both roots (re-opened beneath them without
/// following symlinks when their turn comes), so neither the depth nor the width of the archive
/// costs stack frames or open descriptors.
fn merge(
    src_root: &OwnedFd,
    dst_root: &OwnedFd,
    shown_dir: &Path,
    skip: Option<&OsStr>,
) -> Result<(), FileError> {
    let mut stack: Vec<PathBuf> = vec![PathBuf::new()];
    while let Some(rel) = stack.pop() {
        let dir = shown_dir.join(&rel);
        let open = |root: &OwnedFd| {
            archive::open_dir_beneath(root, &rel)
                .map_err(|e| FileError::from_errno("open", &dir, e))
        };
        let (src, dst) = (open(src_root)?, open(dst_root)?);
        let names =
            super::remove::dir_names(&src).map_err(|e| FileError::from_errno("list", &dir, e))?;
        for n in names {
            if rel.as_os_str().is_empty() && Some(n.as_os_str()) == skip {
                continue;
            }
            let here = dir.join(&n);
            let skind =
                archive::lkind(&src, &n).map_err(|e| FileError::from_errno("stat", &here, e))?;
            if skind == SFlag::S_IFDIR && archive::lkind(&dst, &n) == Ok(SFlag::S_IFDIR) {
                stack.push(rel.join(&n));
            } else {
                nix::fcntl::renameat(src.as_fd(), n.as_os_str(), dst.as_fd(), n.as_os_str())
                    .map_err(|e| FileError::from_errno("rename", &here, e))?;
            }
        }
    }
    Ok(())
}
