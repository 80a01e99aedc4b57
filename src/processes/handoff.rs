//! The process API's part of an in-place reload (`daemon/reload.rs`): every running process is
//! written down with its output log and its pipes or terminal, and rebuilt in the new image on
//! the same descriptors, so output written meanwhile waits in the pipe and the log's offsets go
//! on without a gap. Exited records are not carried.

use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::log::{LogState, LogStream, OutputLog};
use super::{ManagedProcess, ProcessService, RunningSlot, monitor, pty, pump, pump_pty};
use crate::supervisor::ChildState;

#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize, PartialEq)]
pub struct ProcessesState {
    pub next_id: u64,
    pub next_run: u64,
    pub processes: Vec<ProcessState>,
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

impl ProcessService {
    /// Freezes every running process (its output stays in its pipes) and writes it down;
    /// `keep` receives the descriptors that must survive the exec.
    pub async fn export(&self, keep: &mut Vec<OwnedFd>) -> std::io::Result<ProcessesState> {
        let all: Vec<Arc<ManagedProcess>> =
            crate::sys::lock(&self.records).values().cloned().collect();
        let mut out = ProcessesState {
            next_id: self.next_id.load(Ordering::Relaxed),
            next_run: self.next_run.load(Ordering::Relaxed),
            processes: Vec::new(),
        };
        for p in all {
            // A record recovered from the state dir has no process to carry.
            let Some(handle) = p.handle.as_ref() else {
                continue;
            };
            if p.ended().is_some() || handle.exit().is_some() {
                continue;
            }
            p.freeze.cancel();
            // The pumps stop at their next await (a read that took nothing, or right after an
            // append); one yield lets them see it.
            tokio::task::yield_now().await;
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
                Err(e) => tracing::error!(id = %s.id, pid = s.child.pid, error = %e,
                    "cannot take over a process after the reload"),
            }
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
            freeze,
            pipes: dups,
            n: s.n,
        });
        tokio::spawn(monitor(process.clone(), readers, slot, self.budget.clone()));
        crate::sys::lock(&self.records).insert(s.n, process);
        Ok(())
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
        let state = log.export();
        let back = OutputLog::restore(&state);
        assert_eq!(back.end(), log.end());
        assert_eq!(back.held(), log.held());
        assert_eq!(back.export(), state);
        back.append(LogStream::Stdout, Bytes::from_static(b"!"), 3);
        assert_eq!(back.end(), 14);
    }
}
