//! The way to an agent's stdin: a POST writes directly when nothing is queued (whole lines
//! packed into atomic writes of at most `PIPE_BUF`), a WebSocket batch its lines the same way;
//! what the pipe does not take at once goes, in order, to the instance's writer task
//! (`write_loop`), within the per-instance and daemon-wide byte budgets (`StdinCaps`).

use std::sync::{Arc, Mutex};

use bytes::{Bytes, BytesMut};
use tokio::process::ChildStdin;
use tokio::sync::{mpsc, oneshot, watch};

use super::{AcpInstance, Running, Seen};
use crate::acp::caps::{Budget, Reservation};
use crate::acp::jsonrpc::{Envelope, IdKey, Kind};

/// A line for the agent's stdin and what to tell when it was written (or could not be).
pub(super) struct WriteJob {
    pub(super) line: Bytes,
    pub(super) done: Done,
    /// Its bytes in the stdin budgets, given back when the job is written or dropped.
    pub(super) _queued: Reservation,
}

/// The budgets of bytes queued for stdin: this instance's and every instance's together.
pub struct StdinCaps {
    pub per_instance: Arc<Budget>,
    pub total: Arc<Budget>,
}

/// Why a line could not be handed to the agent.
pub(super) enum SendFail {
    Gone,
    Full { what: &'static str, limit: u64 },
}

pub(super) enum Done {
    /// A request: on failure its pending entry is dropped, which wakes its POST.
    Request(IdKey),
    /// A notification or response: the POST waits for this acknowledgement.
    Ack(oneshot::Sender<()>),
    /// Several lines written as one (a WebSocket read batch): on failure the pending entries of
    /// its requests are dropped; the acknowledgement, when asked for, follows the write.
    Batch {
        keys: Vec<IdKey>,
        ack: Option<oneshot::Sender<()>>,
    },
}

/// The agent's stdin, shared by the POSTs' fast path and the writer task.
pub(super) struct Stdin {
    pub(super) pipe: ChildStdin,
    /// Lines are queued to (or being written by) the writer task: later lines must queue too,
    /// so that they stay in order.
    pub(super) backlog: bool,
    pub(super) broken: bool,
    /// The fast path's packing buffer: grows to the largest packed write (under `PIPE_BUF`), from
    /// empty, so an instance that only ever sent small lines holds only what they needed.
    pub(super) scratch: Vec<u8>,
}

/// Writes of at most this many bytes to a pipe are atomic: all or nothing (POSIX `PIPE_BUF`).
pub(super) const PIPE_BUF: usize = 4096;

pub(super) fn lock_stdin(m: &Mutex<Stdin>) -> std::sync::MutexGuard<'_, Stdin> {
    crate::sys::lock(m)
}

/// What `send_line` writes: a bare line, or an envelope's.
pub(super) trait ToStdin {
    fn line(&self) -> &Bytes;
}

impl ToStdin for Bytes {
    fn line(&self) -> &Bytes {
        self
    }
}

impl ToStdin for Envelope {
    fn line(&self) -> &Bytes {
        &self.line
    }
}

pub(super) fn request_key(env: Envelope) -> Option<IdKey> {
    match env.kind {
        Kind::Request { key, .. } => Some(key),
        Kind::Notification | Kind::Response => None,
    }
}

pub(super) enum Sent {
    Written,
    /// Handed to the writer task, which reports through the job's `Done`.
    Queued,
}

/// A send that failed after its first `written` lines had reached the pipe.
pub(super) struct Failed {
    pub(super) fail: SendFail,
    pub(super) written: usize,
}

pub(super) fn failed(fail: SendFail, written: usize) -> Failed {
    Failed { fail, written }
}

/// Writes lines, in order. The fast path writes them from the caller's task at once when nothing
/// is queued: whole lines packed into writes of at most `PIPE_BUF` bytes, each of which is atomic
/// (a cancelled caller can never leave half a line), so a batch that arrived together costs one
/// `write` per 4 KiB instead of one per message. What the pipe does not take at once (and any line
/// of `PIPE_BUF` bytes or more) goes to the writer task, as one job, which waits for room.
pub(super) async fn send_line<L: ToStdin>(
    running: &Running,
    caps: &StdinCaps,
    lines: &[L],
    done: impl FnOnce(usize) -> Done,
) -> Result<Sent, Failed> {
    let job = {
        let mut st = lock_stdin(&running.stdin);
        if st.broken {
            return Err(failed(SendFail::Gone, 0));
        }
        // Lines before `next` are in the pipe; `cut` is the unwritten tail of line `next - 1`
        // after a short write.
        let mut next = 0;
        let mut cut: Option<Bytes> = None;
        if !st.backlog {
            let st = &mut *st;
            while next < lines.len() {
                st.scratch.clear();
                let mut end = next;
                while end < lines.len() && st.scratch.len() + lines[end].line().len() < PIPE_BUF {
                    st.scratch.extend_from_slice(lines[end].line());
                    st.scratch.push(b'\n');
                    end += 1;
                }
                if end == next {
                    break;
                }
                match nix::unistd::write(&st.pipe, &st.scratch) {
                    Ok(n) if n == st.scratch.len() => next = end,
                    // Not expected below PIPE_BUF; queue the rest (a cut line's newline is added
                    // back by the writer).
                    Ok(n) => {
                        let lens = lines[next..end].iter().map(|l| l.line().len());
                        let (whole, part) = split_written(lens, n);
                        next += whole;
                        if let Some(k) = part {
                            cut = Some(lines[next].line().slice(k..));
                            next += 1;
                        }
                        break;
                    }
                    Err(nix::errno::Errno::EAGAIN) => break,
                    Err(_) => {
                        st.broken = true;
                        return Err(failed(SendFail::Gone, next));
                    }
                }
            }
            if next == lines.len() && cut.is_none() {
                return Ok(Sent::Written);
            }
        }
        // The job covers the cut line too (its request is in flight either way).
        let first = next - usize::from(cut.is_some());
        let rest = &lines[next..];
        let line = match (cut, rest) {
            (None, [one]) => one.line().clone(),
            (cut, rest) => {
                let size = cut.as_ref().map_or(0, |c| c.len() + 1)
                    + rest.iter().map(|l| l.line().len() + 1).sum::<usize>();
                let mut joined = BytesMut::with_capacity(size);
                for l in cut.iter().chain(rest.iter().map(ToStdin::line)) {
                    joined.extend_from_slice(l);
                    joined.extend_from_slice(b"\n");
                }
                // The writer adds the last newline.
                joined.truncate(size.saturating_sub(1));
                joined.freeze()
            }
        };
        // What waits for the agent is bounded in bytes, per instance and in total; lines that
        // do not fit are refused at once rather than held.
        let n = line.len() as u64 + 1;
        let Some(mut queued) = caps.per_instance.try_reserve(n) else {
            let limit = caps.per_instance.limit();
            let what = "bytes queued for this agent's stdin";
            crate::metrics::refused(crate::metrics::Limit::StdinQueue);
            return Err(failed(SendFail::Full { what, limit }, next));
        };
        if !queued.grow(&caps.total, n) {
            let limit = caps.total.limit();
            let what = "bytes queued for every agent's stdin";
            crate::metrics::refused(crate::metrics::Limit::StdinQueueTotal);
            return Err(failed(SendFail::Full { what, limit }, next));
        }
        let job = WriteJob {
            line,
            done: done(first),
            _queued: queued,
        };
        // Queued under the lock, so the writer cannot declare the backlog empty in between.
        st.backlog = true;
        match running.writer.try_send(job) {
            Ok(()) => return Ok(Sent::Queued),
            Err(mpsc::error::TrySendError::Closed(_)) => {
                return Err(failed(SendFail::Gone, next));
            }
            Err(mpsc::error::TrySendError::Full(job)) => (job, next),
        }
    };
    // The queue is full (the agent reads slowly): wait for room, outside the lock.
    let (job, next) = job;
    running
        .writer
        .send(job)
        .await
        .map_err(|_| failed(SendFail::Gone, next))?;
    Ok(Sent::Queued)
}

/// After a short write of `n` bytes of lines (each followed by its newline) of these lengths:
/// how many lines went whole, and how many bytes of the next one (its newline not included)
/// went too, if any did — that line is cut, and its rest must follow before anything else.
pub(super) fn split_written(
    lens: impl IntoIterator<Item = usize>,
    n: usize,
) -> (usize, Option<usize>) {
    let mut off = 0;
    let mut whole = 0;
    for len in lens {
        if off + len < n {
            off += len + 1;
            whole += 1;
            continue;
        }
        return (whole, (n > off).then(|| (n - off).min(len)));
    }
    (whole, None)
}

/// Writes all of `buf`, taking the stdin lock only for each attempt (never across an await).
pub(super) async fn write_all_shared(stdin: &Mutex<Stdin>, buf: &[u8]) -> std::io::Result<()> {
    use tokio::io::AsyncWrite;
    let mut off = 0;
    while off < buf.len() {
        let n = std::future::poll_fn(|cx| {
            let mut st = lock_stdin(stdin);
            std::pin::Pin::new(&mut st.pipe).poll_write(cx, &buf[off..])
        })
        .await?;
        if n == 0 {
            return Err(std::io::ErrorKind::WriteZero.into());
        }
        off += n;
    }
    Ok(())
}

pub(super) async fn write_loop(
    inst: std::sync::Weak<AcpInstance>,
    mut seen: watch::Receiver<Seen>,
    stdin: Arc<Mutex<Stdin>>,
    mut rx: mpsc::Receiver<WriteJob>,
) {
    // Allocated when a backlog first reaches this task and given back once the queue is empty
    // again: the fast path in `send_line` writes most lines itself, and an idle agent should not
    // hold a batch's buffers (an idle instance cost 32.5 KiB with them, 18.9 KiB without).
    let mut jobs = Vec::new();
    let mut buf = Vec::new();
    loop {
        let n = tokio::select! {
            n = rx.recv_many(&mut jobs, 64) => n,
            // Ended or retired: nothing more is written; the queued jobs (and their budget
            // shares) are dropped with the receiver.
            _ = seen.wait_for(|s| s.ended || s.retired) => 0,
        };
        if n == 0 {
            break;
        }
        buf.clear();
        buf.reserve(jobs.iter().map(|j| j.line.len() + 1).sum());
        for j in &jobs {
            buf.extend_from_slice(&j.line);
            buf.push(b'\n');
        }
        match write_all_shared(&stdin, &buf).await {
            Ok(()) => {
                for j in jobs.drain(..) {
                    match j.done {
                        Done::Ack(tx) | Done::Batch { ack: Some(tx), .. } => {
                            let _ = tx.send(());
                        }
                        Done::Request(_) | Done::Batch { ack: None, .. } => {}
                    }
                }
                let mut st = lock_stdin(&stdin);
                if rx.is_empty() {
                    st.backlog = false;
                }
            }
            Err(e) => {
                lock_stdin(&stdin).broken = true;
                let Some(inst) = inst.upgrade() else { break };
                tracing::warn!(server_id = %inst.server_id, agent = %inst.agent, error = %e,
                    "cannot write to the agent's stdin");
                let mut life = inst.life();
                for j in jobs.drain(..) {
                    match j.done {
                        Done::Request(key) => {
                            life.waiters.remove(&key);
                        }
                        Done::Batch { keys, .. } => {
                            for key in keys {
                                life.waiters.remove(&key);
                            }
                        }
                        Done::Ack(_) => {}
                    }
                }
                break;
            }
        }
        if rx.is_empty() {
            buf = Vec::new();
            jobs = Vec::new();
        }
    }
    lock_stdin(&stdin).broken = true;
    // Dropping the receiver makes every later send fail, which its POST answers with 502.
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Where a short write leaves a batch of lines (lengths, bytes written): whole lines, and
    /// the bytes of the cut line that went.
    #[test]
    fn short_write_split() {
        let check = |lens: &[usize], n, expected| {
            assert_eq!(
                split_written(lens.iter().copied(), n),
                expected,
                "{lens:?} {n}"
            )
        };
        check(&[3, 3], 0, (0, None));
        check(&[3, 3], 2, (0, Some(2)));
        // The line went but not its newline: an empty rest (its newline) must still follow.
        check(&[3, 3], 3, (0, Some(3)));
        check(&[3, 3], 4, (1, None));
        check(&[3, 3], 5, (1, Some(1)));
        check(&[3, 3], 7, (1, Some(3)));
        check(&[3, 3], 8, (2, None));
        check(&[0, 2], 1, (1, None));
        check(&[0, 2], 2, (1, Some(1)));
    }
}
