//! Our `d…` directory beneath the shared subtree, taken under the subtree's flock, and the
//! clearing of the groups of daemons that died without stopping their agents.

use super::*;

/// Creates `<own>/sandbox-agent/<name>` and locks it; clears dead daemons' leftovers on the way.
/// The subtree's own flock serialises this between daemons starting side by side.
pub(super) fn claim(
    own: &Path,
    name: &str,
    version: Version,
    enable: &[&'static str],
) -> io::Result<Hierarchy> {
    let subtree = own.join(SUBTREE);
    let guard = lock_subtree(&subtree, version, enable)?;
    // Killing a dead daemon's agents waits for them to die (sleeps between rounds): that is done
    // on a thread of its own, not on the caller's (the runtime thread at start-up). A leftover
    // directory is claimed by its flock, so a second daemon clearing at the same time skips it.
    // The sweep takes the subtree's lock too, so it never runs while a daemon is between
    // creating its directory and locking it (below, under the same lock).
    let leftovers = subtree.clone();
    let controllers = enable.to_vec();
    let _ = std::thread::Builder::new()
        .name("cgroup-leftovers".into())
        .spawn(move || {
            if let Ok(_guard) = lock_subtree(&leftovers, version, &controllers) {
                clear_leftovers(&leftovers);
            }
        });
    let dir = subtree.join(name);
    fs::create_dir(&dir)?;
    if version == Version::V2 {
        enable_controllers(&dir, enable);
    }
    let lock = Flock::lock(File::open(&dir)?, FlockArg::LockExclusiveNonblock)
        .map_err(|(_, e)| io::Error::from(e))?;
    drop(guard);
    Ok(Hierarchy {
        version,
        controllers: enable.to_vec(),
        dir,
        _lock: lock,
    })
}

/// Creates `subtree` if needed and takes its flock. A daemon that stops removes the subtree when
/// it is empty (under the same lock), so after the lock is ours the directory is checked to be the
/// one on disk; if it was removed meanwhile, start over.
pub(super) fn lock_subtree(
    subtree: &Path,
    version: Version,
    enable: &[&'static str],
) -> io::Result<Flock<File>> {
    use std::os::unix::fs::MetadataExt;
    for _ in 0..20 {
        match fs::create_dir(subtree) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(e) => {
                return Err(io::Error::new(
                    e.kind(),
                    format!("create {}: {e}", subtree.display()),
                ));
            }
        }
        if version == Version::V2 {
            enable_controllers(subtree, enable);
        }
        let guard = match File::open(subtree) {
            Ok(f) => {
                Flock::lock(f, FlockArg::LockExclusive).map_err(|(_, e)| io::Error::from(e))?
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
            Err(e) => return Err(e),
        };
        let locked = guard.metadata()?.ino();
        if fs::metadata(subtree).is_ok_and(|m| m.ino() == locked) {
            return Ok(guard);
        }
    }
    Err(io::Error::other(format!(
        "{} keeps disappearing",
        subtree.display()
    )))
}

/// Kills and removes every `d…` directory whose daemon is gone (its flock can be taken).
pub(super) fn clear_leftovers(subtree: &Path) {
    let Ok(entries) = fs::read_dir(subtree) else {
        return;
    };
    for entry in entries.flatten() {
        let dir = entry.path();
        if !dir.is_dir() || !entry.file_name().to_string_lossy().starts_with('d') {
            continue;
        }
        let Ok(file) = File::open(&dir) else { continue };
        let Ok(_lock) = Flock::lock(file, FlockArg::LockExclusiveNonblock) else {
            continue; // a live daemon owns it
        };
        // A daemon starting beside us creates its directory, then locks it: in between, the
        // lock is free. A directory that is that young and holds no process is such a daemon's,
        // not a leftover (a real leftover with nothing in it is cleared by a later start).
        let young = entry
            .metadata()
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| t.elapsed().ok())
            .is_none_or(|age| age < std::time::Duration::from_secs(10));
        if young && !holds_processes(&dir) {
            continue;
        }
        let mut killed = 0;
        let mut groups = 0;
        for sub in fs::read_dir(&dir).into_iter().flatten().flatten() {
            let p = sub.path();
            if !p.is_dir() {
                continue;
            }
            groups += 1;
            let cg = AgentCgroup {
                dirs: vec![(p.clone(), Version::V1, Vec::new())],
            };
            let mut killed_here = 0;
            for _ in 0..200 {
                let n = cg.kill_all();
                killed_here += n;
                if cg.is_empty() {
                    break;
                }
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
            killed += killed_here;
            // Right after a kill the kernel may still be releasing the group: retry briefly. A
            // group that was already empty and cannot be removed is pinned (an unreaped zombie
            // of it elsewhere): retrying only holds the subtree's lock, and every daemon
            // starting meanwhile waits for it. A later start tries again.
            cg.remove_dirs_within(if killed_here > 0 { 50 } else { 1 });
        }
        let removed = fs::remove_dir(&dir).is_ok();
        tracing::warn!(
            dir = %dir.display(),
            agent_cgroups = groups,
            processes_killed = killed,
            removed,
            "cleared leftovers of a previous daemon that did not stop its agents"
        );
    }
}

/// True when `dir` or one of its child groups lists a process.
pub(super) fn holds_processes(dir: &Path) -> bool {
    let listed =
        |d: &Path| fs::read_to_string(d.join("cgroup.procs")).is_ok_and(|s| !s.trim().is_empty());
    listed(dir)
        || fs::read_dir(dir)
            .into_iter()
            .flatten()
            .flatten()
            .any(|e| e.path().is_dir() && listed(&e.path()))
}
