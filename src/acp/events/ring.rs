//! The retained frames of one event log, packed: frames are written one after the other into
//! blocks of at most `BLOCK_BYTES` (a larger frame gets a block of its own), and each frame costs
//! only its 2-byte end offset beyond its text — its id is read back from the frame itself. A
//! sealed block is one shared buffer, so a reader's replay gets each frame as a slice of it (no
//! copy); only the block still being written is copied from. Evicting the oldest frame moves a
//! cursor; a block is freed once its last frame is evicted.

use std::collections::VecDeque;

use bytes::Bytes;

/// Most bytes of frames one block packs. Smaller blocks waste less (the front block keeps its
/// evicted frames until the last goes, the open one has room to spare); larger ones cost fewer
/// block headers. It fits the 2-byte end offsets.
const BLOCK_BYTES: usize = 16 * 1024;

const HEAD: &[u8] = b"event: message\nid: ";
const DATA: &[u8] = b"\ndata: ";

/// The length of the frame `write_frame` writes.
pub(super) fn frame_len(id: u64, json_line: &[u8]) -> usize {
    let digits = id.checked_ilog10().map_or(1, |l| l as usize + 1);
    HEAD.len() + digits + DATA.len() + json_line.len() + 2
}

/// Appends `event: message`, the id, the JSON on one line, and the blank line that ends a frame.
pub(super) fn write_frame(buf: &mut Vec<u8>, id: u64, json_line: &[u8]) {
    use std::io::Write as _;
    buf.extend_from_slice(HEAD);
    // Formatted in place: no temporary string per event.
    let _ = write!(buf, "{id}");
    buf.extend_from_slice(DATA);
    buf.extend_from_slice(json_line);
    buf.extend_from_slice(b"\n\n");
}

/// The id of a frame `write_frame` wrote (None for anything else).
pub(super) fn frame_id(frame: &[u8]) -> Option<u64> {
    let rest = frame.strip_prefix(HEAD)?;
    let end = memchr::memchr(b'\n', rest)?;
    std::str::from_utf8(&rest[..end]).ok()?.parse().ok()
}

/// A sealed block: its frames back to back.
#[derive(Clone)]
struct Block {
    buf: Bytes,
    /// Each frame's end in `buf`; empty for a block of one frame larger than `BLOCK_BYTES`.
    ends: Box<[u16]>,
}

impl Block {
    fn count(&self) -> usize {
        self.ends.len().max(1)
    }

    fn range(&self, i: usize) -> std::ops::Range<usize> {
        if self.ends.is_empty() {
            return 0..self.buf.len();
        }
        let start = if i == 0 { 0 } else { self.ends[i - 1] as usize };
        start..self.ends[i] as usize
    }
}

/// The block being written.
#[derive(Clone, Default)]
struct Open {
    buf: Vec<u8>,
    ends: Vec<u16>,
}

impl Open {
    fn range(&self, i: usize) -> std::ops::Range<usize> {
        let start = if i == 0 { 0 } else { self.ends[i - 1] as usize };
        start..self.ends[i] as usize
    }
}

/// The frames, oldest first, ids strictly increasing.
#[derive(Clone, Default)]
pub(super) struct Ring {
    sealed: VecDeque<Block>,
    open: Open,
    /// Frames already evicted from the first block (the first sealed one, else the open one).
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

    /// The bytes this ring keeps allocated for its frames and their index beyond the frames
    /// themselves (evicted frames of the front block, room to spare in the open one): what the
    /// packing costs.
    #[cfg(test)]
    pub fn overhead(&self) -> usize {
        let sealed: usize = self
            .sealed
            .iter()
            .map(|b| b.buf.len() + b.ends.len() * 2 + std::mem::size_of::<Block>())
            .sum();
        sealed + self.open.buf.capacity() + self.open.ends.capacity() * 2 - self.bytes
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

    /// Appends a frame as it is (one `write_frame` wrote: a previous image's).
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
        // At most BLOCK_BYTES (checked by `reserve`), which fits.
        self.open.ends.push(self.open.buf.len() as u16);
        self.len += 1;
        self.bytes += len;
    }

    fn push_large(&mut self, buf: Vec<u8>) {
        self.len += 1;
        self.bytes += buf.len();
        self.sealed.push_back(Block {
            buf: Bytes::from(buf),
            ends: Box::new([]),
        });
    }

    /// Turns the open block into a sealed one (its buffer trimmed to its frames).
    fn seal(&mut self) {
        if self.open.ends.is_empty() {
            self.open.buf.clear();
            return;
        }
        let mut open = std::mem::take(&mut self.open);
        open.buf.shrink_to_fit();
        let count = open.ends.len();
        self.sealed.push_back(Block {
            buf: Bytes::from(open.buf),
            ends: open.ends.into_boxed_slice(),
        });
        // The next block likely holds as many frames.
        self.open.ends.reserve_exact(count);
    }

    /// The first block's frame `i` (sealed blocks first, then the open one).
    fn blocks(&self) -> impl Iterator<Item = (Option<&Block>, usize)> {
        self.sealed
            .iter()
            .map(|b| (Some(b), b.count()))
            .chain(std::iter::once((None, self.open.ends.len())))
    }

    /// Drops the oldest frame; its id.
    pub fn pop_front(&mut self) -> Option<u64> {
        if self.len == 0 {
            return None;
        }
        let (id, len, last_of_block) = match self.sealed.front() {
            Some(b) => {
                let r = b.range(self.skip);
                (
                    frame_id(&b.buf[r.clone()]),
                    r.len(),
                    self.skip + 1 == b.count(),
                )
            }
            None => {
                let r = self.open.range(self.skip);
                let last = self.skip + 1 == self.open.ends.len();
                (frame_id(&self.open.buf[r.clone()]), r.len(), last)
            }
        };
        self.len -= 1;
        self.bytes -= len;
        self.skip += 1;
        if last_of_block {
            self.skip = 0;
            if self.sealed.pop_front().is_none() {
                self.open.buf.clear();
                self.open.ends.clear();
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
        if let Some(i) = self.open.ends.len().checked_sub(1) {
            let f = &self.open.buf[self.open.range(i)];
            return Some((frame_id(f).unwrap_or(0), Bytes::copy_from_slice(f)));
        }
        let b = self.sealed.back()?;
        let f = b.buf.slice(b.range(b.count() - 1));
        Some((frame_id(&f).unwrap_or(0), f))
    }

    /// The id of the newest frame.
    pub fn back_id(&self) -> Option<u64> {
        if self.len == 0 {
            return None;
        }
        if let Some(i) = self.open.ends.len().checked_sub(1) {
            return frame_id(&self.open.buf[self.open.range(i)]);
        }
        let b = self.sealed.back()?;
        frame_id(&b.buf[b.range(b.count() - 1)])
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
        self.blocks()
            .enumerate()
            .filter(move |(_, (block, count))| {
                *count > 0
                    && match block {
                        Some(b) => frame_id(&b.buf[b.range(count - 1)]).is_none_or(|id| id > after),
                        None => true,
                    }
            })
            .flat_map(move |(n, (block, count))| {
                let first = if n == 0 { skip } else { 0 };
                (first..count).filter_map(move |i| {
                    let (id, f) = match block {
                        Some(b) => {
                            let r = b.range(i);
                            (frame_id(&b.buf[r.clone()])?, b.buf.slice(r))
                        }
                        None => {
                            let f = &self.open.buf[self.open.range(i)];
                            (frame_id(f)?, Bytes::copy_from_slice(f))
                        }
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
        // 4,096 frames of ~210 bytes, then as many again evicting the oldest: the index, the
        // block headers, the front block's evicted frames and the open block's spare room.
        let mut r = Ring::default();
        let json = format!("{{\"pad\":\"{}\"}}", "p".repeat(180));
        for id in 1..=8192u64 {
            if r.len() == 4096 {
                r.pop_front();
            }
            r.push(id, json.as_bytes());
        }
        assert!(r.overhead() <= 32 * 1024, "{} bytes", r.overhead());
    }
}
