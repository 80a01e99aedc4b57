//! The supervisor's blocking work (starting a child, the steps of a stop), bounded and shared, so
//! that a burst of starts or stops (a client starting or deleting a thousand instances at once)
//! does not need a blocking-pool thread each.
//!
//! Each start and each step of a stop used to be a task of its own on tokio's blocking pool, which
//! grows to 512 threads: 32 concurrent starts kept ~35 threads busy, and a thousand stops at once
//! (each asking every 10 ms which members of its process group are still alive: a read of its
//! cgroup's `cgroup.procs`, or without cgroups a scan of all of `/proc`) grew the pool to more
//! than a hundred. Each of those threads had its own glibc thread cache and (before the daemon
//! capped glibc's arenas) its own arena, and what the instances allocated there and later freed
//! stayed scattered over pages the allocator cannot give back (measured in docs/performance.md,
//! "Density"). Here:
//! - starts run on a lane of at most `MAX_THREADS` threads of their own (`supervisor-start`) and
//!   the blocking steps of stops (the asks, a signal to members found by a scan, the removal of
//!   an emptied cgroup) on another (`supervisor-stop`), so a burst of starts or of stops uses at
//!   most that many threads, whatever its size, and the same threads from one burst to the next.
//!   Stops have their own lane so that starts that hang (an exec on a dead network filesystem)
//!   never hold up the stops that free resources. A lane's thread is started when work finds
//!   every thread busy and ends after `IDLE` without work; what comes while all are busy waits in
//!   the lane's queue, in order. (On tokio's blocking pool, with a semaphore in front, a burst
//!   still added threads: one that had just finished a step was not yet idle when the next was
//!   queued, and the pool then started another.)
//! - without cgroups, the stops that wait at the same time share one `/proc` scan: a stop takes
//!   the answer of a scan that started after it asked, or starts one itself. One scan answers
//!   every waiting stop, instead of one scan of every process per stop.
//!
//! No work on a lane waits for other work on a lane or for anything but its own system calls (a
//! fork and exec, a scan, an `rmdir` with its retries), so the lanes cannot deadlock; work behind
//! `MAX_THREADS` others of its kind waits for one of those to finish.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Condvar};
use std::time::{Duration, Instant};

use tokio::sync::{Mutex, oneshot};

use super::stats;

/// At most this many threads start children at once, and at most this many do the steps of
/// stops (docs/limits.md).
pub const MAX_THREADS: usize = 4;

/// A lane's thread with nothing to do for this long ends.
const IDLE: Duration = Duration::from_secs(10);

/// The live (not zombie) processes of every process group, from one `/proc` scan.
type Groups = HashMap<i32, Vec<i32>>;

struct Scan {
    started: Instant,
    groups: Groups,
}

/// Shared by a supervisor and every handle it gives out.
pub struct Blocking {
    starts: Arc<Lane>,
    stops: Arc<Lane>,
    /// The latest `/proc` scan; its lock is held while one runs, so callers queue behind it.
    scan: Mutex<Option<Scan>>,
}

impl Default for Blocking {
    fn default() -> Self {
        Blocking {
            starts: Lane::new("supervisor-start"),
            stops: Lane::new("supervisor-stop"),
            scan: Mutex::new(None),
        }
    }
}

impl Blocking {
    /// Runs the start `f` on the starts' lane; as `Lane::run`.
    pub async fn start<T: Send + 'static>(
        &self,
        f: impl FnOnce() -> T + Send + 'static,
    ) -> Option<T> {
        self.starts.run(f).await
    }

    /// Runs the step of a stop `f` on the stops' lane; as `Lane::run`.
    pub async fn stop_step<T: Send + 'static>(
        &self,
        f: impl FnOnce() -> T + Send + 'static,
    ) -> Option<T> {
        self.stops.run(f).await
    }

    /// The live members of process group `pgid`, as found by a `/proc` scan that started after
    /// this call: the scan of another stop when one started since, else a new one. `None` when
    /// the scan panicked.
    pub async fn group_members(&self, pgid: i32) -> Option<Vec<i32>> {
        let asked = Instant::now();
        let mut latest = self.scan.lock().await;
        if let Some(s) = latest.as_ref().filter(|s| s.started >= asked) {
            return Some(s.groups.get(&pgid).cloned().unwrap_or_default());
        }
        let started = Instant::now();
        let groups = self.stop_step(|| stats::every_group(false)).await?;
        let members = groups.get(&pgid).cloned().unwrap_or_default();
        *latest = Some(Scan { started, groups });
        Some(members)
    }
}

type Job = Box<dyn FnOnce() + Send>;

/// Up to `MAX_THREADS` threads of one name and the queue of work they take, oldest first.
struct Lane {
    name: &'static str,
    state: std::sync::Mutex<LaneState>,
    work: Condvar,
}

#[derive(Default)]
struct LaneState {
    queue: VecDeque<Job>,
    threads: usize,
    idle: usize,
}

impl Lane {
    fn new(name: &'static str) -> Arc<Lane> {
        Arc::new(Lane {
            name,
            state: std::sync::Mutex::default(),
            work: Condvar::new(),
        })
    }

    /// Runs `f` on one of this lane's threads, inside the caller's runtime (so that it may
    /// spawn a child with `tokio::process` or a task), and returns its value; `None` if it
    /// panicked (the hook logs it) or no thread could be started. Cancel-safe: work whose caller
    /// went away before a thread took it is not run, and a value whose caller went away while
    /// it ran is dropped on the lane's thread.
    async fn run<T: Send + 'static>(
        self: &Arc<Self>,
        f: impl FnOnce() -> T + Send + 'static,
    ) -> Option<T> {
        let (tx, rx) = oneshot::channel();
        let runtime = tokio::runtime::Handle::current();
        self.push(Box::new(move || {
            if tx.is_closed() {
                return;
            }
            let _in_runtime = runtime.enter();
            let _ = tx.send(f());
        }))?;
        rx.await.ok()
    }

    /// Queues `job` and wakes an idle thread; starts one more while fewer than `MAX_THREADS` run
    /// and the queue holds more work than there are idle threads to take it. `None` when no
    /// thread runs and none can be started (the job is dropped unrun).
    fn push(self: &Arc<Self>, job: Job) -> Option<()> {
        let mut st = crate::sys::lock(&self.state);
        st.queue.push_back(job);
        if st.idle > 0 {
            self.work.notify_one();
        }
        if st.queue.len() <= st.idle || st.threads >= MAX_THREADS {
            return Some(());
        }
        let lane = self.clone();
        match std::thread::Builder::new()
            .name(self.name.into())
            .spawn(move || lane.serve())
        {
            Ok(_) => {
                st.threads += 1;
                Some(())
            }
            Err(e) if st.threads == 0 => {
                st.queue.clear();
                tracing::error!(lane = self.name, error = %e, "cannot start a supervisor thread");
                None
            }
            // The running threads take it in turn.
            Err(_) => Some(()),
        }
    }

    /// A lane thread: takes work until there has been none for `IDLE`.
    fn serve(&self) {
        let mut st = crate::sys::lock(&self.state);
        loop {
            if let Some(job) = st.queue.pop_front() {
                drop(st);
                // A panic is logged by the hook; the thread goes on with the next job.
                let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(job));
                st = crate::sys::lock(&self.state);
                continue;
            }
            st.idle += 1;
            let (next, waited) = self
                .work
                .wait_timeout(st, IDLE)
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            st = next;
            st.idle -= 1;
            if waited.timed_out() && st.queue.is_empty() {
                st.threads -= 1;
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_burst_runs_at_most_max_threads_closures_of_a_kind_at_once() {
        let b = Arc::new(Blocking::default());
        // [starts, steps of stops]: running now, most at once.
        let now: Arc<[AtomicUsize; 2]> = Arc::default();
        let most: Arc<[AtomicUsize; 2]> = Arc::default();
        let tasks: Vec<_> = (0..64)
            .map(|i| {
                let (b, now, most) = (b.clone(), now.clone(), most.clone());
                tokio::spawn(async move {
                    let kind = i % 2;
                    let step = move || {
                        let n = now[kind].fetch_add(1, Ordering::SeqCst) + 1;
                        most[kind].fetch_max(n, Ordering::SeqCst);
                        // Long enough that the burst piles up behind the lane's threads.
                        std::thread::sleep(std::time::Duration::from_millis(5));
                        now[kind].fetch_sub(1, Ordering::SeqCst);
                        i
                    };
                    if kind == 0 {
                        b.start(step).await
                    } else {
                        b.stop_step(step).await
                    }
                })
            })
            .collect();
        for (i, t) in tasks.into_iter().enumerate() {
            assert_eq!(t.await.unwrap(), Some(i), "every closure ran, once");
        }
        for (kind, most) in ["starts", "steps of stops"].iter().zip(most.iter()) {
            let most = most.load(Ordering::SeqCst);
            assert!(most <= MAX_THREADS, "{most} {kind} ran at once");
            assert!(most > 1, "the {kind} ran in parallel ({most} at once)");
        }
    }

    #[tokio::test]
    async fn a_panicking_step_leaves_its_lane_working() {
        let b = Blocking::default();
        for _ in 0..MAX_THREADS + 1 {
            assert_eq!(
                b.stop_step(|| -> u8 { panic!("a step that fails") }).await,
                None
            );
            assert_eq!(
                b.start(|| -> u8 { panic!("a start that fails") }).await,
                None
            );
        }
        assert_eq!(b.stop_step(|| 7).await, Some(7));
        assert_eq!(b.start(|| 8).await, Some(8));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_lane_runs_on_at_most_max_threads_threads_of_its_name_and_skips_abandoned_work() {
        let b = Arc::new(Blocking::default());
        let names = Arc::new(std::sync::Mutex::new(HashMap::new()));
        let tasks: Vec<_> = (0..40)
            .map(|_| {
                let (b, names) = (b.clone(), names.clone());
                tokio::spawn(async move {
                    b.stop_step(move || {
                        let t = std::thread::current();
                        names
                            .lock()
                            .unwrap()
                            .insert(t.id(), t.name().map(str::to_string));
                        std::thread::sleep(Duration::from_millis(2));
                    })
                    .await
                })
            })
            .collect();
        for t in tasks {
            assert_eq!(t.await.unwrap(), Some(()));
        }
        let names = std::mem::take(&mut *names.lock().unwrap());
        assert!(names.len() <= MAX_THREADS, "{} threads", names.len());
        assert!(
            names
                .values()
                .all(|n| n.as_deref() == Some("supervisor-stop")),
            "{names:?}"
        );
        // A start whose caller went away while the lane was busy never runs.
        let ran = Arc::new(AtomicUsize::new(0));
        let busy: Vec<_> = (0..MAX_THREADS)
            .map(|_| {
                let b = b.clone();
                tokio::spawn(async move {
                    b.start(|| std::thread::sleep(Duration::from_millis(200)))
                        .await
                })
            })
            .collect();
        tokio::time::sleep(Duration::from_millis(50)).await;
        let counted = ran.clone();
        let abandoned = tokio::time::timeout(
            Duration::from_millis(10),
            b.start(move || counted.fetch_add(1, Ordering::SeqCst)),
        )
        .await;
        assert!(abandoned.is_err(), "the lane was busy");
        for t in busy {
            assert_eq!(t.await.unwrap(), Some(()));
        }
        let counted = ran.clone();
        assert_eq!(
            b.start(move || counted.fetch_add(1, Ordering::SeqCst))
                .await,
            Some(0),
            "the abandoned start did not run"
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_shared_scan_finds_the_live_members_of_a_group_and_not_the_dead_ones() {
        use std::os::unix::process::CommandExt;
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .process_group(0)
            .spawn()
            .expect("sleep");
        let pgid = child.id() as i32;
        let b = Arc::new(Blocking::default());
        let asks: Vec<_> = (0..16)
            .map(|_| {
                let b = b.clone();
                tokio::spawn(async move { b.group_members(pgid).await })
            })
            .collect();
        for a in asks {
            assert_eq!(a.await.unwrap(), Some(vec![pgid]));
        }
        child.kill().expect("kill");
        // A zombie (killed, not reaped yet) is not a live member; nor is a reaped process.
        let mut members = b.group_members(pgid).await;
        for _ in 0..500 {
            if members == Some(vec![]) {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
            members = b.group_members(pgid).await;
        }
        assert_eq!(members, Some(vec![]));
        assert!(
            std::fs::read_to_string(format!("/proc/{pgid}/stat")).is_ok(),
            "still unreaped: a zombie"
        );
        child.wait().expect("reap");
        assert_eq!(b.group_members(pgid).await, Some(vec![]));
    }
}
