//! Directory entries: list, stat, mkdir, move and delete, each on descriptors obtained beneath the
//! root. Invariant: a final-component symlink is acted on as a link (deleted, moved), never
//! followed out of the root; recursive removal never follows symlinks.

use std::ffi::OsStr;
use std::os::fd::{AsFd, OwnedFd};

use nix::errno::Errno;
use nix::fcntl::{OFlag, RenameFlags};
use nix::sys::stat::{FileStat, Mode, SFlag};
use nix::unistd::UnlinkatFlags;

use super::{EntryType, FileError, FileService, FsEntry, FsStat, blocking, rfc3339, shown};

use super::remove::{dir_names, kind, lstat_at, remove_tree};

fn mtime(st: &FileStat) -> Option<String> {
    let t = std::time::UNIX_EPOCH.checked_add(std::time::Duration::new(
        st.st_mtime.max(0) as u64,
        st.st_mtime_nsec as u32,
    ));
    rfc3339(t.ok_or_else(|| std::io::Error::other("mtime")))
}

/// Moves a regular file to another filesystem with the guarantees of a PUT: copied into a
/// temporary beside the destination, fsynced, renamed into place, then the source unlinked.
fn copy_across(
    (sdir, sname, ddir, dname): (&OwnedFd, &OsStr, &OwnedFd, &OsStr),
    sst: &FileStat,
    flags: RenameFlags,
    from: &std::path::Path,
    to: &std::path::Path,
) -> Result<(), FileError> {
    let src = nix::fcntl::openat(
        sdir.as_fd(),
        sname,
        OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| FileError::from_errno("open", from, e))?;
    let mut src = std::fs::File::from(src);
    let (temp, mut out) = super::write::TempEntry::create(
        ddir,
        "move",
        Mode::from_bits_truncate(sst.st_mode & 0o7777),
        to,
    )?;
    std::io::copy(&mut src, &mut out).map_err(|e| FileError::from_io("copy", to, e))?;
    if let Ok(m) = src.metadata().and_then(|m| m.modified()) {
        let _ = out.set_modified(m);
    }
    out.sync_all()
        .map_err(|e| FileError::from_io("fsync", to, e))?;
    drop(out);
    nix::fcntl::renameat2(
        ddir.as_fd(),
        temp.name.as_os_str(),
        ddir.as_fd(),
        dname,
        flags,
    )
    .map_err(|e| FileError::from_errno("move", to, e))?;
    temp.keep();
    let _ = nix::unistd::fsync(ddir.as_fd());
    nix::unistd::unlinkat(sdir.as_fd(), sname, UnlinkatFlags::NoRemoveDir)
        .map_err(|e| FileError::from_errno("remove", from, e))
}

impl FileService {
    /// Lists a directory (sorted by name). A symlink is described by what it points to when that
    /// stays beneath the root, else as the link itself.
    pub async fn list(&self, path: &str) -> Result<Vec<FsEntry>, FileError> {
        let p = self.policy.resolve(path)?;
        let policy = self.policy.clone();
        blocking(move || {
            let dir = policy.open(&p, OFlag::O_RDONLY | OFlag::O_DIRECTORY)?;
            let names = dir_names(&dir).map_err(|e| FileError::from_errno("list", &p.abs, e))?;
            let mut out = Vec::with_capacity(names.len());
            for name in names {
                let Ok(mut st) = lstat_at(&dir, &name) else {
                    continue; // removed meanwhile
                };
                if kind(&st) == SFlag::S_IFLNK {
                    let child = p.join(&name);
                    if let Ok(fd) = policy.open(&child, OFlag::O_PATH)
                        && let Ok(t) = nix::sys::stat::fstat(fd.as_fd())
                    {
                        st = t;
                    }
                }
                out.push(FsEntry {
                    name: name.to_string_lossy().into_owned(),
                    path: shown(&p.abs.join(&name)),
                    entry_type: if kind(&st) == SFlag::S_IFDIR {
                        EntryType::Directory
                    } else {
                        EntryType::File
                    },
                    size: st.st_size.max(0) as u64,
                    modified: mtime(&st),
                });
            }
            out.sort_by(|a, b| a.name.cmp(&b.name));
            Ok(out)
        })
        .await
    }

    pub async fn stat(&self, path: &str) -> Result<FsStat, FileError> {
        let p = self.policy.resolve(path)?;
        let policy = self.policy.clone();
        blocking(move || {
            let fd = policy.open(&p, OFlag::O_PATH)?;
            let st = nix::sys::stat::fstat(fd.as_fd())
                .map_err(|e| FileError::from_errno("stat", &p.abs, e))?;
            Ok(FsStat {
                path: shown(&p.abs),
                entry_type: if kind(&st) == SFlag::S_IFDIR {
                    EntryType::Directory
                } else {
                    EntryType::File
                },
                size: st.st_size.max(0) as u64,
                modified: mtime(&st),
            })
        })
        .await
    }

    /// The device, inode and directory-ness of what `path` resolves to (symlinks followed
    /// beneath the root): the identity of a directory however it is spelled.
    pub async fn identity(&self, path: &str) -> Result<(u64, u64, bool), FileError> {
        let p = self.policy.resolve(path)?;
        let policy = self.policy.clone();
        blocking(move || {
            let fd = policy.open(&p, OFlag::O_PATH)?;
            let st = nix::sys::stat::fstat(fd.as_fd())
                .map_err(|e| FileError::from_errno("stat", &p.abs, e))?;
            Ok((st.st_dev, st.st_ino, kind(&st) == SFlag::S_IFDIR))
        })
        .await
    }

    /// `mkdir -p`: succeeds when the directory exists; 409 when something else has the name.
    pub async fn mkdir(&self, path: &str) -> Result<String, FileError> {
        let p = self.policy.resolve(path)?;
        let policy = self.policy.clone();
        blocking(move || match policy.create_dirs(&p.rel, &p.abs) {
            Ok(_) => Ok(shown(&p.abs)),
            Err(FileError::WrongKind { .. }) | Err(FileError::AlreadyExists { .. }) => {
                Err(FileError::AlreadyExists { path: p.abs })
            }
            Err(e) => Err(e),
        })
        .await
    }

    /// Deletes a file, a symlink (not its target) or a directory (`recursive` when not empty).
    pub async fn delete(&self, path: &str, recursive: bool) -> Result<String, FileError> {
        let p = self.policy.resolve(path)?;
        let policy = self.policy.clone();
        blocking(move || {
            let (dir, name) = policy.open_parent(&p, false)?;
            let st = lstat_at(&dir, &name).map_err(|e| FileError::from_errno("stat", &p.abs, e))?;
            let res = if kind(&st) == SFlag::S_IFDIR {
                if recursive {
                    remove_tree(&dir, &name)
                } else {
                    nix::unistd::unlinkat(dir.as_fd(), name.as_os_str(), UnlinkatFlags::RemoveDir)
                }
            } else {
                nix::unistd::unlinkat(dir.as_fd(), name.as_os_str(), UnlinkatFlags::NoRemoveDir)
            };
            res.map_err(|e| FileError::from_errno("delete", &p.abs, e))?;
            Ok(shown(&p.abs))
        })
        .await
    }

    /// Renames `from` to `to` (parents of `to` created). Without `overwrite` an existing `to` is
    /// 409; with it, a file replaces a file and a directory replaces an empty directory.
    pub async fn rename(
        &self,
        from: &str,
        to: &str,
        overwrite: bool,
    ) -> Result<(String, String), FileError> {
        let src = self.policy.resolve(from)?;
        let dst = self.policy.resolve(to)?;
        let policy = self.policy.clone();
        blocking(move || {
            let (sdir, sname) = policy.open_parent(&src, false)?;
            let sst =
                lstat_at(&sdir, &sname).map_err(|e| FileError::from_errno("stat", &src.abs, e))?;
            let (ddir, dname) = policy.open_parent(&dst, true)?;
            match lstat_at(&ddir, &dname) {
                Ok(_) if !overwrite => return Err(FileError::AlreadyExists { path: dst.abs }),
                Ok(dst_st) => {
                    let src_dir = kind(&sst) == SFlag::S_IFDIR;
                    let dst_dir = kind(&dst_st) == SFlag::S_IFDIR;
                    if src_dir != dst_dir {
                        return Err(FileError::WrongKind {
                            path: dst.abs,
                            expected: if dst_dir {
                                "is a directory and the source is not"
                            } else {
                                "is not a directory and the source is one"
                            },
                        });
                    }
                }
                Err(Errno::ENOENT) => {}
                Err(e) => return Err(FileError::from_errno("stat", &dst.abs, e)),
            }
            let flags = if overwrite {
                RenameFlags::empty()
            } else {
                RenameFlags::RENAME_NOREPLACE
            };
            let moved = nix::fcntl::renameat2(
                sdir.as_fd(),
                sname.as_os_str(),
                ddir.as_fd(),
                dname.as_os_str(),
                flags,
            );
            // Across filesystems a regular file is copied, then the source removed.
            if moved == Err(Errno::EXDEV) && kind(&sst) == SFlag::S_IFREG {
                let ends = (&sdir, sname.as_os_str(), &ddir, dname.as_os_str());
                copy_across(ends, &sst, flags, &src.abs, &dst.abs)?;
                return Ok((shown(&src.abs), shown(&dst.abs)));
            }
            moved.map_err(|e| match e {
                Errno::EXDEV => FileError::Invalid {
                    reason: format!(
                        "{} and {} are on different filesystems; only regular files move across",
                        src.abs.display(),
                        dst.abs.display()
                    ),
                },
                Errno::EINVAL => FileError::Invalid {
                    reason: format!("cannot move {} into itself", src.abs.display()),
                },
                e => FileError::from_errno("move", &dst.abs, e),
            })?;
            Ok((shown(&src.abs), shown(&dst.abs)))
        })
        .await
    }

    /// Reads a small file whole (config files); `None` when it does not exist.
    pub async fn read_small(
        &self,
        path: super::SandboxPath,
        max: u64,
    ) -> Result<Option<Vec<u8>>, FileError> {
        let policy = self.policy.clone();
        blocking(move || {
            let fd = match policy.open(&path, OFlag::O_RDONLY | OFlag::O_NONBLOCK) {
                Ok(fd) => fd,
                Err(FileError::NotFound { .. }) => return Ok(None),
                Err(e) => return Err(e),
            };
            let file = std::fs::File::from(fd);
            let meta = file
                .metadata()
                .map_err(|e| FileError::from_io("stat", &path.abs, e))?;
            if !meta.is_file() {
                return Err(FileError::WrongKind {
                    path: path.abs,
                    expected: "is not a regular file",
                });
            }
            let mut out = Vec::new();
            use std::io::Read;
            (&file)
                .take(max + 1)
                .read_to_end(&mut out)
                .map_err(|e| FileError::from_io("read", &path.abs, e))?;
            if out.len() as u64 > max {
                return Err(FileError::Invalid {
                    reason: format!("{} is larger than {max} bytes", path.abs.display()),
                });
            }
            Ok(Some(out))
        })
        .await
    }
}
