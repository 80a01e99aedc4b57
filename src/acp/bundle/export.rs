//! Writing a bundle: a snapshot of one serverId taken between turns (a request in progress is
//! refused, `Busy`), then the tar + gzip written on the blocking pool into a bounded channel
//! that the response body reads: at most a few chunks of it are in memory at any time.

use std::io::{Read, Write};
use std::path::PathBuf;

use bytes::Bytes;
use sha2::{Digest, Sha256};
use tokio::sync::mpsc;

use super::agent_files::{self, Places};
use super::{
    BundleError, BundleSession, EVENTS, EventsInfo, FORMAT, FileEntry, MANIFEST, Manifest,
};
use crate::acp::AcpService;

/// Chunks of the bundle in flight between the writer and the response.
const CHANNEL_CHUNKS: usize = 4;
const CHUNK: usize = 64 * 1024;

/// What an export writes: taken at once, written afterwards.
pub struct Snapshot {
    manifest: Manifest,
    /// The retained events (their bytes shared with the live log, not copied).
    events: Vec<(u64, Bytes)>,
    /// (path in the bundle, path on disk, session id).
    files: Vec<(String, PathBuf, String)>,
}

/// Takes the snapshot of `server_id` (refused while a request to its agent is in progress).
pub async fn snapshot(
    acp: &AcpService,
    places: &(dyn Fn(&str) -> Places + Sync),
    server_id: &str,
) -> Result<Snapshot, BundleError> {
    let inst = acp.get(server_id).ok_or_else(|| BundleError::NotFound {
        server_id: server_id.to_string(),
    })?;
    let t = inst
        .events
        .durable()
        .ok_or(BundleError::NoStateDir)?
        .clone();
    let pending = inst.snapshot().pending_requests;
    if pending > 0 {
        return Err(BundleError::Busy {
            server_id: server_id.to_string(),
            pending,
        });
    }
    let meta = t.meta();
    let events = inst.events.lines_after(0);
    let sessions: Vec<BundleSession> = meta
        .sessions
        .iter()
        .map(|s| BundleSession {
            session_id: s.session_id.clone(),
            cwd: s.cwd.clone(),
            mcp_servers: s.mcp_servers.clone(),
            redacted: s.secrets,
            created_at_ms: s.created_at_ms,
            title: s.title.clone(),
        })
        .collect();
    let agent = meta.agent.clone();
    let places = places(&agent);
    let ids: Vec<String> = sessions.iter().map(|s| s.session_id.clone()).collect();
    let files = crate::sys::blocking(move || {
        let mut out = Vec::new();
        for sid in ids {
            for (path, disk) in agent_files::find(&agent, &places, &sid) {
                out.push((path, disk, sid.clone()));
            }
        }
        out
    })
    .await;
    let manifest = Manifest {
        format: FORMAT.to_string(),
        version: super::VERSION,
        server_id: server_id.to_string(),
        agent: meta.agent.clone(),
        created_at_ms: meta.created_at_ms,
        exported_at_ms: super::now_ms(),
        initialize: meta.initialize.clone(),
        load_session: meta.load_session,
        resume_session: meta.resume_session,
        list_sessions: meta.list_sessions,
        sessions,
        events: EventsInfo {
            count: events.len() as u64,
            first_id: events.first().map_or(0, |e| e.0),
            last_id: events.last().map_or(0, |e| e.0),
        },
        files: Vec::new(),
    };
    Ok(Snapshot {
        manifest,
        events,
        files,
    })
}

/// The bundle as a stream of chunks, written on the blocking pool. A write that fails (a file
/// that changed size under the export, a disk error) ends the stream with an error, so that the
/// client sees a truncated bundle, which an import refuses.
pub fn stream(snap: Snapshot) -> mpsc::Receiver<Result<Bytes, std::io::Error>> {
    let (tx, rx) = mpsc::channel(CHANNEL_CHUNKS);
    tokio::task::spawn_blocking(move || {
        let mut out = ChanWriter {
            tx: tx.clone(),
            buf: Vec::with_capacity(CHUNK),
        };
        let res = write(snap, &mut out).and_then(|()| {
            out.flush()
                .map_err(BundleError::io("sending the bundle".to_string()))
        });
        if let Err(e) = res {
            tracing::warn!(error = %e, "a bundle export failed");
            let _ = tx.blocking_send(Err(std::io::Error::other(e.to_string())));
        }
    });
    rx
}

/// Writes the whole bundle into `out`. Blocking.
pub fn write(mut snap: Snapshot, out: impl Write) -> Result<(), BundleError> {
    let gz = flate2::write::GzEncoder::new(out, flate2::Compression::fast());
    let mut tar = tar::Builder::new(gz);
    let io = |what: &str| BundleError::io(what.to_string());
    // The event log.
    let size: u64 = snap
        .events
        .iter()
        .map(|(id, l)| (digits(*id) + 2 + l.len()) as u64)
        .sum();
    let mut events = EventsReader {
        events: std::mem::take(&mut snap.events).into_iter(),
        line: Vec::new(),
        pos: 0,
        hash: Sha256::new(),
    };
    tar.append(&header(EVENTS, size)?, &mut events)
        .map_err(io("writing the event log"))?;
    snap.manifest.files.push(FileEntry {
        path: EVENTS.to_string(),
        size,
        sha256: crate::sys::hex(&events.hash.finalize()),
        session_id: None,
    });
    // The agent's files.
    for (path, disk, sid) in std::mem::take(&mut snap.files) {
        let what = format!("reading {}", disk.display());
        let f = std::fs::File::open(&disk).map_err(io(&what))?;
        let size = f.metadata().map_err(io(&what))?.len();
        let mut r = Exact {
            inner: f.take(size),
            left: size,
            hash: Sha256::new(),
        };
        tar.append(&header(&path, size)?, &mut r)
            .map_err(io(&what))?;
        snap.manifest.files.push(FileEntry {
            path,
            size,
            sha256: crate::sys::hex(&r.hash.finalize()),
            session_id: Some(sid),
        });
    }
    let m = serde_json::to_vec_pretty(&snap.manifest).unwrap_or_default();
    tar.append(&header(MANIFEST, m.len() as u64)?, &m[..])
        .map_err(io("writing the manifest"))?;
    let gz = tar.into_inner().map_err(io("ending the tar"))?;
    gz.finish().map_err(io("ending the gzip stream"))?;
    Ok(())
}

fn header(path: &str, size: u64) -> Result<tar::Header, BundleError> {
    let mut h = tar::Header::new_ustar();
    h.set_path(path)
        .map_err(BundleError::io(format!("naming `{path}` in the tar")))?;
    h.set_size(size);
    h.set_mode(0o600);
    h.set_mtime(super::now_ms() / 1000);
    h.set_entry_type(tar::EntryType::Regular);
    h.set_cksum();
    Ok(h)
}

fn digits(n: u64) -> usize {
    n.checked_ilog10().map_or(1, |d| d as usize + 1)
}

/// `events.log` made on the fly: `<id> <line>\n` per event, hashed as it is read.
struct EventsReader {
    events: std::vec::IntoIter<(u64, Bytes)>,
    line: Vec<u8>,
    pos: usize,
    hash: Sha256,
}

impl Read for EventsReader {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        while self.pos == self.line.len() {
            let Some((id, l)) = self.events.next() else {
                return Ok(0);
            };
            self.line.clear();
            self.line.extend_from_slice(id.to_string().as_bytes());
            self.line.push(b' ');
            self.line.extend_from_slice(&l);
            self.line.push(b'\n');
            self.pos = 0;
        }
        let n = buf.len().min(self.line.len() - self.pos);
        buf[..n].copy_from_slice(&self.line[self.pos..self.pos + n]);
        self.hash.update(&buf[..n]);
        self.pos += n;
        Ok(n)
    }
}

/// A file read to exactly its size at the snapshot (shorter is an error), hashed.
struct Exact<R> {
    inner: R,
    left: u64,
    hash: Sha256,
}

impl<R: Read> Read for Exact<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        if n == 0 && self.left > 0 {
            return Err(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                "the file shrank while it was exported",
            ));
        }
        self.left -= n as u64;
        self.hash.update(&buf[..n]);
        Ok(n)
    }
}

/// Writes into the bounded channel in chunks; a gone reader is a broken pipe.
struct ChanWriter {
    tx: mpsc::Sender<Result<Bytes, std::io::Error>>,
    buf: Vec<u8>,
}

impl Write for ChanWriter {
    fn write(&mut self, data: &[u8]) -> std::io::Result<usize> {
        let n = data.len().min(CHUNK - self.buf.len());
        self.buf.extend_from_slice(&data[..n]);
        if self.buf.len() >= CHUNK {
            self.flush()?;
        }
        Ok(n)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        if self.buf.is_empty() {
            return Ok(());
        }
        let chunk = Bytes::from(std::mem::replace(&mut self.buf, Vec::with_capacity(CHUNK)));
        self.tx
            .blocking_send(Ok(chunk))
            .map_err(|_| std::io::Error::from(std::io::ErrorKind::BrokenPipe))
    }
}
