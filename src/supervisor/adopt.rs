//! The supervisor's part of an in-place reload (`daemon/reload.rs`): what of its children and
//! cgroups is written into the hand-off, and how the new image takes them over. A child keeps
//! its pid across the exec (the daemon's pid does not change, so it is still our child), its
//! process group, session, cgroup and pipes; only the bookkeeping is rebuilt here.

use std::os::fd::{AsFd, OwnedFd};

use tokio::process::ChildStderr;

use super::cgroup::{AgentCgroup, CgroupDirState, CgroupsState};
use super::stderr::{Fields, Tail};
use super::{ChildHandle, Supervisor};

/// One child in a hand-off: what the new image needs to control it.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, PartialEq)]
pub struct ChildState {
    pub pid: u32,
    pub server_id: String,
    pub agent: String,
    pub cgroup: Vec<CgroupDirState>,
    /// The stderr pipe when the supervisor logs it (agents); its descriptor number.
    pub stderr_fd: Option<i32>,
    /// The last bytes of stderr (what `stderrTail` shows).
    pub stderr_tail: String,
}

impl ChildHandle {
    /// This child's entry for a hand-off. `keep` receives the descriptors that must survive
    /// the exec (a duplicate of the stderr pipe's read end, when the supervisor logs it).
    pub fn handoff_state(&self, keep: &mut Vec<OwnedFd>) -> std::io::Result<ChildState> {
        let stderr_fd = match &*crate::sys::lock(&self.inner.stderr_dup) {
            Some(fd) => {
                let dup = fd.as_fd().try_clone_to_owned()?;
                let n = std::os::fd::AsRawFd::as_raw_fd(&dup);
                keep.push(dup);
                Some(n)
            }
            None => None,
        };
        Ok(ChildState {
            pid: self.inner.pid,
            server_id: self.inner.server_id.clone(),
            agent: self.inner.agent.clone(),
            cgroup: self
                .inner
                .cgroup
                .as_ref()
                .map(AgentCgroup::handoff_state)
                .unwrap_or_default(),
            stderr_fd,
            stderr_tail: crate::sys::lock(&self.inner.stderr_tail).text(super::STDERR_TAIL_BYTES),
        })
    }
}

impl Supervisor {
    /// The supervisor of a new image after a reload: the previous image's cgroups (with their
    /// flocks, `locks` in the order of `state.dirs`), the configuration's limits and environment.
    pub fn adopting(
        config: &crate::config::Config,
        state: &CgroupsState,
        locks: Vec<OwnedFd>,
    ) -> std::io::Result<Self> {
        let cgroups = if state.dirs.is_empty() {
            super::cgroup::Cgroups::setup(config.agent_cgroups)
        } else {
            super::cgroup::Cgroups::adopt(state, locks)?
        };
        Ok(Self::with_cgroups(config, cgroups))
    }

    /// The cgroups part of a hand-off; `keep` receives duplicates of the flock descriptors.
    pub fn handoff_cgroups(&self, keep: &mut Vec<OwnedFd>) -> std::io::Result<CgroupsState> {
        self.cgroups.handoff_state(keep)
    }

    /// Kills every live child whose pid is not in `carried` and waits (at most `within`) until
    /// each has ended and been reaped: after the exec nobody would own it (e.g. a `run` of the
    /// process API still going at the end of a reload's drain).
    pub async fn kill_uncarried(&self, carried: &[u32], within: std::time::Duration) {
        let doomed: Vec<ChildHandle> = self
            .live()
            .into_iter()
            .filter(|h| !carried.contains(&h.pid()))
            .collect();
        for h in &doomed {
            tracing::warn!(
                server_id = h.server_id(),
                agent = h.agent(),
                pid = h.pid(),
                "not carried across the reload: killing it"
            );
        }
        let kills = futures_util::future::join_all(doomed.iter().map(|h| h.kill()));
        let _ = tokio::time::timeout(within, kills).await;
    }

    /// Kills, reaps and removes the warm stubs (a reload drops them; the new image makes new
    /// ones): a stub left running would become a child nobody reaps after the exec.
    pub async fn close_warm(&self) {
        if let Some(pool) = &self.warm {
            pool.close().await;
        }
    }

    /// Takes over a child the previous image started (same pid: it is still our child). Its
    /// exit is watched through a pidfd, as for a child started here; `stderr` is its stderr
    /// pipe's read end when the supervisor logged it.
    pub fn adopt(
        &self,
        state: &ChildState,
        stderr: Option<OwnedFd>,
    ) -> std::io::Result<ChildHandle> {
        let pid = state.pid;
        let pidfd = crate::sys::pidfd(pid)?;
        let cgroup = if state.cgroup.is_empty() {
            None
        } else {
            Some(AgentCgroup::adopt(&state.cgroup))
        };
        let mut tail = Tail::default();
        tail.push(state.stderr_tail.as_bytes());
        let logged = match stderr {
            Some(fd) => Some(ChildStderr::from_std(std::process::ChildStderr::from(fd))?),
            None => None,
        };
        let who = Fields {
            server_id: state.server_id.clone(),
            agent: state.agent.clone(),
            pid,
        };
        let watch = super::spawn::ExitWatch::Pidfd {
            fd: pidfd,
            kept: None,
        };
        Ok(super::spawn::supervise(
            self, who, cgroup, tail, logged, watch,
        ))
    }

    /// Whether a handle of the live set has this pid (an adopted child).
    pub fn is_live(&self, pid: u32) -> bool {
        self.live().iter().any(|h| h.pid() == pid)
    }

    /// A child of the hand-off that the new image could not take over: nobody would own it, so
    /// its process group is killed and its top process reaped (its pid cannot have been reused:
    /// the reload held every reap, so it is still our unreaped child).
    pub fn discard_unadopted(&self, state: &ChildState) {
        use nix::sys::signal::{Signal, kill, killpg};
        let Ok(raw) = i32::try_from(state.pid) else {
            return;
        };
        let pid = nix::unistd::Pid::from_raw(raw);
        let _ = killpg(pid, Signal::SIGKILL);
        let _ = kill(pid, Signal::SIGKILL);
        tracing::warn!(server_id = %state.server_id, agent = %state.agent, pid = state.pid,
            "killed a child the reload could not take over");
        let _ = std::thread::Builder::new()
            .name("reap-unadopted".into())
            .spawn(move || {
                let _ = nix::sys::wait::waitpid(pid, None);
            });
    }
}
