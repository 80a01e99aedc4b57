//! Request bodies of file transfers, read on the async side only, and the blocking disk steps
//! they feed. Invariants: no blocking thread ever waits for the network — the async side collects
//! complete batches and only then hands each one to a short blocking step (see `write.rs`,
//! `upload.rs`), which runs while the next batch arrives (one step in flight per transfer);
//! `--transfer-max` bounds the disk steps running at once, never the transfers, so a transfer
//! waiting on its client holds no slot; a body that sends nothing for the transfer timeout, or
//! falls below the minimum rate (`--body-min-rate`), ends the transfer (408); the byte limit is
//! enforced as bytes arrive; a body that pauses has what it sent written out, so a stalled
//! transfer holds its socket and a descriptor, not its data.

use std::io::{self, IoSlice, Write};
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use futures_util::{Stream, StreamExt};
use tokio::sync::Semaphore;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::{FileError, internal};

/// A request body as the service sees it (the HTTP layer maps its own error type to io).
pub type BodyStream = Pin<Box<dyn Stream<Item = io::Result<Bytes>> + Send>>;

/// Bytes per disk step (one `write` batch, one read of a download): large enough that the trips
/// to the blocking pool are noise next to the copy. Kept under the mmap threshold the daemon
/// fixes at start (1 MiB, `main.rs`), so buffers come from the heap instead of fresh mappings
/// that fault in every page.
pub(super) const CHUNK: usize = (1 << 20) - (64 << 10);
/// Frames smaller than `SMALL_FRAME` are copied into a shared buffer of `SMALL` bytes (so a
/// trickle of tiny frames does not pin many of hyper's buffers); larger ones are written as they
/// are, by a vectored write. Hyper reads a body at most 256 KiB at a time (its read buffer's
/// cap, `daemon/protocol.rs`) and often less; with the threshold at 64 KiB, when its reads were
/// capped there, most of an upload was copied once more on its way to the disk.
const SMALL: usize = 64 << 10;
const SMALL_FRAME: usize = 16 << 10;
/// A body that pauses this long with data pending gets that data written out: a stalled
/// transfer then holds no body bytes in memory.
const QUIET: Duration = Duration::from_millis(50);

/// After an early answer (limit exceeded, the writer failed), the rest of the body is read and
/// discarded up to this much, so that a client still sending gets to read the answer instead of
/// a connection reset (what nginx calls a lingering close).
const LINGER_BYTES: u64 = 64 << 20;
const LINGER_TIME: Duration = Duration::from_secs(2);

/// The disk-step slots of file transfers, the body deadlines, and the count of transfers under
/// way (for the heap trim after a storm).
#[derive(Clone)]
pub struct Transfers {
    steps: Arc<Semaphore>,
    active: Arc<AtomicUsize>,
    pub idle: Duration,
    /// Bytes per second a body must average after the first `idle` (0: no minimum).
    pub min_rate: u64,
}

impl Transfers {
    pub fn new(max_steps: usize, idle: Duration, min_rate: u64) -> Self {
        Transfers {
            steps: Arc::new(Semaphore::new(max_steps.max(1))),
            active: Arc::new(AtomicUsize::new(0)),
            idle,
            min_rate,
        }
    }

    /// Counts a transfer as under way until the guard drops. Never refuses: what a transfer
    /// costs while it waits on its client is its socket and a descriptor, and the disk work is
    /// bounded by the step slots.
    pub fn begin(&self) -> TransferGuard {
        self.active.fetch_add(1, Ordering::AcqRel);
        TransferGuard {
            active: self.active.clone(),
        }
    }

    /// Runs `f` on the blocking pool once a step slot is free; the slot is held until `f`
    /// returns, even if the caller stops waiting.
    pub async fn step<T, F>(&self, f: F) -> Result<T, FileError>
    where
        F: FnOnce() -> Result<T, FileError> + Send + 'static,
        T: Send + 'static,
    {
        self.spawn(f)
            .await
            .await
            .unwrap_or_else(|e| Err(internal(e)))
    }

    /// Starts `f` as in [`Self::step`] (waiting only for a free slot) and returns its handle.
    pub(super) async fn spawn<R, F>(&self, f: F) -> JoinHandle<R>
    where
        F: FnOnce() -> R + Send + 'static,
        R: Send + 'static,
    {
        // The semaphore is never closed.
        let permit = self.steps.clone().acquire_owned().await.ok();
        tokio::task::spawn_blocking(move || {
            let r = f();
            drop(permit);
            r
        })
    }
}

/// One transfer under way; when the last one ends, the heap is trimmed soon after: transfers
/// allocate their chunks on many threads, and glibc keeps what they freed in per-thread arenas,
/// so without it the daemon stayed ~120 MiB above its start after a storm of transfers
/// (`hostile_files::memory_goes_back_down_after_a_storm_of_file_transfers`).
pub struct TransferGuard {
    active: Arc<AtomicUsize>,
}

impl Drop for TransferGuard {
    fn drop(&mut self) {
        if self.active.fetch_sub(1, Ordering::AcqRel) == 1 {
            crate::sys::trim_soon();
        }
    }
}

/// A batch of body bytes, as the frames (or coalesced runs of small frames) that carried them.
#[derive(Default)]
pub struct Batch {
    parts: Vec<Bytes>,
    len: usize,
}

impl Batch {
    fn push(&mut self, b: Bytes) {
        self.len += b.len();
        self.parts.push(b);
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The batch's bytes, frame by frame.
    pub fn parts(&self) -> impl Iterator<Item = &[u8]> {
        self.parts.iter().map(|b| &b[..])
    }

    /// Writes the whole batch with vectored writes (no copy into one buffer).
    pub fn write_to(&self, out: impl Write) -> io::Result<()> {
        self.write_from(0, out)
    }

    /// Writes the batch from byte `from` on, with vectored writes.
    pub fn write_from(&self, from: usize, mut out: impl Write) -> io::Result<()> {
        let mut skip = from;
        let mut slices: Vec<IoSlice<'_>> = Vec::with_capacity(self.parts.len());
        for b in &self.parts {
            if skip >= b.len() {
                skip -= b.len();
                continue;
            }
            slices.push(IoSlice::new(&b[skip..]));
            skip = 0;
        }
        let mut bufs = &mut slices[..];
        while !bufs.is_empty() {
            match out.write_vectored(bufs) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(n) => IoSlice::advance_slices(&mut bufs, n),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }
}

/// Reads the first bytes of a batch, frame by frame (no copy).
pub struct BatchReader<'a> {
    parts: std::slice::Iter<'a, Bytes>,
    current: &'a [u8],
    left: usize,
}

impl<'a> BatchReader<'a> {
    /// The first `len` bytes of `batch`.
    pub fn new(batch: &'a Batch, len: usize) -> Self {
        BatchReader {
            parts: batch.parts.iter(),
            current: &[],
            left: len,
        }
    }
}

impl io::Read for BatchReader<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        while self.current.is_empty() && self.left > 0 {
            match self.parts.next() {
                Some(b) => self.current = &b[..],
                None => return Ok(0),
            }
        }
        let n = buf.len().min(self.current.len()).min(self.left);
        buf[..n].copy_from_slice(&self.current[..n]);
        self.current = &self.current[n..];
        self.left -= n;
        Ok(n)
    }
}

/// When a request body that began at `started` must have ended at the latest, for the `received`
/// bytes it has sent so far: `grace`, plus one second per `min_rate` bytes (`None`: no minimum).
/// A body trickled a byte at a time, never silent for long, runs out of it after the grace.
pub fn rate_deadline(
    started: Instant,
    grace: Duration,
    received: u64,
    min_rate: u64,
) -> Option<Instant> {
    (min_rate > 0).then(|| {
        let earned = Duration::from_secs_f64(received as f64 / min_rate as f64);
        started + grace + earned.min(Duration::from_secs(1 << 32))
    })
}

/// Reads a body in batches on the async side, with the idle timeout, the minimum rate and the
/// byte limit.
pub struct BodyReader {
    body: BodyStream,
    idle: Duration,
    min_rate: u64,
    limit: Option<u64>,
    started: Instant,
    last_frame: Instant,
    total: u64,
    batch: Batch,
    small: BytesMut,
    done: bool,
}

impl BodyReader {
    pub fn new(body: BodyStream, transfers: &Transfers, limit: Option<u64>) -> Self {
        let now = Instant::now();
        BodyReader {
            body,
            idle: transfers.idle,
            min_rate: transfers.min_rate,
            limit,
            started: now,
            last_frame: now,
            total: 0,
            batch: Batch::default(),
            small: BytesMut::new(),
            done: false,
        }
    }

    fn rate_deadline(&self) -> Option<Instant> {
        rate_deadline(self.started, self.idle, self.total, self.min_rate)
    }

    /// Moves the coalesced small frames into the batch.
    fn seal_small(&mut self) {
        if !self.small.is_empty() {
            let b = self.small.split().freeze();
            self.batch.push(b);
        }
    }

    fn take_batch(&mut self) -> Batch {
        self.seal_small();
        let batch = std::mem::take(&mut self.batch);
        crate::metrics::transfer_in(batch.len() as u64);
        batch
    }

    /// The next batch of about [`CHUNK`] bytes (less at the end, or when the body pauses with
    /// data pending), `None` once the body is complete. A timeout, a body error or the limit
    /// ends the body for good.
    pub async fn next_batch(&mut self) -> Result<Option<Batch>, FileError> {
        while !self.done {
            let pending = self.batch.len() + self.small.len() > 0;
            let idle_due = self.last_frame + self.idle;
            let mut due = idle_due;
            if let Some(rate_due) = self.rate_deadline() {
                due = due.min(rate_due);
            }
            let wake = if pending {
                due.min(Instant::now() + QUIET)
            } else {
                due
            };
            let frame = match tokio::time::timeout_at(wake, self.body.next()).await {
                Err(_) if pending && Instant::now() < due => return Ok(Some(self.take_batch())),
                Err(_) => {
                    self.done = true;
                    if Instant::now() >= idle_due {
                        return Err(FileError::Stalled { idle: self.idle });
                    }
                    return Err(FileError::TooSlow {
                        min_rate: self.min_rate,
                    });
                }
                Ok(None) => {
                    self.done = true;
                    break;
                }
                Ok(Some(Err(e))) => {
                    self.done = true;
                    return Err(FileError::Body(e));
                }
                Ok(Some(Ok(f))) => f,
            };
            self.last_frame = Instant::now();
            self.total = self.total.saturating_add(frame.len() as u64);
            if let Some(limit) = self.limit
                && self.total > limit
            {
                self.done = true;
                return Err(FileError::TooLarge { limit });
            }
            if frame.len() >= SMALL_FRAME {
                self.seal_small();
                self.batch.push(frame);
            } else {
                if self.small.len() + frame.len() > SMALL {
                    self.seal_small();
                }
                if self.small.capacity() - self.small.len() < frame.len() {
                    // A fresh small buffer; growing one by doubling would fragment the heap.
                    self.small.reserve(SMALL);
                }
                self.small.extend_from_slice(&frame);
            }
            if self.batch.len() + self.small.len() >= CHUNK {
                return Ok(Some(self.take_batch()));
            }
        }
        let last = self.take_batch();
        Ok((!last.is_empty()).then_some(last))
    }

    /// Reads and discards what the client is still sending after an early answer, bounded in
    /// bytes and time (see [`LINGER_BYTES`]); a stalled or ended body returns at once.
    pub async fn linger(mut self) {
        self.batch = Batch::default();
        self.small = BytesMut::new();
        if self.done {
            return;
        }
        let mut drained = 0u64;
        let idle = self.idle.min(LINGER_TIME);
        let _ = tokio::time::timeout(LINGER_TIME, async {
            while let Ok(Some(Ok(frame))) = tokio::time::timeout(idle, self.body.next()).await {
                drained += frame.len() as u64;
                if drained > LINGER_BYTES {
                    break;
                }
            }
        })
        .await;
    }
}

/// Pumps the whole body into `worker`: each batch is written by `write` as a blocking step
/// while the next batch arrives. Returns the value once the last write is done. On an error the
/// value is dropped on the blocking pool before this returns (a client that reads the error finds
/// nothing of its upload left), and the rest of a refused body is drained a little
/// ([`BodyReader::linger`]) so the client can read the answer.
pub async fn pump<T, W>(
    mut reader: BodyReader,
    mut worker: Worker<T>,
    transfers: &Transfers,
    write: W,
) -> Result<T, FileError>
where
    T: Send + 'static,
    W: Fn(&mut T, &Batch) -> Result<(), FileError> + Clone + Send + 'static,
{
    loop {
        match reader.next_batch().await {
            Ok(Some(batch)) => {
                let write = write.clone();
                if let Err(e) = worker.start(transfers, move |v| write(v, &batch)).await {
                    // The failed step dropped the value on its blocking thread.
                    reader.linger().await;
                    return Err(e);
                }
            }
            Ok(None) => return worker.finish().await,
            Err(e) => {
                worker.discard().await;
                if matches!(e, FileError::TooLarge { .. }) {
                    reader.linger().await;
                }
                return Err(e);
            }
        }
    }
}

/// Drops `value` (a temporary file and its directory, say) on the blocking pool: its `Drop`
/// makes syscalls that must not run on the runtime thread.
pub fn drop_off_thread<T: Send + 'static>(value: T) {
    match tokio::runtime::Handle::try_current() {
        Ok(h) => {
            h.spawn_blocking(move || drop(value));
        }
        Err(_) => drop(value),
    }
}

/// A value whose `Drop` makes syscalls (a temporary file being written, an unnamed spool) that
/// travels between the async side and one blocking step at a time. The step runs while the
/// async side goes on reading the body; a failed step drops the value on the blocking thread;
/// a request cancelled meanwhile (the client went away) has the value dropped on the blocking
/// pool, never on the runtime thread.
pub struct Worker<T: Send + 'static> {
    state: Option<State<T>>,
}

enum State<T> {
    Idle(T),
    Busy(JoinHandle<Result<T, FileError>>),
}

impl<T: Send + 'static> Worker<T> {
    pub fn new(value: T) -> Self {
        Worker {
            state: Some(State::Idle(value)),
        }
    }

    /// Waits for the step under way, if any, and takes the value out.
    async fn take(&mut self) -> Result<T, FileError> {
        match self.state.take() {
            Some(State::Idle(v)) => Ok(v),
            Some(State::Busy(h)) => h.await.unwrap_or_else(|e| Err(internal(e))),
            None => Err(FileError::Io {
                op: "continue",
                path: std::path::PathBuf::from("a transfer"),
                source: io::Error::other("its file was lost after a failed step"),
            }),
        }
    }

    /// Waits for the previous step (returning its error), then starts `f` on the value as a
    /// blocking step under a transfer slot, without waiting for it.
    pub async fn start<F>(&mut self, transfers: &Transfers, f: F) -> Result<(), FileError>
    where
        F: FnOnce(&mut T) -> Result<(), FileError> + Send + 'static,
    {
        let mut v = self.take().await?;
        let h = transfers
            .spawn(move || {
                f(&mut v)?;
                Ok(v)
            })
            .await;
        self.state = Some(State::Busy(h));
        Ok(())
    }

    /// Waits for the last step and returns the value.
    pub async fn finish(mut self) -> Result<T, FileError> {
        self.take().await
    }

    /// Waits for the step under way, then drops the value on the blocking pool and waits until
    /// that is done: for an answer that must not go out before the clean-up.
    pub async fn discard(mut self) {
        if let Ok(v) = self.take().await {
            let _ = tokio::task::spawn_blocking(move || drop(v)).await;
        }
    }
}

impl<T: Send + 'static> Drop for Worker<T> {
    fn drop(&mut self) {
        match self.state.take() {
            Some(State::Idle(v)) => drop_off_thread(v),
            Some(State::Busy(h)) => {
                if let Ok(rt) = tokio::runtime::Handle::try_current() {
                    rt.spawn(async move {
                        if let Ok(Ok(v)) = h.await {
                            drop_off_thread(v);
                        }
                    });
                }
            }
            None => {}
        }
    }
}
