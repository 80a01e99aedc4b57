//! `GET /v1/fs/watch` through the real binary: what changes is reported with the right kinds and
//! absolute paths, new directories are followed and their contents reported once, nothing is lost
//! silently (all 30,000 files, or an `overflow`), a reader that does not read is cut off with the
//! daemon's memory flat, the path rules, the caps and limits, and closed streams give their kernel
//! watches back.

use std::collections::{HashMap, HashSet};
use std::io::{Read, Write};
use std::path::Path;
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use serde_json::Value;

use crate::support::{Daemon, skip};

/// One SSE event: name, id, data as JSON.
#[derive(Debug, Clone)]
struct Event {
    event: String,
    id: Option<u64>,
    data: Value,
}

/// An open watch stream, parsed event by event.
struct Feed {
    body: std::pin::Pin<Box<dyn futures_util::Stream<Item = reqwest::Result<bytes::Bytes>> + Send>>,
    buf: String,
    ended: bool,
}

impl Feed {
    /// Opens a watch; panics unless it is answered 200 with `event: ready` first.
    async fn open(d: &Daemon, query: &str) -> Feed {
        let r = d
            .client()
            .get(d.url(&format!("/v1/fs/watch?{query}")))
            .header("accept", "text/event-stream")
            .send()
            .await
            .unwrap();
        assert_eq!(
            r.status(),
            200,
            "{query}: {}",
            r.text().await.unwrap_or_default()
        );
        assert_eq!(r.headers()["content-type"], "text/event-stream");
        let mut feed = Feed {
            body: Box::pin(r.bytes_stream()),
            buf: String::new(),
            ended: false,
        };
        let ready = feed.next(Duration::from_secs(10)).await.expect("ready");
        assert_eq!(ready.event, "ready", "{ready:?}");
        assert_eq!(ready.id, None);
        feed
    }

    /// The next event within `wait`; `None` at the end of the stream or when nothing came.
    async fn next(&mut self, wait: Duration) -> Option<Event> {
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            while let Some(end) = self.buf.find("\n\n") {
                let block: String = self.buf.drain(..end + 2).collect();
                let mut ev = Event {
                    event: String::new(),
                    id: None,
                    data: Value::Null,
                };
                let mut comment = true;
                for line in block.lines() {
                    if let Some(v) = line.strip_prefix("event: ") {
                        ev.event = v.to_string();
                        comment = false;
                    } else if let Some(v) = line.strip_prefix("id: ") {
                        ev.id = Some(v.parse().unwrap());
                    } else if let Some(v) = line.strip_prefix("data: ") {
                        ev.data = serde_json::from_str(v).unwrap();
                    }
                }
                if !comment {
                    return Some(ev);
                }
            }
            if self.ended {
                return None;
            }
            match tokio::time::timeout_at(deadline, self.body.next()).await {
                Err(_) => return None,
                Ok(None) | Ok(Some(Err(_))) => self.ended = true,
                Ok(Some(Ok(b))) => self.buf.push_str(std::str::from_utf8(&b).unwrap()),
            }
        }
    }

    /// Events until `done` says so (it sees every change), or panics after `wait`.
    async fn until(
        &mut self,
        wait: Duration,
        mut done: impl FnMut(&[Event]) -> bool,
    ) -> Vec<Event> {
        let deadline = Instant::now() + wait;
        let mut seen = Vec::new();
        loop {
            if done(&seen) {
                return seen;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            match self.next(left).await {
                Some(ev) => seen.push(ev),
                None => panic!("stream ended or stalled; seen so far: {seen:#?}"),
            }
        }
    }
}

fn change(ev: &Event) -> Option<(&str, &str, &str)> {
    (ev.event == "change").then(|| {
        (
            ev.data["kind"].as_str().unwrap(),
            ev.data["path"].as_str().unwrap(),
            ev.data["entryType"].as_str().unwrap(),
        )
    })
}

fn has(seen: &[Event], kind: &str, path: &Path, entry: &str) -> bool {
    let p = path.to_str().unwrap();
    seen.iter()
        .filter_map(change)
        .any(|(k, pp, e)| k == kind && pp == p && e == entry)
}

/// The kernel watches the process holds (one `inotify wd:` line per watch in its fdinfo).
fn kernel_watches(pid: u32) -> usize {
    let mut n = 0;
    if let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fdinfo")) {
        for f in fds.flatten() {
            if let Ok(s) = std::fs::read_to_string(f.path()) {
                n += s.lines().filter(|l| l.starts_with("inotify wd:")).count();
            }
        }
    }
    n
}

/// Waits (without starving the runtime, which drives the client's connections) until the
/// daemon holds `n` kernel watches.
async fn wait_watches(pid: u32, n: usize, what: &str) {
    crate::support::eventually_async(Duration::from_secs(10), what, || async move {
        (kernel_watches(pid) == n).then_some(())
    })
    .await
}

fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap()
}

fn q(p: &Path) -> String {
    // Test paths are plain ASCII without reserved characters.
    p.to_str().unwrap().to_string()
}

#[tokio::test]
async fn watch_reports_creates_modifies_renames_and_removes_with_absolute_paths() {
    let d = Daemon::start();
    let w = d.work_dir();
    std::fs::create_dir(w.join("old-dir")).unwrap();
    // Relative to --work-dir.
    let mut feed = Feed::open(&d, "path=.&recursive=true").await;

    std::fs::write(w.join("a.txt"), b"one").unwrap();
    let seen = feed
        .until(Duration::from_secs(10), |s| {
            has(s, "modify", &w.join("a.txt"), "file")
        })
        .await;
    assert!(has(&seen, "create", &w.join("a.txt"), "file"), "{seen:#?}");
    // Ids count from 1 per stream, one per change.
    let ids: Vec<u64> = seen.iter().filter_map(|e| e.id).collect();
    assert_eq!(ids, (1..=ids.len() as u64).collect::<Vec<_>>());

    std::fs::rename(w.join("a.txt"), w.join("b.txt")).unwrap();
    let seen = feed
        .until(Duration::from_secs(10), |s| {
            s.iter().any(|e| e.data["kind"] == "rename")
        })
        .await;
    let rename = seen.iter().find(|e| e.data["kind"] == "rename").unwrap();
    assert_eq!(rename.data["path"], q(&w.join("b.txt")));
    assert_eq!(rename.data["oldPath"], q(&w.join("a.txt")));
    assert_eq!(rename.data["entryType"], "file");

    std::fs::create_dir(w.join("new-dir")).unwrap();
    std::fs::rename(w.join("old-dir"), w.join("moved-dir")).unwrap();
    std::fs::write(w.join("moved-dir/inner"), b"x").unwrap();
    std::fs::remove_file(w.join("b.txt")).unwrap();
    std::fs::remove_dir(w.join("new-dir")).unwrap();
    let seen = feed
        .until(Duration::from_secs(10), |s| {
            has(s, "remove", &w.join("new-dir"), "directory")
                && has(s, "create", &w.join("moved-dir/inner"), "file")
        })
        .await;
    assert!(
        has(&seen, "create", &w.join("new-dir"), "directory"),
        "{seen:#?}"
    );
    assert!(has(&seen, "remove", &w.join("b.txt"), "file"), "{seen:#?}");
    let dir_rename = seen
        .iter()
        .find(|e| e.data["kind"] == "rename")
        .expect("directory rename");
    assert_eq!(dir_rename.data["entryType"], "directory");
    assert_eq!(dir_rename.data["oldPath"], q(&w.join("old-dir")));
    assert_eq!(dir_rename.data["path"], q(&w.join("moved-dir")));
    // A file removed right after its write is reported removed, never modified afterwards.
    let b = q(&w.join("b.txt"));
    let removed_at = seen
        .iter()
        .position(|e| e.data["kind"] == "remove" && e.data["path"] == b)
        .unwrap();
    assert!(
        !seen[removed_at + 1..].iter().any(|e| e.data["path"] == b),
        "{seen:#?}"
    );

    // Moved out of the tree: a remove; moved in: a create (with what it holds).
    let outside = d.dir.path().join("outside");
    std::fs::create_dir_all(outside.join("sub")).unwrap();
    std::fs::write(outside.join("sub/f"), b"x").unwrap();
    std::fs::rename(w.join("moved-dir"), d.dir.path().join("gone-dir")).unwrap();
    std::fs::rename(&outside, w.join("came-in")).unwrap();
    let seen = feed
        .until(Duration::from_secs(10), |s| {
            has(s, "create", &w.join("came-in/sub/f"), "file")
        })
        .await;
    assert!(
        has(&seen, "remove", &w.join("moved-dir"), "directory"),
        "{seen:#?}"
    );
    assert!(
        has(&seen, "create", &w.join("came-in"), "directory"),
        "{seen:#?}"
    );
    assert!(
        has(&seen, "create", &w.join("came-in/sub"), "directory"),
        "{seen:#?}"
    );
    // The directory that left is not watched any more: changes there are not reported.
    std::fs::write(d.dir.path().join("gone-dir/late"), b"x").unwrap();
    std::fs::write(w.join("marker"), b"x").unwrap();
    let seen = feed
        .until(Duration::from_secs(10), |s| {
            has(s, "create", &w.join("marker"), "file")
        })
        .await;
    assert!(
        !seen.iter().any(|e| e.data["path"]
            .as_str()
            .is_some_and(|p| p.ends_with("/late"))),
        "{seen:#?}"
    );
}

#[tokio::test]
async fn a_directory_made_and_filled_at_once_is_reported_whole_and_once() {
    let d = Daemon::start();
    let w = d.work_dir();
    let mut feed = Feed::open(&d, &format!("path={}&recursive=true", q(&w))).await;
    // Made and filled by one process as fast as it can, two levels deep.
    let mut expected: HashSet<String> = HashSet::new();
    for i in 0..20 {
        let a = w.join(format!("tree/a{i}"));
        let b = a.join("b");
        std::fs::create_dir_all(&b).unwrap();
        for j in 0..5 {
            std::fs::write(a.join(format!("f{j}")), b"x").unwrap();
            std::fs::write(b.join(format!("g{j}")), b"x").unwrap();
            expected.insert(q(&a.join(format!("f{j}"))));
            expected.insert(q(&b.join(format!("g{j}"))));
        }
        expected.insert(q(&a));
        expected.insert(q(&b));
    }
    expected.insert(q(&w.join("tree")));
    let seen = feed
        .until(Duration::from_secs(30), |s| {
            let created: HashSet<&str> = s
                .iter()
                .filter_map(change)
                .filter(|c| c.0 == "create")
                .map(|c| c.1)
                .collect();
            expected.iter().all(|p| created.contains(p.as_str()))
        })
        .await;
    // Let any duplicate arrive before counting.
    std::fs::write(w.join("marker"), b"x").unwrap();
    let mut seen = seen;
    seen.extend(
        feed.until(Duration::from_secs(10), |s| {
            has(s, "create", &w.join("marker"), "file")
        })
        .await,
    );
    let mut creates: HashMap<&str, usize> = HashMap::new();
    for c in seen.iter().filter_map(change).filter(|c| c.0 == "create") {
        *creates.entry(c.1).or_default() += 1;
    }
    for p in &expected {
        assert_eq!(
            creates.get(p.as_str()),
            Some(&1),
            "{p} reported {:?} times",
            creates.get(p.as_str())
        );
    }
    assert!(!seen.iter().any(|e| e.event == "overflow"), "{seen:#?}");
}

#[tokio::test]
async fn a_non_recursive_watch_does_not_report_grandchildren() {
    let d = Daemon::start();
    let w = d.work_dir();
    std::fs::create_dir(w.join("sub")).unwrap();
    let mut feed = Feed::open(&d, "path=.").await;
    std::fs::write(w.join("sub/grandchild"), b"x").unwrap();
    std::fs::create_dir(w.join("sub/deeper")).unwrap();
    std::fs::write(w.join("child"), b"x").unwrap();
    let seen = feed
        .until(Duration::from_secs(10), |s| {
            has(s, "create", &w.join("child"), "file")
        })
        .await;
    // Give a wrongly reported grandchild time to arrive, with a marker to wait for.
    std::fs::write(w.join("child2"), b"x").unwrap();
    let mut seen = seen;
    seen.extend(
        feed.until(Duration::from_secs(10), |s| {
            has(s, "create", &w.join("child2"), "file")
        })
        .await,
    );
    assert!(
        !seen
            .iter()
            .any(|e| e.data["path"].as_str().is_some_and(|p| p.contains("/sub/"))),
        "{seen:#?}"
    );
    // The child directory itself is an entry of the watched directory.
    std::fs::remove_dir_all(w.join("sub")).unwrap();
    feed.until(Duration::from_secs(10), |s| {
        has(s, "remove", &w.join("sub"), "directory")
    })
    .await;
}

#[tokio::test]
async fn thirty_thousand_files_are_all_reported_or_an_overflow_says_so() {
    let d = Daemon::start();
    let w = d.work_dir();
    std::fs::create_dir(w.join("many")).unwrap();
    let mut feed = Feed::open(&d, "path=many&recursive=true").await;
    let dir = w.join("many");
    let writer = std::thread::spawn(move || {
        for i in 0..30_000 {
            std::fs::File::create(dir.join(format!("f{i:05}"))).unwrap();
        }
    });
    let mut created = HashSet::new();
    let mut overflow = false;
    let deadline = Instant::now() + Duration::from_secs(120);
    while created.len() < 30_000 && !overflow {
        let left = deadline.saturating_duration_since(Instant::now());
        let ev = feed
            .next(left)
            .await
            .expect("the feed went quiet before every file or an overflow");
        match ev.event.as_str() {
            "overflow" => overflow = true,
            "change" if ev.data["kind"] == "create" => {
                assert!(
                    created.insert(ev.data["path"].as_str().unwrap().to_string()),
                    "twice: {ev:?}"
                );
            }
            _ => {}
        }
    }
    writer.join().unwrap();
    if !overflow {
        for i in 0..30_000 {
            assert!(
                created.contains(&q(&w.join(format!("many/f{i:05}")))),
                "f{i:05} missing"
            );
        }
    }
    // After an overflow (or all of them) the feed goes on.
    std::fs::write(w.join("many/after"), b"x").unwrap();
    feed.until(Duration::from_secs(60), |s| {
        has(s, "create", &w.join("many/after"), "file")
    })
    .await;
    eprintln!(
        "30,000 files: {} reported, overflow: {overflow}",
        created.len()
    );
}

/// A raw HTTP/1.1 SSE request on a socket with a small receive buffer that the test then stops
/// reading.
fn raw_stream(d: &Daemon, query: &str) -> std::net::TcpStream {
    use nix::sys::socket::{setsockopt, sockopt::RcvBuf};
    let addr: std::net::SocketAddr = d.addr.parse().unwrap();
    let mut sock = std::net::TcpStream::connect(addr).unwrap();
    setsockopt(&sock, RcvBuf, &4096).unwrap();
    write!(
        sock,
        "GET /v1/fs/watch?{query} HTTP/1.1\r\nHost: 127.0.0.1\r\nAccept: text/event-stream\r\n\r\n"
    )
    .unwrap();
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"event: ready") {
        sock.read_exact(&mut byte).unwrap();
        head.push(byte[0]);
        assert!(head.len() < 4096, "{}", String::from_utf8_lossy(&head));
    }
    assert!(
        head.starts_with(b"HTTP/1.1 200"),
        "{}",
        String::from_utf8_lossy(&head)
    );
    sock
}

#[tokio::test]
async fn a_reader_that_does_not_read_is_cut_off_and_the_daemon_memory_stays_flat() {
    let d = Daemon::builder()
        .args(["--watch-queue", "256K", "--transfer-timeout", "3s"])
        .start();
    let w = d.work_dir();
    let pid = d.pid();
    let baseline_watches = kernel_watches(pid);
    let sock = raw_stream(&d, "path=.&recursive=true");
    assert_eq!(kernel_watches(pid), baseline_watches + 1);
    let rss_before = rss_kib(pid);
    // Long names: each create and remove is an event of about 300 bytes.
    let long = "n".repeat(200);
    let dir = w.clone();
    let mut peak = rss_before;
    let mut rounds = 0u64;
    let started = Instant::now();
    loop {
        for i in 0..2_000 {
            let p = dir.join(format!("{long}{i}"));
            std::fs::File::create(&p).unwrap();
            std::fs::remove_file(&p).unwrap();
        }
        rounds += 1;
        peak = peak.max(rss_kib(pid));
        if rounds >= 25 && kernel_watches(pid) == baseline_watches {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(120),
            "the reader was not cut off; watches {}",
            kernel_watches(pid)
        );
    }
    // 40 rounds are 160,000 events of about 300 bytes (some 48 MB of frames) while nobody
    // read; the daemon held a bounded amount of them.
    let grown = peak.saturating_sub(rss_before);
    assert!(
        grown < 24 * 1024,
        "RSS grew by {grown} KiB (from {rss_before} KiB)"
    );
    // What the socket still holds ends: an overflow said events were lost, then the end.
    let mut sock = sock;
    sock.set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let mut rest = Vec::new();
    let _ = sock.read_to_end(&mut rest);
    let text = String::from_utf8_lossy(&rest);
    assert!(text.contains("event: overflow"), "{} bytes", rest.len());
    assert!(
        text.ends_with("0\r\n\r\n"),
        "the stream did not end: …{}",
        &text[text.len().saturating_sub(200)..]
    );
    assert!(d.stderr().contains("cut off"), "{}", d.stderr());
}

#[tokio::test]
async fn watch_follows_the_path_rules_of_the_filesystem_api() {
    let d = Daemon::builder().confine_to_work_dir().start();
    let w = d.work_dir();
    std::fs::write(w.join("file"), b"x").unwrap();
    std::os::unix::fs::symlink("/etc", w.join("escape")).unwrap();
    let c = d.client();
    let status = |query: &'static str| {
        let c = c.clone();
        let url = d.url(&format!("/v1/fs/watch?{query}"));
        async move {
            let r = c.get(url).send().await.unwrap();
            let s = r.status().as_u16();
            let ct = r.headers()["content-type"].to_str().unwrap().to_string();
            let body: Value = r.json().await.unwrap_or(Value::Null);
            (s, ct, body)
        }
    };
    for (query, want) in [
        ("path=/etc", 403),
        ("path=../..", 403),
        ("path=escape", 403),
        ("path=missing", 404),
        ("path=file", 400),
        ("path=", 400),
        ("recursive=true", 400),
        ("path=.&recursive=maybe", 400),
    ] {
        let (s, ct, body) = status(query).await;
        assert_eq!(s, want, "{query}: {body}");
        assert_eq!(ct, "application/problem+json", "{query}");
    }
    // A symlink inside the tree is reported as an entry, never followed out of the root.
    std::fs::create_dir(w.join("sub")).unwrap();
    let mut feed = Feed::open(&d, "path=.&recursive=true").await;
    std::os::unix::fs::symlink("/tmp", w.join("sub/link")).unwrap();
    std::fs::create_dir(w.join("sub/real")).unwrap();
    std::fs::write(w.join("sub/real/f"), b"x").unwrap();
    let seen = feed
        .until(Duration::from_secs(10), |s| {
            has(s, "create", &w.join("sub/real/f"), "file")
        })
        .await;
    assert!(
        has(&seen, "create", &w.join("sub/link"), "file"),
        "{seen:#?}"
    );
    // /tmp itself is not watched: one watch per directory of the tree (., sub, sub/real).
    assert_eq!(kernel_watches(d.pid()), 3);
}

#[tokio::test]
async fn ignored_entries_are_neither_watched_nor_reported() {
    let d = Daemon::start();
    let w = d.work_dir();
    std::fs::create_dir_all(w.join(".git/objects")).unwrap();
    std::fs::create_dir_all(w.join("pkg/node_modules/dep")).unwrap();
    let mut feed = Feed::open(
        &d,
        "path=.&recursive=true&ignore=.git,node_modules&ignore=*.log",
    )
    .await;
    // ., pkg: the ignored trees hold no watch.
    assert_eq!(kernel_watches(d.pid()), 2);
    std::fs::write(w.join(".git/objects/x"), b"x").unwrap();
    std::fs::create_dir(w.join("pkg/node_modules/new")).unwrap();
    std::fs::write(w.join("pkg/build.log"), b"x").unwrap();
    std::fs::create_dir_all(w.join("fresh/node_modules/a")).unwrap();
    std::fs::write(w.join("pkg/kept"), b"x").unwrap();
    let seen = feed
        .until(Duration::from_secs(10), |s| {
            has(s, "create", &w.join("pkg/kept"), "file")
        })
        .await;
    for e in seen.iter().filter_map(change) {
        assert!(
            !(e.1.contains(".git") || e.1.contains("node_modules") || e.1.ends_with(".log")),
            "{e:?}"
        );
    }
    assert!(
        has(&seen, "create", &w.join("fresh"), "directory"),
        "{seen:#?}"
    );
    let (s, body) = {
        let r = d
            .client()
            .get(d.url("/v1/fs/watch?path=.&ignore=a,,b"))
            .header("accept", "text/event-stream")
            .send()
            .await
            .unwrap();
        (
            r.status().as_u16(),
            r.headers().get("content-type").cloned(),
        )
    };
    assert_eq!(s, 200, "{body:?}");
    let many = vec!["x"; 65].join(",");
    let r = d
        .client()
        .get(d.url(&format!("/v1/fs/watch?path=.&ignore={many}")))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
}

#[tokio::test]
async fn watch_streams_are_capped_and_closing_one_frees_its_slot() {
    let d = Daemon::builder().args(["--max-watches", "2"]).start();
    let a = Feed::open(&d, "path=.").await;
    let _b = Feed::open(&d, "path=.&recursive=true").await;
    let r = d
        .client()
        .get(d.url("/v1/fs/watch?path=."))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 503);
    assert_eq!(r.headers()["retry-after"], "1");
    assert_eq!(r.headers()["content-type"], "application/problem+json");
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["limit"], 2, "{body}");
    drop(a);
    let _c = crate::support::eventually_async(Duration::from_secs(10), "a slot freed", || async {
        let r = d
            .client()
            .get(d.url("/v1/fs/watch?path=."))
            .send()
            .await
            .unwrap();
        (r.status() == 200).then_some(r)
    })
    .await;
}

#[tokio::test]
async fn closed_streams_give_back_their_kernel_watches_and_descriptors() {
    let d = Daemon::start();
    let w = d.work_dir();
    for i in 0..50 {
        std::fs::create_dir_all(w.join(format!("d{i}/e"))).unwrap();
    }
    let pid = d.pid();
    // A first stream so that lazily made descriptors (e.g. the runtime's) exist in the baseline.
    drop(Feed::open(&d, "path=.").await);
    wait_watches(pid, 0, "no watch").await;
    let fds = crate::support::open_fds(pid);
    let mut feeds = Vec::new();
    for _ in 0..5 {
        feeds.push(Feed::open(&d, "path=.&recursive=true").await);
    }
    // 101 directories per stream.
    assert_eq!(kernel_watches(pid), 5 * 101);
    assert!(crate::support::open_fds(pid) > fds);
    // A directory made during the stream adds a watch; removing it gives it back.
    std::fs::create_dir(w.join("later")).unwrap();
    let last = feeds.last_mut().unwrap();
    last.until(Duration::from_secs(10), |s| {
        has(s, "create", &w.join("later"), "directory")
    })
    .await;
    wait_watches(pid, 5 * 102, "the new directory watched by all").await;
    std::fs::remove_dir(w.join("later")).unwrap();
    wait_watches(pid, 5 * 101, "its watches given back").await;
    drop(feeds);
    wait_watches(pid, 0, "every watch given back").await;
    crate::support::eventually_async(
        Duration::from_secs(10),
        "every descriptor given back",
        || async move { (crate::support::open_fds(pid) <= fds).then_some(()) },
    )
    .await;
}

#[tokio::test]
async fn the_directory_budget_fails_the_watch_instead_of_watching_half() {
    let d = Daemon::builder().args(["--watch-max-dirs", "5"]).start();
    let w = d.work_dir();
    for i in 0..3 {
        std::fs::create_dir(w.join(format!("d{i}"))).unwrap();
    }
    std::fs::create_dir_all(w.join("big/a/b/c/d/e")).unwrap();
    // The whole tree needs 10 directories: refused, and nothing stays watched.
    let r = d
        .client()
        .get(d.url("/v1/fs/watch?path=.&recursive=true"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 503);
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["setting"], "--watch-max-dirs", "{body}");
    assert_eq!(body["limit"], 5, "{body}");
    assert_eq!(kernel_watches(d.pid()), 0);
    // A tree that fits, then grows beyond the budget: an error event, then the end.
    std::fs::remove_dir_all(w.join("big")).unwrap();
    let mut feed = Feed::open(&d, "path=.&recursive=true").await;
    std::fs::create_dir_all(w.join("grow/a/b")).unwrap();
    let mut seen = Vec::new();
    while let Some(ev) = feed.next(Duration::from_secs(10)).await {
        seen.push(ev);
    }
    let err = seen
        .iter()
        .find(|e| e.event == "error")
        .unwrap_or_else(|| panic!("{seen:#?}"));
    assert_eq!(err.data["status"], 503, "{err:?}");
    assert_eq!(err.data["setting"], "--watch-max-dirs");
    assert!(feed.ended, "the stream goes on after the error: {seen:#?}");
    wait_watches(d.pid(), 0, "watches given back").await;
}

/// The kernel's own limit, for real: the daemon runs in a user namespace whose inotify watch
/// limit (`/proc/sys/user/max_inotify_watches`, per namespace) is 20.
#[tokio::test]
async fn the_kernel_watch_limit_is_a_clear_answer() {
    let probe = std::process::Command::new("unshare")
        .args([
            "--user",
            "--map-root-user",
            "sh",
            "-c",
            "echo 20 > /proc/sys/user/max_inotify_watches",
        ])
        .status();
    if !probe.is_ok_and(|s| s.success()) {
        skip("cannot make a user namespace with its own inotify limit (unshare --user)");
        return;
    }
    let d = Daemon::builder()
        .wrapper([
            "unshare",
            "--user",
            "--map-root-user",
            "sh",
            "-c",
            "echo 20 > /proc/sys/user/max_inotify_watches && exec \"$0\" \"$@\"",
        ])
        .start();
    let w = d.work_dir();
    for i in 0..30 {
        std::fs::create_dir(w.join(format!("d{i}"))).unwrap();
    }
    let r = d
        .client()
        .get(d.url("/v1/fs/watch?path=.&recursive=true"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 503);
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["setting"], "fs.inotify.max_user_watches", "{body}");
    assert!(
        body["detail"].as_str().unwrap().contains("is not watched"),
        "{body}"
    );
    // A smaller tree still can be watched (nothing of the refused one was kept).
    let mut feed = Feed::open(&d, "path=d0&recursive=true").await;
    std::fs::write(w.join("d0/f"), b"x").unwrap();
    feed.until(Duration::from_secs(10), |s| {
        has(s, "create", &w.join("d0/f"), "file")
    })
    .await;
}

#[tokio::test]
async fn the_watched_directory_going_away_ends_the_stream_with_its_remove() {
    let d = Daemon::start();
    let w = d.work_dir();
    std::fs::create_dir_all(w.join("root/sub")).unwrap();
    let mut feed = Feed::open(&d, "path=root&recursive=true").await;
    std::fs::remove_dir_all(w.join("root")).unwrap();
    let mut seen = Vec::new();
    while let Some(ev) = feed.next(Duration::from_secs(10)).await {
        seen.push(ev);
    }
    assert!(feed.ended, "{seen:#?}");
    assert!(
        has(&seen, "remove", &w.join("root/sub"), "directory"),
        "{seen:#?}"
    );
    assert!(
        has(&seen, "remove", &w.join("root"), "directory"),
        "{seen:#?}"
    );
}

#[tokio::test]
async fn watch_is_served_over_a_websocket_too() {
    use tokio_tungstenite::tungstenite::Message;
    let d = Daemon::builder().token("ws-token").start();
    let w = d.work_dir();
    let url = format!(
        "ws://{}/v1/fs/watch?path=.&recursive=true&access_token=ws-token",
        d.addr
    );
    let (mut ws, _) = tokio_tungstenite::connect_async(url).await.unwrap();
    let text = |m: Message| match m {
        Message::Text(t) => serde_json::from_str::<Value>(&t).unwrap(),
        other => panic!("{other:?}"),
    };
    let ready = text(ws.next().await.unwrap().unwrap());
    assert_eq!(ready["event"], "ready", "{ready}");
    assert_eq!(ready["data"]["path"], q(&w));
    std::fs::create_dir(w.join("dir")).unwrap();
    std::fs::write(w.join("dir/f"), b"x").unwrap();
    let mut got = Vec::new();
    while got.len() < 2 {
        let m = tokio::time::timeout(Duration::from_secs(10), ws.next())
            .await
            .expect("a frame")
            .unwrap()
            .unwrap();
        if let Message::Text(_) = m {
            got.push(text(m));
        }
    }
    assert_eq!(got[0]["event"], "change");
    assert_eq!(got[0]["id"], 1);
    assert_eq!(got[0]["data"]["kind"], "create");
    assert_eq!(got[0]["data"]["path"], q(&w.join("dir")));
    assert_eq!(got[1]["id"], 2);
    assert_eq!(got[1]["data"]["path"], q(&w.join("dir/f")));
    // Without the token the upgrade is refused.
    let bare = format!("ws://{}/v1/fs/watch?path=.", d.addr);
    assert!(tokio_tungstenite::connect_async(bare).await.is_err());
    let _ = ws.close(None).await;
    wait_watches(d.pid(), 0, "its watches given back").await;
}
