//! The process API's part of an in-place reload (`daemon/reload.rs`): every running process is
//! written down with its output log and its pipes or terminal, and rebuilt in the new image on
//! the same descriptors, so output written meanwhile waits in the pipe and the log's offsets go
//! on without a gap. Every exited record (one recovered from the state dir too) is written down
//! with how it ended and its output log, and rebuilt as the same exited record (same id, same
//! offsets; it can be read and deleted as before). With a state dir, each carried record goes on
//! writing its durable state in the new image (a running one's later output and its end reach
//! the disk), and what its log holds beyond what the disk has is written first.
//!
//! A hand-off from a build that did not carry exited records parses (`exited` is empty).

use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::durable::{ProcExit, ProcMeta};
use super::log::{LogState, LogStream, OutputLog};
use super::{
    DRAIN_TIMEOUT, ManagedProcess, ProcessService, RunningSlot, monitor, now_ms, pty, pump,
    pump_pty,
};
use crate::supervisor::{ChildState, ExitInfo};

#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize, PartialEq)]
pub struct ProcessesState {
    pub next_id: u64,
    pub next_run: u64,
    pub processes: Vec<ProcessState>,
    /// The exited records.
    #[serde(default)]
    pub exited: Vec<ExitedState>,
}

/// An exited record: what `meta.json` of the state dir holds (its `exit` always set), its
/// number and its output log.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, PartialEq)]
pub struct ExitedState {
    pub n: u64,
    pub record: ProcMeta,
    pub log: LogState,
}

#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, PartialEq)]
pub struct ProcessState {
    pub n: u64,
    pub id: String,
    pub command: String,
    pub args: Vec<String>,
    pub cwd: Option<String>,
    pub tty: bool,
    pub interactive: bool,
    pub created_at_ms: u64,
    pub child: ChildState,
    pub stdin_fd: Option<i32>,
    pub pipes: Vec<(LogStream, i32)>,
    pub pty_fd: Option<i32>,
    pub log: LogState,
}

/// How long a reload waits for a process's pumps to stop.
const FREEZE_WAIT: Duration = Duration::from_secs(2);

impl ProcessService {
    /// A reload's drain has ended: every `run` still going is stopped and answered with a
    /// problem saying the reload cut it (its HTTP connection cannot be carried across the exec).
    pub fn cut_runs(&self) {
        self.runs_cut.cancel();
    }

    /// What a reload's hand-off would carry of the output logs, in bytes.
    pub fn handoff_bytes(&self) -> u64 {
        let all: Vec<Arc<ManagedProcess>> =
            crate::sys::lock(&self.records).values().cloned().collect();
        all.iter().map(|p| p.log.held_bytes() + 4096).sum()
    }

    /// Freezes every running process (its output stays in its pipes) and writes it down with
    /// every exited record; `keep` receives the descriptors that must survive the exec.
    pub async fn export(&self, keep: &mut Vec<OwnedFd>) -> std::io::Result<ProcessesState> {
        let all: Vec<Arc<ManagedProcess>> =
            crate::sys::lock(&self.records).values().cloned().collect();
        let mut out = ProcessesState {
            next_id: self.next_id.load(Ordering::Relaxed),
            next_run: self.next_run.load(Ordering::Relaxed),
            processes: Vec::new(),
            exited: Vec::new(),
        };
        // A process whose end was seen before the reload held the reaps is finishing: its
        // monitor drains its output (bounded by the drain timeout) and publishes the end.
        let deadline = tokio::time::Instant::now() + DRAIN_TIMEOUT + Duration::from_millis(500);
        for p in &all {
            if p.ended().is_none() && p.handle.as_ref().is_some_and(|h| h.exit().is_some()) {
                let _ = tokio::time::timeout_at(deadline, p.wait_ended()).await;
            }
        }
        for p in all {
            let finished = match (p.ended(), p.handle.as_ref()) {
                (Some(e), _) => Some(e),
                (None, Some(h)) => h.exit().map(|e| (e, now_ms())),
                // Not reached: a record without a process is a recovered, exited one.
                (None, None) => None,
            };
            if let Some((exit, at)) = finished {
                // The pumps of one that did not finish draining stop here.
                p.freeze.cancel();
                out.exited.push(exited_state(&p, &exit, at));
                continue;
            }
            let Some(handle) = p.handle.as_ref() else {
                continue;
            };
            p.freeze.cancel();
            // The pumps stop at their next await (a read that took nothing, or right after an
            // append); the monitor says when all have (on a multi-thread runtime one may be in
            // the middle of an append on another worker).
            let mut stopped = p.pumps_stopped.subscribe();
            if tokio::time::timeout(FREEZE_WAIT, stopped.wait_for(|s| *s))
                .await
                .is_err()
            {
                tracing::warn!(id = %p.id, "reload: a process's output pumps did not stop in time");
            }
            let mut dup = |fd: std::os::fd::BorrowedFd<'_>| -> std::io::Result<i32> {
                let d = fd.try_clone_to_owned()?;
                let n = d.as_raw_fd();
                keep.push(d);
                Ok(n)
            };
            let stdin_fd = match &*p.stdin.lock().await {
                Some(s) => Some(dup(s.as_fd())?),
                None => None,
            };
            let mut pipes = Vec::new();
            for (stream, fd) in &p.pipes {
                pipes.push((*stream, dup(fd.as_fd())?));
            }
            let pty_fd = match &p.pty {
                Some(t) => Some(dup(t.fd())?),
                None => None,
            };
            let child = handle.handoff_state(keep)?;
            out.processes.push(ProcessState {
                n: p.n,
                id: p.id.clone(),
                command: p.command.clone(),
                args: p.args.clone(),
                cwd: p.cwd.clone(),
                tty: p.tty,
                interactive: p.interactive,
                created_at_ms: p.created_at_ms,
                child,
                stdin_fd,
                pipes,
                pty_fd,
                log: p.log.export(),
            });
        }
        Ok(out)
    }

    /// Rebuilds the processes of a hand-off in the new image.
    pub fn adopt(
        &self,
        state: &ProcessesState,
        take: &mut dyn FnMut(i32) -> std::io::Result<OwnedFd>,
    ) {
        self.next_id.fetch_max(state.next_id, Ordering::Relaxed);
        self.next_run.fetch_max(state.next_run, Ordering::Relaxed);
        for s in &state.processes {
            match self.adopt_one(s, take) {
                Ok(()) => tracing::info!(id = %s.id, pid = s.child.pid, log_end = s.log.end,
                    "process carried across the reload"),
                Err(e) => {
                    tracing::error!(id = %s.id, pid = s.child.pid, error = %e,
                        "cannot take over a process after the reload; stopping it");
                    if !self.supervisor.is_live(s.child.pid) {
                        self.supervisor.discard_unadopted(&s.child);
                    }
                }
            }
        }
        // The exited ones after the running ones (whose logs' reservations are not optional),
        // each within the total log budget.
        for s in &state.exited {
            let Some(e) = &s.record.exit else {
                continue;
            };
            let exit = (
                ExitInfo {
                    reason: e.reason,
                    code: e.code,
                    signal: e.signal,
                },
                e.exited_at_ms,
            );
            let on_disk = self.on_disk(s.n);
            let log = OutputLog::restore(&s.log);
            if let Some(p) = self.exited_record(s.n, s.record.clone(), exit, log, on_disk) {
                self.replace(s.n, p);
            }
        }
        self.forget_oldest_exited(&mut crate::sys::lock(&self.records));
    }

    /// With a state dir, the offset up to which the disk holds record `n`'s output: the new
    /// image read the record back from the disk (a running one as ended by the restart) before
    /// it adopts the hand-off.
    fn on_disk(&self, n: u64) -> u64 {
        crate::sys::lock(&self.records)
            .get(&n)
            .map_or(0, |p| p.log.end())
    }

    /// Puts a carried record in place of the one read back from the state dir, if any (whose
    /// durable state the carried one continues, so it is not forgotten).
    fn replace(&self, n: u64, p: Arc<ManagedProcess>) {
        if let Some(old) = crate::sys::lock(&self.records).insert(n, p) {
            self.budget.release(old.log.held());
        }
    }

    fn adopt_one(
        &self,
        s: &ProcessState,
        take: &mut dyn FnMut(i32) -> std::io::Result<OwnedFd>,
    ) -> std::io::Result<()> {
        let stdin = s.stdin_fd.map(&mut *take).transpose()?;
        let mut pipes = Vec::new();
        for (stream, n) in &s.pipes {
            pipes.push((*stream, take(*n)?));
        }
        let pty = s.pty_fd.map(&mut *take).transpose()?;
        let handle = self.supervisor.adopt(&s.child, None)?;
        // Counted as running again (the new image's count starts at zero).
        self.running.fetch_add(1, Ordering::AcqRel);
        let slot = RunningSlot(self.running.clone());
        let log = Arc::new(OutputLog::restore(&s.log));
        if let Some(store) = &self.state {
            // Its record on disk goes on: later output and its end are written as before.
            let track = super::durable::ProcTrack::new(
                store,
                ProcMeta {
                    id: s.id.clone(),
                    command: s.command.clone(),
                    args: s.args.clone(),
                    cwd: s.cwd.clone(),
                    tty: s.tty,
                    interactive: s.interactive,
                    created_at_ms: s.created_at_ms,
                    exit: None,
                },
                false,
            );
            track.catch_up(&log, self.on_disk(s.n));
            log.set_durable(track);
        }
        // Its log's whole cap is reserved while it runs, as at its creation.
        self.budget
            .reserved
            .fetch_add(log.cap(), std::sync::atomic::Ordering::AcqRel);
        let freeze = CancellationToken::new();
        let mut readers = Vec::new();
        let mut dups = Vec::new();
        for (stream, fd) in pipes {
            dups.push((stream, fd.as_fd().try_clone_to_owned()?));
            let pipe = tokio::process::ChildStdout::from_std(std::process::ChildStdout::from(fd))?;
            readers.push(tokio::spawn(pump(
                pipe,
                stream,
                log.clone(),
                freeze.clone(),
            )));
        }
        let pty = match pty {
            Some(fd) => {
                let t = Arc::new(pty::Pty::from_master(fd)?);
                readers.push(tokio::spawn(pump_pty(
                    t.clone(),
                    log.clone(),
                    freeze.clone(),
                )));
                Some(t)
            }
            None => None,
        };
        let stdin = match stdin {
            Some(fd) => Some(tokio::process::ChildStdin::from_std(
                std::process::ChildStdin::from(fd),
            )?),
            None => None,
        };
        let process = Arc::new(ManagedProcess {
            id: s.id.clone(),
            command: s.command.clone(),
            args: s.args.clone(),
            cwd: s.cwd.clone(),
            tty: s.tty,
            interactive: s.interactive,
            created_at_ms: s.created_at_ms,
            handle: Some(handle),
            log,
            stdin: tokio::sync::Mutex::new(stdin),
            pty,
            ended: watch::channel(None).0,
            readers: AtomicUsize::new(0),
            pumps_stopped: watch::channel(false).0,
            freeze,
            pipes: dups,
            n: s.n,
        });
        tokio::spawn(monitor(process.clone(), readers, slot, self.budget.clone()));
        self.replace(s.n, process);
        Ok(())
    }
}

/// An exited record as the hand-off carries it.
fn exited_state(p: &ManagedProcess, exit: &ExitInfo, at_ms: u64) -> ExitedState {
    ExitedState {
        n: p.n,
        record: ProcMeta {
            id: p.id.clone(),
            command: p.command.clone(),
            args: p.args.clone(),
            cwd: p.cwd.clone(),
            tty: p.tty,
            interactive: p.interactive,
            created_at_ms: p.created_at_ms,
            exit: Some(ProcExit {
                reason: exit.reason,
                code: exit.code,
                signal: exit.signal,
                exited_at_ms: at_ms,
            }),
        },
        log: p.log.export(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

    #[test]
    fn an_output_log_round_trips_with_its_offsets() {
        let log = OutputLog::new(1 << 20);
        log.append(LogStream::Stdout, Bytes::from_static(b"hello "), 1);
        log.append(LogStream::Stderr, Bytes::from_static(b"\x00\xffworld"), 2);
        let held = log.held();
        let state = log.export();
        // The export takes the chunks out (the hand-off frees them as it writes them).
        assert_eq!(log.held(), 0);
        let back = OutputLog::restore(&state);
        assert_eq!(back.end(), log.end());
        assert_eq!(back.held(), held);
        assert_eq!(back.export(), state);
        back.append(LogStream::Stdout, Bytes::from_static(b"!"), 3);
        assert_eq!(back.end(), 14);
    }
}
