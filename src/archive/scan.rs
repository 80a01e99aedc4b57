//! Where a plain tar archive arriving in pieces can be cut: after whole entries only. Used by
//! upload-batch to extract entries while the rest of the body arrives (`super::TarStream`).

/// Finds, in a plain tar archive arriving in pieces, how far its bytes hold only whole entries:
/// [`TarScan::ready`] is the end of the last entry (its data and padding, with the GNU long-name
/// records before it) that has fully arrived. It reads the headers only, in memory (one 512-byte
/// block kept across pieces). On anything it does not follow exactly as `tar` does — a bad
/// checksum, a pax record (which may redefine a size), a sparse entry, a base-256 size, the
/// archive's end, a compressed stream — it stops advancing: the bytes from `ready` on are then
/// extracted in one piece at the end, where `tar` itself reports whatever is wrong.
#[derive(Debug, Default)]
pub struct TarScan {
    /// Bytes seen.
    pos: u64,
    /// Where the next header starts.
    next: u64,
    header: Vec<u8>,
    /// The end of the last whole entry.
    ready: u64,
    /// The end of the entry whose data is still arriving.
    pending: Option<u64>,
    stopped: bool,
}

impl TarScan {
    pub fn new() -> Self {
        TarScan::default()
    }

    pub fn ready(&self) -> u64 {
        self.ready
    }

    /// Takes the next bytes of the archive.
    pub fn feed(&mut self, mut data: &[u8]) {
        while !data.is_empty() && !self.stopped {
            let end = self.pos + data.len() as u64;
            if self.next >= end {
                break;
            }
            if self.next > self.pos {
                let skip = (self.next - self.pos) as usize;
                data = &data[skip..];
                self.pos = self.next;
            }
            let take = (512 - self.header.len()).min(data.len());
            self.header.extend_from_slice(&data[..take]);
            data = &data[take..];
            self.pos += take as u64;
            if self.header.len() == 512 {
                self.header_complete();
                self.header.clear();
            }
        }
        self.pos += data.len() as u64;
        if let Some(p) = self.pending
            && p <= self.pos
        {
            self.ready = p;
            self.pending = None;
        }
    }

    fn header_complete(&mut self) {
        let h = &self.header;
        let start = self.next;
        let looks_compressed =
            start == 0 && (h.starts_with(&[0x1f, 0x8b]) || h.starts_with(b"BZh"));
        let size = match (looks_compressed, header_checksum_ok(h), octal(&h[124..136])) {
            (false, true, Some(size)) => size,
            _ => {
                self.stopped = true; // also the all-zero block that ends the archive
                return;
            }
        };
        let Some(next) = size
            .checked_next_multiple_of(512)
            .and_then(|d| d.checked_add(start + 512))
        else {
            self.stopped = true;
            return;
        };
        match h[156] {
            b'x' | b'g' | b'S' => self.stopped = true,
            // A long name or link target for the entry that follows: not a boundary.
            b'L' | b'K' => self.next = next,
            _ => {
                if let Some(p) = self.pending.replace(next) {
                    self.ready = p;
                }
                self.next = next;
            }
        }
    }
}

/// The header's checksum field matches its bytes (summed with that field as spaces), as `tar`
/// checks it; an all-zero block does not match.
fn header_checksum_ok(h: &[u8]) -> bool {
    let Some(want) = octal(&h[148..156]) else {
        return false;
    };
    let sum: u64 = h
        .iter()
        .enumerate()
        .map(|(i, b)| {
            if (148..156).contains(&i) {
                32
            } else {
                u64::from(*b)
            }
        })
        .sum();
    sum == want
}

/// A numeric header field as `tar` reads it: octal digits up to the first NUL, surrounding
/// spaces ignored. None for a base-256 value or anything else.
fn octal(field: &[u8]) -> Option<u64> {
    if field.first().is_some_and(|b| b & 0x80 != 0) {
        return None;
    }
    let end = field.iter().position(|b| *b == 0).unwrap_or(field.len());
    let text = std::str::from_utf8(&field[..end]).ok()?.trim();
    u64::from_str_radix(text, 8).ok()
}
