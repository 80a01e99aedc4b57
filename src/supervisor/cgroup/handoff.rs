//! What of the cgroups a reload's hand-off carries (the daemon's own directories with their
//! locks, each agent's groups), in the shapes the hand-off stores; `supervisor/adopt.rs` writes
//! and reads them.

use std::path::PathBuf;

use super::Version;

/// One of the daemon's own `d<pid>-<nonce>` cgroup directories, with the descriptor that holds
/// its flock (kept open across the exec, so no other daemon ever sees it unlocked).
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, PartialEq)]
pub struct CgroupDirState {
    pub dir: PathBuf,
    pub v2: bool,
    pub controllers: Vec<String>,
    /// The flock's descriptor number (not close-on-exec), for the own directories only.
    pub lock_fd: Option<i32>,
}

/// The supervisor's cgroups in a hand-off.
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize, PartialEq)]
pub struct CgroupsState {
    pub dirs: Vec<CgroupDirState>,
    /// The next agent group's number (names stay unique across reloads).
    pub next: u64,
}

pub(super) fn controllers_from(names: &[String]) -> Vec<&'static str> {
    super::WANTED
        .iter()
        .copied()
        .filter(|c| names.iter().any(|n| n == c))
        .collect()
}

pub(super) fn dir_state(
    dir: &std::path::Path,
    version: Version,
    controllers: &[&'static str],
    lock_fd: Option<i32>,
) -> CgroupDirState {
    CgroupDirState {
        dir: dir.to_path_buf(),
        v2: version == Version::V2,
        controllers: controllers.iter().map(|c| c.to_string()).collect(),
        lock_fd,
    }
}
