//! `sandbox-agent fs ls|get|put`: the filesystem API (`/v1/fs`). Transfers stream in chunks in
//! both directions; a download to a file is written beside it and renamed into place only once
//! complete, so a failed or interrupted one leaves the old file (or nothing) behind.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use futures_util::StreamExt;
use reqwest::Method;
use reqwest::header::{CONTENT_LENGTH, CONTENT_TYPE};
use serde_json::json;
use tokio::io::{AsyncRead, AsyncReadExt};

use super::api::{Api, ClientError};
use super::{out, out_json, table};
use crate::cli::FsCommand;

/// Bytes read from a local file or stdin per chunk of an upload.
const CHUNK: usize = 256 * 1024;

pub async fn run(api: &Api, command: FsCommand, json: bool) -> Result<u8, ClientError> {
    match command {
        FsCommand::Ls { path, .. } => ls(api, path.as_deref(), json).await,
        FsCommand::Get { remote, local, .. } => get(api, &remote, local.as_deref(), json).await,
        FsCommand::Put { local, remote, .. } => put(api, &local, &remote, json).await,
    }
}

async fn ls(api: &Api, path: Option<&str>, json: bool) -> Result<u8, ClientError> {
    let query: Vec<(&str, &str)> = path.map(|p| ("path", p)).into_iter().collect();
    let what = format!("listing {}", path.unwrap_or("the work directory"));
    let entries = api
        .get_json(&what, &["v1", "fs", "entries"], &query)
        .await?;
    if json {
        return out_json(&entries).map(|()| 0);
    }
    let rows: Vec<Vec<String>> = entries
        .as_array()
        .ok_or_else(|| ClientError::Protocol(format!("{what}: not a list")))?
        .iter()
        .map(|e| {
            let dir = e["entryType"] == "directory";
            let mut name = table::cell(&e["name"]);
            if dir {
                name.push('/');
            }
            vec![
                if dir { "dir" } else { "file" }.to_string(),
                table::cell(&e["size"]),
                table::cell(&e["modified"]),
                name,
            ]
        })
        .collect();
    out(table::render(&["TYPE", "SIZE", "MODIFIED", "NAME"], &rows).as_bytes()).map(|()| 0)
}

async fn get(api: &Api, remote: &str, local: Option<&Path>, json: bool) -> Result<u8, ClientError> {
    let rb = api.request(
        Method::GET,
        api.url(&["v1", "fs", "file"], &[("path", remote)]),
    );
    let resp = api.send(&format!("downloading {remote}"), rb).await?;
    let mut body = resp.bytes_stream();
    let target = match local {
        None => None,
        Some(p) if p.as_os_str() == "-" => None,
        Some(p) if p.is_dir() => {
            let name = Path::new(remote)
                .file_name()
                .ok_or_else(|| ClientError::Usage(format!("`{remote}` names no file")))?;
            Some(p.join(name))
        }
        Some(p) => Some(p.to_path_buf()),
    };
    let Some(target) = target else {
        // The bytes are the output, with or without `--json`.
        while let Some(chunk) = body.next().await {
            out(&chunk.map_err(|e| api.transport(e))?)?;
        }
        return Ok(0);
    };
    let mut part = PartFile::create(&target)?;
    let mut n = 0u64;
    while let Some(chunk) = body.next().await {
        let chunk = chunk.map_err(|e| api.transport(e))?;
        n += chunk.len() as u64;
        part.write(&chunk)?;
    }
    part.commit()?;
    if json {
        out_json(&json!({"path": remote, "local": target, "bytes": n})).map(|()| 0)
    } else {
        Ok(0)
    }
}

/// A download being written: a new file beside the target, renamed over it by `commit`, removed
/// if dropped before.
struct PartFile {
    file: Option<std::fs::File>,
    path: PathBuf,
    target: PathBuf,
}

impl PartFile {
    fn create(target: &Path) -> Result<PartFile, ClientError> {
        let dir = match target.parent() {
            Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
            _ => PathBuf::from("."),
        };
        let name = target
            .file_name()
            .ok_or_else(|| ClientError::Usage(format!("`{}` names no file", target.display())))?
            .to_string_lossy()
            .into_owned();
        let mut attempt = 0u32;
        loop {
            let path = dir.join(format!(".{name}.{}.{attempt}.part", std::process::id()));
            match std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(&path)
            {
                Ok(file) => {
                    return Ok(PartFile {
                        file: Some(file),
                        path,
                        target: target.to_path_buf(),
                    });
                }
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && attempt < 100 => {
                    attempt += 1;
                }
                Err(e) => {
                    return Err(ClientError::local(
                        format!("creating a file in {}", dir.display()),
                        e,
                    ));
                }
            }
        }
    }

    fn write(&mut self, bytes: &[u8]) -> Result<(), ClientError> {
        let file = self.file.as_mut().expect("written only before commit");
        file.write_all(bytes)
            .map_err(|e| ClientError::local(format!("writing {}", self.path.display()), e))
    }

    fn commit(mut self) -> Result<(), ClientError> {
        let file = self.file.take().expect("committed once");
        file.sync_all()
            .map_err(|e| ClientError::local(format!("writing {}", self.path.display()), e))?;
        drop(file);
        std::fs::rename(&self.path, &self.target).map_err(|e| {
            ClientError::local(format!("renaming into {}", self.target.display()), e)
        })?;
        self.path = PathBuf::new();
        Ok(())
    }
}

impl Drop for PartFile {
    fn drop(&mut self) {
        if !self.path.as_os_str().is_empty() {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

async fn put(api: &Api, local: &Path, remote: &str, json: bool) -> Result<u8, ClientError> {
    let (reader, len): (Box<dyn AsyncRead + Send + Unpin>, Option<u64>) =
        if local.as_os_str() == "-" {
            (Box::new(tokio::io::stdin()), None)
        } else {
            let file = tokio::fs::File::open(local)
                .await
                .map_err(|e| ClientError::local(format!("opening {}", local.display()), e))?;
            let meta = file
                .metadata()
                .await
                .map_err(|e| ClientError::local(format!("reading {}", local.display()), e))?;
            if !meta.is_file() {
                return Err(ClientError::Usage(format!(
                    "{} is not a regular file",
                    local.display()
                )));
            }
            (Box::new(file), Some(meta.len()))
        };
    // A local read error ends the body; it is kept here so that it is reported as what it is,
    // not as the broken request it causes.
    let read_error: Arc<Mutex<Option<std::io::Error>>> = Arc::default();
    let body = reqwest::Body::wrap_stream(chunks(reader, read_error.clone()));
    let mut rb = api
        .request(
            Method::PUT,
            api.url(&["v1", "fs", "file"], &[("path", remote)]),
        )
        .header(CONTENT_TYPE, "application/octet-stream")
        .body(body);
    if let Some(len) = len {
        // Lets the daemon refuse an upload over its limit, or a full disk, before the body.
        rb = rb.header(CONTENT_LENGTH, len);
    }
    let result = api.json(&format!("uploading to {remote}"), rb).await;
    if let Some(e) = crate::sys::lock(&read_error).take() {
        return Err(ClientError::local(
            format!("reading {}", local.display()),
            e,
        ));
    }
    let outcome = result?;
    if json {
        return out_json(&outcome).map(|()| 0);
    }
    out(format!(
        "wrote {} bytes to {}\n",
        table::cell(&outcome["bytesWritten"]),
        table::printable(&table::cell(&outcome["path"]))
    )
    .as_bytes())
    .map(|()| 0)
}

/// The reader as a stream of chunks; an error is stored in `error` and ends the stream with it.
pub(super) fn chunks(
    reader: Box<dyn AsyncRead + Send + Unpin>,
    error: Arc<Mutex<Option<std::io::Error>>>,
) -> impl futures_util::Stream<Item = Result<Bytes, std::io::Error>> + Send + 'static {
    futures_util::stream::unfold(Some(reader), move |state| {
        let error = error.clone();
        async move {
            let mut reader = state?;
            let mut buf = vec![0u8; CHUNK];
            match reader.read(&mut buf).await {
                Ok(0) => None,
                Ok(n) => {
                    buf.truncate(n);
                    Some((Ok(Bytes::from(buf)), Some(reader)))
                }
                Err(e) => {
                    let report = std::io::Error::new(e.kind(), e.to_string());
                    *crate::sys::lock(&error) = Some(e);
                    Some((Err(report), None))
                }
            }
        }
    })
}
