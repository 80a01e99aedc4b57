//! Moves a request body from the async side to a blocking writer through a bounded channel, so
//! memory stays constant whatever the size, and enforces the byte limit while doing it.
//! Invariant: the blocking side sees [`Chunk::End`] only after the whole body arrived within the
//! limit; any other ending (error, limit, client gone) makes it abandon its work.

use std::io::{self, Read};
use std::pin::Pin;

use bytes::{Bytes, BytesMut};
use futures_util::{Stream, StreamExt};
use tokio::sync::mpsc;

use super::FileError;

/// A request body as the service sees it (the HTTP layer maps its own error type to io).
pub type BodyStream = Pin<Box<dyn Stream<Item = io::Result<Bytes>> + Send>>;

pub enum Chunk {
    Data(Bytes),
    End,
}

/// In-flight chunks between the two sides; with [`BATCH`] this bounds buffered memory to a few
/// MiB per request.
pub const CHANNEL_CHUNKS: usize = 4;
/// Small frames are coalesced up to this size so the writer makes few large `write` calls.
const BATCH: usize = 512 << 10;
/// Frames at least this large go to the writer as they are (hyper's frames are usually a few
/// hundred KiB); copying them would cost more than the extra `write` call.
const PASS_THROUGH: usize = 64 << 10;

/// Why pumping stopped early.
pub enum PumpEnd {
    /// The blocking side hung up (it failed, or it needs no more input).
    ReceiverGone,
    Failed(FileError),
}

/// After an early answer (limit exceeded, the writer failed or needs no more), the rest of the
/// body is read and discarded up to this much, so that a client still sending gets to read the
/// answer instead of a connection reset (what nginx calls a lingering close).
const LINGER_BYTES: u64 = 64 << 20;
const LINGER_TIME: std::time::Duration = std::time::Duration::from_secs(2);

/// Forwards `body` into `tx`, then sends `End`. Counts bytes against `limit`.
pub async fn pump(
    mut body: BodyStream,
    tx: mpsc::Sender<Chunk>,
    limit: Option<u64>,
) -> Result<u64, PumpEnd> {
    let res = forward(&mut body, tx, limit).await;
    if matches!(
        res,
        Err(PumpEnd::ReceiverGone) | Err(PumpEnd::Failed(FileError::TooLarge { .. }))
    ) {
        let mut drained = 0u64;
        let _ = tokio::time::timeout(LINGER_TIME, async {
            while let Some(Ok(frame)) = body.next().await {
                drained += frame.len() as u64;
                if drained > LINGER_BYTES {
                    break;
                }
            }
        })
        .await;
    }
    res
}

/// The forwarding loop of [`pump`]; dropping `tx` on any early return tells the writer to
/// abandon its work.
async fn forward(
    body: &mut BodyStream,
    tx: mpsc::Sender<Chunk>,
    limit: Option<u64>,
) -> Result<u64, PumpEnd> {
    let mut total: u64 = 0;
    let mut pending = BytesMut::new();
    while let Some(frame) = body.next().await {
        let frame = frame.map_err(|e| PumpEnd::Failed(FileError::Body(e)))?;
        total += frame.len() as u64;
        if let Some(limit) = limit {
            if total > limit {
                return Err(PumpEnd::Failed(FileError::TooLarge { limit }));
            }
        }
        let out = if pending.is_empty() && frame.len() >= PASS_THROUGH {
            frame
        } else {
            if pending.capacity() == 0 {
                // A fresh buffer per batch: growing one by doubling would fragment the heap.
                pending.reserve(BATCH);
            }
            pending.extend_from_slice(&frame);
            if pending.len() < BATCH {
                continue;
            }
            pending.split().freeze()
        };
        tx.send(Chunk::Data(out))
            .await
            .map_err(|_| PumpEnd::ReceiverGone)?;
    }
    if !pending.is_empty() {
        tx.send(Chunk::Data(pending.freeze()))
            .await
            .map_err(|_| PumpEnd::ReceiverGone)?;
    }
    tx.send(Chunk::End)
        .await
        .map_err(|_| PumpEnd::ReceiverGone)?;
    Ok(total)
}

/// The blocking side of the channel as a `Read`: EOF only on `End`; a channel closed without
/// `End` is an error, so a half-received body never looks complete.
pub struct ChannelReader {
    rx: mpsc::Receiver<Chunk>,
    cur: Bytes,
    done: bool,
}

impl ChannelReader {
    pub fn new(rx: mpsc::Receiver<Chunk>) -> Self {
        ChannelReader {
            rx,
            cur: Bytes::new(),
            done: false,
        }
    }
}

impl Read for ChannelReader {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        while self.cur.is_empty() {
            if self.done {
                return Ok(0);
            }
            match self.rx.blocking_recv() {
                Some(Chunk::Data(b)) => self.cur = b,
                Some(Chunk::End) => self.done = true,
                None => {
                    return Err(io::Error::new(
                        io::ErrorKind::ConnectionAborted,
                        "the request body ended early",
                    ));
                }
            }
        }
        let n = buf.len().min(self.cur.len());
        buf[..n].copy_from_slice(&self.cur[..n]);
        let _ = self.cur.split_to(n);
        Ok(n)
    }
}
