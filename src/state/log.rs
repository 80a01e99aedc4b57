//! The on-disk record format of one append-only log: each record is
//! `len: u32 LE | crc32: u32 LE | id: u64 LE | payload (len bytes)`, the CRC covering the id and
//! the payload. Reading stops at the first record that is short or does not check out (a crash
//! in the middle of an append, a torn page after a power failure, a cut file), and the file is
//! truncated there: what follows a bad record cannot be trusted either.

use std::io::{BufReader, Read, Write};
use std::path::Path;

use bytes::Bytes;

/// Bytes of a record before its payload.
pub const HEADER: usize = 16;

/// Largest payload a record may claim: a longer length field is corruption, not a record (it
/// would make the reader allocate whatever the garbage says).
pub const MAX_PAYLOAD: usize = 256 << 20;

/// Appends the frame of one record to `out`.
pub fn encode(out: &mut Vec<u8>, id: u64, payload: &[u8]) {
    let mut crc = crc32fast::Hasher::new();
    crc.update(&id.to_le_bytes());
    crc.update(payload);
    out.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    out.extend_from_slice(&crc.finalize().to_le_bytes());
    out.extend_from_slice(&id.to_le_bytes());
    out.extend_from_slice(payload);
}

/// How much of a log a read keeps in memory: the newest records within both bounds (the newest
/// one always). The file is streamed, never held whole.
#[derive(Debug, Clone, Copy)]
pub struct Keep {
    pub records: usize,
    pub bytes: u64,
}

impl Keep {
    pub const ALL: Keep = Keep {
        records: usize::MAX,
        bytes: u64::MAX,
    };
}

/// What `read` found in a log file.
#[derive(Debug, Default)]
pub struct LogRead {
    /// The newest good records within the `Keep` bounds, in file order.
    pub records: Vec<(u64, Bytes)>,
    /// Good records in the file (kept or not).
    pub count: u64,
    /// The id of the last good record (0 for none).
    pub last_id: u64,
    /// Bytes of the good records (the length the file is cut to).
    pub good_len: u64,
    /// Bytes after them that were cut (0 for a clean file).
    pub cut: u64,
}

/// Reads the good records of `path` (keeping the newest within `keep`) and truncates the file
/// after the last one. A missing file reads as empty; a symlink is not followed (an error).
/// Ids must strictly increase: a record whose id does not is corruption too.
pub fn read_and_repair(path: &Path, keep: Keep) -> std::io::Result<LogRead> {
    use std::os::unix::fs::PermissionsExt;
    let file = match super::dir::open_existing(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(LogRead::default()),
        Err(e) => return Err(e),
    };
    let meta = file.metadata()?;
    if meta.permissions().mode() & 0o077 != 0 {
        file.set_permissions(std::fs::Permissions::from_mode(0o600))?;
    }
    let total = meta.len();
    let mut kept = std::collections::VecDeque::new();
    let mut kept_bytes = 0u64;
    let mut r = BufReader::with_capacity(64 * 1024, &file);
    let mut out = LogRead::default();
    let mut header = [0u8; HEADER];
    let mut last_id = 0u64;
    loop {
        if read_full(&mut r, &mut header)? < HEADER {
            break;
        }
        let len = u32::from_le_bytes(header[0..4].try_into().expect("4 bytes")) as usize;
        let crc = u32::from_le_bytes(header[4..8].try_into().expect("4 bytes"));
        let id = u64::from_le_bytes(header[8..16].try_into().expect("8 bytes"));
        if len > MAX_PAYLOAD || out.good_len + (HEADER + len) as u64 > total || id <= last_id {
            break;
        }
        let mut payload = vec![0u8; len];
        if read_full(&mut r, &mut payload)? < len {
            break;
        }
        let mut h = crc32fast::Hasher::new();
        h.update(&id.to_le_bytes());
        h.update(&payload);
        if h.finalize() != crc {
            break;
        }
        last_id = id;
        out.good_len += (HEADER + len) as u64;
        out.count += 1;
        kept_bytes += len as u64;
        kept.push_back((id, Bytes::from(payload)));
        while kept.len() > 1 && (kept.len() > keep.records || kept_bytes > keep.bytes) {
            let (_, old) = kept.pop_front().expect("not empty");
            kept_bytes -= old.len() as u64;
        }
    }
    drop(r);
    out.last_id = last_id;
    out.records = kept.into();
    out.cut = total - out.good_len;
    if out.cut > 0 {
        file.set_len(out.good_len)?;
        file.sync_all()?;
    }
    Ok(out)
}

/// Reads until `buf` is full or the end; returns how many bytes were read.
fn read_full(r: &mut impl Read, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match r.read(&mut buf[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}

/// Writes `records` as a new log at `path` (through a temporary and a rename, synced), for
/// compaction. Returns its size.
pub fn rewrite(path: &Path, records: &[(u64, Bytes)]) -> std::io::Result<u64> {
    let tmp = path.with_extension("tmp");
    let mut buf = Vec::new();
    for (id, p) in records {
        encode(&mut buf, *id, p);
    }
    let mut f = super::dir::create_file(&tmp).map_err(std::io::Error::other)?;
    f.write_all(&buf)?;
    f.sync_data()?;
    drop(f);
    std::fs::rename(&tmp, path)?;
    Ok(buf.len() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(path: &Path, n: u64) -> Vec<u8> {
        let mut buf = Vec::new();
        for id in 1..=n {
            encode(&mut buf, id, format!("{{\"n\":{id}}}").as_bytes());
        }
        std::fs::write(path, &buf).unwrap();
        buf
    }

    #[test]
    fn a_clean_log_reads_back_whole() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("events.log");
        let buf = write(&p, 50);
        let r = read_and_repair(&p, Keep::ALL).unwrap();
        assert_eq!(r.records.len(), 50);
        assert_eq!(r.cut, 0);
        assert_eq!(r.good_len, buf.len() as u64);
        assert_eq!(&r.records[49].1[..], b"{\"n\":50}");
        assert!(
            read_and_repair(&dir.path().join("none"), Keep::ALL)
                .unwrap()
                .records
                .is_empty()
        );
    }

    /// Cut at every byte: the records before the cut survive, the partial one is cut off, and
    /// the file is left at a record boundary (a second read finds nothing to cut).
    #[test]
    fn a_log_cut_at_any_byte_keeps_every_whole_record() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("events.log");
        let full = write(&p, 20);
        let sizes: Vec<usize> = (1..=20)
            .map(|id: u64| HEADER + format!("{{\"n\":{id}}}").len())
            .collect();
        for cut in 0..full.len() {
            std::fs::write(&p, &full[..cut]).unwrap();
            let r = read_and_repair(&p, Keep::ALL).unwrap();
            let mut whole = 0;
            let mut acc = 0;
            for s in &sizes {
                if acc + s <= cut {
                    acc += s;
                    whole += 1;
                }
            }
            assert_eq!(r.records.len(), whole, "cut at {cut}");
            assert_eq!(std::fs::metadata(&p).unwrap().len(), acc as u64);
            assert_eq!(read_and_repair(&p, Keep::ALL).unwrap().cut, 0);
        }
    }

    /// A read keeps only the newest records within its bounds (the file is streamed), yet
    /// counts and checks them all.
    #[test]
    fn a_read_keeps_only_the_newest_window() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("events.log");
        write(&p, 500);
        let r = read_and_repair(
            &p,
            Keep {
                records: 5,
                bytes: u64::MAX,
            },
        )
        .unwrap();
        assert_eq!((r.count, r.last_id, r.records.len()), (500, 500, 5));
        assert_eq!(r.records[0].0, 496);
        let r = read_and_repair(
            &p,
            Keep {
                records: usize::MAX,
                bytes: 20,
            },
        )
        .unwrap();
        // The last payloads are 9 bytes each: two fit in 20.
        assert_eq!(r.records.len(), 2);
        assert_eq!(r.records[1].0, 500);
    }

    #[test]
    fn a_flipped_byte_ends_the_log_there() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("events.log");
        let mut full = write(&p, 10);
        let third = 2 * (HEADER + 7) + HEADER + 2;
        full[third] ^= 0x40;
        std::fs::write(&p, &full).unwrap();
        let r = read_and_repair(&p, Keep::ALL).unwrap();
        assert_eq!(r.records.len(), 2);
        // A huge length field is refused without allocating it.
        let mut huge = Vec::new();
        encode(&mut huge, 1, b"{}");
        huge[0..4].copy_from_slice(&u32::MAX.to_le_bytes());
        std::fs::write(&p, &huge).unwrap();
        assert!(read_and_repair(&p, Keep::ALL).unwrap().records.is_empty());
    }
}
