//! Short-lived helper programs the daemon runs to completion (e.g. `npm install` for the
//! installer). Each runs in its own process group, so a timeout or a cancelled caller kills the
//! whole tree it started (npm runs lifecycle scripts in children), not just its top process.

use std::io;
use std::process::Output;
use std::time::Duration;

use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;

#[derive(Debug, thiserror::Error)]
pub enum ToolError {
    #[error("cannot run {program}: {source}")]
    Spawn {
        program: String,
        #[source]
        source: io::Error,
    },
    #[error("{program} did not finish within {timeout:?}")]
    Timeout { program: String, timeout: Duration },
    #[error("{program} failed: {source}")]
    Wait {
        program: String,
        #[source]
        source: io::Error,
    },
}

/// Kills the process group when dropped, unless disarmed after the group's leader was reaped.
struct GroupGuard(Option<Pid>);

impl Drop for GroupGuard {
    fn drop(&mut self) {
        if let Some(pgid) = self.0 {
            let _ = killpg(pgid, Signal::SIGKILL);
        }
    }
}

/// Runs `cmd` to completion in a new process group with its output captured; after `timeout`
/// (or if the returned future is dropped) the whole group is killed.
pub async fn run_to_completion(
    mut cmd: tokio::process::Command,
    timeout: Duration,
) -> Result<Output, ToolError> {
    let program = cmd.as_std().get_program().to_string_lossy().into_owned();
    cmd.process_group(0)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true);
    let child = cmd.spawn().map_err(|source| ToolError::Spawn {
        program: program.clone(),
        source,
    })?;
    let mut guard = GroupGuard(child.id().map(|pid| Pid::from_raw(pid as i32)));
    let result = tokio::time::timeout(timeout, child.wait_with_output()).await;
    // Whatever the leader did, nothing it started may outlive it. The leader is reaped by now
    // (or being killed on drop), so its group id may be reused: only the members a `/proc` scan
    // finds in the group are killed, never the id blindly (on the blocking pool: a scan).
    if let Some(pgid) = guard.0.take() {
        let _ = tokio::task::spawn_blocking(move || {
            for p in super::stats::group_members(pgid.as_raw()) {
                let _ = nix::sys::signal::kill(Pid::from_raw(p), Signal::SIGKILL);
            }
        })
        .await;
    }
    match result {
        Ok(Ok(out)) => Ok(out),
        Ok(Err(source)) => Err(ToolError::Wait { program, source }),
        Err(_) => Err(ToolError::Timeout { program, timeout }),
    }
}
