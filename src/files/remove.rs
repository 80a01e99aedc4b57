//! Recursive removal beneath a directory descriptor, never following a symlink and never
//! recursing on the tree's depth, and the directory listing it walks with: the one way the
//! file service, the upload staging, the temporaries and the journal's sweep delete a tree.

use std::ffi::{OsStr, OsString};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;

use nix::errno::Errno;
use nix::fcntl::{AtFlags, OFlag};
use nix::sys::stat::{FileStat, Mode, SFlag};
use nix::unistd::UnlinkatFlags;

pub(super) fn kind(st: &FileStat) -> SFlag {
    SFlag::from_bits_truncate(st.st_mode & SFlag::S_IFMT.bits())
}

pub(super) fn lstat_at(dir: &OwnedFd, name: &OsStr) -> nix::Result<FileStat> {
    nix::sys::stat::fstatat(dir.as_fd(), name, AtFlags::AT_SYMLINK_NOFOLLOW)
}

/// Removes `name` in `dir` and, for a directory, everything beneath it, without following any
/// symlink. Iterative, holding two descriptors at most, whatever the depth (a tree 15,000 levels
/// deep must neither overflow the stack nor exhaust descriptors): it descends with `O_NOFOLLOW`
/// and climbs back through `..`, checking that `..` is still the directory it came from (same
/// device and inode), so a tree moved meanwhile stops the removal instead of redirecting it.
pub(super) fn remove_tree(dir: &OwnedFd, name: &OsStr) -> nix::Result<()> {
    let st = lstat_at(dir, name)?;
    if kind(&st) != SFlag::S_IFDIR {
        return nix::unistd::unlinkat(dir.as_fd(), name, UnlinkatFlags::NoRemoveDir);
    }
    let open_dir = |at: &OwnedFd, n: &OsStr| {
        nix::fcntl::openat(
            at.as_fd(),
            n,
            OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            Mode::empty(),
        )
    };
    let id = |fd: &OwnedFd| nix::sys::stat::fstat(fd.as_fd()).map(|s| (s.st_dev, s.st_ino));
    // Unlinks what is not a directory in `d`; returns its subdirectories, still to do.
    let clear = |d: &OwnedFd| -> nix::Result<Vec<OsString>> {
        let mut dirs = Vec::new();
        for n in dir_names(d)? {
            let Ok(cst) = lstat_at(d, &n) else {
                continue; // removed meanwhile
            };
            if kind(&cst) == SFlag::S_IFDIR {
                dirs.push(n);
                continue;
            }
            match nix::unistd::unlinkat(d.as_fd(), n.as_os_str(), UnlinkatFlags::NoRemoveDir) {
                Ok(()) | Err(Errno::ENOENT) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(dirs)
    };
    let mut cur = open_dir(dir, name)?;
    if id(&cur)? != (st.st_dev, st.st_ino) {
        return Err(Errno::ESTALE);
    }
    // One frame per directory we are inside: its name in its parent, the parent's identity and
    // the subdirectories still to remove.
    let mut stack: Vec<(OsString, (u64, u64), Vec<OsString>)> =
        vec![(name.to_os_string(), id(dir)?, clear(&cur)?)];
    loop {
        let Some((_, _, todo)) = stack.last_mut() else {
            return Ok(());
        };
        if let Some(n) = todo.pop() {
            let next = match open_dir(&cur, &n) {
                Ok(fd) => fd,
                Err(Errno::ENOENT) => continue,
                Err(e) => return Err(e),
            };
            let frame = (n, id(&cur)?, clear(&next)?);
            stack.push(frame);
            cur = next;
            continue;
        }
        // `cur` is empty: climb to its parent and remove it there.
        let Some((n, parent_id, _)) = stack.pop() else {
            return Ok(());
        };
        if stack.is_empty() {
            return nix::unistd::unlinkat(dir.as_fd(), n.as_os_str(), UnlinkatFlags::RemoveDir);
        }
        let parent = open_dir(&cur, OsStr::new(".."))?;
        if id(&parent)? != parent_id {
            return Err(Errno::ESTALE);
        }
        nix::unistd::unlinkat(parent.as_fd(), n.as_os_str(), UnlinkatFlags::RemoveDir)?;
        cur = parent;
    }
}

/// Removes the tree at `path` (a path the daemon itself chose, e.g. an installer's staging
/// directory) with [`remove_tree`]: iterative, never following a symlink.
pub fn remove_dir_all(path: &std::path::Path) -> std::io::Result<()> {
    let parent = path.parent().unwrap_or(std::path::Path::new("/"));
    let name = path
        .file_name()
        .ok_or_else(|| std::io::Error::other("no name to remove"))?;
    let dir = nix::fcntl::open(
        parent,
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
        Mode::empty(),
    )?;
    Ok(remove_tree(&dir, name)?)
}

/// The names in a directory (without `.` and `..`), read through a fresh descriptor so that the
/// read always starts at the beginning.
pub(super) fn dir_names(dir: &OwnedFd) -> nix::Result<Vec<OsString>> {
    let fresh = nix::fcntl::openat(
        dir.as_fd(),
        ".",
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
        Mode::empty(),
    )?;
    let mut d = nix::dir::Dir::from_fd(fresh)?;
    let mut out = Vec::new();
    for e in d.iter() {
        let e = e?;
        let n = e.file_name().to_bytes();
        if n != b"." && n != b".." {
            out.push(OsStr::from_bytes(n).to_os_string());
        }
    }
    Ok(out)
}
