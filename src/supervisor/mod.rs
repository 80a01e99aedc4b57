//! Every child process the daemon owns: spawning agents in their own session (process group) and
//! cgroup, keeping their stderr apart from the protocol channel, stopping whole process trees,
//! reaping. Knows nothing of ACP. Only this module spawns, signals or waits on processes.
//!
//! **Invariant:** once an `AgentProcess` exists, its whole tree is stopped by `ChildHandle::stop`,
//! by its own exit (the rest of its tree is killed), or by the daemon's shutdown, and nothing of
//! it outlives the daemon's stop; the exit is published only once the tree is gone.
//!
//! This file (~1,025 lines) holds the types every part of the supervisor shares and the one
//! place the invariant above is kept: `ChildHandle`'s stop, the top process's exit and the tree
//! kill behind it, and the supervisor's registry; spawning, adoption, cgroups, limits, stderr and
//! the warm pool are the modules below.

mod adopt;
mod blocking;
mod cgroup;
mod limits;
mod spawn;
mod stats;
mod stderr;
mod tool;
mod warm;

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use std::os::fd::OwnedFd;

use nix::sys::signal::{Signal, kill, killpg};
use nix::unistd::Pid;
use tokio::process::{ChildStderr, ChildStdin, ChildStdout};
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::task::TaskTracker;

use crate::config::Config;

pub use adopt::ChildState;
pub use cgroup::{CgroupDirState, CgroupsState};
pub use limits::Limits;
pub use stats::{GroupScan, read_stat};
pub use stderr::TAIL_BYTES as STDERR_TAIL_BYTES;
pub use tool::{ToolError, run_capped, run_to_completion};
pub use warm::stub_main;

/// What to run, and the labels its log lines carry.
#[derive(Debug, Clone)]
pub struct SpawnSpec {
    pub program: PathBuf,
    pub args: Vec<OsString>,
    /// Added on top of the daemon's filtered environment (`Config::agent_base_env`) and the
    /// configured extra variables (`--agent-env`); may set HOME and TMPDIR per agent.
    pub env: Vec<(OsString, OsString)>,
    pub cwd: PathBuf,
    /// The child's name in the daemon's logs (field `server_id`): an agent's serverId, or a
    /// process id of `/v1/processes`.
    pub name: String,
    /// What it is (field `agent`): the agent id, or `process:<program>`.
    pub agent: String,
}

#[derive(Debug, thiserror::Error)]
pub enum SpawnError {
    #[error("cannot start {program}: {source}")]
    Exec {
        program: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// How an agent ended (also in the state dir and the reload hand-off).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ExitReason {
    /// Ended by itself; `code` is set.
    Exited,
    /// Killed by a signal it did not get from us; `signal` is set.
    Crashed,
    /// Killed by the memory limit.
    Oom,
    /// Stopped by us and gone within the grace period.
    Graceful,
    /// Stopped by us; SIGKILL was needed.
    Forced,
    /// Known only from the state dir: the daemon itself was restarted (or crashed) while it
    /// ran, and the process went with it (`--state-dir`).
    #[serde(rename = "daemon_restart")]
    DaemonRestart,
}

impl ExitReason {
    pub fn as_str(self) -> &'static str {
        match self {
            ExitReason::Exited => "exited",
            ExitReason::Crashed => "crashed",
            ExitReason::Oom => "oom",
            ExitReason::Graceful => "graceful",
            ExitReason::Forced => "forced",
            ExitReason::DaemonRestart => "daemon_restart",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ExitInfo {
    pub reason: ExitReason,
    pub code: Option<i32>,
    pub signal: Option<i32>,
}

/// Process figures for the listing, summed over the agent's processes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ProcessStats {
    pub rss_bytes: u64,
    pub cpu_ms: u64,
    pub processes: u64,
    pub open_fds: u64,
}

/// A freshly spawned agent: its pipes (taken by the caller) and a handle to control it.
pub struct AgentProcess {
    pub stdin: ChildStdin,
    pub stdout: ChildStdout,
    pub handle: ChildHandle,
}

/// How a child's standard streams are connected.
#[derive(Debug)]
pub enum ChildStdio {
    /// stdin and stdout piped to the caller; stderr logged line by line with its tail kept
    /// (what agents get).
    Pipes,
    /// stdin, stdout and stderr all piped to the caller; nothing is logged or kept here.
    AllPipes,
    /// All three on this terminal (the slave side of a pseudo-terminal), which becomes the
    /// controlling terminal of the child's new session.
    Terminal(OwnedFd),
}

/// A freshly spawned child: whichever pipes its `ChildStdio` made, and its handle.
pub struct Spawned {
    pub stdin: Option<ChildStdin>,
    pub stdout: Option<ChildStdout>,
    pub stderr: Option<ChildStderr>,
    pub handle: ChildHandle,
}

/// Who ends the agent's life: set once, under the lock, by whoever comes first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Running,
    /// `stop` was called; it does the clean-up and publishes.
    Stopping,
    /// The top process ended by itself; the reaper does the clean-up and publishes.
    SelfExit,
}

/// The top process's raw wait status: (exit code, signal).
type RawStatus = (Option<i32>, Option<i32>);

struct HandleInner {
    pid: u32,
    server_id: String,
    agent: String,
    cgroup: Option<cgroup::AgentCgroup>,
    status: watch::Receiver<Option<RawStatus>>,
    exit: watch::Sender<Option<ExitInfo>>,
    phase: Mutex<Phase>,
    stderr_tail: Arc<Mutex<stderr::Tail>>,
    /// Awaited (bounded) before the exit is published, so the tail holds the last words.
    stderr_reader: Mutex<Option<tokio::task::JoinHandle<()>>>,
    /// A duplicate of the stderr pipe's read end while the reader above owns the pipe, for a
    /// reload's hand-off.
    stderr_dup: Mutex<Option<OwnedFd>>,
    /// The owning supervisor's live set (this entry is removed on publish).
    registry: Registry,
    /// Where the removal of the (empty) cgroup runs after the exit is published; the
    /// supervisor's shutdown waits for it.
    removals: TaskTracker,
    /// The supervisor's: runs the blocking work of starts and stops on its own bounded threads
    /// and shares the stops' `/proc` scans.
    blocking: Arc<blocking::Blocking>,
    /// The top process until it is reaped; see `Leader`.
    leader: Mutex<Leader>,
    /// The supervisor's: while on (a reload is executing), nothing is reaped.
    reap_hold: Arc<ReapHold>,
}

/// The top process (the group leader) and whether it has been reaped. Until it is, its pid —
/// and so the process group id — cannot be given to another process (an exited leader is a
/// zombie that still holds it), so `killpg` can only reach our own processes. It is reaped
/// last, when the exit is published, after every signal of the stop; each `killpg` is sent
/// under this lock, so a signal and the reap never interleave, whatever thread runs them.
/// (Without pidfds, before Linux 5.3, tokio's `wait` reaps at exit and `reaped` follows a
/// moment later: the old, narrower window.)
struct Leader {
    /// Kept only to reap it with `try_wait`; `None` once reaped or when tokio's `wait` owns it.
    child: Option<tokio::process::Child>,
    reaped: bool,
    /// Started by the previous image (a reload): no tokio `Child`; reaped with `waitpid`.
    adopted: bool,
}

/// Cheap to clone; every clone controls the same process tree.
#[derive(Clone)]
pub struct ChildHandle {
    inner: Arc<HandleInner>,
}

/// A reload's hold on reaping: while `on`, an ended child is left a zombie (its pid in `held`).
#[derive(Default)]
struct ReapHold {
    on: AtomicBool,
    held: Mutex<Vec<u32>>,
}

/// Agents whose exit is not yet published, by pid.
type Registry = Arc<Mutex<BTreeMap<u32, ChildHandle>>>;

impl ChildHandle {
    pub fn pid(&self) -> u32 {
        self.inner.pid
    }

    pub fn server_id(&self) -> &str {
        &self.inner.server_id
    }

    pub fn agent(&self) -> &str {
        &self.inner.agent
    }

    /// The agent's cgroup directory (the one its processes are listed from), if it has one.
    pub fn cgroup_path(&self) -> Option<&Path> {
        self.inner.cgroup.as_ref().and_then(|c| c.path())
    }

    /// How it ended, once it has (and its whole tree is gone).
    pub fn exit(&self) -> Option<ExitInfo> {
        self.inner.exit.borrow().clone()
    }

    /// Resolves when the agent has ended and its process group and cgroup have been cleared.
    pub async fn wait(&self) -> ExitInfo {
        let mut rx = self.inner.exit.subscribe();
        loop {
            if let Some(info) = rx.borrow_and_update().clone() {
                return info;
            }
            // The sender lives in `inner`, which we hold: `changed` cannot fail.
            let _ = rx.changed().await;
        }
    }

    /// TERM to the process group, up to `grace` for the whole tree to go, then KILL the group and
    /// everything left in the cgroup; returns how it ended. Idempotent. The stop runs in its own
    /// task, so it completes even if the caller stops waiting.
    pub async fn stop(&self, grace: Duration) -> ExitInfo {
        self.end(grace, true).await
    }

    /// KILL the whole tree at once (no TERM first); returns how it ended. Idempotent; a stop
    /// already under way goes on as it was.
    pub async fn kill(&self) -> ExitInfo {
        self.end(Duration::ZERO, false).await
    }

    /// Sends `signal` to the process group while the process runs (nothing once it has ended).
    pub fn signal_group(&self, signal: Signal) {
        if self.exit().is_none() && self.inner.status.borrow().is_none() {
            self.inner.killpg_unless_reaped(signal);
        }
    }

    /// KILL the whole tree without waiting, for paths that cannot await (a drop): the group gets
    /// SIGKILL at once, so the child cannot outlive a runtime that is shutting down; the rest
    /// (reaping, what is left in the cgroup, the exit) follows in a task as for `kill`.
    pub fn kill_detached(&self) {
        let first = {
            let mut phase = crate::sys::lock(&self.inner.phase);
            let first = *phase == Phase::Running;
            if first {
                *phase = Phase::Stopping;
            }
            first
        };
        if first {
            self.inner.killpg_unless_reaped(Signal::SIGKILL);
            if let Ok(rt) = tokio::runtime::Handle::try_current() {
                rt.spawn(self.inner.clone().run_stop(Duration::ZERO, false));
            }
        }
    }

    async fn end(&self, grace: Duration, term: bool) -> ExitInfo {
        let first = {
            let mut phase = crate::sys::lock(&self.inner.phase);
            if *phase == Phase::Running {
                *phase = Phase::Stopping;
                true
            } else {
                false
            }
        };
        if first {
            tokio::spawn(self.inner.clone().run_stop(grace, term));
        }
        self.wait().await
    }

    /// The last bytes the agent wrote to stderr (at most 64 KiB are kept).
    pub fn stderr_tail(&self) -> String {
        self.stderr_excerpt(STDERR_TAIL_BYTES)
    }

    /// At most `max` bytes of the end of stderr, starting at a line start when one is in reach
    /// (for error bodies: "the last few KiB").
    pub fn stderr_excerpt(&self, max: usize) -> String {
        let text = self
            .inner
            .stderr_tail
            .lock()
            .expect("stderr lock")
            .text(max);
        match text.find('\n') {
            Some(i) if i + 1 < text.len() && text.len() >= max => text[i + 1..].to_string(),
            _ => text,
        }
    }

    /// rss, cpu time, process count and open fds of the agent's processes (its cgroup, or its
    /// process group without one). Zero once it has ended. Blocking (reads `/proc`): call it on
    /// the blocking pool. (The daemon itself always asks through `stats_in`.)
    #[cfg(test)]
    pub fn stats(&self) -> ProcessStats {
        self.stats_in(&mut GroupScan::default())
    }

    /// `stats`, finding a process group (no cgroup) in `scan`, which a listing shares among
    /// its agents so that `/proc` is scanned once per listing.
    pub fn stats_in(&self, scan: &mut GroupScan) -> ProcessStats {
        if self.exit().is_some() {
            return ProcessStats::default();
        }
        let pids = match &self.inner.cgroup {
            Some(cg) => cg.tracked_pids(),
            None => scan.members(self.inner.pid as i32),
        };
        stats::collect(&pids)
    }
}

impl HandleInner {
    fn pgid(&self) -> Pid {
        Pid::from_raw(self.pid as i32)
    }

    fn leader(&self) -> std::sync::MutexGuard<'_, Leader> {
        crate::sys::lock(&self.leader)
    }

    /// `killpg(sig)` if the top process is not reaped yet (see `Leader`); false when it is, and
    /// the id may already name a stranger's group, so nothing was sent.
    fn killpg_unless_reaped(&self, sig: Signal) -> bool {
        let leader = self.leader();
        if leader.reaped {
            return false;
        }
        let _ = killpg(self.pgid(), sig);
        true
    }

    /// Reaps the top process (it has exited: its status is known). Called once, on publish.
    fn reap(&self) {
        let mut leader = self.leader();
        if self.reap_hold.on.load(Ordering::Acquire) {
            crate::sys::lock(&self.reap_hold.held).push(self.pid);
            // A reload is executing: the zombie stays for the new image, which adopted this
            // pid and sees the exit through its own pidfd. Nothing is signalled from here on.
            if let Some(child) = leader.child.take() {
                std::mem::forget(child);
            }
            leader.reaped = true;
            return;
        }
        if let Some(mut child) = leader.child.take()
            && !matches!(child.try_wait(), Ok(Some(_)))
        {
            // Cannot happen for an exited child; dropping it hands it to tokio's orphan reaper.
            tracing::warn!(
                pid = self.pid,
                "the agent's top process was not reapable yet"
            );
        }
        if leader.adopted && !leader.reaped {
            let _ = nix::sys::wait::waitpid(
                Pid::from_raw(self.pid as i32),
                Some(nix::sys::wait::WaitPidFlag::WNOHANG),
            );
        }
        *crate::sys::lock(&self.stderr_dup) = None;
        leader.reaped = true;
    }

    /// The live members of the agent's process group (zombies are not), proven ours without
    /// `killpg`: the cgroup's processes that are in the group, or (no cgroup) a `/proc` scan —
    /// which is only sound while the leader is unreaped, since after that a stranger may own
    /// the group id. Blocking: call it on the blocking pool.
    fn group_members_now(&self) -> Vec<i32> {
        let pgid = self.pid as i32;
        let in_group = |p: &i32| stats::read_stat(*p).is_some_and(|s| s.pgrp == pgid && !s.zombie);
        match &self.cgroup {
            Some(cg) => cg.pids().into_iter().filter(in_group).collect(),
            None => stats::group_members(pgid)
                .into_iter()
                .filter(in_group)
                .collect(),
        }
    }

    /// Sends `sig` to the agent's process group: `killpg` while the leader is unreaped (always,
    /// with pidfds: it is reaped only on publish), else each member `group_members_now` finds.
    async fn signal_group(self: &Arc<Self>, sig: Signal) {
        if self.killpg_unless_reaped(sig) {
            return;
        }
        let me = self.clone();
        self.blocking
            .stop_step(move || {
                for p in me.group_members_now() {
                    let _ = kill(Pid::from_raw(p), sig);
                }
            })
            .await;
    }

    /// True when the top process has exited and nothing live is left in its process group:
    /// everything that got our TERM has gone. (Processes that left the group never got it;
    /// `clear` kills them.)
    async fn group_gone(self: &Arc<Self>) -> bool {
        if self.status.borrow().is_none() {
            return false;
        }
        if self.cgroup.is_none() {
            // While the leader is unreaped (it is until the exit is published), the scan's
            // members of its group are ours: the same answer as `group_members_now`, from a
            // scan shared with every other stop waiting now.
            return self
                .blocking
                .group_members(self.pid as i32)
                .await
                .is_some_and(|m| m.is_empty());
        }
        let me = self.clone();
        self.blocking
            .stop_step(move || me.group_members_now().is_empty())
            .await
            .unwrap_or(false)
    }

    async fn top_status(&self) -> RawStatus {
        let mut rx = self.status.clone();
        loop {
            if let Some(s) = *rx.borrow_and_update() {
                return s;
            }
            if rx.changed().await.is_err() {
                return rx.borrow().unwrap_or((None, None));
            }
        }
    }

    /// KILL the group and everything in the cgroup until it is empty, then remove the cgroup.
    async fn clear(self: &Arc<Self>) {
        let Some(cg) = &self.cgroup else {
            self.signal_group(Signal::SIGKILL).await;
            return;
        };
        // A round of the cgroup's reads and signals, on a stop thread (a panicked one counts as
        // a group not yet empty).
        let kill_round = || {
            let me = self.clone();
            async move {
                let work = me.blocking.clone();
                work.stop_step(move || me.cgroup.as_ref().map_or(0, |cg| cg.kill_all()))
                    .await
                    .unwrap_or(usize::MAX)
            }
        };
        // With a cgroup, the group's members are found through it anyway (`group_members_now`),
        // so once the leader is reaped `kill_all` below covers them; before, `killpg` is cheap.
        self.killpg_unless_reaped(Signal::SIGKILL);
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            // It signals what it lists: nothing listed means the cgroup is empty (one read of
            // each `cgroup.procs` for a process that left nothing behind).
            if kill_round().await == 0 {
                break;
            }
            if Instant::now() > deadline {
                tracing::error!(
                    server_id = self.server_id,
                    agent = self.agent,
                    pid = self.pid,
                    remaining = ?cg.pids(),
                    "processes survive SIGKILL in the agent's cgroup; leaving it"
                );
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        // The group is empty, so nothing of the tree is left: the exit can be published now.
        // Removing the directories (a few milliseconds of rmdir, with retries while the kernel
        // releases them) happens after, tracked so that shutdown waits for it.
        let me = self.clone();
        self.removals.spawn(async move {
            let work = me.blocking.clone();
            work.stop_step(move || {
                if let Some(cg) = &me.cgroup {
                    cg.remove_dirs();
                }
            })
            .await;
        });
    }

    async fn run_stop(self: Arc<Self>, grace: Duration, term: bool) {
        if term {
            self.signal_group(Signal::SIGTERM).await;
        }
        let graceful = tokio::time::timeout(grace, async {
            self.top_status().await;
            while !self.group_gone().await {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
        .await
        .is_ok();
        if !graceful && term {
            tracing::warn!(
                server_id = self.server_id,
                agent = self.agent,
                pid = self.pid,
                ?grace,
                "agent still running after the grace period; killing it"
            );
        }
        self.clear().await;
        let (code, signal) = self.top_status().await;
        let reason = if graceful {
            ExitReason::Graceful
        } else {
            ExitReason::Forced
        };
        self.publish(ExitInfo {
            reason,
            code,
            signal,
        })
        .await;
    }

    /// Called by the reaper when the top process has ended.
    async fn on_top_exit(self: Arc<Self>, status: RawStatus) {
        let self_exit = {
            let mut phase = crate::sys::lock(&self.phase);
            if *phase == Phase::Running {
                *phase = Phase::SelfExit;
                true
            } else {
                false
            }
        };
        if !self_exit {
            return; // `run_stop` publishes
        }
        let oom = self.cgroup.as_ref().is_some_and(|c| c.oom_kills() > 0);
        self.clear().await;
        self.publish(classify(status, oom)).await;
    }

    async fn publish(&self, info: ExitInfo) {
        let reader = self
            .stderr_reader
            .lock()
            .expect("stderr reader lock")
            .take();
        if let Some(reader) = reader {
            // The tree is gone, so EOF is near; a process outside any cgroup may still hold the
            // pipe, hence the bound.
            let _ = tokio::time::timeout(Duration::from_secs(1), reader).await;
        }
        let reason = info.reason.as_str();
        if !self.agent.starts_with("process:") {
            crate::metrics::agent_exited(&self.agent, info.reason.as_str());
        }
        if unexpected_exit(&info, &self.agent) {
            // Nobody asked it to stop: the operator needs the why, which is usually in the last
            // lines it wrote to stderr.
            let tail = self
                .stderr_tail
                .lock()
                .expect("stderr lock")
                .text(STDERR_TAIL_IN_LOG);
            tracing::warn!(
                server_id = self.server_id,
                agent = self.agent,
                pid = self.pid,
                reason,
                code = info.code,
                signal = info.signal,
                stderr_tail = tail.trim_end(),
                "agent ended unexpectedly"
            );
        } else {
            tracing::info!(
                server_id = self.server_id,
                agent = self.agent,
                pid = self.pid,
                reason,
                code = info.code,
                signal = info.signal,
                "agent ended"
            );
        }
        // Every signal of this life has been sent: the pid may go now.
        self.reap();
        self.registry
            .lock()
            .expect("registry lock")
            .remove(&self.pid);
        self.exit.send_replace(Some(info));
    }
}

/// Bytes of the stderr tail an unexpected exit's log line carries.
const STDERR_TAIL_IN_LOG: usize = 2048;

/// An exit worth a warning: an agent that ended by itself with a non-zero code, by a signal or
/// by the memory limit. A stop we asked for (graceful, or forced: its own warning was logged
/// when the grace ran out) and an exit with code 0 are not; nor is a process of the process
/// API ending with a code, which is what its caller asked to learn.
fn unexpected_exit(info: &ExitInfo, agent: &str) -> bool {
    match info.reason {
        ExitReason::Crashed | ExitReason::Oom => true,
        ExitReason::Exited => info.code != Some(0) && !agent.starts_with("process:"),
        ExitReason::Graceful | ExitReason::Forced | ExitReason::DaemonRestart => false,
    }
}

/// How an agent that ended by itself ended.
fn classify((code, signal): RawStatus, oom: bool) -> ExitInfo {
    let reason = if oom && code != Some(0) {
        ExitReason::Oom
    } else if signal.is_some() || code.is_none() {
        ExitReason::Crashed
    } else {
        ExitReason::Exited
    };
    ExitInfo {
        reason,
        code,
        signal,
    }
}

/// Owns the agents' cgroup subtree, their limits and environment.
pub struct Supervisor {
    base_env: Vec<(OsString, OsString)>,
    limits: Limits,
    user: Result<Option<limits::AgentUser>, limits::AgentUserError>,
    cgroups: Arc<cgroup::Cgroups>,
    agent_grace: Duration,
    live: Registry,
    /// Lines and bytes per second of each agent's stderr that reach the log.
    stderr_budget: (u64, u64),
    /// Children started ahead in their cgroups (`--warm-spawns`); none without cgroups.
    warm: Option<Arc<warm::Pool>>,
    /// Deferred cgroup removals of ended children.
    removals: TaskTracker,
    /// The blocking work of starts and stops, bounded (see `blocking`).
    blocking: Arc<blocking::Blocking>,
    /// Set by a reload's export: ended children are no longer reaped (the new image does it).
    reap_hold: Arc<ReapHold>,
    /// `DISPLAY` while the desktop (`desktop/`) runs: every child started meanwhile gets it
    /// (beneath the spec's own variables, so a caller's `DISPLAY` wins).
    display: std::sync::Mutex<Option<OsString>>,
}

impl Supervisor {
    /// Sets up the cgroup subtree (clearing what a previous daemon killed with SIGKILL left
    /// behind) and resolves the agent user.
    pub fn new(config: &Config) -> Self {
        Self::with_cgroups(config, cgroup::Cgroups::setup(config.agent_cgroups))
    }

    fn with_cgroups(config: &Config, cgroups: cgroup::Cgroups) -> Self {
        let mut base_env = config.agent_base_env.clone();
        let user = limits::resolve_user(config.agent_user.as_deref());
        if let Err(e) = &user {
            tracing::error!(error = %e, "agents cannot start until --agent-user is fixed");
        }
        // An agent user gets its own HOME, not the daemon's (`--agent-env HOME=…` still wins).
        if let Ok(Some(u)) = &user {
            base_env.retain(|(k, _)| k != "HOME");
            match limits::agent_home(u, &config.data_dir) {
                Ok(home) => base_env.push(("HOME".into(), home.into_os_string())),
                Err(e) => {
                    tracing::warn!(error = %e, "no HOME for the agent user; agents start without HOME")
                }
            }
        }
        base_env.extend(
            config
                .agent_env
                .iter()
                .map(|(k, v)| (OsString::from(k), OsString::from(v))),
        );
        cgroups.apply_budget(config.agents_memory_max, config.agents_pids_max);
        let cgroups = Arc::new(cgroups);
        let limits = Limits::from_config(config);
        // Only cgroups make a start wait (for the join); without them there is nothing to hide.
        let warm = match &user {
            Ok(_) if cgroups.enabled() && config.warm_spawns > 0 => {
                let pool = warm::Pool::new(
                    warm::Recipe {
                        cgroups: cgroups.clone(),
                        limits,
                        program: PathBuf::from("/proc/self/exe"),
                    },
                    config.warm_spawns,
                );
                pool.refill();
                Some(pool)
            }
            _ => None,
        };
        Supervisor {
            base_env,
            limits,
            user,
            cgroups,
            agent_grace: config.agent_grace,
            live: Registry::default(),
            stderr_budget: (config.agent_stderr_lines, config.agent_stderr_bytes),
            warm,
            removals: TaskTracker::new(),
            blocking: Arc::default(),
            reap_hold: Arc::default(),
            display: std::sync::Mutex::new(None),
        }
    }

    /// Sets (or clears) the `DISPLAY` children started from now on get.
    pub fn set_display(&self, display: Option<OsString>) {
        *crate::sys::lock(&self.display) = display;
    }

    /// The base environment with `DISPLAY` when a desktop runs.
    pub fn child_base_env(&self) -> Vec<(OsString, OsString)> {
        let mut env = self.base_env.clone();
        if let Some(d) = self
            .display
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
        {
            env.retain(|(k, _)| k != "DISPLAY");
            env.push(("DISPLAY".into(), d));
        }
        env
    }

    /// True when agents get their own cgroups (else only process groups and rlimits).
    pub fn cgroups_enabled(&self) -> bool {
        self.cgroups.enabled()
    }

    /// Starts an agent in its own session, process group and cgroup, with piped stdio.
    pub async fn start(self: &Arc<Self>, spec: SpawnSpec) -> Result<AgentProcess, SpawnError> {
        let s = self.start_with(spec, ChildStdio::Pipes).await?;
        match (s.stdin, s.stdout) {
            (Some(stdin), Some(stdout)) => Ok(AgentProcess {
                stdin,
                stdout,
                handle: s.handle,
            }),
            // `Pipes` always yields both; kept total rather than panicking.
            _ => Err(SpawnError::Exec {
                program: PathBuf::new(),
                source: std::io::Error::other("stdio pipes missing"),
            }),
        }
    }

    /// Starts a child exactly as `start` does, with its standard streams connected as `stdio`
    /// says.
    ///
    /// The start runs on the starts' own threads (`blocking.rs`), never on the runtime thread:
    /// with cgroups the child is moved into its group before it execs, and that move can wait for
    /// a kernel grace period (tens of milliseconds); a warm stub's exec is waited for as well. At
    /// most `blocking::MAX_THREADS` starts run at once; the others wait in order (a burst of
    /// starts does not add a thread each). It is cancel-safe: a child whose caller went away
    /// before taking it is killed (and reaped by its own task).
    pub async fn start_with(
        self: &Arc<Self>,
        spec: SpawnSpec,
        stdio: ChildStdio,
    ) -> Result<Spawned, SpawnError> {
        let sup = self.clone();
        let program = spec.program.clone();
        // With the caller gone the value is dropped where it is made: the guard kills. (Gone
        // while waiting for a thread, nothing was started.)
        let started = self
            .blocking
            .start(move || {
                spawn::spawn(&sup, spec, stdio).map(|s| {
                    let unclaimed = KillUnclaimed(Some(s.handle.clone()));
                    (s, unclaimed)
                })
            })
            .await;
        let (spawned, mut unclaimed) = started.ok_or_else(|| SpawnError::Exec {
            program,
            source: std::io::Error::other("the start was abandoned (the daemon is stopping)"),
        })??;
        unclaimed.0 = None;
        Ok(spawned)
    }

    /// From now on no child is reaped (a reload's exec follows; see `HandleInner::reap`).
    pub fn hold_reaps(&self) {
        self.reap_hold.on.store(true, Ordering::Release);
    }

    /// Reaps the children whose exit came while reaps were held and that are not `carried`
    /// (the new image adopts only those).
    pub fn reap_held_except(&self, carried: &[u32]) {
        let held = std::mem::take(&mut *crate::sys::lock(&self.reap_hold.held));
        for pid in held.into_iter().filter(|p| !carried.contains(p)) {
            let _ = nix::sys::wait::waitpid(
                Pid::from_raw(pid as i32),
                Some(nix::sys::wait::WaitPidFlag::WNOHANG),
            );
        }
    }

    /// Every agent of this supervisor that has not ended yet.
    pub fn live(&self) -> Vec<ChildHandle> {
        self.live
            .lock()
            .expect("registry lock")
            .values()
            .cloned()
            .collect()
    }

    /// Stops every live agent in parallel (TERM, then KILL what is left shortly before
    /// `deadline`, at most the agent grace period), then removes the daemon's cgroups.
    pub async fn stop_all(&self, deadline: Instant) {
        let left = deadline.saturating_duration_since(Instant::now());
        // Leave room after the KILL for reaping and cgroup removal.
        let grace = self.agent_grace.min(
            left.saturating_sub(left / 10)
                .saturating_sub(Duration::from_millis(100)),
        );
        let handles = self.live();
        if !handles.is_empty() {
            tracing::info!(agents = handles.len(), ?grace, "stopping every agent");
        }
        let warm = async {
            if let Some(pool) = &self.warm {
                pool.close().await;
            }
        };
        let stops = futures_util::future::join_all(handles.iter().map(|h| h.stop(grace)));
        tokio::join!(warm, stops);
        self.removals.close();
        self.removals.wait().await;
        // Takes a blocking flock: not on the runtime thread.
        let cgroups = self.cgroups.clone();
        let _ = tokio::task::spawn_blocking(move || cgroups.remove_own()).await;
    }

    /// The HOME agents are started with (the last one of their base environment wins, as in
    /// the spawn): the agent user's own under `--agent-user`, `--agent-env HOME=…` over all.
    pub fn agent_home(&self) -> Option<std::path::PathBuf> {
        self.base_env
            .iter()
            .rev()
            .find(|(k, _)| k == "HOME")
            .map(|(_, v)| std::path::PathBuf::from(v))
    }

    /// Kills every live agent process group and everything in the daemon's agent cgroups at
    /// once, without waiting for anything (a second stop signal: the process exits next).
    pub fn emergency_kill_all(&self) {
        // Held only for map updates, never across an await: taking it here cannot stall.
        let handles: Vec<ChildHandle> = self
            .live
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .values()
            .cloned()
            .collect();
        for h in &handles {
            // Never a group whose leader is reaped (its id may be reused); its cgroup, or the
            // members a scan finds, instead.
            if !h.inner.killpg_unless_reaped(Signal::SIGKILL) && h.inner.cgroup.is_none() {
                for p in h.inner.group_members_now() {
                    let _ = kill(Pid::from_raw(p), Signal::SIGKILL);
                }
            }
            if let Some(cg) = &h.inner.cgroup {
                cg.kill_all();
            }
        }
        // Also whatever the registry does not show yet (an agent being spawned joins its
        // cgroup before it is registered).
        cgroup::kill_beneath(&self.cgroups.own_dirs());
    }
}

impl Drop for Supervisor {
    fn drop(&mut self) {
        if let Some(pool) = &self.warm {
            pool.kill_now();
        }
        self.cgroups.remove_own();
    }
}

#[cfg(test)]
impl Supervisor {
    /// The pids of the agents still live once none is, or `within` has passed.
    pub(crate) async fn live_after(&self, within: Duration) -> Vec<u32> {
        let deadline = Instant::now() + within;
        while !self.live().is_empty() && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        self.live().iter().map(|h| h.pid()).collect()
    }
}

/// Kills a just-started child that nobody took (its start was cancelled); its own task reaps it
/// and removes its cgroup.
struct KillUnclaimed(Option<ChildHandle>);

impl Drop for KillUnclaimed {
    fn drop(&mut self) {
        let Some(h) = self.0.take() else { return };
        tracing::info!(
            server_id = h.server_id(),
            agent = h.agent(),
            pid = h.pid(),
            "its start was cancelled before it was taken: killing it"
        );
        h.kill_detached();
    }
}

/// Registers a new agent with its supervisor (called by `spawn`).
fn register(handle: &ChildHandle) {
    handle
        .inner
        .registry
        .lock()
        .expect("registry lock")
        .insert(handle.inner.pid, handle.clone());
}

/// Set once a limit fallback has been announced, so the log says it once.
static FALLBACK_ANNOUNCED: AtomicBool = AtomicBool::new(false);

fn announce_fallback(what: &str) {
    if !FALLBACK_ANNOUNCED.swap(true, Ordering::Relaxed) {
        tracing::warn!(
            what,
            "agent memory limit enforced with RLIMIT_DATA (per process) instead of a cgroup"
        );
    }
}

#[cfg(test)]
mod process_tests;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn self_exits_are_classified() {
        assert_eq!(classify((Some(0), None), false).reason, ExitReason::Exited);
        assert_eq!(classify((Some(3), None), false).reason, ExitReason::Exited);
        assert_eq!(
            classify((None, Some(11)), false).reason,
            ExitReason::Crashed
        );
        assert_eq!(classify((None, Some(9)), true).reason, ExitReason::Oom);
        // A clean exit is not an OOM even if something in the group was OOM-killed.
        assert_eq!(classify((Some(0), None), true).reason, ExitReason::Exited);
        assert_eq!(classify((None, None), false).reason, ExitReason::Crashed);
    }

    #[test]
    fn exit_reasons_serialize_as_the_contract_says() {
        for r in [
            ExitReason::Exited,
            ExitReason::Crashed,
            ExitReason::Oom,
            ExitReason::Graceful,
            ExitReason::Forced,
            ExitReason::DaemonRestart,
        ] {
            assert_eq!(
                serde_json::to_value(r).expect("serializes"),
                serde_json::Value::String(r.as_str().to_string())
            );
        }
    }
}
