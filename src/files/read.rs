//! `GET /v1/fs/file`: opens a regular file beneath the root and streams a byte range of it from a
//! blocking reader through a bounded channel. Invariant: memory per download is a few chunks,
//! whatever the file size; a vanished client stops the reader at its next chunk.

use std::fs::File;
use std::io::{self, Read, Seek, SeekFrom};

use bytes::Bytes;
use nix::fcntl::OFlag;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

use super::{FileError, FileService, blocking};

/// Bytes per read; large enough that syscalls and channel hops are noise next to the copy.
const READ_CHUNK: usize = 1 << 20;
/// Chunks read ahead of the socket.
const READ_AHEAD: usize = 4;

pub struct OpenedFile {
    pub file: File,
    pub size: u64,
    pub modified: Option<std::time::SystemTime>,
}

impl FileService {
    /// Opens `path` for reading; directories and special files are refused (400).
    pub async fn open_file(&self, path: &str) -> Result<OpenedFile, FileError> {
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
                size: meta.len(),
                modified: meta.modified().ok(),
                file,
            })
        })
        .await
    }
}

/// Streams `len` bytes of `file` from `start`. A file that shrinks meanwhile ends the stream
/// with an error, so the client sees a short body rather than silently wrong data.
pub fn stream_range(mut file: File, start: u64, len: u64) -> ReceiverStream<io::Result<Bytes>> {
    let (tx, rx) = mpsc::channel::<io::Result<Bytes>>(READ_AHEAD);
    tokio::task::spawn_blocking(move || {
        if let Err(e) = file.seek(SeekFrom::Start(start)) {
            let _ = tx.blocking_send(Err(e));
            return;
        }
        let mut left = len;
        while left > 0 {
            let want = (READ_CHUNK as u64).min(left);
            // `read_to_end` fills the spare capacity without zeroing it first.
            let mut chunk = Vec::with_capacity(want as usize);
            if let Err(e) = (&mut file).take(want).read_to_end(&mut chunk) {
                let _ = tx.blocking_send(Err(e));
                return;
            }
            if chunk.is_empty() {
                let _ = tx.blocking_send(Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "the file shrank while being read",
                )));
                return;
            }
            left -= chunk.len() as u64;
            if tx.blocking_send(Ok(Bytes::from(chunk))).is_err() {
                return; // the client is gone
            }
        }
    });
    ReceiverStream::new(rx)
}
