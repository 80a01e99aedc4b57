//! Hostile clients of `/v1/fs/*` and `/v1/config/*` (issue 10, part B), through the real binary:
//! stalled uploads and downloads (no blocking thread held, idle timeout, slot cap), declared sizes
//! that reserve nothing, trees deeper than any stack, hostile tar headers, planted temporary
//! names, config writes through several spellings of one directory, and entries that could not
//! be read back. Each test also checks that nothing is left behind once the attack ends.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::support::{Daemon, eventually};

/// Opens a connection and sends `head` (a request without its final CRLF CRLF) and `body`.
fn stalled(d: &Daemon, head: &str, body: &[u8]) -> TcpStream {
    let mut s = TcpStream::connect(&d.addr).unwrap();
    // The edge refuses a body without a Content-Type (harden-edge's browser guard).
    let ctype = if head.contains("Content-Type") {
        ""
    } else {
        "\r\nContent-Type: application/octet-stream"
    };
    s.write_all(format!("{head}{ctype}\r\nHost: 127.0.0.1\r\n\r\n").as_bytes())
        .unwrap();
    s.write_all(body).unwrap();
    s
}

/// The status line of the answer on `s`, waiting up to `timeout`.
fn status_of(s: &mut TcpStream, timeout: Duration) -> String {
    s.set_read_timeout(Some(timeout)).unwrap();
    let mut buf = [0u8; 512];
    let mut got = Vec::new();
    while !got.windows(2).any(|w| w == b"\r\n") {
        match s.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => got.extend_from_slice(&buf[..n]),
        }
    }
    String::from_utf8_lossy(&got)
        .lines()
        .next()
        .unwrap_or("")
        .to_string()
}

fn threads(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .map(|d| d.count())
        .unwrap_or(0)
}

/// How many descriptors of the daemon point at something whose path starts with `prefix`.
fn fds_to(pid: u32, prefix: &Path) -> usize {
    let prefix = prefix.to_string_lossy().to_string();
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| {
            d.flatten()
                .filter(|e| {
                    std::fs::read_link(e.path())
                        .is_ok_and(|t| t.to_string_lossy().starts_with(&prefix))
                })
                .count()
        })
        .unwrap_or(0)
}

/// Our temporaries and staging directories below `dir`.
fn temporaries(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let p = e.path();
            if e.file_name()
                .to_string_lossy()
                .starts_with(".sandbox-agent-")
            {
                out.push(p.clone());
            }
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                todo.push(p);
            }
        }
    }
    out
}

fn tar_of(files: &[(&str, &[u8])]) -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    for (name, data) in files {
        let mut h = tar::Header::new_gnu();
        h.set_size(data.len() as u64);
        h.set_mode(0o644);
        h.set_mtime(1_700_000_000);
        b.append_data(&mut h, name, *data).unwrap();
    }
    b.into_inner().unwrap()
}

/// A well-behaved client: PUT, GET back, upload a tar, list. Each with its own deadline.
async fn good_client_works(d: &Daemon, tag: &str) {
    sandbox_agent::install_crypto_provider();
    let c = reqwest::Client::builder()
        .timeout(Duration::from_secs(10))
        .no_proxy()
        .build()
        .unwrap();
    let r = c
        .put(d.url(&format!("/v1/fs/file?path=good/{tag}.txt")))
        .header("content-type", "application/octet-stream")
        .body(format!("hello {tag}"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200, "{:?}", r.text().await);
    let r = c
        .get(d.url(&format!("/v1/fs/file?path=good/{tag}.txt")))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.text().await.unwrap(), format!("hello {tag}"));
    let r = c
        .post(d.url(&format!("/v1/fs/upload-batch?path=good/{tag}")))
        .header("content-type", "application/x-tar")
        .body(tar_of(&[("a/b.txt", b"tar")]))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200, "{:?}", r.text().await);
    let r = c
        .get(d.url("/v1/fs/entries?path=good"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let r = c.get(d.url("/v1/health")).send().await.unwrap();
    assert_eq!(r.status(), 200);
}

#[tokio::test]
async fn hundreds_of_stalled_transfers_hold_no_thread_and_a_good_client_gets_through() {
    let d = Daemon::builder()
        .args(["--transfer-max", "1000", "--transfer-timeout", "120s"])
        .start();
    let big = d.work_dir().join("big.bin");
    std::fs::write(&big, vec![7u8; 16 << 20]).unwrap();
    let pid = d.pid();
    let mut socks = Vec::new();
    // 150 PUTs and 100 upload-batches that send headers and 1 KiB, then nothing.
    for i in 0..150 {
        socks.push(stalled(
            &d,
            &format!(
                "PUT /v1/fs/file?path=stalled/{i}.bin HTTP/1.1\r\nContent-Length: 1048576\r\nContent-Type: application/octet-stream"
            ),
            &[1u8; 1024],
        ));
    }
    for i in 0..100 {
        socks.push(stalled(
            &d,
            &format!(
                "POST /v1/fs/upload-batch?path=stalled-up/{i} HTTP/1.1\r\nContent-Length: 1048576\r\nContent-Type: application/x-tar"
            ),
            &[0u8; 1024],
        ));
    }
    // 50 downloads of a 16 MiB file whose client never reads.
    for _ in 0..50 {
        socks.push(stalled(
            &d,
            &format!("GET /v1/fs/file?path={} HTTP/1.1", big.display()),
            b"",
        ));
    }
    // Every stalled transfer reached its handler: a temporary per PUT, a spool per upload, an
    // open descriptor on the big file per download.
    eventually(Duration::from_secs(30), "300 transfers under way", || {
        let puts = temporaries(&d.work_dir().join("stalled")).len();
        let spools = fds_to(pid, &d.data_dir().join("tmp"));
        let downloads = fds_to(pid, &big);
        (puts == 150 && spools == 100 && downloads == 50).then_some(())
    });
    // None of them holds a thread (the old design held one blocking thread per transfer for as
    // long as it stalled). Their short blocking steps started pool threads, which exit once
    // idle for tokio's keep-alive (10 s); threads still blocked on a client would not.
    eventually(Duration::from_secs(30), "idle pool threads to exit", || {
        (threads(pid) < 24).then_some(())
    });
    good_client_works(&d, "during").await;
    // The attack ends: every temporary, spool and descriptor goes.
    drop(socks);
    eventually(
        Duration::from_secs(20),
        "the stalled transfers to end",
        || {
            let left = temporaries(&d.work_dir());
            (left.is_empty()
                && fds_to(pid, &d.data_dir().join("tmp")) == 0
                && fds_to(pid, &big) == 0)
                .then_some(())
        },
    );
    assert!(!d.work_dir().join("stalled-up").exists());
    good_client_works(&d, "after").await;
}

/// `/v1/health` latencies, one request every 20 ms for `span`, each within 2 s; sorted.
async fn health_latencies(d: &Daemon, span: Duration) -> Vec<Duration> {
    let c = crate::support::http();
    let mut latencies = Vec::new();
    let until = Instant::now() + span;
    while Instant::now() < until {
        let t = Instant::now();
        let r = tokio::time::timeout(Duration::from_secs(2), c.get(d.url("/v1/health")).send())
            .await
            .expect("health answered within 2 s")
            .unwrap();
        assert_eq!(r.status(), 200);
        latencies.push(t.elapsed());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    latencies.sort();
    latencies
}

/// The p99 of sorted `latencies`, printed; asserted well above the 100 ms target so that a
/// loaded CI machine does not fail it, and far below what a locked-out daemon would show.
fn check_p99(what: &str, latencies: &[Duration]) {
    let p99 = latencies[(latencies.len() * 99 / 100).min(latencies.len() - 1)];
    eprintln!(
        "health {what}: n={} p50={:?} p99={p99:?} max={:?}",
        latencies.len(),
        latencies[latencies.len() / 2],
        latencies.last().unwrap()
    );
    assert!(
        p99 < Duration::from_millis(750),
        "health p99 {p99:?} {what}"
    );
}

/// Sizes of our temporaries below `dir`.
fn temporary_sizes(dir: &Path) -> Vec<u64> {
    temporaries(dir)
        .iter()
        .filter_map(|p| std::fs::metadata(p).ok().map(|m| m.len()))
        .collect()
}

/// Issue 25, "stalled uploads lock out uploads": 300 uploads that send their headers and 1 KiB,
/// then stop, used to take every `--transfer-max` slot (a PUT from an honest client was 503 for
/// the whole transfer timeout). Slots now bound only the disk steps: with 4 of them, the stalled
/// transfers hold none, an honest PUT, GET and upload-batch succeed at once, and what the stalled
/// ones sent is on disk, not held in memory. They still end with 408 and leave nothing behind.
#[tokio::test]
async fn stalled_uploads_hold_no_slot_and_an_honest_transfer_succeeds_at_once() {
    let d = Daemon::builder()
        .args(["--transfer-max", "4", "--transfer-timeout", "15s"])
        .start();
    let mut socks: Vec<TcpStream> = Vec::new();
    for i in 0..200 {
        socks.push(stalled(
            &d,
            &format!("PUT /v1/fs/file?path=s/{i} HTTP/1.1\r\nContent-Length: 100000"),
            &[1u8; 1024],
        ));
    }
    for i in 0..100 {
        socks.push(stalled(
            &d,
            &format!(
                "POST /v1/fs/upload-batch?path=su/{i} HTTP/1.1\r\nContent-Length: 100000\r\nContent-Type: application/x-tar"
            ),
            &[0u8; 1024],
        ));
    }
    // Every stalled PUT reached its handler, and the 1 KiB it sent was written out (a stalled
    // transfer keeps no body bytes in memory); every upload has its spool open.
    eventually(Duration::from_secs(30), "300 stalled transfers", || {
        let sizes = temporary_sizes(&d.work_dir().join("s"));
        let spools = fds_to(d.pid(), &d.data_dir().join("tmp"));
        (sizes.len() == 200 && sizes.iter().all(|&n| n == 1024) && spools == 100).then_some(())
    });
    // An honest client is served at once, far more than 4 times over.
    let started = Instant::now();
    for i in 0..3 {
        tokio::time::timeout(
            Duration::from_secs(10),
            good_client_works(&d, &format!("during-{i}")),
        )
        .await
        .expect("an honest client is served while 300 transfers stall");
    }
    let honest = started.elapsed();
    let latencies = health_latencies(&d, Duration::from_secs(2)).await;
    check_p99("while 300 uploads stall", &latencies);
    eprintln!("three honest rounds of PUT, GET, upload-batch and list took {honest:?}");
    // The stalled bodies end with 408 after the transfer timeout; their temporaries go.
    for s in &mut socks {
        let line = status_of(s, Duration::from_secs(40));
        assert!(line.contains(" 408 "), "{line:?}");
    }
    eventually(Duration::from_secs(10), "the temporaries to go", || {
        (temporaries(&d.work_dir()).is_empty() && fds_to(d.pid(), &d.data_dir().join("tmp")) == 0)
            .then_some(())
    });
    assert!(!d.work_dir().join("s/0").exists());
    assert!(!d.work_dir().join("su").exists());
}

/// A download whose client takes nothing holds no slot either (the only one stays free for
/// others), and after the transfer timeout its file is closed although the connection is open.
#[tokio::test]
async fn a_download_whose_client_takes_nothing_holds_no_slot_and_ends_after_the_timeout() {
    let d = Daemon::builder()
        .args(["--transfer-max", "1", "--transfer-timeout", "2s"])
        .start();
    let big = d.work_dir().join("big.bin");
    std::fs::write(&big, vec![3u8; 32 << 20]).unwrap();
    let socks: Vec<TcpStream> = (0..20)
        .map(|_| {
            stalled(
                &d,
                &format!("GET /v1/fs/file?path={} HTTP/1.1", big.display()),
                b"",
            )
        })
        .collect();
    eventually(Duration::from_secs(10), "the downloads to start", || {
        (fds_to(d.pid(), &big) == 20).then_some(())
    });
    tokio::time::timeout(Duration::from_secs(10), good_client_works(&d, "during"))
        .await
        .expect("an honest client is served while 20 downloads stall");
    // The clients never read: after the timeout every file is closed, though the connections
    // are still open.
    eventually(
        Duration::from_secs(15),
        "the stalled downloads to give up",
        || (fds_to(d.pid(), &big) == 0).then_some(()),
    );
    drop(socks);
}

/// Sends `head` (without its final CRLF CRLF), then one body byte every 250 ms until the daemon
/// answers (or 30 s pass), on a thread; joins to the answer's status line and how long it took.
fn trickle(d: &Daemon, head: String) -> std::thread::JoinHandle<(String, Duration)> {
    let addr = d.addr.clone();
    std::thread::spawn(move || {
        let mut s = TcpStream::connect(&addr).unwrap();
        s.write_all(format!("{head}\r\nHost: 127.0.0.1\r\n\r\n").as_bytes())
            .unwrap();
        s.set_read_timeout(Some(Duration::from_millis(250)))
            .unwrap();
        let started = Instant::now();
        let mut got = Vec::new();
        let mut buf = [0u8; 512];
        while started.elapsed() < Duration::from_secs(30) {
            if s.write_all(b"x").is_err() {
                break;
            }
            match s.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => {
                    got.extend_from_slice(&buf[..n]);
                    if got.windows(2).any(|w| w == b"\r\n") {
                        break;
                    }
                }
                Err(_) => {}
            }
        }
        let line = String::from_utf8_lossy(&got)
            .lines()
            .next()
            .unwrap_or("")
            .to_string();
        (line, started.elapsed())
    })
}

/// Issue 25, "bodies trickled forever", as first seen: a `POST /v1/acp` body of 515 bytes sent a
/// byte at a time stayed open for as long as its client liked (only silence timed out). Past the
/// grace of `--idle-timeout` it must average `--body-min-rate`: 408, while health stays fast.
#[tokio::test]
async fn a_trickled_acp_post_is_408_after_the_grace() {
    let d = Daemon::builder()
        .args(["--idle-timeout", "2s", "--body-min-rate", "1K"])
        .start();
    let tricklers: Vec<_> = (0..10)
        .map(|i| {
            trickle(
                &d,
                format!(
                    "POST /v1/acp/trickle{i}?agent=mock HTTP/1.1\r\nContent-Length: 515\r\nContent-Type: application/json"
                ),
            )
        })
        .collect();
    let latencies = health_latencies(&d, Duration::from_secs(2)).await;
    check_p99("while 10 ACP bodies trickle", &latencies);
    for t in tricklers {
        let (line, took) = tokio::task::spawn_blocking(move || t.join().unwrap())
            .await
            .unwrap();
        assert!(line.contains(" 408 "), "{line:?} after {took:?}");
        assert!(took < Duration::from_secs(20), "408 only after {took:?}");
    }
}

/// Issue 25, "bodies trickled forever", for every other body: the JSON bodies the routes read
/// whole (a config entry, the RFD transport's POST, a process start, a file move) got no minimum
/// rate, only the idle timeout. Past the grace of `--idle-timeout` each must average
/// `--body-min-rate`: 408 with `minRate`; a slow body above the rate that lasts longer than the
/// grace is still accepted (the negative control), and health stays fast meanwhile.
#[tokio::test]
async fn trickled_json_bodies_of_every_route_are_408_after_the_grace() {
    let d = Daemon::builder()
        .args(["--idle-timeout", "2s", "--body-min-rate", "1K"])
        .start();
    std::fs::create_dir_all(d.path("proj")).unwrap();
    let heads = [
        "PUT /v1/config/mcp?directory=proj&mcpName=x HTTP/1.1\r\nContent-Length: 515\r\nContent-Type: application/json",
        "POST /v1/agents/mock/acp HTTP/1.1\r\nContent-Length: 515\r\nContent-Type: application/json\r\nAccept: application/json",
        "POST /v1/processes HTTP/1.1\r\nContent-Length: 515\r\nContent-Type: application/json",
        "POST /v1/fs/move HTTP/1.1\r\nContent-Length: 515\r\nContent-Type: application/json",
    ];
    let tricklers: Vec<_> = heads
        .iter()
        .map(|h| (h.to_string(), trickle(&d, h.to_string())))
        .collect();
    // The control: a config entry of about 6 KiB sent 600 bytes every 300 ms (2 KB/s, above the
    // minimum) for about 3 s, longer than the grace.
    let slow = {
        let c = d.client();
        let url = d.url("/v1/config/mcp?directory=proj&mcpName=slow");
        let body = serde_json::to_vec(&json!({
            "type": "local", "command": ["srv"], "env": {"PAD": "p".repeat(6000)}
        }))
        .unwrap();
        tokio::spawn(async move {
            let len = body.len();
            let chunks: Vec<Vec<u8>> = body.chunks(600).map(<[u8]>::to_vec).collect();
            let stream = futures_util::stream::unfold(chunks.into_iter(), |mut it| async move {
                let next = it.next()?;
                tokio::time::sleep(Duration::from_millis(300)).await;
                Some((Ok::<_, std::io::Error>(next), it))
            });
            let r = c
                .put(url)
                .header("content-type", "application/json")
                .header("content-length", len)
                .body(reqwest::Body::wrap_stream(stream))
                .send()
                .await
                .unwrap();
            (r.status().as_u16(), r.text().await.unwrap_or_default())
        })
    };
    let latencies = health_latencies(&d, Duration::from_secs(2)).await;
    check_p99("while 4 JSON bodies trickle", &latencies);
    for (head, t) in tricklers {
        let (line, took) = tokio::task::spawn_blocking(move || t.join().unwrap())
            .await
            .unwrap();
        assert!(line.contains(" 408 "), "{head}: {line:?} after {took:?}");
        assert!(
            took < Duration::from_secs(20),
            "{head}: 408 only after {took:?}"
        );
    }
    let (status, text) = slow.await.unwrap();
    assert_eq!(status, 204, "the slow honest body: {text}");
    // The problem names the rate.
    let mut s = TcpStream::connect(&d.addr).unwrap();
    s.write_all(
        b"PUT /v1/config/mcp?directory=proj&mcpName=y HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 100\r\nContent-Type: application/json\r\n\r\n{",
    )
    .unwrap();
    let mut got = String::new();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let _ = s.read_to_string(&mut got);
    assert!(got.starts_with("HTTP/1.1 408"), "{got}");
    assert!(got.contains("\"minRate\":1024"), "{got}");
    assert!(got.contains("application/problem+json"), "{got}");
}

/// Issue 25, "bodies trickled forever": a body sent a byte at a time, never silent for the
/// transfer timeout, used to stay open as long as its client liked. Past the grace of
/// `--transfer-timeout` a body must average `--body-min-rate`; a trickled PUT and upload-batch
/// are answered 408 and leave nothing behind, while a slow body above the rate that lasts
/// longer than the grace is accepted, and health and an honest PUT stay fast meanwhile.
#[tokio::test]
async fn bodies_trickled_below_the_minimum_rate_are_408_and_slow_honest_ones_pass() {
    let d = Daemon::builder()
        .args(["--transfer-timeout", "2s", "--body-min-rate", "1K"])
        .start();
    // 20 tricklers: a byte every 250 ms (never idle for 2 s, far below 1 KiB/s).
    let trickle = |head: String| trickle(&d, head);
    let mut tricklers = Vec::new();
    for i in 0..10 {
        tricklers.push(trickle(format!(
            "PUT /v1/fs/file?path=t/{i} HTTP/1.1\r\nContent-Length: 515\r\nContent-Type: application/octet-stream"
        )));
        tricklers.push(trickle(format!(
            "POST /v1/fs/upload-batch?path=tu/{i} HTTP/1.1\r\nContent-Length: 515\r\nContent-Type: application/x-tar"
        )));
    }
    // A slow honest PUT: 4 KiB every 400 ms for about 3.2 s (10 KiB/s), longer than the grace.
    let slow = {
        let c = d.client();
        let url = d.url("/v1/fs/file?path=slow.bin");
        tokio::spawn(async move {
            let body = futures_util::stream::unfold(0u32, |i| async move {
                if i == 8 {
                    return None;
                }
                tokio::time::sleep(Duration::from_millis(400)).await;
                Some((Ok::<_, std::io::Error>(vec![b's'; 4096]), i + 1))
            });
            let r = c
                .put(url)
                .header("content-type", "application/octet-stream")
                .header("content-length", 8 * 4096)
                .body(reqwest::Body::wrap_stream(body))
                .send()
                .await
                .unwrap();
            r.status().as_u16()
        })
    };
    let latencies = health_latencies(&d, Duration::from_secs(2)).await;
    check_p99("while 20 bodies trickle", &latencies);
    tokio::time::timeout(Duration::from_secs(10), good_client_works(&d, "during"))
        .await
        .expect("an honest client is served while bodies trickle");
    for t in tricklers {
        let (line, took) = tokio::task::spawn_blocking(move || t.join().unwrap())
            .await
            .unwrap();
        assert!(line.contains(" 408 "), "{line:?} after {took:?}");
        assert!(took < Duration::from_secs(20), "408 only after {took:?}");
    }
    assert_eq!(
        slow.await.unwrap(),
        200,
        "a slow body above the rate passes"
    );
    assert_eq!(
        std::fs::metadata(d.work_dir().join("slow.bin"))
            .unwrap()
            .len(),
        8 * 4096
    );
    eventually(Duration::from_secs(10), "the temporaries to go", || {
        (temporaries(&d.work_dir()).is_empty() && fds_to(d.pid(), &d.data_dir().join("tmp")) == 0)
            .then_some(())
    });
    assert!(!d.work_dir().join("t/0").exists());
    assert!(!d.work_dir().join("tu").exists());
}

#[tokio::test]
async fn a_declared_size_reserves_no_disk_and_more_than_the_free_space_is_507() {
    // No upload limit: with more free space than the default limit (64G) the declared size
    // would be refused as too large (413) before the free space is looked at.
    let d = Daemon::builder().args(["--upload-limit", "max"]).start();
    let st = nix::sys::statvfs::statvfs(&d.work_dir()).unwrap();
    let free = st.blocks_available() as u64 * st.fragment_size() as u64;
    // More than the filesystem has: refused before any byte of the body is read.
    let mut s = stalled(
        &d,
        &format!(
            "PUT /v1/fs/file?path=huge.bin HTTP/1.1\r\nContent-Length: {}",
            free + (1 << 30)
        ),
        b"",
    );
    let line = status_of(&mut s, Duration::from_secs(10));
    assert!(line.contains(" 507 "), "{line:?}");
    assert!(temporaries(&d.work_dir()).is_empty());
    // A large declared size that fits: only what arrived takes blocks.
    let declared = 5_000_000_000u64.min(free / 2);
    let s = stalled(
        &d,
        &format!("PUT /v1/fs/file?path=big.bin HTTP/1.1\r\nContent-Length: {declared}"),
        &[9u8; 1024],
    );
    let temp = eventually(Duration::from_secs(10), "the temporary file", || {
        temporaries(&d.work_dir()).pop()
    });
    use std::os::unix::fs::MetadataExt;
    let blocks = std::fs::metadata(&temp).unwrap().blocks() * 512;
    assert!(
        blocks <= 1 << 20,
        "{blocks} bytes allocated for 1 KiB received"
    );
    drop(s);
    eventually(Duration::from_secs(10), "the temporary to go", || {
        temporaries(&d.work_dir()).is_empty().then_some(())
    });
}

/// Creates `depth` nested directories named `d` below `top` without any path longer than a name
/// (openat one level at a time), with a file at the bottom.
fn deep_tree(top: &Path, depth: usize) {
    use nix::fcntl::{OFlag, openat};
    use nix::sys::stat::Mode;
    std::fs::create_dir_all(top).unwrap();
    let mut fd =
        nix::fcntl::open(top, OFlag::O_DIRECTORY | OFlag::O_RDONLY, Mode::empty()).unwrap();
    for _ in 0..depth {
        nix::sys::stat::mkdirat(fd.as_fd(), "d", Mode::from_bits_truncate(0o755)).unwrap();
        fd = openat(
            fd.as_fd(),
            "d",
            OFlag::O_DIRECTORY | OFlag::O_RDONLY,
            Mode::empty(),
        )
        .unwrap();
    }
    let f = openat(
        fd.as_fd(),
        "leaf",
        OFlag::O_CREAT | OFlag::O_WRONLY,
        Mode::from_bits_truncate(0o644),
    )
    .unwrap();
    drop(f);
}

#[tokio::test]
async fn a_tree_15000_levels_deep_is_deleted_without_recursion() {
    let d = Daemon::start();
    let top = d.work_dir().join("deep");
    deep_tree(&top, 15_000);
    let c = d.client();
    let r = c
        .delete(d.url("/v1/fs/entry?path=deep&recursive=true"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200, "{:?}", r.text().await);
    assert!(!top.exists());
    let r = c.get(d.url("/v1/health")).send().await.unwrap();
    assert_eq!(r.status(), 200, "the daemon survived");
}

#[tokio::test]
async fn an_upload_merging_into_a_deep_existing_tree_walks_it_without_recursion() {
    let d = Daemon::start();
    // Paths in an archive stop at PATH_MAX, so about 2,000 levels is as deep as a merge goes.
    let depth = 2_000;
    deep_tree(&d.work_dir().join("m"), depth);
    let deep_name: String = std::iter::repeat_n("d/", depth).collect::<String>() + "new.txt";
    let r = d
        .client()
        .post(d.url("/v1/fs/upload-batch?path=m"))
        .header("content-type", "application/x-tar")
        .body(tar_of(&[(deep_name.as_str(), b"deep")]))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200, "{:?}", r.text().await);
    let r = d
        .client()
        .delete(d.url("/v1/fs/entry?path=m&recursive=true"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert!(temporaries(&d.work_dir()).is_empty());
}

#[tokio::test]
async fn a_tar_entry_with_a_huge_base256_mtime_is_extracted_without_a_panic() {
    let d = Daemon::start();
    let mut t = tar_of(&[("t.txt", b"time")]);
    // mtime field (offset 136, 12 bytes): base-256 marker and all ones, then fix the checksum.
    t[136] = 0x80;
    t[137..148].fill(0xff);
    t[148..156].fill(b' ');
    let sum: u64 = t[..512].iter().map(|&b| b as u64).sum();
    t[148..156].copy_from_slice(format!("{sum:06o}\0 ").as_bytes());
    let r = d
        .client()
        .post(d.url("/v1/fs/upload-batch?path=when"))
        .header("content-type", "application/x-tar")
        .body(t)
        .send()
        .await
        .unwrap();
    let status = r.status();
    let text = r.text().await.unwrap();
    assert_eq!(status, 200, "{text}");
    assert_eq!(
        std::fs::read(d.work_dir().join("when/t.txt")).unwrap(),
        b"time"
    );
    let r = d.client().get(d.url("/v1/health")).send().await.unwrap();
    assert_eq!(r.status(), 200);
}

#[tokio::test]
async fn planted_temporary_names_neither_fail_a_put_nor_get_deleted() {
    let d = Daemon::start();
    let dir = d.work_dir().join("p");
    std::fs::create_dir_all(&dir).unwrap();
    // The old scheme was `.sandbox-agent-write-<pid>-<n>`: plant the first hundred.
    let planted: Vec<PathBuf> = (0..100)
        .map(|n| dir.join(format!(".sandbox-agent-write-{}-{n}", d.pid())))
        .collect();
    for p in &planted {
        std::fs::write(p, b"mine").unwrap();
    }
    for i in 0..20 {
        let r = d
            .client()
            .put(d.url(&format!("/v1/fs/file?path=p/f{i}")))
            .header("content-type", "application/octet-stream")
            .body("data")
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
    }
    for p in &planted {
        assert_eq!(std::fs::read(p).unwrap(), b"mine", "{}", p.display());
    }
}

#[tokio::test]
async fn a_failed_upload_through_dotdot_creates_no_directory() {
    let d = Daemon::start();
    let mut bad = tar_of(&[("ok.txt", b"x")]);
    // Drop the end-of-archive blocks and add an entry that climbs out (written raw: the tar
    // crate refuses to build one), refused after the first entry was staged.
    bad.truncate(bad.len() - 1024);
    let mut h = tar::Header::new_gnu();
    h.as_mut_bytes()[..4].copy_from_slice(b"../x");
    h.set_size(1);
    h.set_mode(0o644);
    h.set_cksum();
    bad.extend_from_slice(h.as_bytes());
    bad.push(b'y');
    bad.resize(bad.len().div_ceil(512) * 512 + 1024, 0);
    let r = d
        .client()
        .post(d.url("/v1/fs/upload-batch?path=m1/../m2/m3"))
        .header("content-type", "application/x-tar")
        .body(bad)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400, "{:?}", r.text().await);
    assert!(!d.work_dir().join("m1").exists(), "m1 left behind");
    assert!(!d.work_dir().join("m2").exists(), "m2 left behind");
    assert!(temporaries(&d.work_dir()).is_empty());
}

#[tokio::test]
async fn upload_batch_takes_only_archive_content_types() {
    let d = Daemon::start();
    let c = d.client();
    let tar = tar_of(&[("f", b"x")]);
    for (ctype, want) in [
        (Some("text/plain"), 415),
        (Some("application/x-www-form-urlencoded"), 415),
        (Some("multipart/form-data; boundary=x"), 415),
        (None, 415),
        (Some("application/x-tar"), 200),
        (Some("application/octet-stream"), 200),
        (Some("Application/X-Tar; charset=binary"), 200),
    ] {
        let mut req = c
            .post(d.url("/v1/fs/upload-batch?path=ct"))
            .body(tar.clone());
        if let Some(t) = ctype {
            req = req.header("content-type", t);
        }
        let r = req.send().await.unwrap();
        assert_eq!(r.status(), want, "{ctype:?}");
        if want == 415 {
            assert_eq!(r.headers()["content-type"], "application/problem+json");
        }
    }
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    gz.write_all(&tar_of(&[("g", b"y")])).unwrap();
    let gz = gz.finish().unwrap();
    for ctype in ["application/gzip", "application/x-gzip"] {
        let r = c
            .post(d.url("/v1/fs/upload-batch?path=ct"))
            .header("content-type", ctype)
            .body(gz.clone())
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200, "{ctype}");
    }
    // Nothing was extracted by the refused requests before the accepted ones.
    assert_eq!(std::fs::read(d.work_dir().join("ct/g")).unwrap(), b"y");
}

#[tokio::test]
async fn a_signed_range_is_ignored_and_bad_move_json_is_400() {
    let d = Daemon::start();
    std::fs::write(d.work_dir().join("r.txt"), b"0123456789").unwrap();
    let c = d.client();
    for range in ["bytes=+1-2", "bytes=1-+2", "bytes=-+3"] {
        let r = c
            .get(d.url("/v1/fs/file?path=r.txt"))
            .header("range", range)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200, "{range}");
        assert_eq!(r.text().await.unwrap(), "0123456789");
    }
    for body in ["{", r#"{"from":1}"#, r#"{"from":"a","to":"b","x":1}"#, "[]"] {
        let r = c
            .post(d.url("/v1/fs/move"))
            .header("content-type", "application/json")
            .body(body)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 400, "{body}");
        assert_eq!(r.headers()["content-type"], "application/problem+json");
    }
}

fn config_url(d: &Daemon, dir: &str, name: &str) -> String {
    d.url(&format!("/v1/config/mcp?directory={dir}&mcpName={name}"))
}

#[tokio::test]
async fn config_writes_through_every_spelling_of_a_directory_are_all_kept() {
    let d = Daemon::start();
    std::fs::create_dir_all(d.work_dir().join("d")).unwrap();
    std::fs::create_dir_all(d.work_dir().join("sub")).unwrap();
    let spellings = ["d", "sub/../d", "d/../d", "./d"];
    let c = d.client();
    let mut tasks = Vec::new();
    for i in 0..64 {
        let url = config_url(&d, spellings[i % spellings.len()], &format!("n{i}"));
        let c = c.clone();
        tasks.push(tokio::spawn(async move {
            c.put(url)
                .header("content-type", "application/json")
                .body(json!({"type":"local","command":format!("cmd{i}")}).to_string())
                .send()
                .await
                .unwrap()
                .status()
        }));
    }
    for t in tasks {
        assert_eq!(t.await.unwrap(), 204);
    }
    let stored: Value = serde_json::from_slice(
        &std::fs::read(d.work_dir().join("d/.sandbox-agent/config/mcp.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(stored.as_object().unwrap().len(), 64, "{stored}");
}

#[tokio::test]
async fn config_that_could_not_be_read_back_is_refused_up_front() {
    let d = Daemon::start();
    std::fs::create_dir_all(d.work_dir().join("c")).unwrap();
    let c = d.client();
    let entry =
        |bytes: usize| json!({"type":"local","command":"x","args":["a".repeat(bytes)]}).to_string();
    // One entry over the entry cap (1 MiB): 413 with the limit.
    let r = c
        .put(config_url(&d, "c", "big"))
        .header("content-type", "application/json")
        .body(entry(2 << 20))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 413);
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["limit"], 1 << 20, "{body}");
    // A stored file just under the 16 MiB file cap (written directly, to keep the test short):
    // one more entry under the entry cap would make it unreadable, so it is refused, and the
    // directory stays readable and writable.
    let mut stored = serde_json::Map::new();
    for i in 0..16 {
        stored.insert(
            format!("e{i}"),
            json!({"type":"local","command":"x","args":["a".repeat(1_000_000)]}),
        );
    }
    let file = d.work_dir().join("c/.sandbox-agent/config/mcp.json");
    std::fs::create_dir_all(file.parent().unwrap()).unwrap();
    std::fs::write(&file, serde_json::to_vec_pretty(&stored).unwrap()).unwrap();
    assert!(std::fs::metadata(&file).unwrap().len() < 16 << 20);
    let r = c
        .put(config_url(&d, "c", "e16"))
        .header("content-type", "application/json")
        .body(entry(1_000_000))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 413, "{:?}", r.text().await);
    assert!(
        std::fs::metadata(&file).unwrap().len() < 16 << 20,
        "nothing written"
    );
    let r = c.get(config_url(&d, "c", "e0")).send().await.unwrap();
    assert_eq!(r.status(), 200, "the directory is still readable");
    let r = c
        .put(config_url(&d, "c", "small"))
        .header("content-type", "application/json")
        .body(json!({"type":"local","command":"y"}).to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 204, "and still writable");
    let r = c.delete(config_url(&d, "c", "e1")).send().await.unwrap();
    assert_eq!(r.status(), 204);
    let r = c.get(config_url(&d, "c", "e1")).send().await.unwrap();
    assert_eq!(r.status(), 404);
}

/// The daemon's resident memory in KiB.
fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

/// Starts complete transfers at once, under `tag/`: `[puts, batches, gets]` PUTs of `payload`,
/// upload-batches of `archive` and downloads of `big` read to the end. Each job gives its status
/// and the bytes it read (0 for uploads).
fn complete_transfers(
    d: &Daemon,
    c: &reqwest::Client,
    tag: &str,
    [puts, batches, gets]: [usize; 3],
    payload: &[u8],
    archive: &[u8],
    big: &std::path::Path,
) -> Vec<tokio::task::JoinHandle<(u16, usize)>> {
    // (request, is a download)
    let mut reqs = Vec::new();
    for i in 0..puts {
        let req = c
            .put(d.url(&format!("/v1/fs/file?path={tag}/p{i}.bin")))
            .header("content-type", "application/octet-stream")
            .body(payload.to_vec());
        reqs.push((req, false));
    }
    for i in 0..batches {
        let req = c
            .post(d.url(&format!("/v1/fs/upload-batch?path={tag}/b{i}")))
            .header("content-type", "application/x-tar")
            .body(archive.to_vec());
        reqs.push((req, false));
    }
    for _ in 0..gets {
        let req = c.get(d.url(&format!("/v1/fs/file?path={}", big.display())));
        reqs.push((req, true));
    }
    reqs.into_iter()
        .map(|(req, download)| {
            tokio::spawn(async move {
                let r = req.send().await.unwrap();
                let status = r.status().as_u16();
                let len = if download {
                    r.bytes().await.unwrap().len()
                } else {
                    0
                };
                (status, len)
            })
        })
        .collect()
}

/// After a bounded storm of file-shaped attacks — stalled PUTs and upload-batches, downloads
/// whose client takes nothing, and complete large PUTs, downloads and upload-batches, all at
/// once — the daemon's memory comes back near where it was once everything has ended, as
/// `hostile_agents::memory_goes_back_down_after_a_load_of_large_messages` asks of the ACP path.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_goes_back_down_after_a_storm_of_file_transfers() {
    let d = Daemon::builder()
        .args(["--transfer-max", "1000", "--transfer-timeout", "2s"])
        .start();
    let pid = d.pid();
    let big = d.work_dir().join("big.bin");
    std::fs::write(&big, vec![5u8; 16 << 20]).unwrap();
    let payload = vec![9u8; 4 << 20];
    let archive = {
        let parts: Vec<(String, Vec<u8>)> = (0..8)
            .map(|i| (format!("d{i}/f.bin"), vec![i as u8; 256 << 10]))
            .collect();
        let refs: Vec<(&str, &[u8])> = parts
            .iter()
            .map(|(n, b)| (n.as_str(), b.as_slice()))
            .collect();
        tar_of(&refs)
    };
    // Warm-up: one of each, then a few at once, so that one-time allocations (the runtime,
    // pools, TLS-free client paths, and the allocator arenas of the blocking-pool threads that
    // concurrent transfers bring up: a few MiB that stay for the daemon's life whatever comes
    // later) are in the baseline. Without the concurrent part the baseline missed them and the
    // storm's residue sat at 6-13 MiB, on both sides of the line, on a 2-core machine.
    good_client_works(&d, "warm").await;
    {
        let c = d.client();
        let warm = complete_transfers(&d, &c, "warm", [8, 8, 8], &payload, &archive, &big);
        for w in warm {
            assert_eq!(w.await.unwrap().0, 200);
        }
    }
    // The warm-up's connections close and its heap trim (200 ms after the last transfer) runs.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let before = rss_kib(pid);

    // The peak, sampled while the storm runs (only reported: it shows the storm cost memory).
    let peak = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(before));
    let sampling = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
    let sampler = {
        let (peak, sampling) = (peak.clone(), sampling.clone());
        tokio::spawn(async move {
            while sampling.load(std::sync::atomic::Ordering::Relaxed) {
                peak.fetch_max(rss_kib(pid), std::sync::atomic::Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
    };

    // Stalled: 100 PUTs and 50 upload-batches that send headers and 64 KiB, then nothing; 50
    // downloads of the 16 MiB file whose client never reads. They end by the 2 s transfer
    // timeout while their sockets stay open.
    let mut socks = Vec::new();
    for i in 0..100 {
        socks.push(stalled(
            &d,
            &format!(
                "PUT /v1/fs/file?path=stalled/{i}.bin HTTP/1.1\r\nContent-Length: 8388608\r\nContent-Type: application/octet-stream"
            ),
            &[1u8; 64 << 10],
        ));
    }
    for i in 0..50 {
        socks.push(stalled(
            &d,
            &format!(
                "POST /v1/fs/upload-batch?path=stalled-up/{i} HTTP/1.1\r\nContent-Length: 8388608\r\nContent-Type: application/x-tar"
            ),
            &[0u8; 64 << 10],
        ));
    }
    for _ in 0..50 {
        socks.push(stalled(
            &d,
            &format!("GET /v1/fs/file?path={} HTTP/1.1", big.display()),
            b"",
        ));
    }
    // Complete, at the same time: 40 PUTs of 4 MiB, 20 upload-batches of 2 MiB, 20 downloads of
    // the 16 MiB file read to the end.
    let c = d.client();
    let jobs = complete_transfers(&d, &c, "storm", [40, 20, 20], &payload, &archive, &big);
    for job in jobs {
        let (status, len) = tokio::time::timeout(Duration::from_secs(120), job)
            .await
            .expect("every complete transfer finished within 120 s")
            .unwrap();
        assert_eq!(status, 200);
        assert!(len == 0 || len == 16 << 20, "a download came back whole");
    }
    // Its idle keep-alive connections (each with hyper's buffers) go too, as a client's would.
    drop(c);
    // The stalled ones end by the timeout: nothing of them is left.
    eventually(
        Duration::from_secs(30),
        "the stalled transfers to end",
        || {
            (temporaries(&d.work_dir()).is_empty()
                && fds_to(pid, &d.data_dir().join("tmp")) == 0
                && fds_to(pid, &big) == 0)
                .then_some(())
        },
    );
    drop(socks);
    sampling.store(false, std::sync::atomic::Ordering::Relaxed);
    sampler.await.unwrap();
    let peak = peak.load(std::sync::atomic::Ordering::Relaxed);

    // Back within 10 MiB of the start. Measured on the debug build: the storm peaks at
    // 280-300 MiB and ends 6 MiB below to 5 MiB above the warmed baseline (before the
    // concurrent warm-up, 6-13 MiB above a cold one). With the heap trimmed but glibc's
    // mmap threshold left to float it stayed ~15 MiB above, with the threshold fixed but no
    // trim ~19 MiB, with neither ~120 MiB (the client's keep-alive connections still open):
    // all fail here, which is the point. What may legitimately remain is allocator slack and
    // the stacks of blocking-pool threads that have not yet reached tokio's 10 s idle exit,
    // which the 30 s deadline waits out; none of it depends on how loaded the machine is.
    let last = std::sync::atomic::AtomicU64::new(0);
    let settled = tokio::time::timeout(Duration::from_secs(30), async {
        loop {
            let now = rss_kib(pid);
            last.store(now, std::sync::atomic::Ordering::Relaxed);
            if now <= before + (10 << 10) {
                return now;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    let Ok(now) = settled else {
        panic!(
            "RSS not back within 10 MiB of its start after 30 s: before {} KiB, peak {} KiB, now {} KiB",
            before,
            peak,
            last.load(std::sync::atomic::Ordering::Relaxed)
        );
    };
    eprintln!(
        "file storm: RSS before {} MiB, peak {} MiB, after {} MiB",
        before >> 10,
        peak >> 10,
        now >> 10
    );
    good_client_works(&d, "after").await;
}
