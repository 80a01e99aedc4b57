//! The event log of one serverId: every agent→client message that is not a POST's answer gets the
//! next id (from 1, strictly increasing), is kept in a ring bounded by count and bytes, and is
//! queued to every subscriber. **Invariant:** a push is in the ring and in every live subscriber's
//! queue before `push` returns (subscribers are woken in batches by `wake`); a subscriber whose queue outgrows its bound is cut off, so no
//! subscriber ever slows the reader or another subscriber, and memory stays bounded.

mod ring;
pub mod withdrawn;

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use bytes::{Bytes, BytesMut};
use tokio::sync::Notify;

/// The SSE frame of a keepalive comment.
pub const KEEPALIVE_FRAME: &[u8] = b": keepalive\n\n";

/// Limits of one log; a subscriber may queue at most twice as much before it is cut off.
#[derive(Debug, Clone, Copy)]
pub struct LogLimits {
    pub max_events: usize,
    pub max_bytes: usize,
}

/// An event log in a reload's hand-off.
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize, PartialEq)]
pub struct EventsState {
    pub next_id: u64,
    /// (id, complete SSE frame), oldest first.
    pub frames: Vec<(u64, crate::carried::Payload)>,
    /// The last real event's id, the newest evicted id and the ids the run before a restart
    /// lost: what the frames alone cannot say (a restart's skipped ids held no event, lost ids
    /// did). Absent in the hand-off of a build before them (then derived from the frames).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_event: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub evicted: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lost: Option<(u64, u64)>,
}

struct LogState {
    /// The retained events' complete SSE frames (`event: message\nid: N\ndata: …\n\n`),
    /// packed into shared blocks.
    ring: ring::Ring,
    next_id: u64,
    /// The id of the last event this log holds or held (0 for none): after a restart the next
    /// id is further on (the restart's skip), but no event has the ids in between.
    last_event: u64,
    /// The newest id evicted from the ring (0 for none): a reader from before it gets a `gap`.
    evicted: u64,
    /// Ids that may have been issued but were lost (the previous run stopped being durable).
    lost: Option<(u64, u64)>,
    closed: bool,
    subscribers: Vec<Arc<Queue>>,
    /// Events no longer offered to a new subscriber: an agent's request it withdrew
    /// (`$/cancel_request`) and the withdrawal. **Invariant:** at most [`MAX_WITHDRAWN`].
    withdrawn: std::collections::BTreeSet<u64>,
}

/// Most withdrawn events remembered (the oldest are forgotten first, and offered again).
const MAX_WITHDRAWN: usize = 1024;

/// One serverId's event log. Cheap operations under one short mutex; never awaits while locked.
pub struct EventLog {
    limits: LogLimits,
    state: Mutex<LogState>,
    /// Its copy on disk (`--state-dir`), set once when the instance is created or recovered.
    durable: std::sync::OnceLock<Arc<super::durable::Tracked>>,
}

/// What `subscribe` found.
pub enum Subscribe {
    Live(Subscription),
    /// The log is closed (the agent is gone) and nothing is left to deliver after the given id.
    NothingLeft,
    /// The given id is beyond the last id this log ever issued (`last`).
    Ahead {
        last: u64,
    },
    /// The log already has its most subscribers.
    Full,
}

impl EventLog {
    pub fn new(limits: LogLimits) -> Self {
        EventLog {
            limits,
            state: Mutex::new(LogState {
                ring: ring::Ring::default(),
                next_id: 1,
                last_event: 0,
                evicted: 0,
                lost: None,
                closed: false,
                subscribers: Vec::new(),
                withdrawn: Default::default(),
            }),
            durable: std::sync::OnceLock::new(),
        }
    }

    /// A log recovered from the state dir: its retained events (ids increasing), the next id
    /// to issue, and the ids lost by the previous run, if it lost any. Open, so that
    /// subscribers wait for the instance to be used again.
    pub fn recovered(
        limits: LogLimits,
        events: Vec<(u64, Bytes)>,
        next_id: u64,
        lost: Option<(u64, u64)>,
    ) -> Self {
        let log = EventLog::new(limits);
        {
            let mut st = log.lock();
            // What the disk kept no longer (compacted away) is a gap like an eviction.
            st.evicted = events.first().map_or(0, |e| e.0.saturating_sub(1));
            st.last_event = events.last().map_or(0, |e| e.0);
            st.lost = lost;
            // The requests the agent withdrew stay withdrawn (their cancellations are in the log).
            st.add_withdrawn(withdrawn::scan(events.iter().map(|(id, l)| (*id, l))).withdrawn);
            for (id, line) in events {
                st.ring.push(id, &line);
                st.evict_over(limits);
            }
            st.next_id = next_id.max(st.ring.back_id().map_or(1, |id| id + 1));
        }
        log
    }

    /// Ties the log to its copy on disk (once).
    pub fn set_durable(&self, t: Arc<super::durable::Tracked>) {
        let _ = self.durable.set(t);
    }

    pub fn durable(&self) -> Option<&Arc<super::durable::Tracked>> {
        self.durable.get()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, LogState> {
        // A panic while holding this lock would be a bug in this file; recover the data anyway
        // rather than poisoning every later request of the instance.
        crate::sys::lock(&self.state)
    }

    /// Appends one message (a single-line JSON object) and queues it to every subscriber
    /// (`wake` then wakes them). Returns its id. A closed log drops the message (the instance is
    /// gone).
    pub fn push(&self, json_line: &[u8]) -> u64 {
        let mut st = self.lock();
        if st.closed {
            return 0;
        }
        let durable = self.durable.get();
        if durable.is_some_and(|d| d.swallows(json_line)) {
            return st.next_id - 1;
        }
        let id = st.next_id;
        st.next_id += 1;
        st.last_event = id;
        if let Some(d) = durable {
            // Under the lock, so the disk sees the events in id order.
            d.append(id, json_line);
        }
        // At the count bound the oldest goes first, so that the ring never holds one more than
        // the bound.
        if st.ring.len() >= self.limits.max_events.max(1)
            && let Some(old) = st.ring.pop_front()
        {
            st.evicted = st.evicted.max(old);
        }
        st.ring.push(id, json_line);
        st.evict_over(self.limits);
        let limits = self.limits;
        let st = &mut *st;
        // The ring packs the frame into a block; live subscribers share one copy of it.
        if !st.subscribers.is_empty()
            && let Some((_, newest)) = st.ring.newest()
        {
            st.subscribers.retain(|q| q.offer(&newest, limits));
        }
        id
    }

    /// Wakes every subscriber that has frames it was not yet woken for. The reader calls this
    /// before it waits for more agent output and before it hands a response to its POST.
    pub fn wake(&self) {
        let st = self.lock();
        for q in &st.subscribers {
            q.wake();
        }
    }

    /// A new open log holding what this one holds (its ring, numbering and gaps, its durable
    /// state): the same serverId listed again after a failed start.
    pub fn reopened(&self) -> EventLog {
        let st = self.lock();
        let log = EventLog::new(self.limits);
        {
            let mut n = log.lock();
            n.ring = st.ring.clone();
            n.next_id = st.next_id;
            n.last_event = st.last_event;
            n.evicted = st.evicted;
            n.lost = st.lost;
            n.withdrawn = st.withdrawn.clone();
        }
        log
    }

    /// The JSON lines of the retained events after `from` (for the state dir's catch-up after a
    /// reload).
    pub fn lines_after(&self, from: u64) -> Vec<(u64, Bytes)> {
        let st = self.lock();
        st.ring
            .frames_after(from)
            .filter_map(|(id, frame)| {
                let line = withdrawn::frame_line(&frame)?;
                Some((id, frame.slice_ref(line)))
            })
            .collect()
    }

    /// Waits until every event pushed so far is in the state dir (at once without one): what
    /// the stdout reader awaits before it wakes the streams or reads on.
    pub async fn written(&self) {
        if let Some(d) = self.durable.get() {
            d.written().await;
        }
    }

    /// What a reload carries of this log: the next id and the retained frames, taken out of the
    /// ring (slices of its blocks, no copy; a block is freed once the hand-off has written its
    /// last frame, so a reload does not hold the log twice). Called once the log is frozen for
    /// the hand-off.
    pub fn export(&self) -> EventsState {
        let mut st = self.lock();
        EventsState {
            next_id: st.next_id,
            frames: st
                .ring
                .take()
                .into_iter()
                .map(|(id, frame)| (id, crate::carried::Payload(frame)))
                .collect(),
            last_event: Some(st.last_event),
            evicted: Some(st.evicted),
            lost: st.lost,
        }
    }

    /// The bytes a hand-off of this log carries (its retained frames).
    pub fn retained_bytes(&self) -> usize {
        self.lock().ring.bytes()
    }

    /// Takes over a previous image's log (a fresh log, before anyone subscribed): ids go on
    /// from `next_id`, the retained frames are replayed to readers as before (but the requests
    /// the agent withdrew); the bounds are this image's. Returns the agent's requests still
    /// waiting for an answer (JSON-RPC id → event id), for the adopted agent's later withdrawals.
    pub fn restore(
        &self,
        state: &EventsState,
    ) -> std::collections::HashMap<crate::acp::jsonrpc::IdKey, u64> {
        let mut st = self.lock();
        st.next_id = state.next_id.max(1);
        st.ring = ring::Ring::default();
        let mut newest = None;
        for (id, frame) in &state.frames {
            // Frames are copied into the ring's blocks (their carried buffers go with `state`);
            // one that is not a message frame of its id (never written by this daemon) is left
            // out rather than replayed under a wrong id.
            if ring::whole_frame_id(&frame.0) != Some(*id) || newest.is_some_and(|n| n >= *id) {
                tracing::warn!(
                    id,
                    "a carried event frame is not an event of its id: left out"
                );
                continue;
            }
            st.ring.push_frame(&frame.0);
            newest = Some(*id);
        }
        st.last_event = match (state.last_event, newest) {
            (Some(last), newest) => last.max(newest.unwrap_or(0)),
            // An older build's hand-off: the newest frame, else the id before the next.
            (None, newest) => newest.unwrap_or(st.next_id - 1),
        };
        st.evicted = state.evicted.unwrap_or(0);
        st.lost = state.lost;
        st.evict_over(self.limits);
        if state.evicted.is_none() && st.evicted == 0 {
            st.evicted = st.ring.front_id().map_or(0, |id| id.saturating_sub(1));
        }
        // Slices of the ring's blocks, not copies.
        let lines: Vec<(u64, Bytes)> = st
            .ring
            .frames()
            .filter_map(|(id, f)| {
                let line = withdrawn::frame_line(&f)?;
                Some((id, f.slice_ref(line)))
            })
            .collect();
        let found = withdrawn::scan(lines.iter().map(|(id, l)| (*id, l)));
        st.add_withdrawn(found.withdrawn);
        found.open
    }

    /// The id of the last event this log holds or held (0 before the first): a real event, also
    /// after a restart's skip.
    pub fn last_id(&self) -> u64 {
        self.lock().last_event
    }

    pub fn subscriber_count(&self) -> usize {
        self.lock().subscribers.len()
    }

    /// Ends every subscription once its queue is drained; later pushes are dropped.
    pub fn close(&self) {
        let mut st = self.lock();
        st.closed = true;
        for q in st.subscribers.drain(..) {
            q.close(false);
        }
    }

    /// Registers a subscriber that first receives the retained events after `after` (preceded by
    /// a `gap` event when some of them were evicted), then every new event; refused when the log
    /// has `max_subscribers` already.
    pub fn subscribe(self: &Arc<Self>, after: u64, max_subscribers: usize) -> Subscribe {
        let mut st = self.lock();
        if st.subscribers.len() >= max_subscribers {
            return Subscribe::Full;
        }
        let last = st.next_id - 1;
        if after > last {
            // Not an id of this log (another instance under the same serverId, or made up):
            // neither a gap nor "nothing missed" would be true.
            return Subscribe::Ahead { last };
        }
        let mut replay = VecDeque::new();
        let mut bytes = 0;
        // Only ids that held an event and are gone are a gap: the ids a restart skipped never
        // held one, unless the previous run lost them (`lost`).
        if after < st.evicted {
            let gap = gap_frame(after + 1, st.evicted);
            bytes += gap.len();
            replay.push_back(gap);
        }
        let mut lost = st.lost.filter(|l| after < l.1);
        for (id, frame) in st
            .ring
            .frames_after(after)
            .filter(|(id, _)| !st.withdrawn.contains(id))
        {
            if let Some((from, to)) = lost
                && id > to
            {
                let gap = gap_frame(from.max(after + 1), to);
                bytes += gap.len();
                replay.push_back(gap);
                lost = None;
            }
            bytes += frame.len();
            replay.push_back(frame);
        }
        if let Some((from, to)) = lost
            && st.next_id > to
        {
            let gap = gap_frame(from.max(after + 1), to);
            bytes += gap.len();
            replay.push_back(gap);
        }
        if st.closed && replay.is_empty() {
            return Subscribe::NothingLeft;
        }
        let queue = Arc::new(Queue {
            state: Mutex::new(QueueState {
                frames: replay,
                bytes,
                closed: st.closed,
                cut: false,
            }),
            notify: Notify::new(),
            unwoken: AtomicBool::new(false),
        });
        if !st.closed {
            st.subscribers.push(queue.clone());
        }
        Subscribe::Live(Subscription {
            log: self.clone(),
            queue,
            _share: None,
        })
    }

    /// Events `ids` are not replayed to subscribers from now on (those already subscribed
    /// have them).
    pub fn withdraw(&self, ids: &[u64]) {
        self.lock().add_withdrawn(ids.to_vec());
    }

    fn unsubscribe(&self, queue: &Arc<Queue>) {
        self.lock().subscribers.retain(|q| !Arc::ptr_eq(q, queue));
    }
}

impl LogState {
    /// Adds withdrawn event ids, forgetting the oldest past [`MAX_WITHDRAWN`].
    fn add_withdrawn(&mut self, ids: Vec<u64>) {
        self.withdrawn.extend(ids);
        while self.withdrawn.len() > MAX_WITHDRAWN {
            self.withdrawn.pop_first();
        }
    }

    /// Evicts the oldest events while the ring is over a bound. The newest event always stays,
    /// even when it alone is over the byte bound, so that a subscriber arriving late still sees
    /// the last thing the agent said.
    fn evict_over(&mut self, limits: LogLimits) {
        while self.ring.len() > 1
            && (self.ring.len() > limits.max_events || self.ring.bytes() > limits.max_bytes)
        {
            match self.ring.pop_front() {
                Some(old) => self.evicted = self.evicted.max(old),
                None => break,
            }
        }
    }
}

/// `event: message`, the id, the JSON on one line, in a buffer of exactly its size.
#[cfg(test)]
fn message_frame(id: u64, json_line: &[u8]) -> Bytes {
    let mut b = Vec::with_capacity(ring::frame_len(id, json_line));
    ring::write_frame(&mut b, id, json_line);
    debug_assert_eq!(b.len(), b.capacity());
    Bytes::from(b)
}

pub(super) fn gap_frame(from: u64, to: u64) -> Bytes {
    Bytes::from(format!(
        "event: gap\ndata: {{\"from\":{from},\"to\":{to}}}\n\n"
    ))
}

struct QueueState {
    frames: VecDeque<Bytes>,
    bytes: usize,
    closed: bool,
    /// Closed because the subscriber fell behind: it ends at once, without draining.
    cut: bool,
}

/// A subscriber's bounded queue of frames.
struct Queue {
    state: Mutex<QueueState>,
    notify: Notify,
    /// Frames were queued since the last wake-up.
    unwoken: AtomicBool,
}

impl Queue {
    fn lock(&self) -> std::sync::MutexGuard<'_, QueueState> {
        crate::sys::lock(&self.state)
    }

    /// Queues a frame; false (and the queue is cut off) when the subscriber is too far behind.
    fn offer(&self, frame: &Bytes, limits: LogLimits) -> bool {
        let mut q = self.lock();
        if q.closed {
            return false;
        }
        // Twice the ring's bounds: a new subscriber's replay (at most one ring) leaves it as
        // much room again for live events before it counts as behind.
        if q.frames.len() >= limits.max_events.saturating_mul(2)
            || q.bytes + frame.len() > limits.max_bytes.saturating_mul(2)
        {
            q.closed = true;
            q.cut = true;
            q.frames.clear();
            q.bytes = 0;
            drop(q);
            self.notify.notify_one();
            return false;
        }
        q.bytes += frame.len();
        q.frames.push_back(frame.clone());
        drop(q);
        // The wake-up is deferred to `EventLog::wake`, so that a burst of events costs each
        // subscriber one wake-up (and one socket write) instead of one per event.
        self.unwoken.store(true, Ordering::Release);
        true
    }

    fn wake(&self) {
        if self.unwoken.swap(false, Ordering::AcqRel) {
            self.notify.notify_one();
        }
    }

    fn close(&self, cut: bool) {
        let mut q = self.lock();
        q.closed = true;
        if cut {
            q.cut = true;
            q.frames.clear();
        }
        drop(q);
        self.notify.notify_one();
    }
}

/// One reader of the log. Dropping it unsubscribes.
pub struct Subscription {
    log: Arc<EventLog>,
    queue: Arc<Queue>,
    /// Its place in the daemon-wide subscriber budget, given back on drop.
    _share: Option<super::caps::Reservation>,
}

/// What a subscription yields next.
pub enum Next {
    /// One or more whole SSE frames, concatenated.
    Frames(Bytes),
    /// Everything was delivered and the log is closed.
    End,
    /// The subscriber fell behind and was cut off.
    CutOff,
}

impl Subscription {
    /// Ties a share of a global budget to this subscription's life.
    pub fn hold(&mut self, share: super::caps::Reservation) {
        self._share = Some(share);
    }

    /// Waits for frames; several queued frames come back as one chunk (at most ~64 KiB unless a
    /// single frame is larger), which keeps the per-event cost of a fast stream low.
    pub async fn next(&self) -> Next {
        loop {
            {
                let mut q = self.queue.lock();
                if q.cut {
                    return Next::CutOff;
                }
                if !q.frames.is_empty() {
                    let q = &mut *q;
                    return Next::Frames(take_chunk(&mut q.frames, &mut q.bytes));
                }
                if q.closed {
                    return Next::End;
                }
            }
            self.queue.notify.notified().await;
        }
    }
}

/// Most bytes of queued frames one wake-up of a reader concatenates (one larger frame goes alone).
pub(super) const CHUNK_BYTES: usize = 64 * 1024;

/// Takes the frames at the front of `frames` (at least one; `frames` must not be empty) that
/// together fit in `CHUNK_BYTES`, as one buffer, subtracting them from `bytes`. The buffer is
/// sized to exactly what is taken: sizing it from the queue's length instead (a large first
/// frame times the number queued) reserved gigabytes that were never written.
pub(super) fn take_chunk(frames: &mut VecDeque<Bytes>, bytes: &mut usize) -> Bytes {
    let mut size = 0;
    let mut count = 0;
    for f in frames.iter() {
        if count > 0 && size + f.len() > CHUNK_BYTES {
            break;
        }
        size += f.len();
        count += 1;
    }
    *bytes -= size;
    if count == 1 {
        return frames.pop_front().expect("one frame counted");
    }
    let mut chunk = BytesMut::with_capacity(size);
    for f in frames.drain(..count) {
        chunk.extend_from_slice(&f);
    }
    chunk.freeze()
}

/// What `Subscription::next_into` found.
pub enum Batch {
    /// Frames were moved into the caller's vector.
    Frames,
    End,
    CutOff,
}

impl Subscription {
    /// Like `next`, but moves the queued frames (up to ~64 KiB, or one larger frame) into `out`
    /// one by one instead of concatenating them: for the faces that take the frames apart again
    /// (the WebSocket), which then copy nothing and allocate nothing per wake-up.
    pub async fn next_into(&self, out: &mut Vec<Bytes>) -> Batch {
        loop {
            {
                let mut q = self.queue.lock();
                if q.cut {
                    return Batch::CutOff;
                }
                let mut taken = 0;
                while let Some(f) = q.frames.front() {
                    if taken > 0 && taken + f.len() > CHUNK_BYTES {
                        break;
                    }
                    let f = q.frames.pop_front().expect("front exists");
                    q.bytes -= f.len();
                    taken += f.len();
                    out.push(f);
                }
                if taken > 0 {
                    return Batch::Frames;
                }
                if q.closed {
                    return Batch::End;
                }
            }
            self.queue.notify.notified().await;
        }
    }
}

impl Subscription {
    /// True once this subscriber was cut off for falling behind. A face that may be blocked on a
    /// socket write (the WebSocket) polls this, so that it can drop a reader that stopped reading.
    pub fn is_cut(&self) -> bool {
        self.queue.lock().cut
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        self.log.unsubscribe(&self.queue);
    }
}

#[cfg(test)]
mod tests;
