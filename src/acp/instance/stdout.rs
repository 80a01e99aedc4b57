//! The agent's stdout: the reader task of an instance and its bounded line reader.
//! **Invariant:** no more than `--max-line` bytes of one line are ever held; a longer line is
//! counted (and logged, within a budget) as soon as it is over, its rest discarded as it
//! arrives; every complete line goes to the instance in the order written; the instance learns
//! the process's exit as soon as the supervisor publishes it, and its end once the pipe is
//! drained (or given up on).

use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt};
use tokio::process::ChildStdout;

use super::AcpInstance;
use crate::acp::jsonrpc::{AgentLine, BadLine, classify_agent_line};
use crate::supervisor::{ChildHandle, ExitInfo};

/// Lines larger than this are classified (parsed) off the runtime thread, which the daemon has
/// only one of; the reader awaits the result, so the order of lines is kept.
const LARGE_LINE: usize = 256 * 1024;

async fn classify(line: &Bytes) -> Result<AgentLine, BadLine> {
    if line.len() <= LARGE_LINE {
        return classify_agent_line(line);
    }
    let line = line.clone();
    crate::sys::blocking(move || classify_agent_line(&line)).await
}

/// The agent's stdout reader, for the agent's life. Its first bytes are `carry` (after a
/// reload: what the previous image's reader had read from the pipe and not yet split into lines;
/// empty for a fresh process), `skipping` as it was.
pub(super) async fn read_loop(
    inst: Arc<AcpInstance>,
    stdout: ChildStdout,
    handle: ChildHandle,
    max_line: usize,
    carry: Vec<u8>,
    skipping: bool,
) {
    let mut reader = LineReader::new(stdout, max_line);
    reader.buf.extend_from_slice(&carry);
    reader.skipping = skipping;
    let mut exit: Option<ExitInfo> = None;
    let mut drain_until = tokio::time::Instant::now();
    let mut detail = String::new();
    // Lines pushed since the reader last waited for the state dir's writer.
    let mut ahead = 0u64;
    loop {
        if !reader.has_line() {
            // About to wait for the agent: let the subscribers have what this burst produced,
            // once it is in the state dir (when there is one): no client sees an event a crash
            // could lose, and an agent faster than the disk waits on its pipe.
            inst.events.written().await;
            ahead = 0;
            inst.events.wake();
        }
        tokio::select! {
            biased;
            // A reload: stop between two lines and hand the pipe over; the agent, its
            // waiters and its log carry on in the new image.
            _ = inst.freeze.cancelled() => {
                inst.hand_over_stdout(super::FrozenStdout {
                    stdout: reader.inner,
                    carry: reader.buf.to_vec(),
                    skipping: reader.skipping,
                });
                return;
            }
            line = reader.next_line() => match line {
                Ok(Some(Line::Data(l))) => {
                    let class = classify(&l).await;
                    // A response is handed to its POST only once what came before is written;
                    // a long burst waits for the writer every `PRODUCER_AHEAD` lines.
                    if ahead >= crate::state::PRODUCER_AHEAD
                        || matches!(class, Ok(AgentLine::Response(_)))
                    {
                        inst.events.written().await;
                        ahead = 0;
                    }
                    inst.on_line(l, class);
                    ahead += 1;
                }
                Ok(Some(Line::TooLong(prefix))) => inst.invalid_line(&prefix, "longer than the maximum line length"),
                Ok(None) => break,
                Err(e) => {
                    detail = format!("cannot read the agent's stdout: {e}");
                    break;
                }
            },
            info = handle.wait(), if exit.is_none() => {
                // The tree is gone: the instance is `exited` from now on, even while the pipe
                // is drained.
                inst.exited(info.clone());
                exit = Some(info);
                // What it wrote before is still in the pipe. Read on until EOF, but not
                // forever: a grandchild that escaped may hold the pipe open.
                drain_until = tokio::time::Instant::now() + Duration::from_millis(500);
            }
            _ = tokio::time::sleep_until(drain_until), if exit.is_some() => break,
        }
    }
    let exit = match exit {
        Some(e) => Some(e),
        None => match tokio::time::timeout(Duration::from_secs(1), handle.wait()).await {
            Ok(e) => Some(e),
            Err(_) => {
                // Stdout closed but the process lives on: it can never answer again. It stays
                // `running` until the stop has cleared its tree.
                if detail.is_empty() {
                    detail = "the agent closed its stdout".to_string();
                }
                inst.finish(None, detail.clone());
                let exit = handle.stop(inst.grace).await;
                inst.exited(exit);
                return;
            }
        },
    };
    if let Some(e) = &exit {
        inst.exited(e.clone());
    }
    if detail.is_empty() {
        detail = describe_exit(exit.as_ref());
    }
    inst.finish(exit, detail);
}

fn describe_exit(exit: Option<&ExitInfo>) -> String {
    match exit {
        Some(ExitInfo {
            code: Some(code), ..
        }) => format!("the agent exited with code {code}"),
        Some(ExitInfo {
            signal: Some(sig), ..
        }) => format!("the agent was killed by signal {sig}"),
        _ => "the agent exited".to_string(),
    }
}

enum Line {
    Data(Bytes),
    /// The first bytes of a line over the maximum, returned as soon as it is over (the rest is
    /// discarded as it arrives, never held), so it is counted while it streams.
    TooLong(Bytes),
}

/// Splits a byte stream into lines without ever holding more than `max` bytes of one line.
struct LineReader<R> {
    inner: R,
    buf: BytesMut,
    max: usize,
    /// Bytes of `buf` already searched for a newline.
    scanned: usize,
    /// Discarding the rest of an oversize line (already reported) up to its newline.
    skipping: bool,
    /// A large line went through: `buf` may still share its big allocation, which would stay
    /// with this reader for good; start a fresh buffer before the next read.
    shrink: bool,
    /// Bytes the last read returned: a small read means a quiet agent, whose buffer goes back
    /// to `QUIET_BUF` once emptied.
    last_read: usize,
}

/// The buffer of an agent that writes little (most agents, most of the time, are idle): an idle
/// instance must not hold 64 KiB for its stdout (docs/performance.md, "Density"). A read that
/// fills it grows it to 64 KiB for as long as the agent keeps writing that much.
const QUIET_BUF: usize = 4 * 1024;

/// Lines at least this long make the reader start a fresh buffer afterwards.
const SHRINK_AFTER: usize = 1 << 20;

impl<R: AsyncRead + Unpin> LineReader<R> {
    fn new(inner: R, max: usize) -> Self {
        LineReader {
            inner,
            buf: BytesMut::with_capacity(QUIET_BUF),
            max: max.max(1),
            scanned: 0,
            skipping: false,
            shrink: false,
            last_read: 0,
        }
    }

    /// The end of a burst: back to a small buffer, and the heap's holes the burst left (its
    /// lines' parsing and framing, between the event log's long-lived blocks) given back to the
    /// system (docs/performance.md, "Density": ~33 KiB per instance after a 4,096-event burst).
    fn quiet_again(&mut self) {
        self.buf = BytesMut::with_capacity(QUIET_BUF);
        crate::sys::trim_soon();
    }

    /// True when a complete line is already buffered (the next call will not wait).
    fn has_line(&self) -> bool {
        memchr::memchr(b'\n', &self.buf[self.scanned..]).is_some()
    }

    /// The next line (without its newline), or `None` at end of stream. Cancel-safe: all state
    /// lives in `self`.
    async fn next_line(&mut self) -> std::io::Result<Option<Line>> {
        loop {
            if let Some(pos) = memchr::memchr(b'\n', &self.buf[self.scanned..]) {
                let end = self.scanned + pos;
                let mut line = self.buf.split_to(end + 1);
                self.scanned = 0;
                if std::mem::take(&mut self.skipping) {
                    // The tail of a line reported when it went over.
                    continue;
                }
                line.truncate(end);
                self.shrink |= end >= SHRINK_AFTER;
                if line.len() > self.max {
                    line.truncate(200);
                    return Ok(Some(Line::TooLong(line.freeze())));
                }
                if line.last() == Some(&b'\r') {
                    line.truncate(end - 1);
                }
                if line.is_empty() {
                    continue;
                }
                return Ok(Some(Line::Data(sanitize(line))));
            }
            self.scanned = self.buf.len();
            if self.skipping {
                // No newline yet: nothing of this line is kept.
                self.buf.clear();
                self.scanned = 0;
            } else if self.buf.len() > self.max {
                let prefix = Bytes::copy_from_slice(&self.buf[..self.buf.len().min(200)]);
                self.buf.clear();
                self.scanned = 0;
                self.shrink = true;
                self.skipping = true;
                return Ok(Some(Line::TooLong(prefix)));
            }
            if self.shrink && self.buf.len() <= 64 * 1024 {
                let mut fresh = BytesMut::with_capacity(64 * 1024);
                fresh.extend_from_slice(&self.buf);
                self.buf = fresh;
                self.shrink = false;
                // The big line itself is freed once its POST or the event log is done with it.
                crate::sys::trim_soon();
            }
            if self.buf.is_empty()
                && self.buf.capacity() > QUIET_BUF
                && self.last_read < QUIET_BUF / 2
            {
                // Quiet again: the big buffer is freed (the lines split off it keep only what
                // they still use).
                self.quiet_again();
            } else if self.buf.capacity() - self.buf.len() < QUIET_BUF / 4 {
                self.buf.reserve(64 * 1024);
            }
            let n = if self.buf.is_empty() && self.buf.capacity() > QUIET_BUF {
                // The end of a burst: try the big buffer once; if the agent has nothing more to
                // say, wait with a small one (a burst's last read is large, so the check above
                // would keep 64 KiB for as long as the agent then stays idle).
                match poll_once(self.inner.read_buf(&mut self.buf)).await {
                    Some(n) => n?,
                    None => {
                        self.quiet_again();
                        self.inner.read_buf(&mut self.buf).await?
                    }
                }
            } else {
                self.inner.read_buf(&mut self.buf).await?
            };
            self.last_read = n;
            if n == 0 {
                if std::mem::take(&mut self.skipping) {
                    self.buf.clear();
                }
                if self.buf.is_empty() {
                    return Ok(None);
                }
                // A last line without its newline still counts.
                let line = self.buf.split();
                self.scanned = 0;
                return Ok(Some(Line::Data(sanitize(line))));
            }
        }
    }
}

/// Polls `fut` once: its output if it is ready, `None` (and the future dropped) if it would
/// wait. Only for cancel-safe futures (a read that returned `Pending` read nothing).
async fn poll_once<F: std::future::Future>(fut: F) -> Option<F::Output> {
    let mut fut = std::pin::pin!(fut);
    std::future::poll_fn(|cx| match fut.as_mut().poll(cx) {
        std::task::Poll::Ready(out) => std::task::Poll::Ready(Some(out)),
        std::task::Poll::Pending => std::task::Poll::Ready(None),
    })
    .await
}

/// A CR inside a line can only be JSON whitespace, but SSE treats it as a line break: fold it.
fn sanitize(mut line: BytesMut) -> Bytes {
    if memchr::memchr(b'\r', &line).is_some() {
        for b in line.iter_mut() {
            if *b == b'\r' {
                *b = b' ';
            }
        }
    }
    line.freeze()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(input: &[u8], max: usize, expected: &[&str]) {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let mut r = LineReader::new(input, max);
        let mut got = Vec::new();
        rt.block_on(async {
            while let Some(l) = r.next_line().await.unwrap() {
                got.push(match l {
                    Line::Data(b) => String::from_utf8_lossy(&b).into_owned(),
                    Line::TooLong(_) => "<too long>".to_string(),
                });
            }
        });
        assert_eq!(got, expected);
    }

    /// A burst grows the buffer; once the agent is quiet again the reader goes back to a small
    /// one, and every line arrives whole either way.
    #[test]
    fn a_quiet_reader_holds_a_small_buffer() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let (mut tx, rx) = tokio::io::duplex(1 << 20);
            let mut r = LineReader::new(rx, 1 << 20);
            assert!(r.buf.capacity() <= QUIET_BUF);
            let burst: String = (0..2000).map(|i| format!("{{\"i\":{i}}}\n")).collect();
            tokio::io::AsyncWriteExt::write_all(&mut tx, burst.as_bytes())
                .await
                .unwrap();
            for i in 0..2000 {
                match r.next_line().await.unwrap() {
                    Some(Line::Data(b)) => assert_eq!(&b[..], format!("{{\"i\":{i}}}").as_bytes()),
                    _ => panic!("line {i}"),
                }
            }
            assert!(r.buf.capacity() > QUIET_BUF || r.last_read > QUIET_BUF / 2);
            // Nothing more: the reader that waits for the next line waits with a small buffer
            // (the burst's last read was large, so only the wait itself can tell it is quiet).
            assert!(poll_once(r.next_line()).await.is_none());
            assert!(
                r.buf.capacity() <= QUIET_BUF,
                "capacity {} while idle after a burst",
                r.buf.capacity()
            );
            // Small writes: the next reads shrink the buffer back.
            for i in 0..3 {
                tokio::io::AsyncWriteExt::write_all(&mut tx, b"{}\n")
                    .await
                    .unwrap();
                assert!(
                    matches!(r.next_line().await.unwrap(), Some(Line::Data(_))),
                    "{i}"
                );
            }
            assert!(
                r.buf.capacity() <= QUIET_BUF,
                "capacity {}",
                r.buf.capacity()
            );
        });
    }

    #[test]
    fn lines() {
        check(b"{}\n{\"a\":1}\n", 100, &["{}", "{\"a\":1}"]);
        check(b"{}\r\n\n{}", 100, &["{}", "{}"]);
        check(b"{\"a\":\r1}\n", 100, &["{\"a\": 1}"]);
        let long = format!("{{\"x\":\"{}\"}}\n{{}}\n", "y".repeat(300_000));
        check(long.as_bytes(), 1000, &["<too long>", "{}"]);
        check(b"0123456789\n{}\n", 5, &["<too long>", "{}"]);
        check(b"0123456789", 5, &["<too long>"]);
    }
}
