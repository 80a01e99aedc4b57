//! Short-lived helper programs the daemon runs to completion (e.g. `npm install` for the
//! installer). Each runs in its own process group, so a timeout or a cancelled caller kills the
//! whole tree it started (npm runs lifecycle scripts in children), not just its top process.

use std::io;
use std::process::Output;
use std::time::Duration;

use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use tokio::io::AsyncReadExt;

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
    #[error("{program} wrote more than {limit} bytes of output")]
    OutputTooLarge { program: String, limit: usize },
    #[error("{program} failed: {source}")]
    Wait {
        program: String,
        #[source]
        source: io::Error,
    },
}

/// Kills the process group when dropped (a cancelled caller): the leader is still ours then,
/// unreaped, so the group id cannot have been reused.
struct GroupGuard(Option<Pid>);

impl Drop for GroupGuard {
    fn drop(&mut self) {
        if let Some(pgid) = self.0 {
            let _ = killpg(pgid, Signal::SIGKILL);
        }
    }
}

/// Reads a pipe to its end, or fails once more than `cap` bytes came (the pipe is then closed,
/// so a writer still going gets EPIPE rather than blocking).
async fn drain(pipe: Option<impl tokio::io::AsyncRead + Unpin>, cap: usize) -> io::Result<Vec<u8>> {
    let mut out = Vec::new();
    if let Some(p) = pipe {
        let limit = u64::try_from(cap).unwrap_or(u64::MAX).saturating_add(1);
        p.take(limit).read_to_end(&mut out).await?;
        if out.len() > cap {
            return Err(io::Error::new(io::ErrorKind::FileTooLarge, "output cap"));
        }
    }
    Ok(out)
}

/// Runs `cmd` to completion in a new process group with its output captured; after `timeout`
/// (or if the returned future is dropped) the whole group is killed. The leader is reaped only
/// after the last `killpg` (its exit is seen through a pidfd without reaping, as for agents), so
/// the group id cannot name a stranger's group when it is signalled; without pidfds the members
/// a `/proc` scan finds after the reap are killed instead.
pub async fn run_to_completion(
    cmd: tokio::process::Command,
    timeout: Duration,
) -> Result<Output, ToolError> {
    run_capped(cmd, timeout, usize::MAX).await
}

/// [`run_to_completion`] with at most `cap` bytes read from each of stdout and stderr: past
/// that the whole group is killed and the answer is [`ToolError::OutputTooLarge`].
pub async fn run_capped(
    mut cmd: tokio::process::Command,
    timeout: Duration,
    cap: usize,
) -> Result<Output, ToolError> {
    let program = cmd.as_std().get_program().to_string_lossy().into_owned();
    cmd.process_group(0)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true);
    crate::sys::clear_signal_mask_on_exec(&mut cmd);
    let mut child = cmd.spawn().map_err(|source| ToolError::Spawn {
        program: program.clone(),
        source,
    })?;
    let pid = child.id();
    let pgid = pid.map(|pid| Pid::from_raw(pid as i32));
    let mut guard = GroupGuard(pgid);
    let pidfd = pid.and_then(|p| crate::sys::pidfd(p).ok());
    let Some(pidfd) = pidfd else {
        return run_reaped(child, guard, timeout, program, cap).await;
    };
    let (stdout, stderr) = (child.stdout.take(), child.stderr.take());
    let pid = pid.unwrap_or(0);
    let result = tokio::time::timeout(timeout, async {
        let (out, err, status) = tokio::join!(
            drain(stdout, cap),
            drain(stderr, cap),
            super::spawn::exited_unreaped(&pidfd, pid)
        );
        Ok::<_, io::Error>((out?, err?, status))
    })
    .await;
    // Whatever the leader did, nothing it started may outlive it; it is unreaped, so the group
    // id is still ours.
    if let Some(pgid) = guard.0.take() {
        let _ = killpg(pgid, Signal::SIGKILL);
    }
    // Reaps it (killed just now if it was still running).
    let reaped = child.wait().await;
    match result {
        Ok(Ok((stdout, stderr, _))) => match reaped {
            Ok(status) => Ok(Output {
                status,
                stdout,
                stderr,
            }),
            Err(source) => Err(ToolError::Wait { program, source }),
        },
        Ok(Err(source)) if source.kind() == io::ErrorKind::FileTooLarge => {
            Err(ToolError::OutputTooLarge {
                program,
                limit: cap,
            })
        }
        Ok(Err(source)) => Err(ToolError::Wait { program, source }),
        Err(_) => Err(ToolError::Timeout { program, timeout }),
    }
}

/// The same without a pidfd: tokio reaps the leader at exit, so afterwards only the members a
/// `/proc` scan finds in the group are killed, never the id blindly (on the blocking pool).
async fn run_reaped(
    child: tokio::process::Child,
    mut guard: GroupGuard,
    timeout: Duration,
    program: String,
    cap: usize,
) -> Result<Output, ToolError> {
    let mut child = child;
    let (stdout, stderr) = (child.stdout.take(), child.stderr.take());
    let result = tokio::time::timeout(timeout, async {
        let (out, err) = tokio::join!(drain(stdout, cap), drain(stderr, cap));
        let (out, err) = (out?, err?);
        let status = child.wait().await?;
        Ok::<_, io::Error>(Output {
            status,
            stdout: out,
            stderr: err,
        })
    })
    .await;
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
        Ok(Err(source)) if source.kind() == io::ErrorKind::FileTooLarge => {
            Err(ToolError::OutputTooLarge {
                program,
                limit: cap,
            })
        }
        Ok(Err(source)) => Err(ToolError::Wait { program, source }),
        Err(_) => Err(ToolError::Timeout { program, timeout }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn alive(pid: i32) -> bool {
        std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
            s.rsplit_once(") ")
                .is_some_and(|(_, r)| !r.starts_with('Z'))
        })
    }

    #[tokio::test]
    async fn output_and_status_are_captured() {
        let mut cmd = tokio::process::Command::new("sh");
        cmd.args(["-c", "echo out; echo err >&2; exit 3"]);
        let out = run_to_completion(cmd, Duration::from_secs(20))
            .await
            .expect("runs");
        assert_eq!(out.status.code(), Some(3));
        assert_eq!(out.stdout, b"out\n");
        assert_eq!(out.stderr, b"err\n");
    }

    #[tokio::test]
    async fn a_timeout_kills_the_whole_group() {
        let dir = tempfile::tempdir().unwrap();
        let pidfile = dir.path().join("bg.pid");
        let mut cmd = tokio::process::Command::new("sh");
        cmd.args([
            "-c",
            &format!("sleep 100 & echo $! > {}; wait", pidfile.display()),
        ]);
        let r = run_to_completion(cmd, Duration::from_millis(500)).await;
        assert!(matches!(r, Err(ToolError::Timeout { .. })), "{r:?}");
        let bg: i32 = std::fs::read_to_string(&pidfile)
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        // The background child was in the group and got its SIGKILL before we returned; its
        // reaping by whoever inherited it may take a moment.
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while alive(bg) {
            assert!(std::time::Instant::now() < deadline, "the group survived");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}
