//! Streamed, size-capped, sha256-checked downloads (HTTP and local files).

use std::io::{Read, Write};
use std::path::Path;

use sha2::{Digest, Sha256};

use super::*;

/// Downloads `url` into a temporary file inside `dir`, checking the size cap and, when given, the
/// sha256. On any error the temporary file is gone.
pub async fn download(
    client: &reqwest::Client,
    url: &str,
    sha256: Option<&str>,
    dir: &Path,
    progress: &dyn Progress,
) -> Result<tempfile_like::TempFile, InstallError> {
    crate::metrics::install_download();
    download_file(client, url, sha256, dir, progress).await
}

async fn download_file(
    client: &reqwest::Client,
    url: &str,
    sha256: Option<&str>,
    dir: &Path,
    progress: &dyn Progress,
) -> Result<tempfile_like::TempFile, InstallError> {
    let dir_owned = dir.to_path_buf();
    let file = tokio::task::spawn_blocking(move || tempfile_like::TempFile::new_in(&dir_owned))
        .await
        .map_err(join_error)?
        .map_err(|source| InstallError::Io {
            what: format!("cannot create a temporary file in {}", dir.display()),
            source,
        })?;
    let hasher = Sha256::new();
    let (file, hasher) = if let Some(path) = url.strip_prefix("file://") {
        // Reading, hashing and copying a local file is blocking work, and the daemon runs every
        // task on one thread: do it on the blocking pool so that requests go on meanwhile.
        let path = path.to_string();
        tokio::task::spawn_blocking(move || copy_local(&path, file, hasher))
            .await
            .map_err(join_error)??
    } else {
        download_http(client, url, file, hasher, progress).await?
    };
    let want = sha256.map(str::to_string);
    let url_owned = url.to_string();
    // Flushing and hashing the tail are blocking/CPU work; on failure the temporary file is
    // dropped (removed) there too.
    tokio::task::spawn_blocking(move || {
        let mut file = file;
        file.flush().map_err(write_error)?;
        if let Some(want) = want {
            let got = hex(&hasher.finalize());
            if !got.eq_ignore_ascii_case(want.trim()) {
                return Err(InstallError::Checksum {
                    url: url_owned,
                    want,
                    got,
                });
            }
        }
        Ok(file)
    })
    .await
    .map_err(join_error)?
}

/// A blocking step that did not finish: a panic goes on unwinding (the edge answers a plain 500);
/// a cancelled step is reported without internals.
pub(super) fn join_error(e: tokio::task::JoinError) -> InstallError {
    if e.is_panic() {
        std::panic::resume_unwind(e.into_panic());
    }
    tracing::warn!(error = %e, "a blocking step of the install was cancelled");
    InstallError::Io {
        what: "a blocking step of the install failed".into(),
        source: std::io::Error::other("see the daemon's log"),
    }
}

pub(super) fn write_error(source: std::io::Error) -> InstallError {
    InstallError::Io {
        what: "cannot write the download".into(),
        source,
    }
}

/// Received bytes are written (and hashed) in batches of this size, each by one blocking step.
pub(super) const DOWNLOAD_BATCH: usize = 1 << 20;

/// The http(s) branch of [`download`]: the async side receives, the blocking pool hashes and
/// writes each batch; the runtime thread never makes a file syscall.
pub(super) async fn download_http(
    client: &reqwest::Client,
    url: &str,
    file: tempfile_like::TempFile,
    hasher: Sha256,
    progress: &dyn Progress,
) -> Result<(tempfile_like::TempFile, Sha256), InstallError> {
    use futures_util::StreamExt;

    // Whoever holds the file on an early return drops it off the runtime thread.
    struct Held(Option<(tempfile_like::TempFile, Sha256)>);
    impl Drop for Held {
        fn drop(&mut self) {
            if let Some(v) = self.0.take() {
                tokio::task::spawn_blocking(move || drop(v));
            }
        }
    }
    let mut held = Held(Some((file, hasher)));
    let flush = |held: &mut Held, buf: Vec<u8>| {
        let taken = held.0.take();
        async move {
            let (mut file, mut hasher) = taken.ok_or_else(abandoned)?;
            tokio::task::spawn_blocking(move || {
                hasher.update(&buf);
                file.write_all(&buf).map_err(write_error)?;
                Ok::<_, InstallError>((file, hasher))
            })
            .await
            .map_err(join_error)?
        }
    };
    let mut done: u64 = 0;
    let resp = client
        .get(url)
        .send()
        .await
        .map_err(|e| InstallError::Download {
            url: url.to_string(),
            reason: error_chain(&e),
        })?;
    if !resp.status().is_success() {
        return Err(InstallError::Download {
            url: url.to_string(),
            reason: format!("the server answered {}", resp.status()),
        });
    }
    let too_large = || InstallError::TooLarge {
        url: url.to_string(),
        limit: MAX_DOWNLOAD,
    };
    let total = resp.content_length();
    if total.is_some_and(|t| t > MAX_DOWNLOAD) {
        return Err(too_large());
    }
    let mut stream = resp.bytes_stream();
    let mut buf: Vec<u8> = Vec::new();
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(|e| InstallError::Download {
            url: url.to_string(),
            reason: error_chain(&e),
        })?;
        done += chunk.len() as u64;
        if done > MAX_DOWNLOAD {
            return Err(too_large());
        }
        buf.extend_from_slice(&chunk);
        if buf.len() >= DOWNLOAD_BATCH {
            let batch = std::mem::take(&mut buf);
            held.0 = Some(flush(&mut held, batch).await?);
        }
        progress.download(done, total);
    }
    if !buf.is_empty() {
        held.0 = Some(flush(&mut held, buf).await?);
    }
    progress.download_done();
    held.0.take().ok_or_else(abandoned)
}

pub(super) fn abandoned() -> InstallError {
    InstallError::Io {
        what: "the download was abandoned".into(),
        source: std::io::Error::other("no file"),
    }
}

/// The `file://` branch of `download`: copies `path` into `file`, hashing it, within the size cap.
pub(super) fn copy_local(
    path: &str,
    mut file: tempfile_like::TempFile,
    mut hasher: Sha256,
) -> Result<(tempfile_like::TempFile, Sha256), InstallError> {
    let mut src = std::fs::File::open(path).map_err(|source| InstallError::Io {
        what: format!("cannot open {path}"),
        source,
    })?;
    let mut buf = vec![0u8; 64 * 1024];
    let mut done: u64 = 0;
    loop {
        let n = src.read(&mut buf).map_err(|source| InstallError::Io {
            what: format!("cannot read {path}"),
            source,
        })?;
        if n == 0 {
            return Ok((file, hasher));
        }
        done += n as u64;
        if done > MAX_DOWNLOAD {
            return Err(InstallError::TooLarge {
                url: format!("file://{path}"),
                limit: MAX_DOWNLOAD,
            });
        }
        hasher.update(&buf[..n]);
        file.write_all(&buf[..n]).map_err(write_error)?;
    }
}

pub(super) use crate::sys::hex;
