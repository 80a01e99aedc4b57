//! Session bundles of a long conversation, for memory (not a test; asserts only that the set-up
//! worked). Daemon A (a state dir, an event buffer large enough to keep them all) gets one mock
//! session whose turn streams `BUNDLE_BENCH_EVENTS` updates (default 100,000); its bundle is
//! exported to a file, then imported from that file into daemon B (its own state dir, the default
//! event buffer). Each daemon's resident memory (`VmRSS`) is sampled every 5 ms: printed before,
//! at the peak during, and after the transfer, with the bundle's size and the times.
//!
//! Run: `cargo bench --bench bundles`.

use std::io::Write;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use serde_json::{Value, json};

mod common;
use common::{Stopping, free_port, knob, rss_kib};

const BIN: &str = env!("CARGO_BIN_EXE_sandbox-agent");

async fn start(dir: &std::path::Path, extra: &[&str]) -> (Stopping, String) {
    let port = free_port();
    std::fs::create_dir_all(dir.join("work")).unwrap();
    let child = Command::new(BIN)
        .args([
            "server",
            "--host",
            "127.0.0.1",
            "--no-token",
            "--log-level",
            "warn",
        ])
        .arg("--port")
        .arg(port.to_string())
        .arg("--work-dir")
        .arg(dir.join("work"))
        .arg("--data-dir")
        .arg(dir.join("data"))
        .arg("--state-dir")
        .arg(dir.join("state"))
        .args(extra)
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start the daemon");
    let base = format!("http://127.0.0.1:{port}");
    let c = reqwest::Client::new();
    let deadline = Instant::now() + Duration::from_secs(20);
    while c.get(format!("{base}/v1/health")).send().await.is_err() {
        assert!(Instant::now() < deadline, "the daemon never answered");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    (Stopping::new(child), base)
}

/// Samples `pid`'s RSS every 5 ms until `stop`; the peak (KiB).
fn sampler(pid: u32, stop: Arc<AtomicBool>) -> std::thread::JoinHandle<u64> {
    let peak = AtomicU64::new(0);
    std::thread::spawn(move || {
        while !stop.load(Ordering::Relaxed) {
            peak.fetch_max(rss_kib(pid), Ordering::Relaxed);
            std::thread::sleep(Duration::from_millis(5));
        }
        peak.load(Ordering::Relaxed)
    })
}

async fn rpc(c: &reqwest::Client, base: &str, id: u64, method: &str, params: Value) -> Value {
    let r = c
        .post(format!("{base}/v1/acp/long?agent=mock"))
        .json(&json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}))
        .send()
        .await
        .expect("POST");
    assert_eq!(r.status(), 200, "{method}");
    r.json().await.unwrap()
}

fn mib(kib: u64) -> f64 {
    kib as f64 / 1024.0
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    sandbox_agent::install_crypto_provider();
    let n: u64 = knob("BUNDLE_BENCH_EVENTS", 100_000);
    let tmp = tempfile::tempdir().unwrap();
    let keep = (n + 100).to_string();
    let (a, base_a) = start(
        &tmp.path().join("a"),
        &[
            "--event-buffer",
            &keep,
            "--event-buffer-bytes",
            "1G",
            "--state-max-bytes",
            "2G",
        ],
    )
    .await;
    let c = reqwest::Client::new();
    rpc(&c, &base_a, 1, "initialize", json!({"protocolVersion": 1})).await;
    let s = rpc(
        &c,
        &base_a,
        2,
        "session/new",
        json!({"cwd": "/", "mcpServers": []}),
    )
    .await;
    let sid = s["result"]["sessionId"].as_str().unwrap().to_string();
    let t = Instant::now();
    rpc(
        &c,
        &base_a,
        3,
        "session/prompt",
        json!({"sessionId": sid, "prompt": [{"type": "text", "text": format!("/stream {n}")}]}),
    )
    .await;
    eprintln!("{n} events made in {:.1} s", t.elapsed().as_secs_f64());

    // Export to a file.
    let file = tmp.path().join("long.tgz");
    let before = rss_kib(a.id());
    let stop = Arc::new(AtomicBool::new(false));
    let peak = sampler(a.id(), stop.clone());
    let t = Instant::now();
    let r = c
        .get(format!("{base_a}/v1/acp/long/bundle"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let mut out = std::fs::File::create(&file).unwrap();
    let mut body = r.bytes_stream();
    while let Some(chunk) = body.next().await {
        out.write_all(&chunk.unwrap()).unwrap();
    }
    drop(out);
    let took = t.elapsed();
    stop.store(true, Ordering::Relaxed);
    let peak = peak.join().unwrap();
    let size = std::fs::metadata(&file).unwrap().len();
    println!(
        "export: {n} events, bundle {:.1} MiB in {:.2} s; daemon A RSS before {:.1} MiB, peak {:.1} MiB (+{:.1}), after {:.1} MiB",
        size as f64 / 1048576.0,
        took.as_secs_f64(),
        mib(before),
        mib(peak),
        mib(peak.saturating_sub(before)),
        mib(rss_kib(a.id()))
    );
    drop(a);

    // Import from the file, streamed.
    let (b, base_b) = start(&tmp.path().join("b"), &[]).await;
    let before = rss_kib(b.id());
    let stop = Arc::new(AtomicBool::new(false));
    let peak = sampler(b.id(), stop.clone());
    let t = Instant::now();
    let f = tokio::fs::File::open(&file).await.unwrap();
    let stream = futures_util::stream::unfold(f, |mut f| async move {
        use tokio::io::AsyncReadExt;
        let mut buf = vec![0u8; 64 * 1024];
        match f.read(&mut buf).await {
            Ok(0) => None,
            Ok(k) => {
                buf.truncate(k);
                Some((Ok::<_, std::io::Error>(buf), f))
            }
            Err(e) => Some((Err(e), f)),
        }
    });
    let r = c
        .post(format!("{base_b}/v1/acp/long/bundle"))
        .header("content-type", "application/gzip")
        .body(reqwest::Body::wrap_stream(stream))
        .send()
        .await
        .unwrap();
    let status = r.status();
    let answer: Value = r.json().await.unwrap();
    assert_eq!(status, 201, "{answer}");
    let took = t.elapsed();
    stop.store(true, Ordering::Relaxed);
    let peak = peak.join().unwrap();
    assert!(answer["events"].as_u64().unwrap() >= n, "{answer}");
    println!(
        "import: {} events in {:.2} s; daemon B RSS before {:.1} MiB, peak {:.1} MiB (+{:.1}), after {:.1} MiB",
        answer["events"],
        took.as_secs_f64(),
        mib(before),
        mib(peak),
        mib(peak.saturating_sub(before)),
        mib(rss_kib(b.id()))
    );
    drop(b);
}
