//! Request bodies of file transfers, read on the async side only. Invariants: no blocking thread
//! ever waits for the network — the async side collects complete batches and only then hands
//! each one to a short blocking step (see `write.rs`, `upload.rs`); a body that sends nothing for
//! the transfer timeout ends the transfer (408); the byte limit is enforced as bytes arrive; at
//! most `--transfer-max` transfers run at once, the next one is refused (503 + `Retry-After`).

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use futures_util::{Stream, StreamExt};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::FileError;

/// A request body as the service sees it (the HTTP layer maps its own error type to io).
pub type BodyStream = Pin<Box<dyn Stream<Item = io::Result<Bytes>> + Send>>;

/// Small frames are coalesced up to this size so the blocking side makes few large `write`
/// calls (and few trips to the blocking pool).
const BATCH: usize = 512 << 10;
/// Frames at least this large go to the writer as they are (hyper's frames are usually a few
/// hundred KiB); copying them would cost more than the extra `write` call.
const PASS_THROUGH: usize = 64 << 10;

/// After an early answer (limit exceeded, the writer failed), the rest of the body is read and
/// discarded up to this much, so that a client still sending gets to read the answer instead of
/// a connection reset (what nginx calls a lingering close).
const LINGER_BYTES: u64 = 64 << 20;
const LINGER_TIME: Duration = Duration::from_secs(2);

/// The transfer slots (uploads and downloads) and their idle timeout.
pub struct Transfers {
    slots: Arc<Semaphore>,
    max: usize,
    pub idle: Duration,
}

impl Transfers {
    pub fn new(max: usize, idle: Duration) -> Self {
        Transfers {
            slots: Arc::new(Semaphore::new(max)),
            max,
            idle,
        }
    }

    /// A slot for one transfer, held until the transfer ends; none free is 503 at once (a
    /// queue would only let stalled clients hold more memory and sockets).
    pub fn acquire(&self) -> Result<TransferSlot, FileError> {
        let permit = self
            .slots
            .clone()
            .try_acquire_owned()
            .map_err(|_| FileError::Busy { limit: self.max })?;
        Ok(TransferSlot {
            permit: Some(permit),
            max: self.max,
        })
    }
}

/// One transfer's slot. When the last transfer under way ends, the heap is trimmed soon after:
/// transfers allocate their chunks on many blocking-pool threads, and glibc keeps what they
/// freed in per-thread arenas, so without it the daemon stayed ~120 MiB above its start after a
/// storm of transfers (`hostile_files::memory_goes_back_down_after_a_storm_of_file_transfers`).
pub struct TransferSlot {
    permit: Option<OwnedSemaphorePermit>,
    max: usize,
}

impl Drop for TransferSlot {
    fn drop(&mut self) {
        let Some(permit) = self.permit.take() else {
            return;
        };
        let slots = permit.semaphore().clone();
        drop(permit);
        if slots.available_permits() == self.max {
            crate::sys::trim_soon();
        }
    }
}

/// Reads a body in batches on the async side, with the idle timeout and the byte limit.
pub struct BodyReader {
    body: BodyStream,
    idle: Duration,
    limit: Option<u64>,
    total: u64,
    pending: BytesMut,
    done: bool,
}

impl BodyReader {
    pub fn new(body: BodyStream, idle: Duration, limit: Option<u64>) -> Self {
        BodyReader {
            body,
            idle,
            limit,
            total: 0,
            pending: BytesMut::new(),
            done: false,
        }
    }

    /// The next batch of at least [`BATCH`] bytes (less at the end), `None` once the body is
    /// complete. A timeout, a body error or the limit ends the body for good.
    pub async fn next_batch(&mut self) -> Result<Option<Bytes>, FileError> {
        while !self.done {
            let frame = match tokio::time::timeout(self.idle, self.body.next()).await {
                Err(_) => {
                    self.done = true;
                    return Err(FileError::Stalled { idle: self.idle });
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
            self.total = self.total.saturating_add(frame.len() as u64);
            if let Some(limit) = self.limit
                && self.total > limit
            {
                return Err(FileError::TooLarge { limit });
            }
            if self.pending.is_empty() && frame.len() >= PASS_THROUGH {
                return Ok(Some(frame));
            }
            if self.pending.capacity() == 0 {
                // A fresh buffer per batch: growing one by doubling would fragment the heap.
                self.pending.reserve(BATCH);
            }
            self.pending.extend_from_slice(&frame);
            if self.pending.len() >= BATCH {
                return Ok(Some(self.pending.split().freeze()));
            }
        }
        if self.pending.is_empty() {
            Ok(None)
        } else {
            Ok(Some(self.pending.split().freeze()))
        }
    }

    /// Reads and discards what the client is still sending after an early answer, bounded in
    /// bytes and time (see [`LINGER_BYTES`]); a stalled or ended body returns at once.
    pub async fn linger(mut self) {
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

/// Holds a value whose `Drop` makes syscalls (unlinking a temporary, closing a large unnamed
/// file) while it sits on the async side between blocking steps. A request cancelled there (the
/// client went away) drops its future on the runtime thread; this sends the value to the
/// blocking pool instead.
pub struct OffThread<T: Send + 'static>(Option<T>);

impl<T: Send + 'static> OffThread<T> {
    pub fn new(value: T) -> Self {
        OffThread(Some(value))
    }

    /// Takes the value out for a blocking step (which drops it there if the step fails).
    pub fn take(&mut self) -> Result<T, FileError> {
        self.0.take().ok_or_else(|| FileError::Io {
            op: "continue",
            path: std::path::PathBuf::from("a transfer"),
            source: io::Error::other("its file was lost after a failed step"),
        })
    }

    pub fn put(&mut self, value: T) {
        self.0 = Some(value);
    }

    /// Drops the value on the blocking pool and waits until that is done (dropping `self`
    /// does it too, without waiting): for an answer that must not go out before the clean-up.
    pub async fn discard(mut self) {
        if let Some(v) = self.0.take() {
            let _ = tokio::task::spawn_blocking(move || drop(v)).await;
        }
    }
}

impl<T: Send + 'static> Drop for OffThread<T> {
    fn drop(&mut self) {
        if let Some(v) = self.0.take() {
            drop_off_thread(v);
        }
    }
}
