//! cgroups for agents, written by hand (a few files per group). Every group lives beneath the
//! daemon's own cgroup, in `<own>/sandbox-agent/d<pid>-<nonce>/a<n>-<serverId>`, never at a
//! hierarchy root. The daemon holds an flock on its `d…` directory for its whole life, so a later
//! daemon can tell leftovers of a dead one (lock free) from a live neighbour's (lock held).
//!
//! Where things are: this file is the daemon's setup (`Cgroups`: which hierarchies, our locked
//! `d…` directory, the per-agent groups it creates, the budget, the hand-off), `mounts.rs`
//! finding the hierarchies (v1 and v2) and our own group in them, `v2.rs` the v2 controller
//! delegation, `knobs.rs` writing and reading back the limit files, `leftovers.rs` the subtree's
//! lock and the clearing of dead daemons' groups, `agent.rs` one agent's groups (`AgentCgroup`), `handoff.rs` what a reload carries of them.

use std::collections::BTreeSet;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use nix::fcntl::{Flock, FlockArg};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

pub use super::limits::Applied;
use super::limits::Limits;
use crate::config::AgentCgroups as Mode;

mod agent;
mod handoff;
mod knobs;
mod leftovers;
mod mounts;
#[cfg(test)]
mod tests;
mod v2;

pub use agent::AgentCgroup;
pub use handoff::{CgroupDirState, CgroupsState};
use handoff::{controllers_from, dir_state};
use knobs::*;
use leftovers::*;
use mounts::*;
pub use mounts::{Mount, own_dir, own_path, parse_mountinfo};
use v2::*;

/// Name of the subtree every daemon creates beneath its own cgroup.
pub const SUBTREE: &str = "sandbox-agent";

/// The controllers we set limits with.
pub(super) const WANTED: [&str; 3] = ["memory", "pids", "cpu"];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Version {
    V1,
    V2,
}

/// One hierarchy the daemon uses, with its locked `d…` directory.
#[derive(Debug)]
struct Hierarchy {
    version: Version,
    /// The wanted controllers effective for groups we create here.
    controllers: Vec<&'static str>,
    dir: PathBuf,
    /// Holds the flock that marks `dir` as owned by a live daemon.
    _lock: Flock<File>,
}

/// The daemon's cgroup setup: zero hierarchies means "no cgroups, rlimits only".
#[derive(Debug)]
pub struct Cgroups {
    hierarchies: Vec<Hierarchy>,
    next: AtomicU64,
    /// `remove_own` ran: a second call (the supervisor's drop) has nothing to do and must not
    /// take the blocking flock again.
    removed: AtomicBool,
}

impl Cgroups {
    /// No cgroups at all.
    pub fn none() -> Self {
        Cgroups {
            hierarchies: Vec::new(),
            next: AtomicU64::new(1),
            removed: AtomicBool::new(false),
        }
    }

    pub fn enabled(&self) -> bool {
        !self.hierarchies.is_empty()
    }

    /// Finds the hierarchies, creates our subtree beneath our own cgroup, clears leftovers of
    /// daemons that died without stopping their agents, and logs what limits can be enforced.
    pub fn setup(mode: Mode) -> Self {
        if mode == Mode::Off {
            tracing::info!("cgroups disabled by configuration; agent limits use rlimits only");
            return Self::none();
        }
        let mounts = fs::read_to_string("/proc/self/mountinfo")
            .map(|t| parse_mountinfo(&t))
            .unwrap_or_default();
        let own = fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
        let v1: Vec<&Mount> = mounts
            .iter()
            .filter(|m| {
                m.version == Version::V1 && WANTED.iter().any(|c| m.options.iter().any(|o| o == c))
            })
            .collect();
        let v2 = mounts.iter().find(|m| m.version == Version::V2);
        let use_v1 = match mode {
            Mode::V1 => true,
            Mode::V2 => false,
            _ => !v1.is_empty(),
        };
        let nonce = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64 & 0xffff_ffff)
            .unwrap_or(0);
        let name = format!("d{}-{nonce:08x}", std::process::id());
        let mut hierarchies = Vec::new();
        let mut problems = Vec::new();
        if use_v1 {
            for (m, controllers, path) in distinct_v1(&v1, &own) {
                match claim(&own_dir(m, &path), &name, Version::V1, &[]) {
                    Ok(h) => hierarchies.push(Hierarchy { controllers, ..h }),
                    Err(e) => problems.push(format!("{}: {e}", m.point.display())),
                }
            }
        } else if let Some(m) = v2
            && let Some(path) = own_path(&own, Version::V2, "")
        {
            let own_dir = own_dir(m, &path);
            match setup_v2(&own_dir, &name) {
                Ok(h) => hierarchies.push(h),
                Err(e) => problems.push(format!("{}: {e}", m.point.display())),
            }
        }
        if hierarchies.is_empty() {
            let why = if problems.is_empty() {
                "no cgroup hierarchy found".to_string()
            } else {
                problems.join("; ")
            };
            tracing::warn!(
                reason = why,
                "cgroups are not writable; agents run without cgroups (memory capped per process with RLIMIT_DATA, no pids or cpu limit, setsid escapees cannot be tracked)"
            );
            return Self::none();
        }
        for p in &problems {
            tracing::warn!(problem = p, "a cgroup hierarchy is not usable");
        }
        let effective: BTreeSet<&str> = hierarchies
            .iter()
            .flat_map(|h| h.controllers.iter().copied())
            .collect();
        for c in WANTED {
            if !effective.contains(c) {
                tracing::warn!(
                    controller = c,
                    "cgroup controller not available to us; its limit is not enforced"
                );
            }
        }
        tracing::info!(
            version = if hierarchies[0].version == Version::V1 { "v1" } else { "v2" },
            dirs = ?hierarchies.iter().map(|h| h.dir.display().to_string()).collect::<Vec<_>>(),
            controllers = ?effective,
            "agent cgroups ready"
        );
        Cgroups {
            hierarchies,
            next: AtomicU64::new(1),
            removed: AtomicBool::new(false),
        }
    }

    /// Creates the agent's groups and writes its limits, reading each back.
    pub fn create(&self, server_id: &str, limits: &Limits) -> io::Result<(AgentCgroup, Applied)> {
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        let label: String = server_id
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                    c
                } else {
                    '_'
                }
            })
            .take(64)
            .collect();
        let name = format!("a{n}-{label}");
        let mut dirs = Vec::new();
        let mut applied = Applied::default();
        for h in &self.hierarchies {
            let dir = h.dir.join(&name);
            if let Err(e) = fs::create_dir(&dir) {
                let cg = AgentCgroup { dirs };
                cg.remove_dirs();
                return Err(io::Error::new(
                    e.kind(),
                    format!("create {}: {e}", dir.display()),
                ));
            }
            for c in &h.controllers {
                let ok = match *c {
                    "memory" => set_memory(&dir, h.version, limits.memory_max),
                    "pids" => set_pids(&dir, limits.pids_max),
                    "cpu" => set_cpu(&dir, h.version, limits.cpu_max),
                    _ => true,
                };
                match *c {
                    "memory" => applied.memory |= ok,
                    "pids" => applied.pids |= ok,
                    _ => applied.cpu |= ok,
                }
            }
            dirs.push((dir, h.version, h.controllers.clone()));
        }
        Ok((AgentCgroup { dirs }, applied))
    }

    /// Applies the budget of all agents together (`--agents-memory-max`, `--agents-pids-max`) to
    /// our `d…` directories, which every agent group is beneath, reading each limit back. Logs
    /// what holds and, clearly, what does not (not writable, controller missing, v1 memory
    /// without hierarchy); agents run either way.
    pub fn apply_budget(&self, memory: Option<u64>, pids: Option<u64>) {
        if memory.is_none() && pids.is_none() {
            return;
        }
        if self.hierarchies.is_empty() {
            tracing::warn!(
                memory_max = memory,
                pids_max = pids,
                "the budget of all agents together is NOT enforced: agents run without cgroups"
            );
            return;
        }
        let mut memory_ok = memory.is_none();
        let mut pids_ok = pids.is_none();
        for h in &self.hierarchies {
            if memory.is_some() && h.controllers.contains(&"memory") {
                if h.version == Version::V1 {
                    // Before any child exists; always 1 on kernels from 5.16 on.
                    let _ = write_file(&h.dir.join("memory.use_hierarchy"), "1");
                    let hier = read_u64(&h.dir.join("memory.use_hierarchy"));
                    if hier == Some(1) {
                        memory_ok |= set_memory(&h.dir, h.version, memory);
                    }
                } else {
                    memory_ok |= set_memory(&h.dir, h.version, memory);
                }
            }
            if pids.is_some() && h.controllers.contains(&"pids") {
                pids_ok |= set_pids(&h.dir, pids);
            }
        }
        let dirs: Vec<String> = self
            .hierarchies
            .iter()
            .map(|h| h.dir.display().to_string())
            .collect();
        if memory_ok && pids_ok {
            tracing::info!(
                memory_max = memory,
                pids_max = pids,
                ?dirs,
                "budget of all agents together enforced by their parent cgroup"
            );
        } else {
            tracing::warn!(
                memory_max = memory,
                pids_max = pids,
                memory_enforced = memory_ok,
                pids_enforced = pids_ok,
                ?dirs,
                "the budget of all agents together is NOT fully enforced (controller missing or not writable)"
            );
        }
    }

    /// Best-effort removal of our own `d…` directories (at shutdown, once every agent is gone).
    /// The shared `sandbox-agent` directory goes too when no other daemon uses it, so nothing
    /// of ours is left in a cgroup someone else may want to remove.
    pub fn remove_own(&self) {
        if self.removed.swap(true, Ordering::AcqRel) {
            return;
        }
        for h in &self.hierarchies {
            if let Err(e) = fs::remove_dir(&h.dir)
                && e.kind() != io::ErrorKind::NotFound
            {
                tracing::debug!(dir = %h.dir.display(), error = %e, "cgroup not removed");
                continue;
            }
            let Some(subtree) = h.dir.parent() else {
                continue;
            };
            if let Ok(f) = File::open(subtree)
                && let Ok(_guard) = Flock::lock(f, FlockArg::LockExclusive)
            {
                // Fails (busy) while another daemon's directory is in it; that is fine.
                let _ = fs::remove_dir(subtree);
            }
        }
    }

    /// The hand-off state of the daemon's own directories; `keep` receives a duplicate of each
    /// flock's descriptor, which holds the lock across the exec.
    pub fn handoff_state(&self, keep: &mut Vec<std::os::fd::OwnedFd>) -> io::Result<CgroupsState> {
        use std::os::fd::{AsFd, AsRawFd};
        let mut dirs = Vec::new();
        for h in &self.hierarchies {
            let dup = h._lock.as_fd().try_clone_to_owned()?;
            let n = dup.as_raw_fd();
            keep.push(dup);
            dirs.push(dir_state(&h.dir, h.version, &h.controllers, Some(n)));
        }
        Ok(CgroupsState {
            dirs,
            next: self.next.load(Ordering::Relaxed),
        })
    }

    /// The previous image's directories, taken over with their flocks (`locks`, in the order of
    /// `state.dirs`); no leftovers are cleared (ours are locked, by us).
    pub fn adopt(state: &CgroupsState, locks: Vec<std::os::fd::OwnedFd>) -> io::Result<Self> {
        let mut hierarchies = Vec::new();
        for (d, fd) in state.dirs.iter().zip(locks) {
            let lock = Flock::lock(File::from(fd), FlockArg::LockExclusiveNonblock)
                .map_err(|(_, e)| io::Error::from(e))?;
            hierarchies.push(Hierarchy {
                version: if d.v2 { Version::V2 } else { Version::V1 },
                controllers: controllers_from(&d.controllers),
                dir: d.dir.clone(),
                _lock: lock,
            });
        }
        tracing::info!(
            dirs = ?hierarchies.iter().map(|h| h.dir.display().to_string()).collect::<Vec<_>>(),
            "agent cgroups taken over from the previous image"
        );
        Ok(Cgroups {
            hierarchies,
            next: AtomicU64::new(state.next.max(1)),
            removed: AtomicBool::new(false),
        })
    }

    /// The daemon's `d…` directories (for the emergency kill).
    pub fn own_dirs(&self) -> Vec<PathBuf> {
        self.hierarchies.iter().map(|h| h.dir.clone()).collect()
    }
}

/// Kills everything in every agent group beneath our `d…` directories (emergency exit).
pub fn kill_beneath(dirs: &[PathBuf]) {
    for d in dirs {
        for sub in fs::read_dir(d).into_iter().flatten().flatten() {
            let cg = AgentCgroup {
                dirs: vec![(sub.path(), Version::V1, Vec::new())],
            };
            let _ = write_file(&sub.path().join("cgroup.kill"), "1");
            cg.kill_all();
        }
    }
}

/// Reads `key N` out of a flat keyed file (`memory.events`, `memory.oom_control`).
pub fn parse_keyed(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|l| {
        let (k, v) = l.split_once(' ')?;
        (k == key).then(|| v.trim().parse().ok()).flatten()
    })
}
