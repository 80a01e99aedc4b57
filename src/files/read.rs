//! `GET /v1/fs/file`: opens a regular file beneath the root and streams a byte range of it. A
//! task on the async side reads one chunk at a time with a short blocking step (under a transfer
//! slot) and feeds a channel of one chunk that the response drains; the next chunk is read while
//! the current one goes out. Invariants: no blocking thread waits for the client, and a download
//! waiting on its client holds no slot; memory per download is at most three chunks while the
//! client keeps up and two once it stalls (the read-ahead is dropped and read again later); a
//! client that takes nothing for the transfer timeout ends the download (file closed); a
//! vanished client stops it at once.

use std::fs::File;
use std::io::{self, Read, Seek, SeekFrom};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use nix::fcntl::OFlag;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_stream::wrappers::ReceiverStream;

use super::body::{CHUNK, TransferGuard, Transfers};
use super::{FileError, FileService};

/// A client that has not taken the previous chunk after this long is slow: the chunk read
/// ahead for it is dropped instead of held.
const SLOW: Duration = Duration::from_millis(50);

pub struct OpenedFile {
    pub file: File,
    /// The transfer under way and the step slots, to hand to [`stream_range`].
    transfer: TransferGuard,
    transfers: Transfers,
    pub size: u64,
    pub modified: Option<std::time::SystemTime>,
}

impl FileService {
    /// How long a download may wait for its client to take the next chunk.
    pub fn transfer_idle(&self) -> Duration {
        self.transfers.idle
    }

    /// Opens `path` for reading; directories and special files are refused (400).
    pub async fn open_file(&self, path: &str) -> Result<OpenedFile, FileError> {
        let transfer = self.transfers.begin();
        let transfers = self.transfers.clone();
        let p = self.policy.resolve(path)?;
        let policy = self.policy.clone();
        self.transfers
            .step(move || {
                // O_NONBLOCK so that opening a fifo cannot hang the request; we refuse it below.
                let fd = policy.open(&p, OFlag::O_RDONLY | OFlag::O_NONBLOCK | OFlag::O_NOCTTY)?;
                let file = File::from(fd);
                let meta = file
                    .metadata()
                    .map_err(|e| FileError::from_io("stat", &p.abs, e))?;
                if meta.is_dir() {
                    return Err(FileError::WrongKind {
                        path: p.abs,
                        expected: "is a directory, not a file",
                    });
                }
                if !meta.is_file() {
                    return Err(FileError::WrongKind {
                        path: p.abs,
                        expected: "is not a regular file",
                    });
                }
                Ok(OpenedFile {
                    transfer,
                    transfers,
                    size: meta.len(),
                    modified: meta.modified().ok(),
                    file,
                })
            })
            .await
    }
}

/// Streams `len` bytes of the opened file from `start`. A file that shrinks meanwhile ends the
/// stream with an error, so the client sees a short body rather than silently wrong data.
pub fn stream_range(opened: OpenedFile, start: u64, len: u64) -> ReceiverStream<io::Result<Bytes>> {
    let (tx, rx) = mpsc::channel::<io::Result<Bytes>>(1);
    tokio::spawn(async move {
        let OpenedFile {
            file,
            transfer,
            transfers,
            ..
        } = opened;
        let _transfer = transfer;
        let file = Arc::new(file);
        let idle = transfers.idle;
        let end = start.saturating_add(len);
        let mut pos = start;
        // The read of the chunk at `pos`, started while the previous chunk went out.
        let mut ahead: Option<JoinHandle<io::Result<Bytes>>> = None;
        while pos < end {
            let read = match ahead.take() {
                Some(h) => h.await,
                None => read_chunk(&transfers, &file, pos, end).await.await,
            };
            let chunk = match read {
                Ok(Ok(chunk)) => chunk,
                Ok(Err(e)) => {
                    let _ = tx.send_timeout(Err(e), idle).await;
                    break;
                }
                Err(e) => {
                    tracing::error!(error = %e, "a download's read failed");
                    let _ = tx
                        .send_timeout(Err(io::Error::other("internal error")), idle)
                        .await;
                    break;
                }
            };
            let next = pos + chunk.len() as u64;
            if next < end {
                ahead = Some(read_chunk(&transfers, &file, next, end).await);
            }
            let permit = match tokio::time::timeout(SLOW, tx.reserve()).await {
                Ok(Ok(permit)) => permit,
                // The client is gone.
                Ok(Err(_)) => break,
                Err(_) => {
                    // A slow or stalled client: forget the read-ahead (its buffer is freed
                    // when the read ends) and read it again once the client takes this chunk.
                    ahead = None;
                    match tokio::time::timeout(idle, tx.reserve()).await {
                        Ok(Ok(permit)) => permit,
                        // Gone, or took nothing for the transfer timeout: stop here. The
                        // connection itself is bounded by the daemon's connection timeouts.
                        _ => break,
                    }
                }
            };
            permit.send(Ok(chunk));
            pos = next;
        }
    });
    ReceiverStream::new(rx)
}

/// Starts reading the chunk at `pos` (at most [`CHUNK`] bytes, not past `end`) as a blocking
/// step once a transfer slot is free. An empty read is an error: the file shrank.
async fn read_chunk(
    transfers: &Transfers,
    file: &Arc<File>,
    pos: u64,
    end: u64,
) -> JoinHandle<io::Result<Bytes>> {
    let file = file.clone();
    let want = (CHUNK as u64).min(end - pos);
    transfers
        .spawn(move || {
            // One read at a time per download, so seeking the shared descriptor is safe;
            // `read_to_end` fills the spare capacity without zeroing it first.
            let mut chunk = Vec::with_capacity(want as usize);
            (&*file).seek(SeekFrom::Start(pos))?;
            (&*file).take(want).read_to_end(&mut chunk)?;
            if chunk.is_empty() {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "the file shrank while being read",
                ));
            }
            crate::metrics::transfer_out(chunk.len() as u64);
            Ok(Bytes::from(chunk))
        })
        .await
}
