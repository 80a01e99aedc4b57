//! `POST /v1/fs/upload-batch`: a tar (plain or gzip) is extracted as it arrives into a staging
//! directory, checked entry by entry on disk, then moved into the destination. Invariants: no
//! entry lands outside the destination (absolute, `..`, device nodes, fifos, links leaving it,
//! paths crossing a symlink are refused); a refused or broken archive leaves the destination as
//! it was (all or nothing); memory stays constant whatever the archive size.

use std::ffi::{OsStr, OsString};
use std::io::{self, BufRead, BufReader, Read};
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Component, Path, PathBuf};
use std::time::{Duration, UNIX_EPOCH};

use nix::errno::Errno;
use nix::fcntl::{AtFlags, OFlag, OpenHow, RenameFlags, ResolveFlag, openat2};
use nix::sys::stat::{Mode, SFlag};
use nix::unistd::UnlinkatFlags;
use tokio::sync::mpsc;

use super::body::{self, CHANNEL_CHUNKS, ChannelReader, Chunk, PumpEnd};
use super::entries::remove_tree;
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

struct Limits {
    bytes: Option<u64>,
    entries: u64,
}

impl FileService {
    pub async fn upload_batch(
        &self,
        dest: &str,
        body: BodyStream,
        compression: Compression,
        declared: Option<u64>,
    ) -> Result<UploadOutcome, FileError> {
        let dest = self.policy.resolve(dest)?;
        let limits = Limits {
            bytes: self.upload_limit,
            entries: self.upload_max_entries,
        };
        if let (Some(limit), Some(n)) = (limits.bytes, declared) {
            if n > limit {
                return Err(FileError::TooLarge { limit });
            }
        }
        let (tx, rx) = mpsc::channel::<Chunk>(CHANNEL_CHUNKS);
        let policy = self.policy.clone();
        let extractor = tokio::task::spawn_blocking(move || {
            extract(&policy, &dest, ChannelReader::new(rx), compression, &limits)
        });
        let pumped = body::pump(body, tx, self.upload_limit).await;
        // A panic in the extractor goes on unwinding: the edge answers a plain 500.
        let extracted = extractor
            .await
            .unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic()));
        match pumped {
            Ok(_) | Err(PumpEnd::ReceiverGone) => extracted,
            Err(PumpEnd::Failed(e)) => Err(e),
        }
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
    /// Ancestors of the destination this upload created: an existing directory and the chain
    /// below it, removed again (only while empty) on failure.
    created: Option<(OwnedFd, PathBuf)>,
    committed: bool,
}

enum Target {
    Merge(OwnedFd),
    Rename { parent: OwnedFd, name: OsString },
}

impl Drop for Staging {
    fn drop(&mut self) {
        let _ = remove_tree(&self.holder, &self.name);
        if !self.committed {
            if let Some((dir, chain)) = &self.created {
                // rmdir, deepest first: a directory someone else put files in meanwhile stays.
                let mut p = chain.clone();
                while !p.as_os_str().is_empty()
                    && nix::unistd::unlinkat(dir.as_fd(), &p, UnlinkatFlags::RemoveDir).is_ok()
                {
                    p.pop();
                }
            }
        }
    }
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

const DIR: OFlag = OFlag::O_RDONLY.union(OFlag::O_DIRECTORY);
fn beneath() -> ResolveFlag {
    ResolveFlag::RESOLVE_BENEATH | ResolveFlag::RESOLVE_NO_MAGICLINKS
}
fn beneath_no_symlinks() -> ResolveFlag {
    ResolveFlag::RESOLVE_BENEATH | ResolveFlag::RESOLVE_NO_SYMLINKS
}

/// A fresh hidden name for a staging directory (unique per daemon and upload).
fn stage_name() -> OsString {
    static SEQ: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    format!(
        ".sandbox-agent-upload-{}-{}",
        std::process::id(),
        SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    )
    .into()
}

fn prepare(policy: &PathPolicy, dest: &SandboxPath) -> Result<Staging, FileError> {
    let mkstage = |holder: &OwnedFd, name: &OsStr| -> Result<OwnedFd, FileError> {
        nix::sys::stat::mkdirat(holder.as_fd(), name, Mode::from_bits_truncate(0o777))
            .map_err(|e| FileError::from_errno("mkdir", &dest.abs, e))?;
        nix::fcntl::openat(
            holder.as_fd(),
            name,
            DIR | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| FileError::from_errno("open", &dest.abs, e))
    };
    match policy.open(dest, DIR) {
        Ok(dest_fd) => {
            // Merge: stage inside the destination, so every final rename stays on one filesystem.
            let holder = dest_fd
                .try_clone()
                .map_err(|e| FileError::from_io("open", &dest.abs, e))?;
            let name = stage_name();
            let fd = mkstage(&holder, &name)?;
            Ok(Staging {
                holder,
                name,
                fd,
                target: Target::Merge(dest_fd),
                created: None,
                committed: false,
            })
        }
        Err(FileError::NotFound { .. }) => {
            let (parent_rel, dname) = dest.split()?;
            // Remember the ancestors this upload creates so a failure removes them again.
            let mut created = None;
            let mut prefix = PathBuf::new();
            let comps: Vec<_> = parent_rel.components().collect();
            for (i, c) in comps.iter().enumerate() {
                prefix.push(c.as_os_str());
                if let Err(Errno::ENOENT) = policy.open_rel(&prefix, DIR) {
                    let up = prefix.parent().unwrap_or(Path::new("")).to_path_buf();
                    let fd = policy
                        .open_rel(&up, DIR)
                        .map_err(|e| FileError::from_errno("open", &dest.abs, e))?;
                    let chain: PathBuf = comps[i..].iter().map(|c| c.as_os_str()).collect();
                    created = Some((fd, chain));
                    break;
                }
            }
            let parent_abs = dest.abs.parent().unwrap_or(Path::new("/")).to_path_buf();
            let parent = policy.create_dirs(&parent_rel, &parent_abs)?;
            let holder = parent
                .try_clone()
                .map_err(|e| FileError::from_io("open", &dest.abs, e))?;
            let name = stage_name();
            let fd = mkstage(&holder, &name)?;
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
            })
        }
        Err(FileError::WrongKind { .. }) => Err(FileError::WrongKind {
            path: dest.abs.clone(),
            expected: "is not a directory",
        }),
        Err(e) => Err(e),
    }
}

/// The entry path as normal components only; absolute paths and `..` are refused.
fn entry_path(raw: &Path, shown_name: &str) -> Result<PathBuf, FileError> {
    let mut out = PathBuf::new();
    for c in raw.components() {
        match c {
            Component::Normal(n) => out.push(n),
            Component::CurDir => {}
            Component::RootDir | Component::Prefix(_) => {
                return Err(unsafe_entry(shown_name, "absolute paths are refused"));
            }
            Component::ParentDir => {
                return Err(unsafe_entry(shown_name, "`..` components are refused"));
            }
        }
    }
    Ok(out)
}

fn unsafe_entry(entry: &str, reason: &str) -> FileError {
    FileError::UnsafeEntry {
        entry: entry.to_string(),
        reason: reason.to_string(),
    }
}

fn conflict(entry: &str, reason: &str) -> FileError {
    FileError::EntryConflict {
        entry: entry.to_string(),
        reason: reason.to_string(),
    }
}

/// Checks that a relative symlink target, read from the link's own directory, never climbs
/// above the destination (lexically; the on-disk check follows after extraction).
fn symlink_target_stays(parent: &Path, target: &Path) -> bool {
    let mut depth = parent.components().count() as i64;
    for c in target.components() {
        match c {
            Component::Normal(_) => depth += 1,
            Component::CurDir => {}
            Component::ParentDir => {
                depth -= 1;
                if depth < 0 {
                    return false;
                }
            }
            Component::RootDir | Component::Prefix(_) => return false,
        }
    }
    true
}

fn lkind(dir: &OwnedFd, name: &OsStr) -> nix::Result<SFlag> {
    nix::sys::stat::fstatat(dir.as_fd(), name, AtFlags::AT_SYMLINK_NOFOLLOW)
        .map(|st| SFlag::from_bits_truncate(st.st_mode & SFlag::S_IFMT.bits()))
}

/// Opens (creating as needed) the directory `rel` inside the staging dir, refusing any path
/// that crosses a symlink — including one an earlier entry of this archive created.
fn staging_dir(stage: &OwnedFd, rel: &Path, entry: &str) -> Result<OwnedFd, FileError> {
    let map = |e: Errno| match e {
        Errno::ELOOP | Errno::EXDEV => unsafe_entry(entry, "its path crosses a symlink"),
        Errno::ENOTDIR => conflict(entry, "a parent in the archive is not a directory"),
        e => FileError::from_errno("mkdir", Path::new(entry), e),
    };
    match resolve_at(stage, rel, DIR, beneath_no_symlinks()) {
        Ok(fd) => return Ok(fd),
        Err(Errno::ENOENT) => {}
        Err(e) => return Err(map(e)),
    }
    let mut prefix = PathBuf::new();
    let mut fd = resolve_at(stage, &prefix, DIR, beneath_no_symlinks()).map_err(map)?;
    for c in rel.components() {
        prefix.push(c.as_os_str());
        match nix::sys::stat::mkdirat(fd.as_fd(), c.as_os_str(), Mode::from_bits_truncate(0o755)) {
            Ok(()) | Err(Errno::EEXIST) => {}
            Err(e) => return Err(map(e)),
        }
        fd = resolve_at(stage, &prefix, DIR, beneath_no_symlinks()).map_err(map)?;
    }
    Ok(fd)
}

/// In merge mode, checks the destination so the final moves cannot fail or escape: no parent
/// of the entry may be a symlink or a non-directory, and kinds must agree at the final name.
fn check_destination(
    dest: &OwnedFd,
    rel: &Path,
    is_dir: bool,
    entry: &str,
) -> Result<(), FileError> {
    let parent = rel.parent().unwrap_or(Path::new(""));
    let name = rel.file_name().unwrap_or_default();
    let pfd = match resolve_at(dest, parent, DIR, beneath_no_symlinks()) {
        Ok(fd) => fd,
        Err(Errno::ENOENT) => return Ok(()),
        Err(Errno::ELOOP) | Err(Errno::EXDEV) => {
            return Err(unsafe_entry(
                entry,
                "its path crosses a symlink in the destination",
            ));
        }
        Err(Errno::ENOTDIR) => {
            return Err(conflict(entry, "a parent exists and is not a directory"));
        }
        Err(e) => return Err(FileError::from_errno("open", Path::new(entry), e)),
    };
    match lkind(&pfd, name) {
        Ok(SFlag::S_IFDIR) if !is_dir => Err(conflict(entry, "a directory exists with this name")),
        Ok(SFlag::S_IFLNK) if is_dir => Err(unsafe_entry(entry, "a symlink exists with this name")),
        Ok(k) if is_dir && k != SFlag::S_IFDIR => {
            Err(conflict(entry, "a file exists with this name"))
        }
        _ => Ok(()),
    }
}

/// Makes room for a non-directory entry: an earlier non-directory of the same name is replaced
/// (as `tar -x` does), a directory is a conflict.
fn clear_name(dir: &OwnedFd, name: &OsStr, entry: &str) -> Result<(), FileError> {
    match lkind(dir, name) {
        Ok(SFlag::S_IFDIR) => Err(conflict(
            entry,
            "an earlier entry is a directory with this name",
        )),
        Ok(_) => nix::unistd::unlinkat(dir.as_fd(), name, UnlinkatFlags::NoRemoveDir)
            .map_err(|e| FileError::from_errno("replace", Path::new(entry), e)),
        Err(_) => Ok(()),
    }
}

fn extract(
    policy: &PathPolicy,
    dest: &SandboxPath,
    reader: ChannelReader,
    compression: Compression,
    limits: &Limits,
) -> Result<UploadOutcome, FileError> {
    let mut staging = prepare(policy, dest)?;
    let mut input = BufReader::with_capacity(256 * 1024, reader);
    let gzip = match compression {
        Compression::Gzip => true,
        Compression::Sniff => {
            let head = input.fill_buf().map_err(FileError::Body)?;
            head.starts_with(&[0x1f, 0x8b])
        }
    };
    let stream: Box<dyn Read> = if gzip {
        Box::new(flate2::bufread::MultiGzDecoder::new(input))
    } else {
        Box::new(input)
    };
    let mut archive = tar::Archive::new(stream);
    let mut paths = Vec::new();
    let mut truncated = false;
    let mut count: u64 = 0;
    let mut total: u64 = 0;
    let mut symlinks: Vec<(PathBuf, PathBuf, String)> = Vec::new();
    let mut cached: Option<(PathBuf, OwnedFd)> = None;
    let mut buf = vec![0u8; 256 * 1024];
    let bad = |e: io::Error| {
        // The tar reader wraps errors but keeps their kind; this one is the body's, not the
        // archive's (see `ChannelReader`).
        if e.kind() == io::ErrorKind::ConnectionAborted {
            FileError::Body(e)
        } else {
            FileError::BadArchive(e)
        }
    };
    for entry in archive.entries().map_err(bad)? {
        let mut entry = entry.map_err(bad)?;
        let kind = entry.header().entry_type();
        if kind.is_pax_global_extensions()
            || kind.is_pax_local_extensions()
            || kind.is_gnu_longname()
            || kind.is_gnu_longlink()
        {
            continue;
        }
        count += 1;
        if count > limits.entries {
            return Err(FileError::TooManyEntries {
                limit: limits.entries,
            });
        }
        let raw = entry.path().map_err(bad)?.into_owned();
        let shown_name = raw.to_string_lossy().into_owned();
        let rel = entry_path(&raw, &shown_name)?;
        let Some(name) = rel.file_name().map(|n| n.to_os_string()) else {
            continue; // the archive's own root (`./`)
        };
        let size = entry.size();
        total = total.saturating_add(size);
        if let Some(limit) = limits.bytes {
            if total > limit {
                return Err(FileError::TooLarge { limit });
            }
        }
        let is_dir = kind.is_dir();
        if !(is_dir
            || kind.is_file()
            || kind.is_symlink()
            || kind.is_hard_link()
            || kind == tar::EntryType::Continuous)
        {
            let reason = if kind.is_character_special() || kind.is_block_special() || kind.is_fifo()
            {
                "device nodes and fifos are refused".to_string()
            } else {
                format!("unsupported entry type {:?}", kind)
            };
            return Err(unsafe_entry(&shown_name, &reason));
        }
        if let Target::Merge(dfd) = &staging.target {
            check_destination(dfd, &rel, is_dir, &shown_name)?;
        }
        let parent_rel = rel.parent().unwrap_or(Path::new("")).to_path_buf();
        let pfd = match &cached {
            Some((p, fd)) if *p == parent_rel => fd,
            _ => {
                let fd = staging_dir(&staging.fd, &parent_rel, &shown_name)?;
                cached = Some((parent_rel.clone(), fd));
                &cached.as_ref().expect("just set").1
            }
        };
        let mode = entry.header().mode().unwrap_or(0o644) & 0o777;
        if is_dir {
            match nix::sys::stat::mkdirat(
                pfd.as_fd(),
                name.as_os_str(),
                Mode::from_bits_truncate(mode | 0o700),
            ) {
                Ok(()) => {}
                Err(Errno::EEXIST) => match lkind(pfd, &name) {
                    Ok(SFlag::S_IFDIR) => {}
                    _ => {
                        clear_name(pfd, &name, &shown_name)?;
                        nix::sys::stat::mkdirat(
                            pfd.as_fd(),
                            name.as_os_str(),
                            Mode::from_bits_truncate(mode | 0o700),
                        )
                        .map_err(|e| FileError::from_errno("mkdir", &dest.abs.join(&rel), e))?;
                    }
                },
                Err(e) => return Err(FileError::from_errno("mkdir", &dest.abs.join(&rel), e)),
            }
        } else if kind.is_symlink() {
            let target = entry
                .link_name()
                .map_err(bad)?
                .ok_or_else(|| unsafe_entry(&shown_name, "symlink without a target"))?
                .into_owned();
            if target.is_absolute() {
                return Err(unsafe_entry(
                    &shown_name,
                    "absolute symlink targets are refused",
                ));
            }
            if !symlink_target_stays(&parent_rel, &target) {
                return Err(unsafe_entry(
                    &shown_name,
                    "its symlink target leaves the destination",
                ));
            }
            clear_name(pfd, &name, &shown_name)?;
            nix::unistd::symlinkat(target.as_os_str(), pfd.as_fd(), name.as_os_str())
                .map_err(|e| FileError::from_errno("symlink", &dest.abs.join(&rel), e))?;
            symlinks.push((rel.clone(), parent_rel.join(&target), shown_name.clone()));
        } else if kind.is_hard_link() {
            let target = entry
                .link_name()
                .map_err(bad)?
                .ok_or_else(|| unsafe_entry(&shown_name, "hard link without a target"))?
                .into_owned();
            let trel = entry_path(&target, &shown_name).map_err(|_| {
                unsafe_entry(&shown_name, "its hard link target leaves the destination")
            })?;
            let tparent = trel.parent().unwrap_or(Path::new(""));
            let tname = trel
                .file_name()
                .ok_or_else(|| unsafe_entry(&shown_name, "empty hard link target"))?;
            let tfd =
                resolve_at(&staging.fd, tparent, DIR, beneath_no_symlinks()).map_err(|_| {
                    unsafe_entry(
                        &shown_name,
                        "its hard link target is not an earlier entry of the archive",
                    )
                })?;
            match lkind(&tfd, tname) {
                // A hard link to a symlink would re-read its relative target from a new directory.
                Ok(SFlag::S_IFDIR) | Ok(SFlag::S_IFLNK) | Err(_) => {
                    return Err(unsafe_entry(
                        &shown_name,
                        "its hard link target is not an earlier file of the archive",
                    ));
                }
                Ok(_) => {}
            }
            clear_name(pfd, &name, &shown_name)?;
            nix::unistd::linkat(
                tfd.as_fd(),
                tname,
                pfd.as_fd(),
                name.as_os_str(),
                AtFlags::empty(),
            )
            .map_err(|e| FileError::from_errno("link", &dest.abs.join(&rel), e))?;
        } else {
            clear_name(pfd, &name, &shown_name)?;
            let fd = nix::fcntl::openat(
                pfd.as_fd(),
                name.as_os_str(),
                OFlag::O_CREAT
                    | OFlag::O_EXCL
                    | OFlag::O_WRONLY
                    | OFlag::O_NOFOLLOW
                    | OFlag::O_CLOEXEC,
                Mode::from_bits_truncate(mode),
            )
            .map_err(|e| FileError::from_errno("create", &dest.abs.join(&rel), e))?;
            let mut file = std::fs::File::from(fd);
            copy(&mut entry, &mut file, &mut buf).map_err(|e| match e {
                CopyError::Read(e) => bad(e),
                CopyError::Write(e) => FileError::from_io("write", &dest.abs.join(&rel), e),
            })?;
            if let Ok(t) = entry.header().mtime() {
                let _ = file.set_modified(UNIX_EPOCH + Duration::from_secs(t));
            }
        }
        if paths.len() < UPLOAD_PATHS_SHOWN {
            paths.push(shown(&dest.abs.join(&rel)));
        } else {
            truncated = true;
        }
    }
    drop(cached);
    // On-disk check of every symlink now that the whole tree exists: resolution beneath the
    // staging dir (and beneath the destination, for a merge) must not leave it.
    for (link, target, shown_name) in &symlinks {
        let escapes = |r: nix::Result<OwnedFd>| matches!(r, Err(Errno::EXDEV) | Err(Errno::ELOOP));
        let mut bad_link = escapes(resolve_at(&staging.fd, link, OFlag::O_PATH, beneath()));
        if let Target::Merge(dfd) = &staging.target {
            bad_link |= escapes(resolve_at(dfd, target, OFlag::O_PATH, beneath()));
        }
        if bad_link {
            return Err(unsafe_entry(
                shown_name,
                "its symlink target leaves the destination",
            ));
        }
    }
    commit(&mut staging, dest)?;
    Ok(UploadOutcome { paths, truncated })
}

enum CopyError {
    Read(io::Error),
    Write(io::Error),
}

fn copy(r: &mut impl Read, w: &mut std::fs::File, buf: &mut [u8]) -> Result<u64, CopyError> {
    use std::io::Write;
    let mut n = 0u64;
    loop {
        let got = match r.read(buf) {
            Ok(0) => return Ok(n),
            Ok(k) => k,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(CopyError::Read(e)),
        };
        w.write_all(&buf[..got]).map_err(CopyError::Write)?;
        n += got as u64;
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

fn merge(
    src: &OwnedFd,
    dst: &OwnedFd,
    shown_dir: &Path,
    skip: Option<&OsStr>,
) -> Result<(), FileError> {
    let names =
        super::entries::dir_names(src).map_err(|e| FileError::from_errno("list", shown_dir, e))?;
    for n in names {
        if Some(n.as_os_str()) == skip {
            continue;
        }
        let here = shown_dir.join(&n);
        let skind = lkind(src, &n).map_err(|e| FileError::from_errno("stat", &here, e))?;
        if skind == SFlag::S_IFDIR && lkind(dst, &n) == Ok(SFlag::S_IFDIR) {
            let open = |d: &OwnedFd| {
                nix::fcntl::openat(
                    d.as_fd(),
                    n.as_os_str(),
                    DIR | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
                    Mode::empty(),
                )
                .map_err(|e| FileError::from_errno("open", &here, e))
            };
            merge(&open(src)?, &open(dst)?, &here, None)?;
        } else {
            nix::fcntl::renameat(src.as_fd(), n.as_os_str(), dst.as_fd(), n.as_os_str())
                .map_err(|e| FileError::from_errno("rename", &here, e))?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(parent: &str, target: &str, expected: bool) {
        assert_eq!(
            symlink_target_stays(Path::new(parent), Path::new(target)),
            expected,
            "{parent} -> {target}"
        );
    }

    fn check_entry(raw: &str, expected: Result<&str, &str>) {
        let got = entry_path(Path::new(raw), raw).map_err(|e| e.to_string());
        match (got, expected) {
            (Ok(p), Ok(e)) => assert_eq!(p, Path::new(e), "{raw}"),
            (Err(m), Err(e)) => assert!(m.contains(e), "{raw}: {m}"),
            (got, expected) => panic!("{raw}: got {got:?}, expected {expected:?}"),
        }
    }

    #[test]
    fn entry_paths_keep_only_normal_components() {
        check_entry("a/b", Ok("a/b"));
        check_entry("./a/./b/", Ok("a/b"));
        check_entry("./", Ok(""));
        check_entry("/etc/passwd", Err("absolute"));
        check_entry("a/../../x", Err("`..`"));
        check_entry("..", Err("`..`"));
    }

    #[test]
    fn symlink_targets_are_checked_from_the_link_directory() {
        check("", "a", true);
        check("", "../a", false);
        check("d", "../a", true);
        check("d", "../../a", false);
        check("d/e", "../../x/../y", true);
        check("d", "./../..", false);
        check("", "/etc", false);
    }
}
