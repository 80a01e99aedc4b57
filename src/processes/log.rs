//! One process's output: an append-only log of chunks, each at a byte offset in the process's
//! combined output (stdout, stderr and a terminal's output share one offset space), kept in a
//! ring bounded by bytes. Readers ask for what lies after an offset and are told plainly (a gap)
//! when part of it was dropped.
//!
//! **Invariant:** offsets only grow; a chunk's `end` is the offset just after its last byte, so
//! "everything after `n`" is exactly the chunks whose `end > n`; dropped output is never
//! silently skipped (the reader gets `Gap { from, to }` with `[from, to)` the lost bytes).

use std::collections::VecDeque;
use std::sync::Mutex;

use bytes::Bytes;
use tokio::sync::watch;

/// Which stream a chunk came from (also in the reload hand-off).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogStream {
    Stdout,
    Stderr,
    /// A terminal's output (stdout and stderr are one stream there).
    Pty,
}

/// Which chunks a reader wants (`?stream=`); `Combined` is every stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StreamFilter {
    Stdout,
    Stderr,
    Combined,
    Pty,
}

impl StreamFilter {
    fn admits(self, s: LogStream) -> bool {
        match self {
            StreamFilter::Combined => true,
            StreamFilter::Stdout => s == LogStream::Stdout,
            StreamFilter::Stderr => s == LogStream::Stderr,
            StreamFilter::Pty => s == LogStream::Pty,
        }
    }
}

/// What a chunk costs beyond its data (the record, the shared buffer's header), counted against
/// the cap so that a process writing a byte at a time cannot hold many times its cap.
pub const CHUNK_OVERHEAD: u64 = 64;

#[derive(Debug, Clone)]
pub struct Chunk {
    /// Offset of the first byte.
    pub start: u64,
    pub stream: LogStream,
    pub at_ms: u64,
    pub data: Bytes,
}

impl Chunk {
    /// Offset just after the last byte: the chunk's `sequence` and SSE id.
    pub fn end(&self) -> u64 {
        self.start + self.data.len() as u64
    }
}

/// What a read found.
#[derive(Debug, Default)]
pub struct Read {
    /// `[from, to)` was asked for but is no longer held.
    pub gap: Option<(u64, u64)>,
    pub chunks: Vec<Chunk>,
    /// Where the next read should start (after what was returned, or after the gap).
    pub cursor: u64,
    /// No more output will come and everything after `cursor` was returned.
    pub finished: bool,
    /// The read stopped at `max_bytes`: more is held after `cursor`.
    pub more: bool,
}

#[derive(Debug, Default)]
struct Inner {
    chunks: VecDeque<Chunk>,
    /// Bytes held: data plus `CHUNK_OVERHEAD` per chunk.
    held: u64,
    /// Offset after the last byte ever appended.
    end: u64,
    /// Offset of the oldest byte still held (== `end` when nothing is).
    first: u64,
    closed: bool,
}

pub struct OutputLog {
    cap: u64,
    inner: Mutex<Inner>,
    /// Its copy on disk (`--state-dir`).
    durable: std::sync::OnceLock<std::sync::Arc<super::durable::ProcTrack>>,
    /// Bumped on every append and on close, for followers.
    version: watch::Sender<u64>,
}

impl OutputLog {
    /// A log holding at most `cap` bytes (output plus `CHUNK_OVERHEAD` per chunk; at least
    /// room for one byte).
    pub fn new(cap: u64) -> Self {
        OutputLog {
            cap: cap.max(CHUNK_OVERHEAD + 1),
            inner: Mutex::new(Inner::default()),
            durable: std::sync::OnceLock::new(),
            version: watch::channel(0).0,
        }
    }

    /// A closed log rebuilt from the state dir: its chunks at their original offsets (within
    /// the cap, the newest kept).
    pub fn recovered(cap: u64, chunks: Vec<Chunk>) -> Self {
        let log = OutputLog::new(cap);
        {
            let mut g = crate::sys::lock(&log.inner);
            for c in chunks {
                if c.start < g.end || c.data.is_empty() {
                    continue;
                }
                let cost = c.data.len() as u64 + CHUNK_OVERHEAD;
                if cost > log.cap {
                    continue;
                }
                while g.held + cost > log.cap {
                    match g.chunks.pop_front() {
                        Some(o) => g.held -= o.data.len() as u64 + CHUNK_OVERHEAD,
                        None => break,
                    }
                }
                g.held += cost;
                g.end = c.end();
                g.chunks.push_back(c);
            }
            g.first = g.chunks.front().map_or(g.end, |c| c.start);
            g.closed = true;
        }
        log
    }

    pub fn durable(&self) -> Option<&std::sync::Arc<super::durable::ProcTrack>> {
        self.durable.get()
    }

    /// Ties the log to its copy on disk (once).
    pub fn set_durable(&self, t: std::sync::Arc<super::durable::ProcTrack>) {
        let _ = self.durable.set(t);
    }

    pub fn cap(&self) -> u64 {
        self.cap
    }

    /// Appends output, dropping the oldest chunks (whole) to stay within the cap. A chunk larger
    /// than the cap keeps only its last bytes.
    pub fn append(&self, stream: LogStream, mut data: Bytes, at_ms: u64) {
        if data.is_empty() {
            return;
        }
        {
            let mut g = crate::sys::lock(&self.inner);
            if g.closed {
                return;
            }
            let mut start = g.end;
            g.end += data.len() as u64;
            let room = (self.cap - CHUNK_OVERHEAD) as usize;
            if data.len() > room {
                let skip = data.len() - room;
                data = data.slice(skip..);
                start += skip as u64;
            }
            let cost = data.len() as u64 + CHUNK_OVERHEAD;
            while g.held + cost > self.cap {
                match g.chunks.pop_front() {
                    Some(c) => g.held -= c.data.len() as u64 + CHUNK_OVERHEAD,
                    None => break,
                }
            }
            g.held += cost;
            if let Some(d) = self.durable.get() {
                // Under the lock, so the disk sees the chunks in order.
                d.output(start, stream, at_ms, &data);
            }
            g.chunks.push_back(Chunk {
                start,
                stream,
                at_ms,
                data,
            });
            g.first = g.chunks.front().map_or(g.end, |c| c.start);
        }
        self.version.send_modify(|v| *v += 1);
    }

    /// No more output: followers finish once they have read everything.
    pub fn close(&self) {
        crate::sys::lock(&self.inner).closed = true;
        self.version.send_modify(|v| *v += 1);
    }

    pub fn is_closed(&self) -> bool {
        crate::sys::lock(&self.inner).closed
    }

    /// Bytes held now (output plus per-chunk overhead).
    pub fn held(&self) -> u64 {
        crate::sys::lock(&self.inner).held
    }

    /// Offset after the last byte written so far.
    pub fn end(&self) -> u64 {
        crate::sys::lock(&self.inner).end
    }

    /// Wakes on every append and on close.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.version.subscribe()
    }

    /// The chunks of `filter` after offset `since`, at most `max_bytes` of data (but at least one
    /// chunk when there is one), with the gap if part of `(since, …)` was dropped.
    pub fn read_after(&self, since: u64, filter: StreamFilter, max_bytes: usize) -> Read {
        let g = crate::sys::lock(&self.inner);
        let mut out = Read {
            cursor: since,
            ..Read::default()
        };
        if since < g.first {
            out.gap = Some((since, g.first));
            out.cursor = g.first;
        }
        let mut bytes = 0usize;
        // Chunks are in offset order: skip to the first that ends after the cursor.
        let from = g.chunks.partition_point(|c| c.end() <= out.cursor);
        let mut complete = true;
        for c in g.chunks.iter().skip(from) {
            if bytes > 0 && bytes + c.data.len() > max_bytes {
                complete = false;
                break;
            }
            out.cursor = c.end();
            if filter.admits(c.stream) {
                bytes += c.data.len();
                out.chunks.push(c.clone());
            }
        }
        if complete {
            // Every held chunk after the cursor was looked at (those of other streams too).
            out.cursor = out.cursor.max(g.end);
        }
        out.finished = complete && g.closed;
        out.more = !complete;
        out
    }

    /// The last `n` chunks of `filter` (after `since`), for `?tail=`; no gap is reported: the
    /// reader asked for the end, not for continuity.
    pub fn tail(&self, since: u64, filter: StreamFilter, n: usize) -> Vec<Chunk> {
        let g = crate::sys::lock(&self.inner);
        let mut out: Vec<Chunk> = g
            .chunks
            .iter()
            .rev()
            .filter(|c| c.end() > since && filter.admits(c.stream))
            .take(n)
            .cloned()
            .collect();
        out.reverse();
        out
    }
}

/// An output log: its cap, the offset after its last byte, its chunks.
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize, PartialEq)]
pub struct LogState {
    pub cap: u64,
    pub end: u64,
    pub chunks: Vec<(u64, LogStream, u64, crate::carried::HexPayload)>,
}

impl OutputLog {
    /// What a reload carries of this log, its chunks taken out (no copy; the hand-off frees
    /// each as it writes it). Called once the log's pumps are frozen.
    pub(crate) fn export(&self) -> LogState {
        let mut g = crate::sys::lock(&self.inner);
        g.held = 0;
        let end = g.end;
        LogState {
            cap: self.cap,
            end,
            chunks: std::mem::take(&mut g.chunks)
                .into_iter()
                .map(|c| {
                    let data = crate::carried::HexPayload(c.data);
                    (c.start, c.stream, c.at_ms, data)
                })
                .collect(),
        }
    }

    /// The bytes a hand-off of this log carries.
    pub(crate) fn held_bytes(&self) -> u64 {
        crate::sys::lock(&self.inner).held
    }

    pub(crate) fn restore(state: &LogState) -> Self {
        let log = OutputLog::new(state.cap);
        {
            let mut g = crate::sys::lock(&log.inner);
            for (start, stream, at_ms, data) in &state.chunks {
                let data = data.0.clone();
                g.held += data.len() as u64 + CHUNK_OVERHEAD;
                g.chunks.push_back(Chunk {
                    start: *start,
                    stream: *stream,
                    at_ms: *at_ms,
                    data,
                });
            }
            g.end = state.end;
            g.first = g.chunks.front().map_or(g.end, |c| c.start);
        }
        log
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn b(s: &str) -> Bytes {
        Bytes::copy_from_slice(s.as_bytes())
    }

    #[test]
    fn offsets_are_byte_positions_and_since_resumes_exactly() {
        let log = OutputLog::new(1024);
        log.append(LogStream::Stdout, b("abc"), 1);
        log.append(LogStream::Stderr, b("de"), 2);
        log.append(LogStream::Stdout, b("f"), 3);
        let r = log.read_after(0, StreamFilter::Combined, usize::MAX);
        let ends: Vec<u64> = r.chunks.iter().map(Chunk::end).collect();
        assert_eq!(ends, vec![3, 5, 6]);
        assert!(r.gap.is_none());
        assert_eq!(r.cursor, 6);
        let r = log.read_after(3, StreamFilter::Combined, usize::MAX);
        assert_eq!(r.chunks.len(), 2);
        assert_eq!(r.chunks[0].data, b("de"));
        let r = log.read_after(0, StreamFilter::Stdout, usize::MAX);
        assert_eq!(r.chunks.len(), 2);
        assert_eq!(r.cursor, 6);
        assert!(!r.finished);
        log.close();
        assert!(log.read_after(6, StreamFilter::Combined, 10).finished);
    }

    #[test]
    fn eviction_is_reported_as_a_gap_with_the_lost_range() {
        let log = OutputLog::new(5 + CHUNK_OVERHEAD);
        log.append(LogStream::Stdout, b("aaa"), 0);
        log.append(LogStream::Stdout, b("bbb"), 0); // evicts "aaa"
        assert_eq!(log.held(), 3 + CHUNK_OVERHEAD);
        let r = log.read_after(0, StreamFilter::Combined, usize::MAX);
        assert_eq!(r.gap, Some((0, 3)));
        assert_eq!(r.chunks.len(), 1);
        assert_eq!(r.chunks[0].start, 3);
        // Nothing lost after 3.
        assert!(log.read_after(3, StreamFilter::Combined, 100).gap.is_none());
        // A chunk larger than the room keeps its tail, and the cut is a gap too.
        log.append(LogStream::Stdout, b("0123456789"), 0);
        let r = log.read_after(6, StreamFilter::Combined, usize::MAX);
        assert_eq!(r.gap, Some((6, 11)));
        assert_eq!(r.chunks[0].data, b("56789"));
        assert_eq!(r.cursor, 16);
    }

    #[test]
    fn tiny_chunks_are_charged_their_overhead() {
        let log = OutputLog::new(10 * (1 + CHUNK_OVERHEAD));
        for _ in 0..100 {
            log.append(LogStream::Stdout, b("x"), 0);
        }
        assert_eq!(
            log.read_after(90, StreamFilter::Combined, usize::MAX)
                .chunks
                .len(),
            10
        );
        assert_eq!(
            log.read_after(0, StreamFilter::Combined, usize::MAX).gap,
            Some((0, 90))
        );
    }

    #[test]
    fn reads_are_bounded_but_make_progress() {
        let log = OutputLog::new(1 << 20);
        for _ in 0..10 {
            log.append(LogStream::Stdout, b("0123456789"), 0);
        }
        let r = log.read_after(0, StreamFilter::Combined, 25);
        assert_eq!(r.chunks.len(), 2);
        assert_eq!(r.cursor, 20);
        let r = log.read_after(0, StreamFilter::Combined, 1);
        assert_eq!(r.chunks.len(), 1);
        let t = log.tail(0, StreamFilter::Combined, 3);
        assert_eq!(
            t.iter().map(Chunk::end).collect::<Vec<_>>(),
            vec![80, 90, 100]
        );
    }
}
