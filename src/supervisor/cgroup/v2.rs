//! v2 only: delegating the wanted controllers beneath our own group.

use super::*;

/// v2: makes the wanted controllers available beneath `own`, respecting "no internal
/// processes": if our group holds only us (and our own init parent, when we run as PID 1's
/// child), those move into the leaf `<own>/sandbox-agent.daemon` first.
pub(super) fn setup_v2(own: &Path, name: &str) -> io::Result<Hierarchy> {
    let available = read_words(&own.join("cgroup.controllers"));
    let wanted: Vec<&'static str> = WANTED
        .iter()
        .copied()
        .filter(|c| available.iter().any(|a| a == c))
        .collect();
    let missing = enable_controllers(own, &wanted);
    if !missing.is_empty()
        && let Some(ours) = only_ours(own)
    {
        let leaf = own.join(format!("{SUBTREE}.daemon"));
        match fs::create_dir(&leaf) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(e),
        }
        for pid in &ours {
            if let Err(e) = write_file(&leaf.join("cgroup.procs"), pid) {
                tracing::warn!(pid, leaf = %leaf.display(), error = %e, "cannot move into the leaf cgroup");
            }
        }
        tracing::info!(leaf = %leaf.display(), "moved the daemon into a leaf cgroup so agent groups can have controllers");
        enable_controllers(own, &wanted);
    }
    let enabled = read_words(&own.join("cgroup.subtree_control"));
    let effective: Vec<&'static str> = wanted
        .into_iter()
        .filter(|c| enabled.iter().any(|e| e == c))
        .collect();
    claim(own, name, Version::V2, &effective)
}

/// The processes of `dir` when every one is us or our parent running the same executable (our
/// own init); `None` when anyone else is there (they are not ours to move).
pub(super) fn only_ours(dir: &Path) -> Option<Vec<String>> {
    let me = std::process::id().to_string();
    let parent = nix::unistd::getppid().to_string();
    let exe = |pid: &str| fs::read_link(format!("/proc/{pid}/exe")).ok();
    let procs = read_words(&dir.join("cgroup.procs"));
    let ours = procs
        .iter()
        .all(|p| *p == me || (*p == parent && exe(p).is_some() && exe(p) == exe(&me)));
    ours.then_some(procs)
}

/// Writes `+c` for each controller to `dir/cgroup.subtree_control`; returns those that failed.
pub(super) fn enable_controllers(dir: &Path, controllers: &[&'static str]) -> Vec<&'static str> {
    let path = dir.join("cgroup.subtree_control");
    controllers
        .iter()
        .copied()
        .filter(|c| write_file(&path, &format!("+{c}")).is_err())
        .collect()
}
