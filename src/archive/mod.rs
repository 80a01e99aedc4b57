//! Reading untrusted archives (tar, plain/gzip/bzip2, and zip) into an empty directory, with one
//! set of safety rules for every caller (`files::upload`, `agents::install`). Knows nothing of
//! HTTP or agents. Invariants: nothing is written outside the root directory — absolute paths,
//! `..`, device nodes, fifos and other special types are refused, every parent is opened beneath
//! the root without following any symlink (an entry is never written through a link), a symlink
//! whose target climbs out (lexically, and then on disk through chains of links, by the kernel
//! with `RESOLVE_BENEATH`) is refused, and a hard link may only name a regular file extracted
//! earlier; the declared and the really written sizes are bounded; no arithmetic or slicing on
//! header values can panic; no walk recurses on the archive's depth.

use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::io::{self, BufRead, BufReader, Read, Seek, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStringExt;
use std::path::{Component, Path, PathBuf};
use std::time::{Duration, UNIX_EPOCH};

use nix::errno::Errno;
use nix::fcntl::{AtFlags, OFlag, OpenHow, ResolveFlag, openat2};
use nix::sys::stat::{Mode, SFlag};
use nix::unistd::UnlinkatFlags;

mod scan;
#[cfg(test)]
mod tests;

pub use scan::TarScan;

/// Everything extraction can fail with.
#[derive(Debug, thiserror::Error)]
pub enum ArchiveError {
    #[error("the archive is malformed: {0}")]
    Malformed(#[source] io::Error),
    /// An entry that would leave the root or is of a refused kind. The message always says
    /// "refused".
    #[error("archive entry {entry:?} refused: {reason}")]
    Refused { entry: String, reason: String },
    /// An entry that clashes with an earlier one or with the destination.
    #[error("archive entry {entry:?} conflicts with the destination: {reason}")]
    Conflict { entry: String, reason: String },
    #[error("refused: the archive unpacks to more than the limit of {limit} bytes")]
    TooLarge { limit: u64 },
    #[error("refused: the archive has more than the limit of {limit} entries")]
    TooManyEntries { limit: u64 },
    /// A system error while writing `path` (relative to the root).
    #[error("{op} {}: {source}", path.display())]
    Io {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

fn refused(entry: &str, reason: &str) -> ArchiveError {
    ArchiveError::Refused {
        entry: entry.to_string(),
        reason: reason.to_string(),
    }
}

fn conflict(entry: &str, reason: &str) -> ArchiveError {
    ArchiveError::Conflict {
        entry: entry.to_string(),
        reason: reason.to_string(),
    }
}

fn io_err(op: &'static str, path: &Path, e: impl Into<io::Error>) -> ArchiveError {
    ArchiveError::Io {
        op,
        path: path.to_path_buf(),
        source: e.into(),
    }
}

/// How a tar stream is compressed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Compression {
    None,
    Gzip,
    Bzip2,
    /// From the magic bytes (gzip `1f 8b`, bzip2 `BZh`), else none.
    Sniff,
}

/// Bounds of one extraction.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Total bytes the entries may unpack to (`None`: unbounded).
    pub bytes: Option<u64>,
    pub entries: u64,
    /// How many entry paths the report lists.
    pub listed: usize,
}

/// What was extracted, relative to the root.
#[derive(Debug, Default)]
pub struct Extracted {
    /// The first `Limits::listed` entries, in archive order.
    pub paths: Vec<PathBuf>,
    pub truncated: bool,
    /// Every symlink: its path and its target joined to the link's directory (lexical).
    pub symlinks: Vec<(PathBuf, PathBuf)>,
}

/// A check of each entry against a destination the caller will move the tree into: called
/// before the entry is written, with its relative path and whether it is a directory.
pub type Guard<'a> = Box<dyn FnMut(&Path, bool, &str) -> Result<(), ArchiveError> + Send + 'a>;

/// The entry path as normal components only (`./` dropped); absolute paths and `..` are refused.
/// The empty path is the archive's own root.
pub fn entry_path(raw: &Path, shown: &str) -> Result<PathBuf, ArchiveError> {
    let mut out = PathBuf::new();
    for c in raw.components() {
        match c {
            Component::Normal(n) => out.push(n),
            Component::CurDir => {}
            Component::RootDir | Component::Prefix(_) => {
                return Err(refused(shown, "absolute paths are refused"));
            }
            Component::ParentDir => {
                return Err(refused(shown, "`..` components are refused"));
            }
        }
    }
    Ok(out)
}

/// Whether a relative symlink target, read from the link's own directory `parent`, stays beneath
/// the root (lexically; the on-disk check follows after extraction).
pub fn link_target_stays(parent: &Path, target: &Path) -> bool {
    let mut depth: u64 = parent.components().count() as u64;
    for c in target.components() {
        match c {
            Component::Normal(_) => depth = depth.saturating_add(1),
            Component::CurDir => {}
            Component::ParentDir => match depth.checked_sub(1) {
                Some(d) => depth = d,
                None => return false,
            },
            Component::RootDir | Component::Prefix(_) => return false,
        }
    }
    true
}

fn resolve_at(
    dir: &OwnedFd,
    rel: &Path,
    flags: OFlag,
    resolve: ResolveFlag,
) -> nix::Result<OwnedFd> {
    let rel = if rel.as_os_str().is_empty() {
        Path::new(".")
    } else {
        rel
    };
    openat2(
        dir.as_fd(),
        rel,
        OpenHow::new()
            .flags(flags | OFlag::O_CLOEXEC)
            .resolve(resolve),
    )
}

pub const DIR: OFlag = OFlag::O_RDONLY.union(OFlag::O_DIRECTORY);

pub fn beneath() -> ResolveFlag {
    ResolveFlag::RESOLVE_BENEATH | ResolveFlag::RESOLVE_NO_MAGICLINKS
}

pub fn beneath_no_symlinks() -> ResolveFlag {
    ResolveFlag::RESOLVE_BENEATH | ResolveFlag::RESOLVE_NO_SYMLINKS
}

/// Opens `rel` beneath `root` without following any symlink on the way.
pub fn open_dir_beneath(root: &OwnedFd, rel: &Path) -> nix::Result<OwnedFd> {
    resolve_at(root, rel, DIR, beneath_no_symlinks())
}

/// Whether resolving `rel` beneath `root`, following symlinks, leaves it (the kernel decides).
pub fn escapes(root: &OwnedFd, rel: &Path) -> bool {
    matches!(
        resolve_at(root, rel, OFlag::O_PATH, beneath()),
        Err(Errno::EXDEV) | Err(Errno::ELOOP)
    )
}

pub fn lkind(dir: &OwnedFd, name: &OsStr) -> nix::Result<SFlag> {
    nix::sys::stat::fstatat(dir.as_fd(), name, AtFlags::AT_SYMLINK_NOFOLLOW)
        .map(|st| SFlag::from_bits_truncate(st.st_mode & SFlag::S_IFMT.bits()))
}

/// The kinds of entry extraction knows.
enum Kind {
    Dir,
    File,
    Symlink(PathBuf),
    HardLink(PathBuf),
}

/// The copy buffer of a file entry's data (made at the first file).
const COPY_BUF: usize = 256 * 1024;

/// Writes entries beneath the root, one at a time.
struct Writer<'g> {
    root: OwnedFd,
    limits: Limits,
    guard: Option<Guard<'g>>,
    count: u64,
    /// Bytes unpacked so far (declared sizes for tar, which reads exactly those; written bytes
    /// for zip, whose declared sizes may lie).
    total: u64,
    cached: Option<(PathBuf, OwnedFd)>,
    buf: Vec<u8>,
    /// The process's umask: a file is created with the archive's bits, and `fchmod`ed only when
    /// the umask took some of them away.
    umask: u32,
    out: Extracted,
}

impl<'g> Writer<'g> {
    fn new(root: &OwnedFd, limits: Limits, guard: Option<Guard<'g>>) -> Result<Self, ArchiveError> {
        Ok(Writer {
            root: root
                .try_clone()
                .map_err(|e| io_err("open", Path::new("."), e))?,
            limits,
            guard,
            count: 0,
            total: 0,
            cached: None,
            buf: Vec::new(),
            umask: current_umask(),
            out: Extracted::default(),
        })
    }

    fn count_entry(&mut self) -> Result<(), ArchiveError> {
        self.count = self.count.saturating_add(1);
        if self.count > self.limits.entries {
            return Err(ArchiveError::TooManyEntries {
                limit: self.limits.entries,
            });
        }
        Ok(())
    }

    fn add_bytes(&mut self, n: u64) -> Result<(), ArchiveError> {
        self.total = self.total.saturating_add(n);
        match self.limits.bytes {
            Some(limit) if self.total > limit => Err(ArchiveError::TooLarge { limit }),
            _ => Ok(()),
        }
    }

    /// Bytes an entry may still write before the total passes the limit.
    fn budget(&self) -> u64 {
        self.limits
            .bytes
            .map_or(u64::MAX, |l| l.saturating_sub(self.total))
    }

    /// Opens (creating as needed) the directory `rel`, refusing any path that crosses a symlink
    /// — including one an earlier entry of this archive created.
    fn parent_dir(&mut self, rel: &Path, entry: &str) -> Result<&OwnedFd, ArchiveError> {
        if !matches!(&self.cached, Some((p, _)) if p == rel) {
            let fd = make_dirs(&self.root, rel, entry)?;
            self.cached = Some((rel.to_path_buf(), fd));
        }
        match &self.cached {
            Some((_, fd)) => Ok(fd),
            None => Err(io_err("open", rel, io::Error::other("no directory"))),
        }
    }

    /// Writes one entry; `data` is read for files only, at most `budget` bytes of it.
    fn entry(
        &mut self,
        raw: &Path,
        kind: Kind,
        (mode, mtime): (u32, Option<u64>),
        data: &mut dyn Read,
        budget: u64,
    ) -> Result<(), ArchiveError> {
        let shown = raw.to_string_lossy().into_owned();
        let rel = entry_path(raw, &shown)?;
        let Some(name) = rel.file_name().map(OsStr::to_os_string) else {
            return Ok(()); // the archive's own root (`./`)
        };
        let is_dir = matches!(kind, Kind::Dir);
        if let Some(guard) = self.guard.as_mut() {
            guard(&rel, is_dir, &shown)?;
        }
        let parent_rel = rel.parent().unwrap_or(Path::new("")).to_path_buf();
        // Only the permission bits: no setuid/setgid/sticky from an archive.
        let perm = Mode::from_bits_truncate(mode & 0o777);
        match kind {
            Kind::Dir => {
                let pfd = self.parent_dir(&parent_rel, &shown)?;
                let dmode = perm | Mode::S_IRWXU;
                match nix::sys::stat::mkdirat(pfd.as_fd(), name.as_os_str(), dmode) {
                    Ok(()) => {}
                    Err(Errno::EEXIST) if lkind(pfd, &name) == Ok(SFlag::S_IFDIR) => {}
                    Err(Errno::EEXIST) => {
                        clear_name(pfd, &name, &shown)?;
                        nix::sys::stat::mkdirat(pfd.as_fd(), name.as_os_str(), dmode)
                            .map_err(|e| io_err("mkdir", &rel, e))?;
                    }
                    Err(e) => return Err(io_err("mkdir", &rel, e)),
                }
            }
            Kind::Symlink(target) => {
                if target.as_os_str().is_empty() {
                    return Err(refused(&shown, "symlink without a target"));
                }
                if target.is_absolute() {
                    return Err(refused(&shown, "absolute symlink targets are refused"));
                }
                if !link_target_stays(&parent_rel, &target) {
                    return Err(refused(&shown, "its symlink target leaves the destination"));
                }
                let pfd = self.parent_dir(&parent_rel, &shown)?;
                replacing(pfd, &name, &shown, || {
                    nix::unistd::symlinkat(target.as_os_str(), pfd.as_fd(), name.as_os_str())
                })?
                .map_err(|e| io_err("symlink", &rel, e))?;
                self.out
                    .symlinks
                    .push((rel.clone(), parent_rel.join(&target)));
            }
            Kind::HardLink(target) => {
                let trel = entry_path(&target, &shown)
                    .map_err(|_| refused(&shown, "its hard link target leaves the destination"))?;
                let tparent = trel.parent().unwrap_or(Path::new(""));
                let tname = trel
                    .file_name()
                    .ok_or_else(|| refused(&shown, "empty hard link target"))?;
                let not_earlier = || {
                    refused(
                        &shown,
                        "its hard link target is not an earlier file of the archive",
                    )
                };
                let tfd = open_dir_beneath(&self.root, tparent).map_err(|_| not_earlier())?;
                // A hard link to a symlink would re-read its relative target from a new place.
                if lkind(&tfd, tname) != Ok(SFlag::S_IFREG) {
                    return Err(not_earlier());
                }
                let pfd = self.parent_dir(&parent_rel, &shown)?;
                replacing(pfd, &name, &shown, || {
                    nix::unistd::linkat(
                        tfd.as_fd(),
                        tname,
                        pfd.as_fd(),
                        name.as_os_str(),
                        AtFlags::empty(),
                    )
                })?
                .map_err(|e| io_err("link", &rel, e))?;
            }
            Kind::File => {
                let umask = self.umask;
                let pfd = self.parent_dir(&parent_rel, &shown)?;
                let fd = replacing(pfd, &name, &shown, || {
                    nix::fcntl::openat(
                        pfd.as_fd(),
                        name.as_os_str(),
                        OFlag::O_CREAT
                            | OFlag::O_EXCL
                            | OFlag::O_WRONLY
                            | OFlag::O_NOFOLLOW
                            | OFlag::O_CLOEXEC,
                        perm,
                    )
                })?
                .map_err(|e| io_err("create", &rel, e))?;
                let mut file = File::from(fd);
                if self.buf.is_empty() {
                    self.buf = vec![0u8; COPY_BUF];
                }
                let written = copy(data, &mut file, &mut self.buf, budget, &rel)?;
                if written > budget {
                    return Err(ArchiveError::TooLarge {
                        limit: self.limits.bytes.unwrap_or(u64::MAX),
                    });
                }
                // The archive's bits as they are: set again only where the umask filtered some.
                if perm.bits() & umask != 0 {
                    let _ = nix::sys::stat::fchmod(file.as_fd(), perm);
                }
                // A header's mtime is input: a huge (base-256) value must not overflow.
                if let Some(t) = mtime.and_then(|t| UNIX_EPOCH.checked_add(Duration::from_secs(t)))
                {
                    let _ = file.set_modified(t);
                }
            }
        }
        if self.out.paths.len() < self.limits.listed {
            self.out.paths.push(rel);
        } else {
            self.out.truncated = true;
        }
        Ok(())
    }

    /// The on-disk check of every symlink once the whole tree exists: resolving it beneath the
    /// root, through any chain of links, must not leave the root.
    fn finish(self) -> Result<Extracted, ArchiveError> {
        drop(self.cached);
        for (link, _) in &self.out.symlinks {
            if escapes(&self.root, link) {
                return Err(refused(
                    &link.to_string_lossy(),
                    "its symlink target leaves the destination",
                ));
            }
        }
        Ok(self.out)
    }
}

/// `mkdir -p` of `rel` beneath `root`, one component at a time, never through a symlink.
fn make_dirs(root: &OwnedFd, rel: &Path, entry: &str) -> Result<OwnedFd, ArchiveError> {
    let map = |e: Errno| match e {
        Errno::ELOOP | Errno::EXDEV => refused(entry, "its path crosses a symlink"),
        Errno::ENOTDIR => conflict(entry, "a parent in the archive is not a directory"),
        e => io_err("mkdir", rel, e),
    };
    match open_dir_beneath(root, rel) {
        Ok(fd) => return Ok(fd),
        Err(Errno::ENOENT) => {}
        Err(e) => return Err(map(e)),
    }
    let mut prefix = PathBuf::new();
    let mut fd = open_dir_beneath(root, &prefix).map_err(map)?;
    for c in rel.components() {
        prefix.push(c.as_os_str());
        match nix::sys::stat::mkdirat(fd.as_fd(), c.as_os_str(), Mode::from_bits_truncate(0o755)) {
            Ok(()) | Err(Errno::EEXIST) => {}
            Err(e) => return Err(map(e)),
        }
        fd = open_dir_beneath(root, &prefix).map_err(map)?;
    }
    Ok(fd)
}

/// Creates an entry with `create`; when the name is taken, makes room first: an earlier
/// non-directory of the same name is replaced (as `tar -x` does), a directory is a conflict. A
/// fresh name (the usual case) costs no lookup beyond the create itself.
fn replacing<T>(
    dir: &OwnedFd,
    name: &OsStr,
    entry: &str,
    mut create: impl FnMut() -> nix::Result<T>,
) -> Result<nix::Result<T>, ArchiveError> {
    match create() {
        Err(Errno::EEXIST) => {
            clear_name(dir, name, entry)?;
            Ok(create())
        }
        r => Ok(r),
    }
}

/// Removes an earlier non-directory named `name`; a directory is a conflict.
fn clear_name(dir: &OwnedFd, name: &OsStr, entry: &str) -> Result<(), ArchiveError> {
    match lkind(dir, name) {
        Ok(SFlag::S_IFDIR) => Err(conflict(
            entry,
            "an earlier entry is a directory with this name",
        )),
        Ok(_) => nix::unistd::unlinkat(dir.as_fd(), name, UnlinkatFlags::NoRemoveDir)
            .map_err(|e| io_err("replace", Path::new(entry), e)),
        Err(_) => Ok(()),
    }
}

/// The process's umask, from `/proc/self/status` (reading it with `umask(2)` would change it
/// for every thread for a moment); all bits when it cannot be read, so that every file is
/// `fchmod`ed as before.
fn current_umask() -> u32 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("Umask:"))
                .and_then(|v| u32::from_str_radix(v.trim(), 8).ok())
        })
        .unwrap_or(0o777)
}

/// Copies at most `budget + 1` bytes (one more shows the budget was passed).
fn copy(
    r: &mut dyn Read,
    w: &mut File,
    buf: &mut [u8],
    budget: u64,
    rel: &Path,
) -> Result<u64, ArchiveError> {
    let mut n = 0u64;
    loop {
        let room = budget.saturating_sub(n).saturating_add(1);
        let want = buf.len().min(usize::try_from(room).unwrap_or(usize::MAX));
        let got = match r.read(&mut buf[..want]) {
            Ok(0) => return Ok(n),
            Ok(k) => k,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(ArchiveError::Malformed(e)),
        };
        w.write_all(&buf[..got])
            .map_err(|e| io_err("write", rel, e))?;
        n = n.saturating_add(got as u64);
        if n > budget {
            return Ok(n);
        }
    }
}

/// The decompressed stream of a tar archive.
pub fn decompress<'a>(
    input: impl Read + 'a,
    compression: Compression,
) -> Result<Box<dyn Read + 'a>, ArchiveError> {
    let mut input = BufReader::with_capacity(256 * 1024, input);
    let compression = match compression {
        Compression::Sniff => {
            let head = input.fill_buf().map_err(ArchiveError::Malformed)?;
            if head.starts_with(&[0x1f, 0x8b]) {
                Compression::Gzip
            } else if head.starts_with(b"BZh") {
                Compression::Bzip2
            } else {
                Compression::None
            }
        }
        c => c,
    };
    Ok(match compression {
        Compression::Gzip => Box::new(flate2::bufread::MultiGzDecoder::new(input)),
        Compression::Bzip2 => Box::new(bzip2::bufread::MultiBzDecoder::new(input)),
        _ => Box::new(input),
    })
}

/// Extracts a tar stream into the (empty) directory `root`.
pub fn extract_tar(
    input: impl Read,
    compression: Compression,
    root: &OwnedFd,
    limits: Limits,
    guard: Option<Guard<'_>>,
) -> Result<Extracted, ArchiveError> {
    let mut w = Writer::new(root, limits, guard)?;
    tar_entries(&mut w, decompress(input, compression)?)?;
    w.finish()
}

/// A plain tar archive extracted in pieces, as its bytes arrive: each [`TarStream::feed`] is
/// given a run of whole entries (as [`TarScan`] finds them), the last one the rest of the
/// archive. Limits, the guard and the checks are those of [`extract_tar`], across the pieces.
pub struct TarStream {
    w: Writer<'static>,
}

impl TarStream {
    pub fn new(
        root: &OwnedFd,
        limits: Limits,
        guard: Option<Guard<'static>>,
    ) -> Result<Self, ArchiveError> {
        Ok(TarStream {
            w: Writer::new(root, limits, guard)?,
        })
    }

    /// Extracts the entries of `input`, which starts at an entry's header (an end of input
    /// where a header would start ends the piece, not the archive).
    pub fn feed(&mut self, input: impl Read) -> Result<(), ArchiveError> {
        tar_entries(&mut self.w, input)?;
        // Between pieces nothing is held but descriptors: the copy buffer is made again.
        self.w.buf = Vec::new();
        self.w.cached = None;
        Ok(())
    }

    pub fn finish(self) -> Result<Extracted, ArchiveError> {
        self.w.finish()
    }
}

/// Every entry of a (decompressed) tar stream, written by `w`.
fn tar_entries(w: &mut Writer<'_>, input: impl Read) -> Result<(), ArchiveError> {
    let mut archive = tar::Archive::new(Forward::new(input));
    let bad = ArchiveError::Malformed;
    for entry in archive.entries_with_seek().map_err(bad)? {
        let mut entry = entry.map_err(bad)?;
        let header_kind = entry.header().entry_type();
        if header_kind.is_pax_global_extensions()
            || header_kind.is_pax_local_extensions()
            || header_kind.is_gnu_longname()
            || header_kind.is_gnu_longlink()
        {
            continue;
        }
        w.count_entry()?;
        let raw = entry.path().map_err(bad)?.into_owned();
        let shown = raw.to_string_lossy().into_owned();
        // The header's size is exactly what tar reads for this entry.
        w.add_bytes(entry.size())?;
        let link = || -> Result<PathBuf, ArchiveError> {
            Ok(entry
                .link_name()
                .map_err(bad)?
                .map(|l| l.into_owned())
                .unwrap_or_default())
        };
        let kind = if header_kind.is_dir() {
            Kind::Dir
        } else if header_kind.is_file() || header_kind == tar::EntryType::Continuous {
            Kind::File
        } else if header_kind.is_symlink() {
            Kind::Symlink(link()?)
        } else if header_kind.is_hard_link() {
            Kind::HardLink(link()?)
        } else if header_kind.is_character_special()
            || header_kind.is_block_special()
            || header_kind.is_fifo()
        {
            return Err(refused(&shown, "device nodes and fifos are refused"));
        } else {
            return Err(refused(
                &shown,
                &format!("unsupported entry type {header_kind:?}"),
            ));
        };
        let mode = entry.header().mode().unwrap_or(0o644);
        let mtime = entry.header().mtime().ok();
        // Its declared size was counted above and tar reads exactly that much.
        w.entry(&raw, kind, (mode, mtime), &mut entry, u64::MAX)?;
    }
    Ok(())
}

/// A stream that "seeks" forward only, by reading into one scratch buffer. `tar` skips each
/// entry's padding (and any data the caller did not read) by seeking when it can; without a
/// seekable stream it zeroes a fresh 32 KiB buffer per entry to read the skipped bytes into,
/// which was a few percent of an upload of many small files.
struct Forward<R> {
    inner: R,
    pos: u64,
    scratch: Vec<u8>,
}

impl<R: Read> Forward<R> {
    fn new(inner: R) -> Self {
        Forward {
            inner,
            pos: 0,
            scratch: vec![0; 4096],
        }
    }
}

impl<R: Read> Read for Forward<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.pos = self.pos.saturating_add(n as u64);
        Ok(n)
    }
}

impl<R: Read> Seek for Forward<R> {
    fn seek(&mut self, to: io::SeekFrom) -> io::Result<u64> {
        let mut left = match to {
            io::SeekFrom::Current(n) => u64::try_from(n).ok(),
            io::SeekFrom::Start(n) => n.checked_sub(self.pos),
            io::SeekFrom::End(_) => None,
        }
        .ok_or_else(|| io::Error::new(io::ErrorKind::Unsupported, "only forward seeks"))?;
        while left > 0 {
            let want = self
                .scratch
                .len()
                .min(usize::try_from(left).unwrap_or(usize::MAX));
            let n = match self.inner.read(&mut self.scratch[..want]) {
                Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            };
            self.pos = self.pos.saturating_add(n as u64);
            left -= n as u64;
        }
        Ok(self.pos)
    }
}

/// Zip symlinks keep their target as the entry's data; longer targets are refused.
const MAX_LINK_TARGET: u64 = 4096;
const S_IFMT: u32 = 0o170_000;
const S_IFREG: u32 = 0o100_000;
const S_IFDIR: u32 = 0o040_000;
const S_IFLNK: u32 = 0o120_000;

/// Extracts a zip archive (read in place: its index is at the end) into the (empty) directory
/// `root`. Sizes are counted from what is really written, not from what the archive declares.
pub fn extract_zip<R: Read + Seek>(
    input: R,
    root: &OwnedFd,
    limits: Limits,
    guard: Option<Guard<'_>>,
) -> Result<Extracted, ArchiveError> {
    let zip_err = |e: zip::result::ZipError| ArchiveError::Malformed(io::Error::other(e));
    let mut archive = zip::ZipArchive::new(BufReader::new(input)).map_err(zip_err)?;
    let mut w = Writer::new(root, limits, guard)?;
    for i in 0..archive.len() {
        let mut entry = archive.by_index(i).map_err(zip_err)?;
        w.count_entry()?;
        let name = entry.name().to_string();
        let raw = PathBuf::from(&name);
        let mode = entry.unix_mode();
        let kind = match mode.map(|m| m & S_IFMT) {
            Some(S_IFLNK) => {
                let mut link = Vec::new();
                (&mut entry)
                    .take(MAX_LINK_TARGET + 1)
                    .read_to_end(&mut link)
                    .map_err(ArchiveError::Malformed)?;
                if link.is_empty() || link.len() as u64 > MAX_LINK_TARGET {
                    return Err(refused(&name, "its symlink target is empty or oversized"));
                }
                Kind::Symlink(PathBuf::from(OsString::from_vec(link)))
            }
            Some(S_IFDIR) => Kind::Dir,
            // Archives made without unix attributes carry no type: the trailing `/` decides.
            None | Some(0) | Some(S_IFREG) if entry.is_dir() => Kind::Dir,
            None | Some(0) | Some(S_IFREG) => Kind::File,
            Some(_) => {
                return Err(refused(
                    &name,
                    "device nodes, fifos and other special files are refused",
                ));
            }
        };
        let perm = mode.map(|m| m & 0o777).filter(|m| *m != 0).unwrap_or(0o644);
        // What is really written counts, within what is left of the limit. An entry is cut one
        // byte past the size the archive's index declares for it: a deflate stream that goes on
        // inflating beyond that (a bomb behind a small declared size) is refused there, after
        // at most its declared size was written, instead of being written whole.
        let declared = entry.size();
        let budget = w.budget();
        let mut capped = (&mut entry).take(declared.saturating_add(1));
        let mut counted = Counting {
            inner: &mut capped,
            n: 0,
        };
        w.entry(&raw, kind, (perm, None), &mut counted, budget)?;
        let n = counted.n;
        if n > declared {
            return Err(refused(
                &name,
                &format!("it inflates to more than the {declared} bytes the archive declares"),
            ));
        }
        w.add_bytes(n)?;
    }
    w.finish()
}

/// Counts the bytes read through it (zip entries' real sizes).
struct Counting<'a> {
    inner: &'a mut dyn Read,
    n: u64,
}

impl Read for Counting<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let k = self.inner.read(buf)?;
        self.n = self.n.saturating_add(k as u64);
        Ok(k)
    }
}
