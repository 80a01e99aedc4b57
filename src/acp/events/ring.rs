//! The retained frames of one event log, packed: frames are written one after the other into
//! blocks of at most `BLOCK_BYTES` (a larger frame gets a block of its own) and cost nothing
//! beyond their text. A frame ends at its first blank line (`\n\n`: the JSON on its `data:` line
//! has no newline), so a block is walked frame by frame, and each frame's id is read back from
//! the frame itself. A sealed block is one shared buffer, so a reader's replay gets each frame as
//! a slice of it (no copy); only the block still being written is copied from. Evicting the
//! oldest frame moves a cursor; a block is freed once its last frame is evicted.

use std::collections::VecDeque;

use bytes::Bytes;

/// Most bytes of frames one block packs. Smaller blocks waste less (the front block keeps its
/// evicted frames until the last goes, the open one has room to spare); larger ones cost fewer
/// block headers.
const BLOCK_BYTES: usize = 16 * 1024;

const HEAD: &[u8] = b"event: message\nid: ";
const DATA: &[u8] = b"\ndata: ";

/// The length of the frame `write_frame` writes.
pub(super) fn frame_len(id: u64, json_line: &[u8]) -> usize {
    let digits = id.checked_ilog10().map_or(1, |l| l as usize + 1);
    HEAD.len() + digits + DATA.len() + json_line.len() + 2
}

/// Appends `event: message`, the id, the JSON on one line, and the blank line that ends a frame.
/// A newline in the JSON (whitespace between tokens: JSON strings cannot hold one) is written as
/// a space, so that the frame has one `data:` line and ends at its only blank line.
pub(super) fn write_frame(buf: &mut Vec<u8>, id: u64, json_line: &[u8]) {
    use std::io::Write as _;
    buf.extend_from_slice(HEAD);
    // Formatted in place: no temporary string per event.
    let _ = write!(buf, "{id}");
    buf.extend_from_slice(DATA);
    let at = buf.len();
    buf.extend_from_slice(json_line);
    if memchr::memchr(b'\n', json_line).is_some() {
        for b in &mut buf[at..] {
            if *b == b'\n' {
                *b = b' ';
            }
        }
    }
    buf.extend_from_slice(b"\n\n");
}

/// The id of a frame `write_frame` wrote (None for anything else).
pub(super) fn frame_id(frame: &[u8]) -> Option<u64> {
    let rest = frame.strip_prefix(HEAD)?;
    let end = memchr::memchr(b'\n', rest)?;
    std::str::from_utf8(&rest[..end]).ok()?.parse().ok()
}

/// The id of `frame` when it is one whole frame as `write_frame` writes them: a message frame
/// whose only blank line is its end (what a block may hold).
pub(super) fn whole_frame_id(frame: &[u8]) -> Option<u64> {
    (frame.ends_with(b"\n\n") && frame_end(frame, 0) == frame.len())
        .then(|| frame_id(frame))
        .flatten()
}

/// The end (exclusive) of the frame that starts at `start` in `buf`: after its blank line.
fn frame_end(buf: &[u8], start: usize) -> usize {
    let mut from = start;
    while let Some(p) = memchr::memchr(b'\n', &buf[from..]) {
        let at = from + p;
        if buf.get(at + 1) == Some(&b'\n') {
            return at + 2;
        }
        from = at + 1;
    }
    buf.len()
}

/// The start of the last frame in `buf` (a non-empty run of whole frames).
fn last_frame_start(buf: &[u8]) -> usize {
    // The last frame's own blank line is the final two bytes; the one before ends the frame
    // before it.
    let mut upto = buf.len().saturating_sub(2);
    while let Some(p) = memchr::memrchr(b'\n', &buf[..upto]) {
        if p > 0 && buf[p - 1] == b'\n' {
            return p + 1;
        }
        upto = p;
    }
    0
}

/// The frames of `buf` from byte `from` on: (start, end) of each.
fn walk(buf: &[u8], from: usize) -> impl Iterator<Item = std::ops::Range<usize>> + '_ {
    let mut at = from;
    std::iter::from_fn(move || {
        (at < buf.len()).then(|| {
            let end = frame_end(buf, at);
            let r = at..end;
            at = end;
            r
        })
    })
}

/// The block being written.
#[derive(Clone, Default)]
struct Open {
    buf: Vec<u8>,
    /// Its frames (evicted ones included).
    frames: usize,
}

/// The frames, oldest first, ids strictly increasing.
#[derive(Clone, Default)]
pub(super) struct Ring {
    /// Sealed blocks: each its frames back to back.
    sealed: VecDeque<Bytes>,
    open: Open,
    /// Bytes of frames already evicted from the first block (the first sealed one, else the
    /// open one).
    skip: usize,
    len: usize,
    bytes: usize,
}

impl Ring {
    /// The number of frames held.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Their bytes.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// The bytes this ring keeps allocated for its frames beyond the frames themselves (evicted
    /// frames of the front block, room to spare in the open one, block headers): what the
    /// packing costs.
    #[cfg(test)]
    pub fn overhead(&self) -> usize {
        let sealed: usize = self
            .sealed
            .iter()
            .map(|b| b.len() + std::mem::size_of::<Bytes>())
            .sum();
        sealed + self.open.buf.capacity() - self.bytes
    }

    /// Appends the frame of event `id`.
    pub fn push(&mut self, id: u64, json_line: &[u8]) {
        let len = frame_len(id, json_line);
        self.reserve(len);
        if len > BLOCK_BYTES {
            let mut buf = Vec::with_capacity(len);
            write_frame(&mut buf, id, json_line);
            self.push_large(buf);
            return;
        }
        write_frame(&mut self.open.buf, id, json_line);
        self.close_frame(len);
    }

    /// Appends a frame as it is (a previous image's, checked with `whole_frame_id`).
    pub fn push_frame(&mut self, frame: &[u8]) {
        self.reserve(frame.len());
        if frame.len() > BLOCK_BYTES {
            self.push_large(frame.to_vec());
            return;
        }
        self.open.buf.extend_from_slice(frame);
        self.close_frame(frame.len());
    }

    /// Makes room in the open block for a frame of `len` bytes, sealing it first when the frame
    /// does not fit. The open block grows by doubling up to `BLOCK_BYTES`, so that a log of a few
    /// events holds a small buffer.
    fn reserve(&mut self, len: usize) {
        if !self.open.buf.is_empty() && (self.open.buf.len() + len > BLOCK_BYTES) {
            self.seal();
        }
        if len > BLOCK_BYTES {
            return;
        }
        let need = self.open.buf.len() + len;
        if need > self.open.buf.capacity() {
            let target = (self.open.buf.capacity() * 2).clamp(need, BLOCK_BYTES);
            self.open.buf.reserve_exact(target - self.open.buf.len());
        }
    }

    fn close_frame(&mut self, len: usize) {
        self.open.frames += 1;
        self.len += 1;
        self.bytes += len;
    }

    fn push_large(&mut self, buf: Vec<u8>) {
        self.len += 1;
        self.bytes += buf.len();
        self.sealed.push_back(Bytes::from(buf));
    }

    /// Turns the open block into a sealed one (its buffer trimmed to its frames).
    fn seal(&mut self) {
        if self.open.frames == 0 {
            self.open.buf.clear();
            return;
        }
        let mut open = std::mem::take(&mut self.open);
        open.buf.shrink_to_fit();
        self.sealed.push_back(Bytes::from(open.buf));
    }

    /// Drops the oldest frame; its id.
    pub fn pop_front(&mut self) -> Option<u64> {
        if self.len == 0 {
            return None;
        }
        let front: &[u8] = self.sealed.front().map_or(&self.open.buf, |b| b);
        let end = frame_end(front, self.skip);
        let id = frame_id(&front[self.skip..end]);
        let last_of_block = end >= front.len();
        self.len -= 1;
        self.bytes -= end - self.skip;
        self.skip = end;
        if last_of_block {
            self.skip = 0;
            if self.sealed.pop_front().is_none() {
                self.open.buf.clear();
                self.open.frames = 0;
            }
        }
        id
    }

    /// The id of the oldest frame.
    pub fn front_id(&self) -> Option<u64> {
        self.frames().next().map(|(id, _)| id)
    }

    /// The newest frame, as a buffer of its own (what live subscribers are sent).
    pub fn newest(&self) -> Option<(u64, Bytes)> {
        if self.len == 0 {
            return None;
        }
        // Evicting the open block's last frame empties it, so its last frame is live.
        if self.open.frames > 0 {
            let f = &self.open.buf[last_frame_start(&self.open.buf)..];
            return Some((frame_id(f).unwrap_or(0), Bytes::copy_from_slice(f)));
        }
        let b = self.sealed.back()?;
        let f = b.slice(last_frame_start(b)..);
        Some((frame_id(&f).unwrap_or(0), f))
    }

    /// The id of the newest frame.
    pub fn back_id(&self) -> Option<u64> {
        if self.len == 0 {
            return None;
        }
        let last: &[u8] = if self.open.frames > 0 {
            &self.open.buf
        } else {
            self.sealed.back()?
        };
        frame_id(&last[last_frame_start(last)..])
    }

    /// Every frame with its id, oldest first: slices of the sealed blocks, copies of the open
    /// block's frames.
    pub fn frames(&self) -> impl Iterator<Item = (u64, Bytes)> + '_ {
        self.frames_after(0)
    }

    /// The frames with an id above `after`, oldest first. Whole blocks at or before `after` are
    /// passed over by their last frame's id.
    pub fn frames_after(&self, after: u64) -> impl Iterator<Item = (u64, Bytes)> + '_ {
        let skip = self.skip;
        let open = (self.open.frames > 0).then_some(&self.open.buf);
        self.sealed
            .iter()
            .map(Some)
            .chain(std::iter::once(None))
            .enumerate()
            .filter(move |(_, block)| match block {
                Some(b) => frame_id(&b[last_frame_start(b)..]).is_none_or(|id| id > after),
                None => open.is_some(),
            })
            .flat_map(move |(n, block)| {
                let from = if n == 0 { skip } else { 0 };
                let buf: &[u8] = match block {
                    Some(b) => b,
                    None => open.map_or(&[][..], |o| o),
                };
                walk(buf, from).filter_map(move |r| {
                    let id = frame_id(&buf[r.clone()])?;
                    let f = match block {
                        Some(b) => b.slice(r),
                        None => Bytes::copy_from_slice(&buf[r]),
                    };
                    (id > after).then_some((id, f))
                })
            })
    }

    /// Takes every frame out (slices of the blocks, which are freed as the slices are dropped),
    /// leaving the ring empty.
    pub fn take(&mut self) -> Vec<(u64, Bytes)> {
        self.seal();
        let out = self.frames().collect();
        *self = Ring::default();
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(r: &Ring) -> Vec<u64> {
        r.frames().map(|(id, _)| id).collect()
    }

    #[test]
    fn frames_come_back_whole_across_blocks_and_evictions() {
        let mut r = Ring::default();
        let mut expected = VecDeque::new();
        // Sizes from tiny to over a block, so that frames straddle every kind of boundary.
        for id in 1..=600u64 {
            let json = format!("{{\"n\":\"{}\"}}", "x".repeat((id as usize * 97) % 400));
            let json = if id % 150 == 0 {
                format!("{{\"big\":\"{}\"}}", "y".repeat(BLOCK_BYTES + 10))
            } else {
                json
            };
            r.push(id, json.as_bytes());
            let mut f = Vec::new();
            write_frame(&mut f, id, json.as_bytes());
            expected.push_back((id, f));
            if id % 3 == 0 {
                let (eid, _) = expected.pop_front().unwrap();
                assert_eq!(r.pop_front(), Some(eid));
            }
            assert_eq!(r.len(), expected.len());
            assert_eq!(r.bytes(), expected.iter().map(|e| e.1.len()).sum::<usize>());
            assert_eq!(r.newest().unwrap().0, id);
        }
        let got: Vec<(u64, Vec<u8>)> = r.frames().map(|(i, f)| (i, f.to_vec())).collect();
        assert_eq!(got, Vec::from(expected.clone()));
        let after = expected[expected.len() / 2].0;
        assert_eq!(
            r.frames_after(after).map(|f| f.0).collect::<Vec<_>>(),
            expected
                .iter()
                .map(|e| e.0)
                .filter(|&i| i > after)
                .collect::<Vec<_>>()
        );
        let copy = r.clone();
        let taken = r.take();
        assert_eq!(taken.len(), expected.len());
        assert_eq!(r.len(), 0);
        let mut again = Ring::default();
        for (_, f) in &taken {
            again.push_frame(f);
        }
        assert_eq!(ids(&again), ids(&copy));
        while again.pop_front().is_some() {}
        assert_eq!((again.len(), again.bytes(), again.front_id()), (0, 0, None));
    }

    #[test]
    fn a_full_ring_costs_little_beyond_its_frames() {
        // 4,096 frames of ~210 bytes, then as many again evicting the oldest: the block
        // headers, the front block's evicted frames and the open block's spare room.
        let mut r = Ring::default();
        let json = format!("{{\"pad\":\"{}\"}}", "p".repeat(180));
        for id in 1..=8192u64 {
            if r.len() == 4096 {
                r.pop_front();
            }
            r.push(id, json.as_bytes());
        }
        // 17.1 KiB: no index (it was 2 bytes a frame, 8 KiB here).
        assert!(r.overhead() <= 20 * 1024, "{} bytes", r.overhead());
    }

    #[test]
    fn a_frame_ends_at_its_only_blank_line() {
        // A newline between JSON tokens would end the frame early: it is written as a space.
        let mut f = Vec::new();
        write_frame(&mut f, 7, b"{\"a\":\n1}\n");
        assert_eq!(f, b"event: message\nid: 7\ndata: {\"a\": 1} \n\n");
        assert_eq!(f.len(), frame_len(7, b"{\"a\":\n1}\n"));
        assert_eq!(whole_frame_id(&f), Some(7));
        let mut r = Ring::default();
        r.push(7, b"{\"a\":\n1}\n");
        r.push(8, b"\n");
        assert_eq!(ids(&r), [7, 8]);
        assert_eq!(r.pop_front(), Some(7));
        assert_eq!(r.newest().map(|n| n.0), Some(8));
        // What a block may not hold: two frames, a cut frame, another kind of frame.
        let mut two = f.clone();
        two.extend_from_slice(&f);
        assert_eq!(whole_frame_id(&two), None);
        assert_eq!(whole_frame_id(&f[..f.len() - 1]), None);
        assert_eq!(whole_frame_id(b": keepalive\n\n"), None);
        assert_eq!(whole_frame_id(b""), None);
    }
}
