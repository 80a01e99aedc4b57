//! The state dir itself: whose it is, its lock, its permissions, and where entries the daemon
//! cannot read are moved aside. **Invariants:** nothing in the dir is ever deleted at start (an
//! entry that does not read back is renamed into `quarantine/`); no symlink in it is followed
//! (every open is `O_NOFOLLOW`, every entry is looked at with `lstat`); a directory the daemon
//! did not make is refused before anything is written into it; files are created 0600 and
//! directories 0700 whatever the umask.

use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::StateError;

/// The file that says "this directory is a sandbox-agent state dir" (written once the dir was
/// found empty or of our own shape).
pub const MARKER: &str = "sandbox-agent-state";
/// Present while every record of the run so far reached the disk; unlinked (which needs no free
/// space) when the store stops being durable. Missing at start: the previous run lost records.
pub const DURABLE: &str = "durable";
/// The `flock` that makes the dir one daemon's (it holds its pid, for the error message).
pub const LOCK: &str = "lock";
/// Where entries that do not read back are moved aside.
pub const QUARANTINE: &str = "quarantine";
/// Where a bundle import stages what it received until it has checked all of it (one random
/// directory per import, removed when the import ends). What is there at start, a crash or a
/// reload cut: removed by `claim`.
pub const IMPORTS: &str = "imports";
/// The services' subdirectories.
pub const SUBDIRS: [&str; 2] = ["acp", "processes"];
/// The files of one entry (the `.tmp` ones are what a crash can leave of a rewrite).
const ENTRY_FILES: [&str; 4] = ["meta.json", "events.log", "meta.json.tmp", "events.tmp"];

/// How long a start waits for the lock before it refuses (a reload's new image may find the
/// old image's descriptor still closing).
const LOCK_WAIT: Duration = Duration::from_secs(1);

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> StateError + '_ {
    move |source| StateError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// Creates a file for writing, 0600, never through a symlink.
pub fn create_file(path: &Path) -> Result<File, StateError> {
    OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
        .map_err(io(path))
}

/// Opens a log for appending (creating it 0600), never through a symlink.
pub fn open_append(path: &Path) -> Result<File, StateError> {
    OpenOptions::new()
        .append(true)
        .create(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
        .map_err(io(path))
}

/// Opens an existing file for reading and writing (to cut a bad tail), never through a symlink.
pub fn open_existing(path: &Path) -> std::io::Result<File> {
    OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
}

/// Makes a directory 0700 (its parents must exist); an existing one must be a real directory.
pub fn make_dir(path: &Path) -> Result<(), StateError> {
    match std::fs::DirBuilder::new().mode(0o700).create(path) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            let m = std::fs::symlink_metadata(path).map_err(io(path))?;
            if m.is_dir() {
                Ok(())
            } else {
                Err(StateError::NotOurs {
                    path: path.to_path_buf(),
                    why: "it is not a directory (a symlink or a file)".into(),
                })
            }
        }
        Err(e) => Err(io(path)(e)),
    }
}

/// Sets 0700/0600 on what the daemon made before this version created things that way.
fn tighten(path: &Path, mode: u32) {
    if let Ok(m) = std::fs::symlink_metadata(path)
        && !m.file_type().is_symlink()
        && m.permissions().mode() & 0o077 != 0
    {
        let _ = std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode));
    }
}

/// The lock, held for the life of the store (closed with the descriptor, never inherited: the
/// descriptor is close-on-exec).
pub struct Lock {
    _guard: nix::fcntl::Flock<File>,
}

/// Refuses a dir that is neither empty nor a state dir of ours, takes its lock, writes the
/// marker, makes `acp/` and `processes/` and tightens permissions. Returns the lock and whether
/// the previous run stayed durable to its end (`false` when it lost records).
pub fn claim(dir: &Path) -> Result<(Lock, bool), StateError> {
    if !dir.exists() {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(io(dir))?;
    }
    let meta = std::fs::metadata(dir).map_err(io(dir))?;
    if !meta.is_dir() {
        return Err(StateError::NotOurs {
            path: dir.to_path_buf(),
            why: "it is not a directory".into(),
        });
    }
    let ours = std::fs::symlink_metadata(dir.join(MARKER)).is_ok_and(|m| m.is_file());
    if !ours {
        check_shape(dir)?;
    }
    let lock = take_lock(dir)?;
    // Ours from here on: the marker is written once, the rest made or tightened.
    let was_durable = if ours {
        std::fs::symlink_metadata(dir.join(DURABLE)).is_ok_and(|m| m.is_file())
    } else {
        let mut f = create_file(&dir.join(MARKER))?;
        f.write_all(b"sandbox-agent state dir, version 1: do not put anything else here\n")
            .map_err(io(dir))?;
        // A dir of a build without the marker (the same shape): nothing says records were lost.
        true
    };
    tighten(dir, 0o700);
    sweep_imports(&dir.join(IMPORTS));
    for sub in SUBDIRS {
        let p = dir.join(sub);
        make_dir(&p)?;
        tighten(&p, 0o700);
    }
    Ok((lock, was_durable))
}

/// Removes the staging of imports that a crash or a reload cut (the dir is locked: no import of
/// this daemon runs yet). `remove_dir_all` removes a symlink itself, never what it points to.
fn sweep_imports(imports: &Path) {
    let Ok(entries) = std::fs::read_dir(imports) else {
        return;
    };
    let cut: Vec<_> = entries.flatten().map(|e| e.path()).collect();
    let mut removed = 0usize;
    for p in &cut {
        match std::fs::remove_dir_all(p).or_else(|_| std::fs::remove_file(p)) {
            Ok(()) => removed += 1,
            Err(e) => tracing::warn!(path = %p.display(), error = %e,
                "cannot remove the staging of a bundle import a crash or reload cut"),
        }
    }
    if removed > 0 {
        tracing::warn!(
            removed,
            "removed the staging of bundle imports a crash or reload cut"
        );
    }
}

/// Writes the "durable" flag (at start, once the store is open).
pub fn set_durable_flag(dir: &Path) -> Result<(), StateError> {
    create_file(&dir.join(DURABLE)).map(|_| ())
}

/// Removes the "durable" flag: records are being lost (an unlink needs no free space).
pub fn clear_durable_flag(dir: &Path) {
    let _ = std::fs::remove_file(dir.join(DURABLE));
}

/// A dir without the marker is claimed only when it is empty or has exactly the shape an older
/// build made: `acp/` and `processes/` holding entry directories of our files and nothing else.
fn check_shape(dir: &Path) -> Result<(), StateError> {
    let refuse = |path: PathBuf, why: String| Err(StateError::NotOurs { path, why });
    for e in std::fs::read_dir(dir).map_err(io(dir))? {
        let e = e.map_err(io(dir))?;
        let name = e.file_name();
        let path = e.path();
        let ft = e.file_type().map_err(io(&path))?;
        match name.to_str() {
            Some(LOCK | DURABLE) if ft.is_file() => {}
            Some(QUARANTINE) if ft.is_dir() => {}
            Some(n) if SUBDIRS.contains(&n) => {
                if !ft.is_dir() {
                    return refuse(path, "it is not a directory (a symlink or a file)".into());
                }
                for entry in std::fs::read_dir(&path).map_err(io(&path))? {
                    let entry = entry.map_err(io(&path))?;
                    let ep = entry.path();
                    if !entry.file_type().map_err(io(&ep))?.is_dir() {
                        return refuse(ep, "not an entry the daemon makes".into());
                    }
                    for f in std::fs::read_dir(&ep).map_err(io(&ep))? {
                        let f = f.map_err(io(&ep))?;
                        let is_file = f.file_type().map_err(io(&ep))?.is_file();
                        let known = f
                            .file_name()
                            .to_str()
                            .is_some_and(|n| ENTRY_FILES.contains(&n));
                        if !is_file || !known {
                            return refuse(f.path(), "not a file the daemon makes".into());
                        }
                    }
                }
            }
            _ => {
                return refuse(
                    path,
                    "the state dir must be empty or one sandbox-agent made".into(),
                );
            }
        }
    }
    Ok(())
}

fn take_lock(dir: &Path) -> Result<Lock, StateError> {
    use nix::fcntl::{Flock, FlockArg};
    let path = dir.join(LOCK);
    let deadline = Instant::now() + LOCK_WAIT;
    loop {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&path)
            .map_err(io(&path))?;
        match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
            Ok(mut locked) => {
                let _ = locked.set_len(0);
                let _ = writeln!(&mut *locked, "{}", std::process::id());
                return Ok(Lock { _guard: locked });
            }
            Err((mut f, nix::errno::Errno::EWOULDBLOCK)) => {
                if Instant::now() < deadline {
                    std::thread::sleep(Duration::from_millis(20));
                    continue;
                }
                let mut holder = String::new();
                let _ = f.read_to_string(&mut holder);
                return Err(StateError::Locked {
                    dir: dir.to_path_buf(),
                    holder: holder.trim().to_string(),
                });
            }
            Err((_, e)) => return Err(io(&path)(e.into())),
        }
    }
}

/// Moves `key`'s directory (or file) aside into `quarantine/`, never deleting it. Returns where
/// it went.
pub fn quarantine(dir: &Path, key: &str) -> Result<PathBuf, StateError> {
    let q = dir.join(QUARANTINE);
    make_dir(&q)?;
    let stamp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis());
    let to = q.join(format!("{}-{stamp}", key.replace('/', "-")));
    let from = dir.join(key);
    std::fs::rename(&from, &to).map_err(io(&from))?;
    Ok(to)
}
