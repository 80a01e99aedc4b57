//! An instance's part of an in-place reload (`daemon/reload.rs`): `export` freezes the stdout
//! reader at a line boundary and writes down everything the new image needs; `adopt` rebuilds a
//! running instance from that, on the same pipes, so nothing the agent writes meanwhile is lost
//! (it waits in the pipe).

use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::sync::Arc;
use std::time::Duration;

use tokio::process::{ChildStdin, ChildStdout};
use tokio::sync::oneshot;

use super::{AcpInstance, Origin, Phase, lock_stdin};
use crate::acp::events::EventsState;
use crate::supervisor::{ChildHandle, ChildState};

/// What the stdout reader hands over when it is frozen.
pub(in crate::acp) struct FrozenStdout {
    pub stdout: ChildStdout,
    /// Bytes read from the pipe and not yet turned into lines (handed to the new reader first).
    pub carry: Vec<u8>,
    /// Discarding the rest of an over-long line.
    pub skipping: bool,
}

/// One running instance in a hand-off.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, PartialEq)]
pub struct InstanceState {
    pub server_id: String,
    pub agent: String,
    pub created_at_ms: u64,
    pub child: ChildState,
    pub stdin_fd: i32,
    pub stdout_fd: i32,
    /// `carry` of `FrozenStdout` (hex in versions 1 and 2).
    pub stdout_carry: crate::carried::HexPayload,
    pub stdout_skipping: bool,
    pub events: EventsState,
    /// Ids of requests written and not yet answered (their answers go to the event log).
    pub pending: Vec<String>,
    pub invalid_lines: u64,
}

/// An instance whose agent has ended, in a hand-off: kept for its status, its exit and its
/// event log (readers with `Last-Event-ID` still get the history) until DELETE.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, PartialEq)]
pub struct ExitedState {
    pub server_id: String,
    pub agent: String,
    pub created_at_ms: u64,
    pub exit: Option<crate::supervisor::ExitInfo>,
    pub stderr_tail: String,
    pub detail: String,
    pub events: EventsState,
    pub invalid_lines: u64,
}

/// How long the freeze waits for the stdin queue to drain and the reader to stop.
const FREEZE_WAIT: Duration = Duration::from_secs(2);

impl AcpInstance {
    /// Freezes a running instance (its stdout reader stops at a line boundary; nothing more is
    /// written to stdin) and writes down its state; `keep` receives the descriptors that must
    /// survive the exec. `None` when it is not running (not started, ended): such an instance
    /// is not carried.
    pub(in crate::acp) async fn export(
        self: &Arc<Self>,
        keep: &mut Vec<OwnedFd>,
    ) -> std::io::Result<Option<InstanceState>> {
        let running = {
            let life = self.life();
            match &life.phase {
                Phase::Running(r) if !life.retired => r.clone(),
                _ => return Ok(None),
            }
        };
        if running.handle.exit().is_some() {
            return Ok(None);
        }
        // Lines already queued for stdin are written first (bounded: an agent that does not
        // read its stdin keeps what is queued in the old image, and the line is lost).
        let deadline = tokio::time::Instant::now() + FREEZE_WAIT;
        while lock_stdin(&running.stdin).backlog && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        let (tx, rx) = oneshot::channel();
        *crate::sys::lock(&self.frozen) = Some(tx);
        self.freeze.cancel();
        let Ok(Ok(frozen)) = tokio::time::timeout(FREEZE_WAIT, rx).await else {
            return Ok(None); // the reader had already ended: the agent is gone
        };
        let stdin_dup = lock_stdin(&running.stdin)
            .pipe
            .as_fd()
            .try_clone_to_owned()?;
        let stdout = frozen.stdout.into_owned_fd()?;
        let child = running.handle.handoff_state(keep)?;
        let state = InstanceState {
            server_id: self.server_id.clone(),
            agent: self.agent.clone(),
            created_at_ms: self.created_at_ms,
            child,
            stdin_fd: stdin_dup.as_raw_fd(),
            stdout_fd: stdout.as_raw_fd(),
            stdout_carry: crate::carried::HexPayload(frozen.carry.into()),
            stdout_skipping: frozen.skipping,
            events: self.events.export(),
            pending: self
                .life()
                .waiters
                .keys()
                .map(|k| k.0.to_string())
                .collect(),
            invalid_lines: self.invalid_lines(),
        };
        keep.push(stdin_dup);
        keep.push(stdout);
        Ok(Some(state))
    }

    /// An instance whose agent ended and whose process tree is gone, written down for the new
    /// image; `None` otherwise (running, starting, still being stopped, retired).
    pub(in crate::acp) fn export_exited(&self) -> Option<ExitedState> {
        let life = self.life();
        if life.retired || life.exit.is_none() {
            return None;
        }
        let Phase::Ended { ended, .. } = &life.phase else {
            return None;
        };
        Some(ExitedState {
            server_id: self.server_id.clone(),
            agent: self.agent.clone(),
            created_at_ms: self.created_at_ms,
            exit: life.exit.clone(),
            stderr_tail: ended.stderr_tail.clone(),
            detail: ended.detail.clone(),
            events: self.events.export(),
            invalid_lines: self.invalid_lines(),
        })
    }

    /// Rebuilds an ended instance in the new image (a fresh `AcpInstance::new` with its
    /// identity): exited as it was, its log restored and closed, POSTs answered as before the
    /// reload (502 with how the agent ended).
    pub(in crate::acp) fn adopt_exited(&self, state: &ExitedState) {
        self.events.restore(&state.events);
        self.events.close();
        self.invalid_lines
            .store(state.invalid_lines, std::sync::atomic::Ordering::Relaxed);
        let ended = Arc::new(crate::acp::Ended {
            exit: state.exit.clone(),
            stderr_tail: state.stderr_tail.clone(),
            detail: state.detail.clone(),
        });
        self.change(|life| {
            life.phase = Phase::Ended {
                running: None,
                ended,
            };
            life.exit = state.exit.clone();
        });
    }

    /// Rebuilds a running instance in the new image (a fresh `AcpInstance::new` with this
    /// instance's identity), on the adopted process and its pipes.
    pub(in crate::acp) fn adopt(
        self: &Arc<Self>,
        state: &InstanceState,
        handle: ChildHandle,
        stdin: OwnedFd,
        stdout: OwnedFd,
        max_line: usize,
    ) -> std::io::Result<()> {
        let stdin = ChildStdin::from_std(std::process::ChildStdin::from(stdin))?;
        let stdout = ChildStdout::from_std(std::process::ChildStdout::from(stdout))?;
        let open = self.events.restore(&state.events);
        self.note_asked_before(open);
        self.invalid_lines
            .store(state.invalid_lines, std::sync::atomic::Ordering::Relaxed);
        let origin = Origin::Adopted {
            pending: &state.pending,
            carry: state.stdout_carry.0.to_vec(),
            skipping: state.stdout_skipping,
        };
        if !self.attach(handle, stdin, stdout, max_line, origin) {
            return Err(std::io::Error::other(
                "the instance was deleted before its adoption",
            ));
        }
        Ok(())
    }

    /// Called by the stdout reader when it sees the freeze: hands over the pipe.
    pub(in crate::acp) fn hand_over_stdout(&self, frozen: FrozenStdout) {
        if let Some(tx) = crate::sys::lock(&self.frozen).take() {
            let _ = tx.send(frozen);
        }
    }
}
