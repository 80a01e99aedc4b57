//! The staging directory every install is built in, renamed into place only when complete.

use std::path::{Path, PathBuf};

/// A fresh directory inside `agent_dir` that is removed on drop unless `keep` was called.
pub struct Staging {
    pub path: PathBuf,
    keep: bool,
}

impl Staging {
    pub fn new(agent_dir: &Path) -> std::io::Result<Staging> {
        std::fs::create_dir_all(agent_dir)?;
        let path = agent_dir.join(format!(".staging-{}-{}", std::process::id(), nonce()));
        std::fs::create_dir(&path)?;
        Ok(Staging { path, keep: false })
    }

    /// [`Self::new`] on the blocking pool.
    pub async fn new_async(agent_dir: &Path) -> std::io::Result<Staging> {
        let dir = agent_dir.to_path_buf();
        tokio::task::spawn_blocking(move || Staging::new(&dir))
            .await
            .map_err(std::io::Error::other)?
    }

    /// [`Self::commit`] on the blocking pool (renames and the removal of an older tree).
    pub async fn commit_async(&mut self, final_dir: &Path) -> std::io::Result<()> {
        let (staged, final_dir) = (self.path.clone(), final_dir.to_path_buf());
        tokio::task::spawn_blocking(move || commit_tree(&staged, &final_dir))
            .await
            .map_err(std::io::Error::other)??;
        self.keep = true;
        Ok(())
    }

    /// Removes the staging directory now (on the blocking pool) and waits for it, so that a
    /// failed install has left nothing behind by the time it is reported.
    pub async fn discard(mut self) {
        if self.keep {
            return;
        }
        self.keep = true;
        let path = std::mem::take(&mut self.path);
        let _ = tokio::task::spawn_blocking(move || crate::files::remove_dir_all(&path)).await;
    }

    /// Moves the staging directory to `final_dir` (replacing an older install of the same
    /// version): after this returns, `final_dir` is complete or untouched.
    pub fn commit(mut self, final_dir: &Path) -> std::io::Result<()> {
        commit_tree(&self.path, final_dir)?;
        self.keep = true;
        Ok(())
    }
}

/// Renames `staged` to `final_dir`, replacing (then removing) an older tree there.
pub(super) fn commit_tree(staged: &Path, final_dir: &Path) -> std::io::Result<()> {
    {
        let parent = final_dir.parent().unwrap_or(Path::new("/"));
        let old = parent.join(format!(".old-{}-{}", std::process::id(), nonce()));
        let had_old = match std::fs::rename(final_dir, &old) {
            Ok(()) => true,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => false,
            Err(e) => return Err(e),
        };
        if let Err(e) = std::fs::rename(staged, final_dir) {
            if had_old {
                let _ = std::fs::rename(&old, final_dir);
            }
            return Err(e);
        }
        if had_old {
            let _ = crate::files::remove_dir_all(&old);
        }
        Ok(())
    }
}

impl Drop for Staging {
    fn drop(&mut self) {
        if !self.keep {
            remove_tree_off_thread(std::mem::take(&mut self.path));
        }
    }
}

/// Removes a tree, on the blocking pool when called from inside a runtime (a `Drop` on the
/// runtime thread must not walk a directory tree), inline otherwise.
pub(super) fn remove_tree_off_thread(path: PathBuf) {
    if path.as_os_str().is_empty() {
        return;
    }
    match tokio::runtime::Handle::try_current() {
        Ok(h) => {
            h.spawn_blocking(move || {
                let _ = crate::files::remove_dir_all(&path);
            });
        }
        Err(_) => {
            let _ = crate::files::remove_dir_all(&path);
        }
    }
}

pub(super) fn nonce() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos() as u64)
        .unwrap_or(0);
    t ^ (N.fetch_add(1, Ordering::Relaxed) << 32)
}

pub fn now_secs() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}
