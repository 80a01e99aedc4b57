//! The process API's I/O: the pumps that copy a child's pipes or terminal into its output log,
//! the capture of a `run`'s output, the monitor that records a process's end once its tree is
//! gone and its output drained, and input and terminal size from clients.

use std::sync::Arc;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio_util::sync::CancellationToken;

use bytes::Bytes;

use super::log::{LogStream, OutputLog};
use super::{
    Budget, DRAIN_TIMEOUT, INPUT_TIMEOUT, ManagedProcess, ProcessError, RunningSlot, now_ms, pty,
};

/// One read of a child's output.
const READ_CHUNK: usize = 64 * 1024;

/// Writes input to a process (shared by `POST …/input` and the terminal socket).
pub async fn write_input(
    p: &ManagedProcess,
    data: &[u8],
    limit: u64,
) -> Result<usize, ProcessError> {
    if data.len() as u64 > limit {
        return Err(ProcessError::InputTooLarge { limit });
    }
    let conflict = |reason| ProcessError::Conflict {
        id: p.id.clone(),
        reason,
    };
    if p.ended().is_some() || p.handle.as_ref().is_none_or(|h| h.exit().is_some()) {
        return Err(conflict("the process is not running"));
    }
    let write = async {
        if let Some(pty) = &p.pty {
            if !p.interactive {
                return Err(conflict("the process was not started with `interactive`"));
            }
            return pty
                .write_all(data)
                .await
                .map_err(|_| conflict("the terminal does not take input"));
        }
        let mut stdin = p.stdin.lock().await;
        let Some(pipe) = stdin.as_mut() else {
            return Err(conflict(
                "the process has no stdin (not started with `interactive`, or it exited)",
            ));
        };
        let res = async {
            pipe.write_all(data).await?;
            pipe.flush().await
        }
        .await;
        if res.is_err() {
            *stdin = None;
            return Err(conflict("the process closed its stdin"));
        }
        Ok(())
    };
    match tokio::time::timeout(INPUT_TIMEOUT, write).await {
        Ok(Ok(())) => Ok(data.len()),
        Ok(Err(e)) => Err(e),
        Err(_) => Err(ProcessError::InputTimeout { id: p.id.clone() }),
    }
}

/// Resizes a process's terminal (shared by `POST …/terminal/resize` and the terminal socket).
pub fn resize(p: &ManagedProcess, cols: u32, rows: u32) -> Result<(), ProcessError> {
    let Some(pty) = &p.pty else {
        return Err(ProcessError::Conflict {
            id: p.id.clone(),
            reason: "the process has no terminal (not started with `tty`)",
        });
    };
    let valid = |v: u32| (1..=u16::MAX as u32).contains(&v);
    if !valid(cols) || !valid(rows) {
        return Err(ProcessError::Invalid(format!(
            "cols and rows must be between 1 and {}",
            u16::MAX
        )));
    }
    pty.resize(cols as u16, rows as u16)
        .map_err(|e| ProcessError::Io(format!("resize: {e}")))?;
    // The kernel signals the terminal's foreground group only when the size changed; the
    // explicit signal makes a resize to the same size observable too.
    if let Some(h) = &p.handle {
        h.signal_group(nix::sys::signal::Signal::SIGWINCH);
    }
    Ok(())
}

/// Copies a pipe into the log until end of file. Each chunk is copied out of the read buffer so
/// the log's byte count is the memory it holds.
pub(super) async fn pump(
    mut pipe: impl AsyncRead + Unpin,
    stream: LogStream,
    log: Arc<OutputLog>,
    freeze: CancellationToken,
) {
    let mut buf = vec![0u8; READ_CHUNK];
    loop {
        // A read cancelled by the freeze took nothing from the pipe.
        let read = tokio::select! {
            biased;
            _ = freeze.cancelled() => return,
            r = pipe.read(&mut buf) => r,
        };
        if let (Ok(n), Some(d)) = (&read, crate::config::test_hooks::pump_delay())
            && *n > 0
        {
            tokio::time::sleep(d).await;
        }
        match read {
            Ok(0) | Err(_) => return,
            Ok(n) => log.append(stream, Bytes::copy_from_slice(&buf[..n]), now_ms()),
        }
        // With a state dir, the next read waits until this one is written: a program faster
        // than the disk waits on its pipe, and at most one read per pump is queued.
        if let Some(t) = log.durable() {
            t.written().await;
        }
    }
}

pub(super) async fn pump_pty(pty: Arc<pty::Pty>, log: Arc<OutputLog>, freeze: CancellationToken) {
    let mut buf = vec![0u8; READ_CHUNK];
    loop {
        let read = tokio::select! {
            biased;
            _ = freeze.cancelled() => return,
            r = pty.read(&mut buf) => r,
        };
        match read {
            Ok(0) | Err(_) => return,
            Ok(n) => log.append(LogStream::Pty, Bytes::copy_from_slice(&buf[..n]), now_ms()),
        }
        if let Some(t) = log.durable() {
            t.written().await;
        }
    }
}

/// Reads a pipe to its end, keeping the first `limit` bytes (the rest is read and dropped so
/// the child never blocks on a full pipe).
pub(super) async fn capture(pipe: Option<impl AsyncRead + Unpin>, limit: usize) -> (Vec<u8>, bool) {
    let Some(mut pipe) = pipe else {
        return (Vec::new(), false);
    };
    let mut kept = Vec::new();
    let mut truncated = false;
    let mut buf = vec![0u8; READ_CHUNK];
    loop {
        match pipe.read(&mut buf).await {
            Ok(0) | Err(_) => return (kept, truncated),
            Ok(n) => {
                let room = limit.saturating_sub(kept.len());
                kept.extend_from_slice(&buf[..n.min(room)]);
                truncated |= n > room;
            }
        }
    }
}

/// Waits for the tree to end, lets the output drain, closes the log, publishes the end and
/// gives back the running slot and the unused part of the log reservation.
pub(super) async fn monitor(
    p: Arc<ManagedProcess>,
    readers: Vec<tokio::task::JoinHandle<()>>,
    slot: RunningSlot,
    budget: Arc<Budget>,
) {
    let Some(handle) = p.handle.clone() else {
        return;
    };
    let exit = tokio::select! {
        e = handle.wait() => e,
        // A reload carries the process: the new image's monitor publishes its end. The pumps
        // return at the freeze; once they all have, the export may take the log.
        _ = p.freeze.cancelled() => {
            let _ = tokio::time::timeout(DRAIN_TIMEOUT, futures_util::future::join_all(readers)).await;
            p.pumps_stopped.send_replace(true);
            return;
        }
    };
    let aborts: Vec<_> = readers.iter().map(|r| r.abort_handle()).collect();
    let _ = tokio::time::timeout(DRAIN_TIMEOUT, futures_util::future::join_all(readers)).await;
    for a in aborts {
        a.abort();
    }
    p.log.close();
    *p.stdin.lock().await = None;
    budget.release(p.log.cap().saturating_sub(p.log.held()));
    drop(slot);
    let at = now_ms();
    if let Some(t) = p.log.durable() {
        t.ended(&exit, at);
    }
    p.ended.send_replace(Some((exit, at)));
}
