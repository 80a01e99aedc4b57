//! The supervisor's blocking work (starting a child, the steps of a stop), bounded and shared, so
//! that a burst of starts or stops (a client starting or deleting a thousand instances at once)
//! does not need a blocking-pool thread each.
//!
//! Each start and each step of a stop used to be a task of its own on tokio's blocking pool, which
//! grows to 512 threads: 32 concurrent starts kept ~35 threads busy, and a thousand stops at once
//! (each asking every 10 ms which members of its process group are still alive: a read of its
//! cgroup's `cgroup.procs`, or without cgroups a scan of all of `/proc`) grew the pool to more
//! than a hundred. Each of those threads has its own glibc thread cache and, up to 8 per core,
//! its own arena, and what the instances allocated there and later freed stays scattered over
//! pages the allocator cannot give back (measured in docs/performance.md, "Density"). Here:
//! - every start runs with one of `MAX_THREADS` start permits and every blocking step of a stop
//!   (the asks, a signal to members found by a scan, the removal of an emptied cgroup) with one of
//!   `MAX_THREADS` stop permits, so a burst of starts or of stops uses at most that many blocking
//!   threads at once, whatever its size. Stops have their own permits so that starts that hang
//!   (an exec on a dead network filesystem) never hold up the stops that free resources;
//! - without cgroups, the stops that wait at the same time share one `/proc` scan: a stop takes
//!   the answer of a scan that started after it asked, or starts one itself. One scan answers
//!   every waiting stop, instead of one scan of every process per stop.
//!
//! No holder of a permit waits for another permit or for anything but its own system calls (a
//! fork and exec, a scan, an `rmdir` with its retries), so the permits cannot deadlock; a start or
//! step behind `MAX_THREADS` others of its kind waits for one of those to finish.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use tokio::sync::{Mutex, Semaphore};

use super::stats;

/// At most this many blocking-pool threads start children at once, and at most this many do the
/// steps of stops (docs/limits.md).
pub const MAX_THREADS: usize = 4;

/// The live (not zombie) processes of every process group, from one `/proc` scan.
type Groups = HashMap<i32, Vec<i32>>;

struct Scan {
    started: Instant,
    groups: Groups,
}

/// Shared by a supervisor and every handle it gives out.
pub struct Blocking {
    starts: Arc<Semaphore>,
    stops: Arc<Semaphore>,
    /// The latest `/proc` scan; its lock is held while one runs, so callers queue behind it.
    scan: Mutex<Option<Scan>>,
}

impl Default for Blocking {
    fn default() -> Self {
        Blocking {
            starts: Arc::new(Semaphore::new(MAX_THREADS)),
            stops: Arc::new(Semaphore::new(MAX_THREADS)),
            scan: Mutex::new(None),
        }
    }
}

impl Blocking {
    /// Runs the start `f` on the blocking pool once a start permit is free; as `run_on`.
    pub async fn start<T: Send + 'static>(
        &self,
        f: impl FnOnce() -> T + Send + 'static,
    ) -> Option<T> {
        run_on(&self.starts, f).await
    }

    /// Runs the step of a stop `f` on the blocking pool once a stop permit is free; as `run_on`.
    pub async fn stop_step<T: Send + 'static>(
        &self,
        f: impl FnOnce() -> T + Send + 'static,
    ) -> Option<T> {
        run_on(&self.stops, f).await
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

/// Runs `f` on the blocking pool once one of `permits` is free, and returns its value; `None` if
/// it panicked (the hook logs it). The permit goes with `f` and comes back with its value: a
/// caller that stops waiting does not free it before `f` is done (it is dropped with the value),
/// and one that waits frees it only once the value is back, when the thread that ran `f` is
/// (nearly always) idle again, so that the next step reuses that thread rather than starting one.
async fn run_on<T: Send + 'static>(
    permits: &Arc<Semaphore>,
    f: impl FnOnce() -> T + Send + 'static,
) -> Option<T> {
    let permit = permits.clone().acquire_owned().await.ok()?;
    let (value, permit) = tokio::task::spawn_blocking(move || (f(), permit))
        .await
        .ok()?;
    drop(permit);
    Some(value)
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
                        // Long enough that the burst piles up behind the permits.
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
    async fn a_panicking_step_gives_its_permit_back() {
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
