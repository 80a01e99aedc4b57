//! The live change feed behind `GET /v1/fs/watch`: one inotify instance and one thread per
//! stream (`feed.rs`), handing changes to the stream's reader through a queue bounded in bytes.
//! **Invariants:** the watch thread never waits for the reader (a full queue drops events and
//! says so with an overflow item; a reader that takes nothing for `--transfer-timeout` while
//! events are dropped is cut off); every kernel watch belongs to one stream's inotify instance,
//! so ending the stream (closing its descriptor) frees them all; a tree that cannot be watched
//! whole fails the stream instead of being presented as watched.
//!
//! Raw inotify (through `nix`) rather than the `notify` crate: the feed must add each watch on
//! the very directory it opened beneath `--fs-root` (notify watches by path string and follows
//! symlinks), must know when the kernel queue has been read up to the end of a scan (to report a
//! file found by the scan of a new directory once, not twice), must not walk ignored trees, and
//! must bound every queue (notify's channels are unbounded and its recursive mode does not
//! report what it finds in new directories).

mod feed;
mod ignore;

use std::collections::VecDeque;
use std::io;
use std::os::fd::OwnedFd;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use nix::fcntl::OFlag;
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};

pub use ignore::IgnoreSet;

use super::{EntryType, FileError, PathPolicy};

/// What happened to an entry (`http::wire::watch` holds the wire shapes of this module's events).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChangeKind {
    Create,
    Modify,
    Remove,
    Rename,
}

/// One change beneath the watched directory (`event: change`).
#[derive(Debug, Clone)]
pub struct WatchChange {
    pub kind: ChangeKind,
    /// The entry's absolute path (for `rename`, its new path).
    pub path: String,
    pub entry_type: EntryType,
    /// Only for `rename`: the entry's absolute path before.
    pub old_path: Option<String>,
}

/// Why changes were lost (`event: overflow`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OverflowReason {
    /// The kernel's event queue overflowed (`fs.inotify.max_queued_events`).
    Kernel,
    /// The reader did not keep up: the stream's queue was full.
    Reader,
    /// A directory that appeared held more entries than the feed keeps track of at once.
    Scan,
}

/// What a stream hands its reader, in order.
#[derive(Debug)]
pub enum WatchItem {
    /// The kernel watches are installed: what happens from now on is reported.
    Ready,
    Change(WatchChange),
    Overflow(OverflowReason),
    /// The watch cannot go on (a limit, a directory that cannot be watched); the stream ends.
    Failed(WatchError),
}

impl WatchItem {
    /// What the item costs the queue's byte budget.
    fn cost(&self) -> usize {
        match self {
            WatchItem::Change(c) => 96 + c.path.len() + c.old_path.as_ref().map_or(0, String::len),
            _ => 64,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum WatchError {
    #[error(transparent)]
    File(#[from] FileError),
    #[error("all {limit} watch streams are in use; retry later")]
    Busy { limit: usize },
    #[error("{what} ({setting} = {limit}) is reached; {} is not watched", path.display())]
    Limit {
        what: &'static str,
        setting: &'static str,
        limit: u64,
        path: PathBuf,
    },
    #[error("the watch failed: {0}")]
    Internal(#[source] io::Error),
}

/// The directories (kernel watches) all streams hold together (`--watch-max-dirs`).
pub(crate) struct DirBudget {
    used: AtomicUsize,
    limit: usize,
}

impl DirBudget {
    fn reserve(&self) -> bool {
        self.used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |u| {
                (u < self.limit).then_some(u + 1)
            })
            .is_ok()
    }

    fn release(&self, n: usize) {
        self.used.fetch_sub(n, Ordering::AcqRel);
    }
}

/// The bounded queue between a feed thread and its reader.
struct Shared {
    queue: Mutex<Queue>,
    wake: Notify,
    /// The reader went away; the thread stops at its next step.
    closed: AtomicBool,
    /// Cancelled when the reader is cut off.
    cut: tokio_util::sync::CancellationToken,
}

struct Queue {
    items: VecDeque<WatchItem>,
    bytes: usize,
    limit: usize,
    last_take: Instant,
    stall: Duration,
    ended: bool,
    cut_off: bool,
}

impl Shared {
    fn new(limit: usize, stall: Duration) -> Self {
        Shared {
            queue: Mutex::new(Queue {
                items: VecDeque::new(),
                bytes: 0,
                limit,
                last_take: Instant::now(),
                stall,
                ended: false,
                cut_off: false,
            }),
            wake: Notify::new(),
            closed: AtomicBool::new(false),
            cut: tokio_util::sync::CancellationToken::new(),
        }
    }

    fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Queue> {
        // A panic while holding this lock leaves a consistent queue (each step is one push).
        crate::sys::lock(&self.queue)
    }

    /// Queues an item without ever waiting. False when the feed must stop: the reader went
    /// away or was cut off for taking nothing while its queue overflowed.
    fn push(&self, item: WatchItem) -> bool {
        if self.is_closed() {
            return false;
        }
        let mut q = self.lock();
        if q.ended {
            return false;
        }
        let overflow = matches!(item, WatchItem::Overflow(_));
        let cost = item.cost();
        let always = matches!(item, WatchItem::Ready | WatchItem::Failed(_));
        if !always && (overflow || q.bytes + cost > q.limit) {
            // One overflow marker stands for any run of lost items.
            if !matches!(q.items.back(), Some(WatchItem::Overflow(_))) {
                let marker = if overflow {
                    item
                } else {
                    WatchItem::Overflow(OverflowReason::Reader)
                };
                let was_empty = q.items.is_empty();
                q.items.push_back(marker);
                if was_empty {
                    self.wake.notify_one();
                }
            }
            if !overflow && q.last_take.elapsed() > q.stall {
                q.cut_off = true;
                q.ended = true;
                self.wake.notify_one();
                self.cut.cancel();
                return false;
            }
            return true;
        }
        let was_empty = q.items.is_empty();
        q.bytes += cost;
        q.items.push_back(item);
        if was_empty {
            self.wake.notify_one();
        }
        true
    }

    fn end(&self) {
        self.lock().ended = true;
        self.wake.notify_one();
    }
}

/// What [`WatchStream::next`] gives.
pub enum Next {
    Items(Vec<WatchItem>),
    /// The feed ended; `cut_off` when because the reader took nothing while events were lost.
    End {
        cut_off: bool,
    },
}

/// The reader's side of one watch. Dropping it stops the feed thread, which closes its inotify
/// instance (every kernel watch of the stream goes with it).
pub struct WatchStream {
    shared: Arc<Shared>,
    /// The write end of the thread's stop pipe: closing it wakes the thread's poll.
    _stop: OwnedFd,
    /// The watched directory's absolute path.
    pub root: String,
    pub recursive: bool,
}

impl Drop for WatchStream {
    fn drop(&mut self) {
        self.shared.closed.store(true, Ordering::Release);
    }
}

/// Items one [`WatchStream::next`] hands out at most.
const BATCH: usize = 256;

impl WatchStream {
    /// The next items, waiting for them without blocking the runtime.
    pub async fn next(&self) -> Next {
        loop {
            {
                let mut q = self.shared.lock();
                if !q.items.is_empty() {
                    let n = q.items.len().min(BATCH);
                    let items: Vec<WatchItem> = q.items.drain(..n).collect();
                    let freed: usize = items.iter().map(WatchItem::cost).sum();
                    q.bytes = q.bytes.saturating_sub(freed);
                    q.last_take = Instant::now();
                    return Next::Items(items);
                }
                if q.ended {
                    return Next::End { cut_off: q.cut_off };
                }
            }
            self.shared.wake.notified().await;
        }
    }

    /// Resolves once the reader was cut off, whatever is still queued: a face blocked writing
    /// to its client uses it to stop waiting.
    pub async fn cut_off(&self) {
        self.shared.cut.cancelled().await
    }
}

/// Starts watches; holds the caps.
pub struct WatchService {
    policy: Arc<PathPolicy>,
    streams: Arc<Semaphore>,
    max_watches: usize,
    budget: Arc<DirBudget>,
    queue_bytes: usize,
    stall: Duration,
}

/// What to watch.
pub struct WatchRequest<'a> {
    pub path: &'a str,
    pub recursive: bool,
    pub ignore: IgnoreSet,
}

impl WatchService {
    pub fn new(
        policy: Arc<PathPolicy>,
        max_watches: usize,
        max_dirs: usize,
        queue_bytes: usize,
        stall: Duration,
    ) -> Self {
        WatchService {
            policy,
            streams: Arc::new(Semaphore::new(max_watches)),
            max_watches,
            budget: Arc::new(DirBudget {
                used: AtomicUsize::new(0),
                limit: max_dirs,
            }),
            queue_bytes,
            stall,
        }
    }

    /// Starts a watch: answers once every kernel watch of the tree is installed (the stream's
    /// first item is then [`WatchItem::Ready`]), or with why it cannot be.
    pub async fn watch(&self, req: WatchRequest<'_>) -> Result<WatchStream, WatchError> {
        let root = self.policy.resolve(req.path)?;
        let permit: OwnedSemaphorePermit =
            self.streams
                .clone()
                .try_acquire_owned()
                .map_err(|_| WatchError::Busy {
                    limit: self.max_watches,
                })?;
        let (stop_r, stop_w) = nix::unistd::pipe2(OFlag::O_CLOEXEC | OFlag::O_NONBLOCK)
            .map_err(|e| WatchError::Internal(e.into()))?;
        let shared = Arc::new(Shared::new(self.queue_bytes, self.stall));
        let stream = WatchStream {
            shared: shared.clone(),
            _stop: stop_w,
            root: root.abs.to_string_lossy().into_owned(),
            recursive: req.recursive,
        };
        let (tx, rx) = tokio::sync::oneshot::channel();
        let plan = feed::Plan {
            policy: self.policy.clone(),
            root,
            recursive: req.recursive,
            ignore: req.ignore,
            shared,
            stop: stop_r,
            budget: self.budget.clone(),
        };
        std::thread::Builder::new()
            .name("fs-watch".into())
            .stack_size(256 * 1024)
            .spawn(move || feed::run(plan, tx, permit))
            .map_err(WatchError::Internal)?;
        match rx.await {
            Ok(Ok(())) => Ok(stream),
            Ok(Err(e)) => Err(e),
            Err(_) => Err(WatchError::Internal(io::Error::other(
                "the watch thread ended before it was ready",
            ))),
        }
    }
}
