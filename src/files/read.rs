//! `GET /v1/fs/file`: opens a regular file beneath the root and streams a byte range of it. A
//! task on the async side reads one chunk at a time with a short blocking step and feeds a
//! bounded channel that the response drains. Invariants: no blocking thread waits for the client
//! (a slow or stalled reader only makes the task wait, on the async side); memory per download is
//! two chunks whatever the file size; a client that takes nothing for the transfer timeout ends
//! the download (file closed, transfer slot released); a vanished client stops it at once.

use std::fs::File;
use std::io::{self, Read, Seek, SeekFrom};
use std::time::Duration;

use bytes::Bytes;
use nix::fcntl::OFlag;
use tokio::sync::mpsc;

use super::body::TransferSlot;
use tokio_stream::wrappers::ReceiverStream;

use super::{FileError, FileService, blocking};

/// Bytes per read; large enough that syscalls and trips to the blocking pool are noise next to
/// the copy, small enough that a stalled download holds little.
const READ_CHUNK: usize = 512 << 10;
/// Chunks read ahead of the socket.
const READ_AHEAD: usize = 1;

pub struct OpenedFile {
    pub file: File,
    /// The transfer slot, to hand to [`stream_range`].
    pub slot: TransferSlot,
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
        let slot = self.transfers.acquire()?;
        let p = self.policy.resolve(path)?;
        let policy = self.policy.clone();
        blocking(move || {
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
                slot,
                size: meta.len(),
                modified: meta.modified().ok(),
                file,
            })
        })
        .await
    }
}

/// Streams `len` bytes of `file` from `start`. A file that shrinks meanwhile ends the stream
/// with an error, so the client sees a short body rather than silently wrong data. `slot` (the
/// transfer slot) is held until the last chunk is handed over or the download is abandoned.
pub fn stream_range(
    file: File,
    start: u64,
    len: u64,
    idle: Duration,
    slot: TransferSlot,
) -> ReceiverStream<io::Result<Bytes>> {
    let (tx, rx) = mpsc::channel::<io::Result<Bytes>>(READ_AHEAD);
    tokio::spawn(async move {
        let _slot = slot;
        let mut file = Some(file);
        let mut pos = start;
        let mut left = len;
        while left > 0 {
            let Some(f) = file.take() else { break };
            let want = (READ_CHUNK as u64).min(left);
            let read = tokio::task::spawn_blocking(move || {
                // `read_to_end` fills the spare capacity without zeroing it first.
                let mut chunk = Vec::with_capacity(want as usize);
                let r = (&f)
                    .seek(SeekFrom::Start(pos))
                    .and_then(|_| (&f).take(want).read_to_end(&mut chunk));
                (f, r.map(|_| chunk))
            })
            .await;
            let item = match read {
                Ok((f, Ok(chunk))) if !chunk.is_empty() => {
                    file = Some(f);
                    pos += chunk.len() as u64;
                    left -= chunk.len() as u64;
                    Ok(Bytes::from(chunk))
                }
                Ok((_, Ok(_))) => Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "the file shrank while being read",
                )),
                Ok((_, Err(e))) => Err(e),
                Err(e) => {
                    tracing::error!(error = %e, "a download's read failed");
                    Err(io::Error::other("internal error"))
                }
            };
            let failed = item.is_err();
            match tx.send_timeout(item, idle).await {
                Ok(()) if !failed => {}
                // Sent an error, the client is gone, or it stopped reading: stop here. The
                // connection itself is bounded by the daemon's connection timeouts.
                _ => break,
            }
        }
    });
    ReceiverStream::new(rx)
}
