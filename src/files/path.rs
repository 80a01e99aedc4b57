//! The path policy: a request path is made absolute against the work dir, then resolved by the
//! kernel (`openat2`) beneath the filesystem root — `/` when none is configured, else `--fs-root`
//! with `RESOLVE_BENEATH`, so neither `..` nor a symlink (absolute or relative) can leave it.
//! Every operation goes through a descriptor obtained here; no path string is trusted twice.

use std::ffi::{OsStr, OsString};
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Component, Path, PathBuf};

use nix::errno::Errno;
use nix::fcntl::{OFlag, OpenHow, ResolveFlag, openat2};
use nix::sys::stat::Mode;

use super::FileError;

/// Where requests may reach, and how relative paths are anchored.
pub struct PathPolicy {
    work_dir: PathBuf,
    root: PathBuf,
    root_fd: OwnedFd,
    confined: bool,
}

/// A request path after lexical normalisation: `abs` is what answers show, `rel` is the same
/// path relative to the root (what the kernel resolves beneath the root descriptor).
#[derive(Debug, Clone)]
pub struct SandboxPath {
    pub abs: PathBuf,
    pub rel: PathBuf,
}

impl SandboxPath {
    /// The parent (relative to the root) and the final name, for operations that create,
    /// replace or remove a directory entry. The root itself has no name.
    pub fn split(&self) -> Result<(PathBuf, OsString), FileError> {
        match self.rel.components().next_back() {
            Some(Component::Normal(name)) => Ok((
                self.rel.parent().unwrap_or(Path::new("")).to_path_buf(),
                name.to_os_string(),
            )),
            _ => Err(FileError::Invalid {
                reason: format!("{}: the path must name an entry", self.abs.display()),
            }),
        }
    }

    pub fn join(&self, name: &OsStr) -> SandboxPath {
        SandboxPath {
            abs: self.abs.join(name),
            rel: self.rel.join(name),
        }
    }
}

/// `rel` as given to `openat2`: the empty path means the root directory itself.
fn dot(rel: &Path) -> &Path {
    if rel.as_os_str().is_empty() {
        Path::new(".")
    } else {
        rel
    }
}

impl PathPolicy {
    pub fn new(work_dir: PathBuf, fs_root: Option<PathBuf>) -> std::io::Result<Self> {
        let (root, confined) = match fs_root {
            Some(r) => (r, true),
            None => (PathBuf::from("/"), false),
        };
        let root_fd = nix::fcntl::open(
            &root,
            OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
            Mode::empty(),
        )?;
        Ok(PathPolicy {
            work_dir,
            root,
            root_fd,
            confined,
        })
    }

    /// Lexical step only: anchors `input` at the work dir, drops `.` components and checks that
    /// the result starts with the root. `..` is left for the kernel, which resolves it beneath
    /// the root (so `/root/../etc` is refused there, not guessed at here).
    pub fn resolve(&self, input: &str) -> Result<SandboxPath, FileError> {
        if input.is_empty() {
            return Err(FileError::Invalid {
                reason: "the path is empty".into(),
            });
        }
        if input.contains('\0') {
            return Err(FileError::Invalid {
                reason: "the path contains a NUL byte".into(),
            });
        }
        let joined = self.work_dir.join(input);
        let mut abs = PathBuf::from("/");
        for c in joined.components() {
            match c {
                Component::Normal(n) => abs.push(n),
                Component::ParentDir => abs.push(".."),
                Component::CurDir | Component::RootDir | Component::Prefix(_) => {}
            }
        }
        let rel = match abs.strip_prefix(&self.root) {
            Ok(r) => r.to_path_buf(),
            Err(_) => return Err(FileError::OutsideRoot { path: abs }),
        };
        Ok(SandboxPath { abs, rel })
    }

    fn resolve_flags(&self) -> ResolveFlag {
        if self.confined {
            ResolveFlag::RESOLVE_BENEATH | ResolveFlag::RESOLVE_NO_MAGICLINKS
        } else {
            ResolveFlag::empty()
        }
    }

    /// Opens `rel` beneath the root, following symlinks only as far as they stay beneath it.
    pub fn open_rel(&self, rel: &Path, flags: OFlag) -> nix::Result<OwnedFd> {
        let how = OpenHow::new()
            .flags(flags | OFlag::O_CLOEXEC)
            .resolve(self.resolve_flags());
        openat2(self.root_fd.as_fd(), dot(rel), how)
    }

    /// Whether a real (symlink-free, absolute) path lies beneath the root: for paths another
    /// program reports (git's top level or its git dir), checked after the fact.
    pub fn contains(&self, real: &Path) -> bool {
        !self.confined || real.starts_with(&self.root)
    }

    /// The real path of an existing directory, opened beneath the root (so `..` and symlinks
    /// are resolved by the kernel and cannot leave it): what is handed to a program that takes
    /// path strings (git). The name is read back from `/proc/self/fd`.
    pub fn real_dir(&self, p: &SandboxPath) -> Result<PathBuf, FileError> {
        let fd = self.open(p, OFlag::O_PATH | OFlag::O_DIRECTORY)?;
        let link = format!("/proc/self/fd/{}", std::os::fd::AsRawFd::as_raw_fd(&fd));
        let real = std::fs::read_link(&link).map_err(|e| FileError::from_io("open", &p.abs, e))?;
        if !self.contains(&real) {
            return Err(FileError::OutsideRoot {
                path: p.abs.clone(),
            });
        }
        Ok(real)
    }

    /// Opens a path for reading metadata or contents; errors name the request path.
    pub fn open(&self, p: &SandboxPath, flags: OFlag) -> Result<OwnedFd, FileError> {
        self.open_rel(&p.rel, flags)
            .map_err(|e| FileError::from_errno("open", &p.abs, e))
    }

    /// Opens the parent directory of `p` (for `*at` calls on the final name), creating the
    /// missing ancestors when `create` is set. Each created component is re-opened through the
    /// root, so a symlink planted meanwhile is still resolved beneath it.
    pub fn open_parent(
        &self,
        p: &SandboxPath,
        create: bool,
    ) -> Result<(OwnedFd, OsString), FileError> {
        let (parent, name) = p.split()?;
        let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY;
        let parent_abs = p.abs.parent().unwrap_or(Path::new("/"));
        match self.open_rel(&parent, flags) {
            Ok(fd) => return Ok((fd, name)),
            Err(Errno::ENOENT) if create => {}
            Err(e) => return Err(FileError::from_errno("open", parent_abs, e)),
        }
        let fd = self.create_dirs(&parent, parent_abs)?;
        Ok((fd, name))
    }

    /// `mkdir -p` beneath the root; returns the final directory.
    pub fn create_dirs(&self, rel: &Path, shown: &Path) -> Result<OwnedFd, FileError> {
        self.create_dirs_tracked(rel, shown, &mut Vec::new())
    }

    /// [`Self::create_dirs`], recording each directory it created as (parent, name), in order,
    /// so that a caller failing later can remove exactly those again.
    pub fn create_dirs_tracked(
        &self,
        rel: &Path,
        shown: &Path,
        created: &mut Vec<(OwnedFd, OsString)>,
    ) -> Result<OwnedFd, FileError> {
        let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY;
        let mut prefix = PathBuf::new();
        let mut fd = self
            .open_rel(&prefix, flags)
            .map_err(|e| FileError::from_errno("open", shown, e))?;
        for c in rel.components() {
            let Component::Normal(n) = c else {
                prefix.push(c.as_os_str());
                fd = self
                    .open_rel(&prefix, flags)
                    .map_err(|e| FileError::from_errno("open", shown, e))?;
                continue;
            };
            prefix.push(n);
            match self.open_rel(&prefix, flags) {
                Ok(next) => fd = next,
                Err(Errno::ENOENT) => {
                    match nix::sys::stat::mkdirat(fd.as_fd(), n, Mode::from_bits_truncate(0o777)) {
                        Ok(()) => {
                            if let Ok(parent) = fd.try_clone() {
                                created.push((parent, n.to_os_string()));
                            }
                        }
                        Err(Errno::EEXIST) => {}
                        Err(e) => return Err(FileError::from_errno("mkdir", shown, e)),
                    }
                    fd = self
                        .open_rel(&prefix, flags)
                        .map_err(|e| FileError::from_errno("open", shown, e))?;
                }
                Err(e) => return Err(FileError::from_errno("open", shown, e)),
            }
        }
        Ok(fd)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(work: &str, root: Option<&str>, input: &str, expected: Result<(&str, &str), ()>) {
        let p = PathPolicy {
            work_dir: work.into(),
            root: root.unwrap_or("/").into(),
            root_fd: nix::fcntl::open("/", OFlag::O_PATH, Mode::empty()).unwrap(),
            confined: root.is_some(),
        };
        let got = p.resolve(input).map(|s| (s.abs, s.rel)).map_err(|_| ());
        let expected = expected.map(|(a, r)| (PathBuf::from(a), PathBuf::from(r)));
        assert_eq!(got, expected, "input {input:?}");
    }

    #[test]
    fn resolution_is_lexical_and_leaves_dotdot_to_the_kernel() {
        check("/w", None, "a/b", Ok(("/w/a/b", "w/a/b")));
        check("/w", None, "./a/./b/", Ok(("/w/a/b", "w/a/b")));
        check("/w", None, "/etc/passwd", Ok(("/etc/passwd", "etc/passwd")));
        check("/w", None, "../x", Ok(("/w/../x", "w/../x")));
        check("/w", Some("/w"), "a", Ok(("/w/a", "a")));
        check("/w", Some("/w"), ".", Ok(("/w", "")));
        check("/w", Some("/w"), "../x", Ok(("/w/../x", "../x")));
        check("/w", Some("/w"), "/etc", Err(()));
        check("/w", Some("/w"), "/wx/a", Err(()));
        check("/w", None, "", Err(()));
    }
}
