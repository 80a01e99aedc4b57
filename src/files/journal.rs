//! The temporaries journal: every temporary a transfer makes in a user's tree (a file being
//! written, an upload's staging directory) is written down here once it exists, and struck off
//! when it is renamed into place or removed. A reload or a stop removes what is still live
//! itself (`write::remove_live_temporaries`); a crash (`kill -9`, the OOM killer) cannot, so the
//! next start reads the journals whose daemon is gone and removes what they still list.
//!
//! Layout: `DATA_DIR/temporaries/<pid>-<random>.journal` (0600, the directory 0700), one per
//! running daemon, held under an exclusive `flock` for the daemon's life: a journal whose lock can
//! be taken belongs to no running daemon. Records are `+<id hex> <absolute path>\0` and
//! `-<id hex>\0`. The file is rewritten with only the live entries once it passes
//! [`COMPACT_AT`], so it stays bounded by the temporaries alive at once (themselves bounded by the
//! transfer caps). A sweep removes an entry only if it still is what we made: its name has our
//! temporaries' pattern (`.sandbox-agent-<stem>-<24 hex>`), it is a regular file or a directory
//! (never a symlink) owned by the daemon's user. Anything else is left alone.
//!
//! Writes are not synced: a daemon's crash leaves them in the page cache; after a power loss a
//! temporary may remain (as may a temporary not yet journaled: the record is written right after
//! the `O_EXCL` create or `mkdir` that made it).

use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::fs::File;
use std::io::{BufRead, Read, Write};
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

/// The journals' directory under the data dir.
pub const DIR: &str = "temporaries";
/// A journal longer than this is rewritten with only its live entries.
pub const COMPACT_AT: u64 = 1 << 20;
/// The longest record a sweep reads (a path longer than `PATH_MAX` is not ours).
const MAX_RECORD: usize = 8192;

struct Open {
    file: nix::fcntl::Flock<File>,
    path: PathBuf,
    bytes: u64,
    live: BTreeMap<u64, Vec<u8>>,
}

static JOURNAL: std::sync::Mutex<Option<Open>> = std::sync::Mutex::new(None);

/// What a start-up sweep did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Swept {
    /// Journals of daemons that are gone, read and removed.
    pub journals: usize,
    /// Temporaries they listed that were still there, removed.
    pub removed: usize,
    /// Listed entries that were there but not ours any more (left alone).
    pub left: usize,
}

/// Sweeps the journals under `data_dir` that no running daemon holds, then opens this process's
/// own (once per process: a second call, e.g. a second in-process daemon of a test, only sweeps).
/// Blocking.
pub fn start(data_dir: &Path) -> std::io::Result<Swept> {
    let dir = data_dir.join(DIR);
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(&dir)?;
    if std::fs::symlink_metadata(&dir)?.file_type().is_symlink() {
        return Err(std::io::Error::other(format!(
            "{} is a symlink",
            dir.display()
        )));
    }
    let swept = sweep(&dir)?;
    let mut j = crate::sys::lock(&JOURNAL);
    if j.is_none() {
        let name = format!(
            "{}-{}.journal",
            std::process::id(),
            crate::sys::random_hex::<8>()
        );
        let path = dir.join(name);
        let file = create_locked(&path)?;
        *j = Some(Open {
            file,
            path,
            bytes: 0,
            live: BTreeMap::new(),
        });
    }
    Ok(swept)
}

/// Removes this process's journal at the end of a clean stop (after the live temporaries were
/// removed): nothing is left for the next start to read.
pub fn close() {
    if let Some(open) = crate::sys::lock(&JOURNAL).take() {
        let _ = std::fs::remove_file(&open.path);
    }
}

/// A fresh journal file, locked.
fn create_locked(path: &Path) -> std::io::Result<nix::fcntl::Flock<File>> {
    let file = std::fs::OpenOptions::new()
        .create_new(true)
        .append(true)
        .mode(0o600)
        .custom_flags(nix::libc::O_NOFOLLOW)
        .open(path)?;
    nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusiveNonblock)
        .map_err(|(_, e)| std::io::Error::from(e))
}

/// Records a temporary `name` this process just made in `dir`. A failure only costs the sweep
/// after a crash (logged once per cause at debug level).
pub(super) fn added(n: u64, dir: &OwnedFd, name: &OsStr) {
    let mut j = crate::sys::lock(&JOURNAL);
    let Some(open) = j.as_mut() else {
        return;
    };
    let Ok(dir_path) = std::fs::read_link(format!("/proc/self/fd/{}", dir.as_raw_fd())) else {
        return;
    };
    let path = dir_path.join(name).into_os_string().into_vec();
    if path.contains(&0) || path.len() > MAX_RECORD - 32 {
        return;
    }
    let mut rec = format!("+{n:x} ").into_bytes();
    rec.extend_from_slice(&path);
    rec.push(0);
    if append(open, &rec) {
        open.live.insert(n, path);
    }
}

/// Strikes temporary `n` off (renamed into place or removed).
pub(super) fn removed(n: u64) {
    let mut j = crate::sys::lock(&JOURNAL);
    let Some(open) = j.as_mut() else {
        return;
    };
    if open.live.remove(&n).is_none() {
        return;
    }
    append(open, format!("-{n:x}\0").as_bytes());
    if open.bytes > COMPACT_AT
        && let Err(e) = compact(open)
    {
        tracing::debug!(error = %e, "cannot compact the temporaries journal");
    }
}

fn append(open: &mut Open, rec: &[u8]) -> bool {
    match open.file.write_all(rec) {
        Ok(()) => {
            open.bytes += rec.len() as u64;
            true
        }
        Err(e) => {
            tracing::debug!(error = %e, "cannot write the temporaries journal");
            false
        }
    }
}

/// Rewrites the journal with its live entries only: a new file, locked before it replaces the
/// old name, so that no start-up sweep ever finds the name unlocked.
fn compact(open: &mut Open) -> std::io::Result<()> {
    let tmp = open.path.with_extension("journal.new");
    let _ = std::fs::remove_file(&tmp);
    let mut file = create_locked(&tmp)?;
    let mut buf = Vec::new();
    for (n, path) in &open.live {
        buf.extend_from_slice(format!("+{n:x} ").as_bytes());
        buf.extend_from_slice(path);
        buf.push(0);
    }
    file.write_all(&buf)?;
    std::fs::rename(&tmp, &open.path)?;
    open.file = file;
    open.bytes = buf.len() as u64;
    Ok(())
}

/// Reads every journal in `dir` that no daemon holds, removes what it still lists, removes it.
fn sweep(dir: &Path) -> std::io::Result<Swept> {
    let mut swept = Swept::default();
    for e in std::fs::read_dir(dir)? {
        let e = e?;
        let name = e.file_name();
        let is_journal =
            name.as_bytes().ends_with(b".journal") || name.as_bytes().ends_with(b".journal.new");
        if !is_journal || !e.file_type()?.is_file() {
            continue;
        }
        let path = e.path();
        let Ok(file) = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(nix::libc::O_NOFOLLOW)
            .open(&path)
        else {
            continue;
        };
        // Held by a running daemon (another one on this data dir, or this process's own).
        let Ok(file) = nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusiveNonblock)
        else {
            continue;
        };
        for listed in live_entries(&file) {
            match remove_if_ours(Path::new(OsStr::from_bytes(&listed))) {
                Some(true) => swept.removed += 1,
                Some(false) => swept.left += 1,
                None => {}
            }
        }
        std::fs::remove_file(&path)?;
        swept.journals += 1;
    }
    Ok(swept)
}

/// The paths a journal lists as live (added, never struck off). A malformed record ends the
/// read: what came before it stands.
fn live_entries(file: &File) -> Vec<Vec<u8>> {
    let mut live: BTreeMap<u64, Vec<u8>> = BTreeMap::new();
    let mut r = std::io::BufReader::new(file);
    let mut rec = Vec::new();
    loop {
        rec.clear();
        match (&mut r).take(MAX_RECORD as u64).read_until(0, &mut rec) {
            Ok(0) | Err(_) => break,
            Ok(_) => {}
        }
        if rec.pop() != Some(0) {
            break; // torn or over-long
        }
        let parse_id = |s: &[u8]| {
            std::str::from_utf8(s)
                .ok()
                .and_then(|s| u64::from_str_radix(s, 16).ok())
        };
        match rec.split_first() {
            Some((b'+', rest)) => {
                let Some(sp) = rest.iter().position(|&b| b == b' ') else {
                    break;
                };
                let Some(n) = parse_id(&rest[..sp]) else {
                    break;
                };
                live.insert(n, rest[sp + 1..].to_vec());
            }
            Some((b'-', rest)) => {
                let Some(n) = parse_id(rest) else {
                    break;
                };
                live.remove(&n);
            }
            _ => break,
        }
    }
    live.into_values().collect()
}

/// Whether `name` is one of our temporaries' names: `.sandbox-agent-<stem>-<24 lowercase hex>`
/// (`write::random_name`: 12 random bytes).
pub fn is_temporary_name(name: &[u8]) -> bool {
    let Some(rest) = name.strip_prefix(b".sandbox-agent-") else {
        return false;
    };
    let Some(dash) = rest.iter().rposition(|&b| b == b'-') else {
        return false;
    };
    let (stem, hex) = (&rest[..dash], &rest[dash + 1..]);
    !stem.is_empty()
        && stem.iter().all(|b| b.is_ascii_lowercase() || *b == b'_')
        && hex.len() == 24
        && hex.iter().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// Removes `path` when it is still a temporary of ours: `Some(true)` removed, `Some(false)` there
/// but not ours (left alone), `None` gone already.
fn remove_if_ours(path: &Path) -> Option<bool> {
    let meta = std::fs::symlink_metadata(path).ok()?;
    let ours = path
        .file_name()
        .is_some_and(|n| is_temporary_name(n.as_bytes()))
        && path.is_absolute()
        && meta.uid() == nix::unistd::geteuid().as_raw()
        && (meta.file_type().is_file() || meta.file_type().is_dir());
    if !ours {
        return Some(false);
    }
    let done = if meta.file_type().is_dir() {
        super::remove::remove_dir_all(path)
    } else {
        std::fs::remove_file(path)
    };
    Some(done.is_ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_names_of_our_temporaries_and_no_others() {
        for ok in [
            ".sandbox-agent-write-0123456789ab0123456789ab",
            ".sandbox-agent-upload-abcdefabcdefabcdefabcdef",
        ] {
            assert!(is_temporary_name(ok.as_bytes()), "{ok}");
        }
        for not in [
            "sandbox-agent-write-0123456789ab0123456789ab",
            ".sandbox-agent-write-0123456789ab0123456789a",
            ".sandbox-agent-write-0123456789ab0123456789abc",
            ".sandbox-agent-write-0123456789ab0123456789AB",
            ".sandbox-agent--0123456789ab0123456789ab",
            ".sandbox-agent-write-0123456789ab0123456789ab.txt",
            ".sandbox-agent-write-0123456789ab",
            "main.py",
        ] {
            assert!(!is_temporary_name(not.as_bytes()), "{not}");
        }
    }

    #[test]
    fn a_journal_lists_what_was_added_and_never_struck_off_and_stops_at_a_torn_record() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("x.journal");
        std::fs::write(
            &p,
            b"+1 /a/.sandbox-agent-write-000000000001\0+2 /b\0-1\0+3 /c\0+4 /d",
        )
        .unwrap();
        let live = live_entries(&File::open(&p).unwrap());
        assert_eq!(live, vec![b"/b".to_vec(), b"/c".to_vec()]);
    }

    #[test]
    fn a_sweep_removes_only_our_temporaries_and_skips_held_journals() {
        let root = tempfile::tempdir().unwrap();
        let tree = root.path().join("tree");
        std::fs::create_dir(&tree).unwrap();
        let ours = tree.join(".sandbox-agent-write-0123456789ab0123456789ab");
        let staging = tree.join(".sandbox-agent-upload-0123456789ab0123456789ab");
        let planted = tree.join(".sandbox-agent-write-abcdefabcdefabcdefabcdef");
        let user = tree.join("main.py");
        std::fs::write(&ours, b"partial").unwrap();
        std::fs::create_dir_all(staging.join("sub")).unwrap();
        std::fs::write(staging.join("sub/f"), b"x").unwrap();
        std::os::unix::fs::symlink(&user, &planted).unwrap();
        std::fs::write(&user, b"print(1)").unwrap();
        let jdir = root.path().join(DIR);
        std::fs::create_dir(&jdir).unwrap();
        let mut rec = Vec::new();
        for (i, p) in [&ours, &staging, &planted, &user].iter().enumerate() {
            rec.extend_from_slice(format!("+{i:x} ").as_bytes());
            rec.extend_from_slice(p.as_os_str().as_bytes());
            rec.push(0);
        }
        std::fs::write(jdir.join("1-dead.journal"), &rec).unwrap();
        // A journal a running daemon holds is not read.
        let held = create_locked(&jdir.join("2-live.journal")).unwrap();
        let mut held_w: &File = &held;
        held_w.write_all(&rec).unwrap();

        let swept = sweep(&jdir).unwrap();
        assert_eq!(
            swept,
            Swept {
                journals: 1,
                removed: 2,
                left: 2
            }
        );
        assert!(!ours.exists() && !staging.exists());
        assert_eq!(std::fs::read(&user).unwrap(), b"print(1)");
        assert!(std::fs::symlink_metadata(&planted).is_ok());
        assert!(!jdir.join("1-dead.journal").exists());
        assert!(jdir.join("2-live.journal").exists());
        drop(held);
    }

    #[test]
    fn compaction_keeps_the_live_entries_and_the_lock() {
        let root = tempfile::tempdir().unwrap();
        let path = root.path().join("1-x.journal");
        let mut open = Open {
            file: create_locked(&path).unwrap(),
            path: path.clone(),
            bytes: 0,
            live: BTreeMap::new(),
        };
        for n in 0..1000u64 {
            assert!(append(
                &mut open,
                format!("+{n:x} /gone/{n}\0-{n:x}\0").as_bytes()
            ));
        }
        open.live.insert(7, b"/still/here".to_vec());
        compact(&mut open).unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"+7 /still/here\0");
        assert_eq!(open.bytes, 15);
        // Still held: a start-up sweep leaves it alone.
        assert_eq!(sweep(root.path()).unwrap(), Swept::default());
        assert!(path.exists());
        assert!(append(&mut open, b"-7\0"));
        assert_eq!(std::fs::read(&path).unwrap(), b"+7 /still/here\0-7\0");
    }
}
