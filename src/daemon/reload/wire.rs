//! The hand-off's bytes (state version 3): a small JSON head and, beside it, every bulk payload
//! (event frames, output chunks, an RFD outbox's messages, a reader's unread bytes) as raw
//! length-prefixed records, so that nothing large is escaped, hex-encoded or held twice.
//!
//! ```text
//! 0      8 bytes   MAGIC
//! 8      u64 LE    offset of the head
//! 16     u64 LE    length of the head
//! 24     records   [u64 LE length][bytes], one per payload, in `payloads()` order
//! head   JSON      the `Handoff`, every payload in it an empty string
//! ```
//!
//! The writer takes each payload out of the hand-off as it writes it (its memory is freed
//! and handed back to the kernel every `TRIM_EVERY` bytes); the reader streams the records into
//! the payloads and punches the memfd's pages it has read, so at any moment a payload exists
//! about once (docs/architecture.md, "Reload"). Versions 1 and 2 were one JSON document
//! (frames as text, output as hex); they are still read, strictly.

use std::io::{BufWriter, Read, Seek, SeekFrom, Write};
use std::os::unix::fs::FileExt;

use bytes::Bytes;

use super::Handoff;
pub use crate::carried::{HexPayload, Payload};

/// The first bytes of a version-3 hand-off (a JSON hand-off starts with `{`).
pub const MAGIC: &[u8; 8] = b"SAHANDF3";
const HEADER: u64 = 24;
/// How many payload bytes are written (or read) between two hand-backs of freed memory.
const TRIM_EVERY: u64 = 16 << 20;

/// Why a hand-off could not be written or read.
#[derive(Debug, thiserror::Error)]
pub enum HandoffError {
    #[error("the hand-off's memfd: {0}")]
    Io(#[from] std::io::Error),
    #[error("the hand-off cannot be serialized: {0}")]
    Serialize(#[source] serde_json::Error),
    #[error("the hand-off is not readable: {0}")]
    Parse(#[source] serde_json::Error),
    #[error("hand-off state version {0} is not one this binary reads ({1}..={2})")]
    Version(u32, u32, u32),
    #[error("the hand-off is damaged: {0}")]
    Damaged(String),
}

/// Every payload of `h`, in the one order the writer and the reader agree on.
fn payloads(h: &mut Handoff) -> Vec<&mut Bytes> {
    let mut out: Vec<&mut Bytes> = Vec::new();
    for i in &mut h.acp.instances {
        out.push(&mut i.stdout_carry.0);
        out.extend(i.events.frames.iter_mut().map(|(_, f)| &mut f.0));
    }
    for e in &mut h.acp.exited {
        out.extend(e.events.frames.iter_mut().map(|(_, f)| &mut f.0));
    }
    for c in &mut h.connections {
        out.extend(c.connection.frames.iter_mut().map(|(_, f)| &mut f.0));
        for (_, o) in &mut c.sessions {
            out.extend(o.frames.iter_mut().map(|(_, f)| &mut f.0));
        }
    }
    for p in &mut h.processes.processes {
        out.extend(p.log.chunks.iter_mut().map(|c| &mut c.3.0));
    }
    for e in &mut h.processes.exited {
        out.extend(e.log.chunks.iter_mut().map(|c| &mut c.3.0));
    }
    out
}

/// What writing a hand-off took.
#[derive(Debug, Clone, Copy)]
pub struct Written {
    pub payloads: u64,
    pub payload_bytes: u64,
    pub head_bytes: u64,
}

/// Writes `h` into `f` (emptied first), taking its payloads out as they are written (they are
/// empty in `h` afterwards). The head is parsed back before this returns: a hand-off the new
/// image could not read fails here, before the exec.
pub fn write(h: &mut Handoff, f: &std::fs::File) -> Result<Written, HandoffError> {
    f.set_len(0)?;
    let mut file = f;
    file.seek(SeekFrom::Start(HEADER))?;
    let mut w = BufWriter::with_capacity(256 << 10, file);
    let (mut count, mut bytes, mut since_trim) = (0u64, 0u64, 0u64);
    for p in payloads(h) {
        let b = std::mem::take(p);
        w.write_all(&(b.len() as u64).to_le_bytes())?;
        w.write_all(&b)?;
        count += 1;
        bytes += 8 + b.len() as u64;
        since_trim += b.len() as u64;
        drop(b);
        if since_trim >= TRIM_EVERY {
            since_trim = 0;
            crate::sys::trim_heap();
        }
    }
    w.flush()?;
    drop(w);
    crate::sys::trim_heap();
    h.payloads = count;
    let mut written = Written {
        payloads: count,
        payload_bytes: bytes,
        head_bytes: 0,
    };
    written.head_bytes = write_head(h, f, &written)?;
    Ok(written)
}

/// (Re)writes the head of a hand-off whose payloads are written (`write`), e.g. once the last
/// fields are known; returns its length.
pub fn write_head(h: &Handoff, f: &std::fs::File, w: &Written) -> Result<u64, HandoffError> {
    let head = serde_json::to_vec(h).map_err(HandoffError::Serialize)?;
    let check: Handoff = serde_json::from_slice(&head).map_err(HandoffError::Parse)?;
    if check.payloads != w.payloads || check.version != h.version {
        return Err(bad("the head does not read back"));
    }
    let head_at = HEADER + w.payload_bytes;
    f.set_len(head_at)?;
    f.write_all_at(&head, head_at)?;
    let mut header = [0u8; HEADER as usize];
    header[..8].copy_from_slice(MAGIC);
    header[8..16].copy_from_slice(&head_at.to_le_bytes());
    header[16..24].copy_from_slice(&(head.len() as u64).to_le_bytes());
    f.write_all_at(&header, 0)?;
    Ok(head.len() as u64)
}

/// Reads a hand-off from `f`: version 3 streamed record by record (the pages read are given back
/// to the kernel as it goes), versions 1 and 2 as their one JSON document.
pub fn read(mut f: std::fs::File) -> Result<Handoff, HandoffError> {
    let size = f.metadata()?.len();
    let mut magic = [0u8; 8];
    let n = f.read_at(&mut magic, 0)?;
    if n < 8 || &magic != MAGIC {
        let mut bytes = Vec::new();
        f.rewind()?;
        f.read_to_end(&mut bytes)?;
        return super::Handoff::from_json(&bytes);
    }
    let mut header = [0u8; HEADER as usize];
    f.read_exact_at(&mut header, 0)?;
    let word = |i: usize| u64::from_le_bytes(header[i..i + 8].try_into().expect("8 bytes"));
    let (head_at, head_len) = (word(8), word(16));
    if head_at < HEADER || head_at.checked_add(head_len) != Some(size) {
        return Err(HandoffError::Damaged(format!(
            "head at {head_at}+{head_len} in {size} bytes"
        )));
    }
    let mut head = vec![0u8; usize::try_from(head_len).map_err(|_| bad("head too large"))?];
    f.read_exact_at(&mut head, head_at)?;
    let mut h = super::Handoff::from_json(&head)?;
    let expected = h.payloads;
    let mut pos = HEADER;
    let mut punched = HEADER;
    f.seek(SeekFrom::Start(HEADER))?;
    let mut r = std::io::BufReader::with_capacity(256 << 10, &f);
    let mut count = 0u64;
    for p in payloads(&mut h) {
        let mut len = [0u8; 8];
        r.read_exact(&mut len)
            .map_err(|_| bad("a record is cut short"))?;
        let len = u64::from_le_bytes(len);
        if len > head_at - pos - 8 {
            return Err(bad("a record runs past the head"));
        }
        let mut data = vec![0u8; len as usize];
        r.read_exact(&mut data)
            .map_err(|_| bad("a record is cut short"))?;
        *p = Bytes::from(data);
        pos += 8 + len;
        count += 1;
        if pos - punched >= TRIM_EVERY {
            // What was read is in the payloads now: its pages in the memfd go back.
            let page = punched & !4095;
            let end = pos & !4095;
            if end > page {
                let _ = nix::fcntl::fallocate(
                    &f,
                    nix::fcntl::FallocateFlags::FALLOC_FL_PUNCH_HOLE
                        | nix::fcntl::FallocateFlags::FALLOC_FL_KEEP_SIZE,
                    page as i64,
                    (end - page) as i64,
                );
                punched = end;
            }
        }
    }
    if count != expected || pos != head_at {
        return Err(bad(&format!(
            "{count} records of {expected}, ending at {pos} instead of {head_at}"
        )));
    }
    Ok(h)
}

fn bad(why: &str) -> HandoffError {
    HandoffError::Damaged(why.to_string())
}
