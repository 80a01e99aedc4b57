//! A burst of DELETEs stops every agent with a handful of blocking threads: the daemon's thread
//! count (`Threads:` in /proc/<daemon>/status, read every 2 ms) grows by no more than a fixed
//! number over what it had with the agents idle (the stops' 4 blocking threads, docs/limits.md,
//! and a margin that does not grow with the number of agents), and everything is gone afterwards (processes, zombies, cgroups, descriptors, the listing).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use serde_json::json;

use crate::support::{Daemon, children_of, eventually, pid_alive, zombies_among};

/// Agents started, then deleted at once: enough that a thread per stop would be seen.
const AGENTS: usize = 300;
/// The stops' own threads (`supervisor::blocking::MAX_THREADS`), what may run on tokio's blocking
/// pool beside them during a delete (the debounced heap trim, the process-figures sampler) and
/// one more for either of those handed to a new pool thread while the last is not yet idle. Not
/// per agent: the build before the bound grew by 14–29 threads for 200 or 300 agents, and the
/// bound on tokio's pool, before the stops had threads of their own, by up to 9. (The warm-spawn
/// pool is off: its refills after the last starts would run beside the deletes too.)
const ALLOWED_GROWTH: u64 = 4 + 2 + 2;

fn threads(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("Threads:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0)
}

/// The cgroup directories of `pid` that are not the daemon's own (v1: one per controller line),
/// as paths under /sys/fs/cgroup: an agent's own groups. Empty where agents get no cgroup.
fn own_cgroups(pid: u32, daemon: u32) -> Vec<std::path::PathBuf> {
    let read = |p: u32| std::fs::read_to_string(format!("/proc/{p}/cgroup")).unwrap_or_default();
    let daemon_lines = read(daemon);
    read(pid)
        .lines()
        .filter(|l| !daemon_lines.lines().any(|d| d == *l))
        .filter_map(|l| {
            let mut f = l.splitn(3, ':');
            let (_, controllers, path) = (f.next()?, f.next()?, f.next()?);
            let dir = if controllers.is_empty() {
                "unified".to_string()
            } else {
                controllers.trim_start_matches("name=").to_string()
            };
            let full = std::path::Path::new("/sys/fs/cgroup")
                .join(dir)
                .join(path.trim_start_matches('/'));
            full.is_dir().then_some(full)
        })
        .collect()
}

/// Runs `each` over `items` with `width` at a time.
async fn in_parallel<F, Fut>(items: Vec<String>, width: usize, each: F)
where
    F: Fn(String) -> Fut + Clone + Send + 'static,
    Fut: std::future::Future<Output = ()> + Send,
{
    let queue = Arc::new(std::sync::Mutex::new(items));
    let mut tasks = Vec::new();
    for _ in 0..width {
        let (queue, each) = (queue.clone(), each.clone());
        tasks.push(tokio::spawn(async move {
            loop {
                let Some(item) = queue.lock().unwrap().pop() else {
                    return;
                };
                each(item).await;
            }
        }));
    }
    for t in tasks {
        t.await.expect("worker");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_burst_of_deletes_stops_every_agent_on_a_bounded_number_of_threads() {
    let d = Daemon::builder()
        .args([
            "--max-agents",
            &(AGENTS + 10).to_string(),
            "--warm-spawns",
            "0",
        ])
        .start();
    let pid = d.pid();
    let fds_before = crate::support::open_fds_but_sockets(pid);
    let ids: Vec<String> = (0..AGENTS).map(|i| format!("burst-{i:03}")).collect();
    let (client, base) = (d.client(), d.url("/v1/acp"));
    in_parallel(ids.clone(), 4, move |id| {
        let (client, url) = (client.clone(), format!("{base}/{id}?agent=mock"));
        async move {
            let r = client
                .post(url)
                .json(&json!({"jsonrpc": "2.0", "id": 1, "method": "initialize",
                    "params": {"protocolVersion": 1}}))
                .send()
                .await
                .expect("POST reaches the daemon");
            assert_eq!(r.status(), 200, "{id}");
        }
    })
    .await;
    // The agents' top processes, as listed (the daemon's other children, warm-spawn stubs, are
    // not agents).
    let agents: Vec<u32> = d
        .servers()
        .await
        .iter()
        .filter_map(|s| s["pid"].as_u64())
        .map(|p| p as u32)
        .collect();
    assert_eq!(agents.len(), AGENTS, "every agent listed with its pid");
    let kids = children_of(pid);
    assert!(
        agents.iter().all(|p| kids.contains(p)),
        "the agents are the daemon's children"
    );
    let groups: Vec<std::path::PathBuf> =
        agents.iter().flat_map(|a| own_cgroups(*a, pid)).collect();
    // The agents idle, and so do the blocking threads their starts used (they would be reused).
    let idle = threads(pid);

    let peak = Arc::new(AtomicU64::new(0));
    let done = Arc::new(AtomicBool::new(false));
    let sampler = {
        let (peak, done) = (peak.clone(), done.clone());
        std::thread::spawn(move || {
            while !done.load(Ordering::Relaxed) {
                peak.fetch_max(threads(pid), Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(2));
            }
        })
    };
    let (client, base) = (d.client(), d.url("/v1/acp"));
    in_parallel(ids, 32, move |id| {
        let (client, url) = (client.clone(), format!("{base}/{id}"));
        async move {
            let r = client.delete(url).send().await.expect("DELETE");
            assert_eq!(r.status(), 204, "{id}");
        }
    })
    .await;
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let left: Vec<u32> = agents
            .iter()
            .copied()
            .filter(|p| pid_alive(*p) || !zombies_among(&[*p]).is_empty())
            .collect();
        if left.is_empty() {
            break;
        }
        if std::time::Instant::now() > deadline {
            let what: Vec<String> = left
                .iter()
                .map(|p| {
                    let stat =
                        std::fs::read_to_string(format!("/proc/{p}/stat")).unwrap_or_default();
                    let cmd = std::fs::read(format!("/proc/{p}/cmdline")).unwrap_or_default();
                    format!(
                        "{stat} [{}]",
                        String::from_utf8_lossy(&cmd).replace('\0', " ")
                    )
                })
                .collect();
            panic!(
                "{} agents left after the deletes: {what:#?}\nlisting: {:?}",
                left.len(),
                d.servers().await
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    // What the stops do after the last reap (the cgroup removals, the trim) is sampled too.
    std::thread::sleep(Duration::from_millis(500));
    done.store(true, Ordering::Relaxed);
    sampler.join().expect("sampler");
    let peak = peak.load(Ordering::Relaxed);
    eprintln!("daemon threads: {idle} with the agents idle, at most {peak} during the deletes");
    assert!(
        peak <= idle + ALLOWED_GROWTH,
        "the delete burst grew the daemon from {idle} to {peak} threads (allowed: +{ALLOWED_GROWTH})"
    );

    assert!(d.servers().await.is_empty(), "the listing is empty");
    let left: Vec<u32> = children_of(pid)
        .into_iter()
        .filter(|c| agents.contains(c))
        .collect();
    assert!(left.is_empty(), "agents left as children: {left:?}");
    // Where agents had cgroups (v1 here, as root: 3 directories each), every one is removed.
    eventually(
        Duration::from_secs(30),
        "every agent cgroup removed",
        || groups.iter().all(|g| !g.exists()).then_some(()),
    );
    eventually(Duration::from_secs(10), "the descriptors back", || {
        (crate::support::open_fds_but_sockets(pid) <= fds_before).then_some(())
    });
}
