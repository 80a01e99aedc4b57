//! Starting one agent: its cgroup and limits first, then the process in a new session with a
//! clean environment, piped stdio and nothing else inherited; the child joins the cgroup before
//! exec, so nothing it starts can be outside it. Then the stderr reader and the reaper. With
//! piped stdio a warm stub (`warm.rs`), made the same way ahead of time, is used when one is
//! ready: it only has to exec.

use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::ExitStatusExt;
use std::process::Stdio;
use std::sync::{Arc, Mutex};

use nix::sys::wait::{Id, WaitPidFlag, WaitStatus, waitid};
use nix::unistd::Pid;
use tokio::io::unix::AsyncFd;
use tokio::sync::watch;

use super::stderr::{self, Fields, Tail};
use super::warm;
use super::{
    ChildHandle, ChildStdio, HandleInner, Leader, Phase, RawStatus, SpawnError, SpawnSpec, Spawned,
    Supervisor, announce_fallback, register,
};

pub(super) fn spawn(
    sup: &Supervisor,
    spec: SpawnSpec,
    stdio: ChildStdio,
) -> Result<Spawned, SpawnError> {
    let fail = |source: std::io::Error| SpawnError::Exec {
        program: spec.program.clone(),
        source,
    };
    let user = sup
        .user
        .clone()
        .map_err(|e| fail(std::io::Error::other(e)))?;
    // Otherwise a missing directory reads as a missing program.
    if !spec.cwd.is_dir() {
        return Err(fail(std::io::Error::new(
            std::io::ErrorKind::NotFound,
            format!("working directory {} does not exist", spec.cwd.display()),
        )));
    }
    let cwd = std::ffi::CString::new(spec.cwd.as_os_str().as_bytes()).map_err(|_| {
        fail(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "the working directory contains a NUL byte",
        ))
    })?;
    let pipes = matches!(stdio, ChildStdio::Pipes | ChildStdio::AllPipes);
    let warm_msg = match &sup.warm {
        Some(_) if pipes => warm::message(&warm::Launch {
            program: &spec.program,
            args: &spec.args,
            env: merged_env(&sup.child_base_env(), &spec.env),
            cwd: &spec.cwd,
            user: user.as_ref(),
        }),
        _ => None,
    };
    let stub = warm_msg
        .as_ref()
        .and_then(|_| sup.warm.as_ref().and_then(|p| p.take()));
    if let (Some(mut stub), Some(msg)) = (stub, warm_msg) {
        if !sup.limits.fallback_rlimits(stub.applied).is_empty() {
            announce_fallback("memory");
        }
        match warm::launch(&mut stub, &msg) {
            Ok(()) => {
                return Ok(started(
                    sup,
                    spec,
                    stub.child,
                    stub.cgroup,
                    matches!(stdio, ChildStdio::Pipes),
                ));
            }
            Err(e) => {
                // The stub exits by itself after a failed exec; make sure, reap it, drop its
                // cgroup.
                let _ = stub.child.start_kill();
                let (child, cgroup) = (stub.child, stub.cgroup);
                tokio::spawn(async move {
                    let mut child = child;
                    let _ = child.wait().await;
                    if let Some(cg) = cgroup {
                        let _ = tokio::task::spawn_blocking(move || {
                            cg.kill_all();
                            cg.remove_dirs();
                        })
                        .await;
                    }
                });
                match e {
                    // Killed (or dead) before its exec: the program never ran, so the start
                    // takes the direct path below instead of reporting a death it did not die.
                    warm::LaunchError::DiedBeforeExec => {
                        tracing::info!(
                            server_id = spec.name,
                            "a warm spawn stub died before its exec; starting directly"
                        );
                    }
                    warm::LaunchError::Failed(e) => return Err(fail(e)),
                }
            }
        }
    }
    let (cgroup, applied) = if sup.cgroups.enabled() {
        match sup.cgroups.create(&spec.name, &sup.limits) {
            Ok((cg, applied)) => (Some(cg), applied),
            Err(e) => {
                tracing::warn!(server_id = spec.name, agent = spec.agent, error = %e, "cannot create the agent's cgroup; starting it without one");
                (None, Default::default())
            }
        }
    } else {
        (None, Default::default())
    };
    let procs_files = match cgroup.as_ref().map(|c| c.open_procs()).transpose() {
        Ok(files) => files.unwrap_or_default(),
        Err(e) => {
            if let Some(cg) = &cgroup {
                cg.remove_dirs();
            }
            return Err(fail(e));
        }
    };
    let rlimits = sup.limits.fallback_rlimits(applied);
    if !rlimits.is_empty() {
        announce_fallback("memory");
    }

    let stdio_logs_stderr = matches!(stdio, ChildStdio::Pipes);
    let mut cmd = tokio::process::Command::new(&spec.program);
    cmd.args(&spec.args)
        .env_clear()
        .envs(sup.child_base_env())
        .envs(spec.env.iter().map(|(k, v)| (k, v)))
        .kill_on_drop(false);
    let terminal = match stdio {
        ChildStdio::Pipes | ChildStdio::AllPipes => {
            cmd.stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped());
            false
        }
        ChildStdio::Terminal(tty) => {
            // Three descriptors for the three streams; ours are closed when `cmd` is dropped.
            let (a, b) = match (tty.try_clone(), tty.try_clone()) {
                (Ok(a), Ok(b)) => (a, b),
                (Err(e), _) | (_, Err(e)) => {
                    if let Some(cg) = &cgroup {
                        cg.remove_dirs();
                    }
                    return Err(fail(e));
                }
            };
            cmd.stdin(Stdio::from(tty))
                .stdout(Stdio::from(a))
                .stderr(Stdio::from(b));
            true
        }
    };
    crate::sys::agent_child_setup(
        &mut cmd,
        crate::sys::ChildSetup {
            cgroup_procs: procs_files.iter().map(|f| f.as_raw_fd()).collect(),
            rlimits,
            user,
            after_join: Vec::new(),
            // Entered as the agent user, after the switch (never by std's `current_dir`, which
            // runs before any `pre_exec` and so as root).
            cwd: Some(cwd),
        },
    );
    if terminal {
        // Registered after the setup above, so it runs after setsid: the new session leader
        // takes the terminal on fd 0 as its controlling terminal.
        crate::sys::controlling_tty_on_exec(&mut cmd);
    }
    let spawned = cmd.spawn();
    // The child has joined (or failed); our copies of the cgroup.procs files go now, and so do
    // our copies of a terminal's slave side (the reader sees EIO once the child's tree is gone).
    drop(procs_files);
    drop(cmd);
    let child = match spawned {
        Ok(c) => c,
        Err(e) => {
            if let Some(cg) = &cgroup {
                cg.remove_dirs();
            }
            return Err(fail(e));
        }
    };
    Ok(started(sup, spec, child, cgroup, stdio_logs_stderr))
}

/// The child runs: supervises it (`supervise`), then says so.
fn started(
    sup: &Supervisor,
    spec: SpawnSpec,
    mut child: tokio::process::Child,
    cgroup: Option<super::cgroup::AgentCgroup>,
    stdio_logs_stderr: bool,
) -> Spawned {
    let pid = child.id().unwrap_or(0);
    let stdin = child.stdin.take();
    let stdout = child.stdout.take();
    // Agents' stderr is logged by the supervisor; with `AllPipes` it belongs to the caller.
    let (logged, stderr_pipe) = match child.stderr.take() {
        Some(pipe) if stdio_logs_stderr => (Some(pipe), None),
        pipe => (None, pipe),
    };
    // With a pidfd the exit is seen without reaping, and the child is reaped on publish (see
    // `Leader`); without one, tokio's `wait` reaps it at exit.
    let watch = match crate::sys::pidfd(pid) {
        Ok(fd) => ExitWatch::Pidfd {
            fd,
            kept: Some(child),
        },
        Err(e) => {
            tracing::debug!(pid, error = %e, "no pidfd; the top process is reaped at exit");
            ExitWatch::Wait(child)
        }
    };
    let who = Fields {
        server_id: spec.name.clone(),
        agent: spec.agent.clone(),
        pid,
    };
    let handle = supervise(sup, who, cgroup, Tail::default(), logged, watch);
    // The process API's programs run as `process:<id>`: not agents, so not in the agent figures.
    if !spec.agent.starts_with("process:") {
        crate::metrics::agent_started(&spec.agent);
    }
    tracing::info!(
        server_id = spec.name,
        agent = spec.agent,
        pid,
        program = %spec.program.display(),
        cgroup = handle.inner.cgroup.as_ref().and_then(|c| c.path()).map(|p| p.display().to_string()),
        "agent started"
    );
    Spawned {
        stdin,
        stdout,
        stderr: stderr_pipe,
        handle,
    }
}

/// How the supervisor learns that a child's top process exited.
pub(super) enum ExitWatch {
    /// Through a pidfd, without reaping: `kept` (a child started here) is reaped when its exit
    /// is published (see `Leader`); an adopted child (`None`) is reaped through its pid.
    Pidfd {
        fd: AsyncFd<OwnedFd>,
        kept: Option<tokio::process::Child>,
    },
    /// No pidfd: tokio's `wait` reaps it at exit.
    Wait(tokio::process::Child),
}

/// The one place a running child becomes supervised, whether it was started here (`started`)
/// or adopted from a reload's previous image (`Supervisor::adopt`): its handle and registration,
/// its stderr reader (when the supervisor logs its stderr; `tail` holds what is already known of
/// it) and the task that watches its exit.
pub(super) fn supervise(
    sup: &Supervisor,
    who: Fields,
    cgroup: Option<super::cgroup::AgentCgroup>,
    tail: Tail,
    logged_stderr: Option<tokio::process::ChildStderr>,
    watch: ExitWatch,
) -> ChildHandle {
    let pid = who.pid;
    let (server_id, agent) = (who.server_id.clone(), who.agent.clone());
    let tail = Arc::new(Mutex::new(tail));
    let (stderr_dup, stderr_task) = match logged_stderr {
        Some(pipe) => (
            // Kept for a reload's hand-off (the reader owns the pipe itself).
            std::os::fd::AsFd::as_fd(&pipe).try_clone_to_owned().ok(),
            Some(tokio::spawn(stderr::forward(
                pipe,
                tail.clone(),
                who,
                crate::logging::RateLimit::new(sup.stderr_budget.0, sup.stderr_budget.1),
            ))),
        ),
        None => (None, None),
    };
    let (status_tx, status_rx) = watch::channel(None);
    let (kept, adopted, pidfd, mut waited) = match watch {
        ExitWatch::Pidfd { fd, kept } => {
            let adopted = kept.is_none();
            (kept, adopted, Some(fd), None)
        }
        ExitWatch::Wait(child) => (None, false, None, Some(child)),
    };
    let inner = Arc::new(HandleInner {
        pid,
        server_id,
        agent,
        cgroup,
        status: status_rx,
        exit: watch::channel(None).0,
        phase: Mutex::new(Phase::Running),
        stderr_tail: tail,
        stderr_reader: Mutex::new(stderr_task),
        stderr_dup: Mutex::new(stderr_dup),
        registry: sup.live.clone(),
        reap_hold: sup.reap_hold.clone(),
        removals: sup.removals.clone(),
        blocking: sup.blocking.clone(),
        leader: Mutex::new(Leader {
            child: kept,
            reaped: false,
            adopted,
        }),
    });
    let handle = ChildHandle {
        inner: inner.clone(),
    };
    register(&handle);
    tokio::spawn(async move {
        let status = match (&pidfd, waited.as_mut()) {
            (Some(fd), _) => exited_unreaped(fd, pid).await,
            (None, Some(child)) => {
                let status = match child.wait().await {
                    Ok(st) => (st.code(), st.signal()),
                    Err(e) => {
                        tracing::error!(pid, error = %e, "cannot wait for the agent");
                        (None, None)
                    }
                };
                inner
                    .leader
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .reaped = true;
                status
            }
            (None, None) => (None, None),
        };
        // The stop path waits on this; the self-exit path uses it right away.
        let _ = status_tx.send(Some(status));
        inner.on_top_exit(status).await;
    });
    handle
}

/// The environment a child gets: the supervisor's base, then the spec's variables on top (a
/// later name replaces an earlier one, as `Command::envs` does).
fn merged_env(
    base: &[(std::ffi::OsString, std::ffi::OsString)],
    extra: &[(std::ffi::OsString, std::ffi::OsString)],
) -> Vec<(std::ffi::OsString, std::ffi::OsString)> {
    let mut map = std::collections::BTreeMap::new();
    for (k, v) in base.iter().chain(extra) {
        map.insert(k.clone(), v.clone());
    }
    map.into_iter().collect()
}

/// Waits until our child `pid` has exited and returns its status without reaping it (the pidfd
/// turns readable at exit; `waitid` with `WNOWAIT` reads the status and leaves the zombie).
pub(super) async fn exited_unreaped(fd: &AsyncFd<OwnedFd>, pid: u32) -> RawStatus {
    let pid_t = Pid::from_raw(pid as i32);
    let flags = WaitPidFlag::WEXITED | WaitPidFlag::WNOWAIT | WaitPidFlag::WNOHANG;
    loop {
        let mut ready = match fd.readable().await {
            Ok(r) => r,
            Err(e) => {
                tracing::error!(pid, error = %e, "cannot wait for the agent");
                return (None, None);
            }
        };
        match waitid(Id::Pid(pid_t), flags) {
            Ok(WaitStatus::Exited(_, code)) => return (Some(code), None),
            Ok(WaitStatus::Signaled(_, sig, _)) => return (None, Some(sig as i32)),
            // Not exited after all (a spurious wake-up): wait for the next readiness.
            Ok(_) => ready.clear_ready(),
            Err(e) => {
                tracing::error!(pid, error = %e, "cannot read the agent's exit status");
                return (None, None);
            }
        }
    }
}
