//! OpenCode sessions in `--state-dir`: `DIR/opencode/<sessionID>.json`, one JSON document per
//! session (title, model, the ACP session it is bound to, messages), replaced atomically
//! (temporary + rename) by one writer thread. The ACP side (the instance, its event log and the
//! `session/load` after a restart) is kept by `crate::state` like every instance's; this is only
//! OpenCode's view of it.
//!
//! **Invariant:** no request waits for the disk: a save is a `try_send` of the serialized
//! document to the writer (a full queue drops that save, the next one of the session catches
//! up; a WARN says so).

use std::path::{Path, PathBuf};
use std::sync::mpsc::{Receiver, SyncSender, TrySendError};

use super::SessionData;

/// Saves queued for the writer.
const QUEUE: usize = 1024;
/// Largest session document read back (larger files are skipped).
const MAX_FILE: u64 = 256 * 1024 * 1024;

enum Op {
    Save(String, Vec<u8>),
    Remove(String),
    /// Everything sent before is written: answer.
    Barrier(std::sync::mpsc::Sender<()>),
}

pub struct Store {
    tx: SyncSender<Op>,
}

impl Store {
    /// Creates `dir`, reads every session back and starts the writer. Blocking.
    pub fn open(dir: &Path) -> std::io::Result<(Store, Vec<SessionData>)> {
        let dir = dir.to_path_buf();
        // Private like the state dir it usually lives in (prompts and answers are in it): 0700
        // whatever the umask, and every file 0600 (`save`).
        {
            use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(&dir)?;
            std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700))?;
        }
        let mut found = Vec::new();
        for e in std::fs::read_dir(&dir)?.flatten() {
            let path = e.path();
            let is_json = path.extension().is_some_and(|x| x == "json");
            let small = e
                .metadata()
                .is_ok_and(|m| m.is_file() && m.len() <= MAX_FILE);
            if !is_json || !small {
                // Leftover temporaries of a crash.
                if path.extension().is_some_and(|x| x == "tmp") {
                    let _ = std::fs::remove_file(&path);
                }
                continue;
            }
            match std::fs::read(&path)
                .ok()
                .and_then(|b| serde_json::from_slice::<SessionData>(&b).ok())
            {
                Some(d) if file_of(&dir, &d.id).as_deref() == Some(path.as_path()) => found.push(d),
                _ => tracing::warn!(path = %path.display(), "unreadable OpenCode session skipped"),
            }
        }
        found.sort_by(|a, b| a.id.cmp(&b.id));
        let (tx, rx) = std::sync::mpsc::sync_channel(QUEUE);
        std::thread::Builder::new()
            .name("opencode-store".into())
            .spawn(move || writer(dir, rx))?;
        Ok((Store { tx }, found))
    }

    pub fn save(&self, d: &SessionData) {
        let Ok(bytes) = serde_json::to_vec(d) else {
            return;
        };
        self.send(Op::Save(d.id.clone(), bytes));
    }

    pub fn remove(&self, id: &str) {
        self.send(Op::Remove(id.to_string()));
    }

    /// Waits (at most `timeout`) until every save sent before is written. Blocking.
    pub fn flush_blocking(&self, timeout: std::time::Duration) -> bool {
        let (tx, rx) = std::sync::mpsc::channel();
        if self.tx.send(Op::Barrier(tx)).is_err() {
            return false;
        }
        rx.recv_timeout(timeout).is_ok()
    }

    fn send(&self, op: Op) {
        if let Err(TrySendError::Full(_)) = self.tx.try_send(op) {
            tracing::warn!("the OpenCode session writer is behind: a save was dropped");
        }
    }
}

/// A session's file; `None` for an id that cannot name one.
fn file_of(dir: &Path, id: &str) -> Option<PathBuf> {
    let ok = !id.is_empty()
        && id.len() <= 100
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-'));
    ok.then(|| dir.join(format!("{id}.json")))
}

/// Writes `bytes` to a new file at `path`, readable by the daemon's user only (0600 whatever the
/// umask; a leftover of a crash is replaced).
fn save(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)?;
    f.set_permissions(std::fs::Permissions::from_mode(0o600))?;
    f.write_all(bytes)
}

fn writer(dir: PathBuf, rx: Receiver<Op>) {
    while let Ok(op) = rx.recv() {
        match op {
            Op::Save(id, bytes) => {
                let Some(path) = file_of(&dir, &id) else {
                    continue;
                };
                let tmp = path.with_extension("tmp");
                let done = save(&tmp, &bytes).and_then(|()| std::fs::rename(&tmp, &path));
                if let Err(e) = done {
                    tracing::warn!(error = %e, path = %path.display(), "cannot save an OpenCode session");
                    let _ = std::fs::remove_file(&tmp);
                }
            }
            Op::Barrier(done) => {
                let _ = done.send(());
            }
            Op::Remove(id) => {
                if let Some(path) = file_of(&dir, &id) {
                    let _ = std::fs::remove_file(path);
                }
            }
        }
    }
}
