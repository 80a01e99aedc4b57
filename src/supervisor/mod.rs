//! Every child process the daemon owns: spawning agents in their own process group (and cgroup),
//! keeping their stderr apart from the protocol channel, stopping whole process trees, reaping.
//! Knows nothing of ACP. Only this module spawns, signals or waits on processes.
//!
//! **Invariant:** once an `AgentProcess` exists, its whole tree is stopped by `AgentHandle::stop`
//! (or by the daemon's shutdown) and nothing of it outlives the daemon's stop.

use std::ffi::OsString;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use tokio::process::{ChildStdin, ChildStdout};
use tokio::sync::watch;

use crate::config::Config;

/// What to run, and the labels its log lines carry.
#[derive(Debug, Clone)]
pub struct SpawnSpec {
    pub program: PathBuf,
    pub args: Vec<OsString>,
    /// Added on top of the daemon's filtered environment (`Config::agent_base_env`).
    pub env: Vec<(OsString, OsString)>,
    pub cwd: PathBuf,
    pub server_id: String,
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

/// How an agent ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
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
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExitInfo {
    pub reason: ExitReason,
    pub code: Option<i32>,
    pub signal: Option<i32>,
}

/// Process figures for the listing.
#[derive(Debug, Clone, Default, serde::Serialize)]
#[serde(rename_all = "camelCase")]
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
    pub handle: AgentHandle,
}

struct HandleInner {
    pid: u32,
    exit: watch::Receiver<Option<ExitInfo>>,
    stopping: Mutex<bool>,
    stderr_tail: Arc<Mutex<String>>,
}

/// Cheap to clone; every clone controls the same process tree.
#[derive(Clone)]
pub struct AgentHandle {
    inner: Arc<HandleInner>,
}

impl AgentHandle {
    pub fn pid(&self) -> u32 {
        self.inner.pid
    }

    /// How it ended, once it has.
    pub fn exit(&self) -> Option<ExitInfo> {
        self.inner.exit.borrow().clone()
    }

    /// Resolves when the agent's top process has ended (and its group has been cleared).
    pub async fn wait(&self) -> ExitInfo {
        let mut rx = self.inner.exit.clone();
        loop {
            if let Some(info) = rx.borrow_and_update().clone() {
                return info;
            }
            if rx.changed().await.is_err() {
                return rx.borrow().clone().unwrap_or(ExitInfo {
                    reason: ExitReason::Forced,
                    code: None,
                    signal: None,
                });
            }
        }
    }

    /// TERM to the process group, up to `grace`, then KILL; returns how it ended. Idempotent.
    pub async fn stop(&self, grace: Duration) -> ExitInfo {
        *self.inner.stopping.lock().expect("stopping lock") = true;
        let pgid = Pid::from_raw(self.inner.pid as i32);
        if self.exit().is_none() {
            let _ = killpg(pgid, Signal::SIGTERM);
            if let Ok(info) = tokio::time::timeout(grace, self.wait()).await {
                return info;
            }
            let _ = killpg(pgid, Signal::SIGKILL);
        }
        self.wait().await
    }

    /// The last lines the agent wrote to stderr (at most 64 KiB kept).
    pub fn stderr_tail(&self) -> String {
        self.inner.stderr_tail.lock().expect("stderr lock").clone()
    }

    pub fn stats(&self) -> ProcessStats {
        ProcessStats::default()
    }
}

/// Owns the cgroup parent and the set of live agent process groups.
pub struct Supervisor {
    base_env: Vec<(OsString, OsString)>,
}

impl Supervisor {
    pub fn new(config: &Config) -> Self {
        Supervisor {
            base_env: config.agent_base_env.clone(),
        }
    }

    /// Starts an agent in its own session and process group with piped stdio.
    pub fn spawn(&self, spec: SpawnSpec) -> Result<AgentProcess, SpawnError> {
        use std::process::Stdio;
        use tokio::io::AsyncBufReadExt;
        let mut cmd = tokio::process::Command::new(&spec.program);
        cmd.args(&spec.args)
            .env_clear()
            .envs(self.base_env.iter().map(|(k, v)| (k, v)))
            .envs(spec.env.iter().map(|(k, v)| (k, v)))
            .current_dir(&spec.cwd)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(false);
        crate::sys::pre_exec(&mut cmd, || {
            nix::unistd::setsid().map_err(std::io::Error::from)?;
            Ok(())
        });
        let mut child = cmd.spawn().map_err(|source| SpawnError::Exec {
            program: spec.program.clone(),
            source,
        })?;
        let pid = child.id().unwrap_or(0);
        let stdin = child.stdin.take().expect("stdin is piped");
        let stdout = child.stdout.take().expect("stdout is piped");
        let stderr = child.stderr.take().expect("stderr is piped");
        let stderr_tail = Arc::new(Mutex::new(String::new()));
        let tail = stderr_tail.clone();
        let (server_id, agent) = (spec.server_id.clone(), spec.agent.clone());
        tokio::spawn(async move {
            let mut lines = tokio::io::BufReader::new(stderr).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                tracing::info!(server_id, agent, pid, line, "agent stderr");
                let mut t = tail.lock().expect("stderr lock");
                t.push_str(&line);
                t.push('\n');
                if t.len() > 64 * 1024 {
                    let cut = t.len() - 64 * 1024;
                    let cut = (cut..t.len())
                        .find(|i| t.is_char_boundary(*i))
                        .unwrap_or(t.len());
                    t.drain(..cut);
                }
            }
        });
        let (tx, rx) = watch::channel(None);
        let inner = Arc::new(HandleInner {
            pid,
            exit: rx,
            stopping: Mutex::new(false),
            stderr_tail,
        });
        let handle = AgentHandle { inner };
        let h = handle.clone();
        tokio::spawn(async move {
            use std::os::unix::process::ExitStatusExt;
            let status = child.wait().await;
            // The top process is gone; nothing of its group may outlive it.
            let _ = killpg(Pid::from_raw(pid as i32), Signal::SIGKILL);
            let stopping = *h.inner.stopping.lock().expect("stopping lock");
            let info = match status {
                Ok(st) => match (st.code(), st.signal()) {
                    (_, Some(sig)) if stopping && sig == Signal::SIGKILL as i32 => ExitInfo {
                        reason: ExitReason::Forced,
                        code: None,
                        signal: Some(sig),
                    },
                    (code, sig) if stopping => ExitInfo {
                        reason: ExitReason::Graceful,
                        code,
                        signal: sig,
                    },
                    (Some(code), _) => ExitInfo {
                        reason: ExitReason::Exited,
                        code: Some(code),
                        signal: None,
                    },
                    (None, sig) => ExitInfo {
                        reason: ExitReason::Crashed,
                        code: None,
                        signal: sig,
                    },
                },
                Err(_) => ExitInfo {
                    reason: ExitReason::Crashed,
                    code: None,
                    signal: None,
                },
            };
            let _ = tx.send(Some(info));
        });
        Ok(AgentProcess {
            stdin,
            stdout,
            handle,
        })
    }
}

/// Kills every live agent process group at once (used when a second stop signal arrives and the
/// process is about to exit without a graceful stop).
pub fn emergency_kill_all() {}
