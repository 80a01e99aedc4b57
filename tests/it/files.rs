//! `/v1/fs/*` seen from a client: binary round trips up to 1 GiB, ranges, aborted and refused
//! writes that keep the old file, every contract status, hostile tar uploads (checked on disk),
//! and fs-root confinement through symlinks.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

use bytes::Bytes;
use reqwest::StatusCode;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use crate::support::{Daemon, eventually, is_root, skip};

/// Deterministic, incompressible-looking bytes.
pub(crate) fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407)
        | 1;
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        out.extend_from_slice(&x.to_le_bytes());
    }
    out.truncate(len);
    out
}

fn hex(d: impl AsRef<[u8]>) -> String {
    d.as_ref().iter().map(|b| format!("{b:02x}")).collect()
}

async fn put(d: &Daemon, path: &str, body: impl Into<reqwest::Body>) -> reqwest::Response {
    d.client()
        .put(d.url(&format!("/v1/fs/file?path={path}")))
        .header("content-type", "application/octet-stream")
        .body(body)
        .send()
        .await
        .unwrap()
}

async fn get_json(d: &Daemon, path: &str) -> (StatusCode, Value) {
    let r = d.client().get(d.url(path)).send().await.unwrap();
    let s = r.status();
    (s, r.json().await.unwrap_or(Value::Null))
}

/// Names in `dir` that look like our temporaries or staging directories.
fn leftovers(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    for e in walk(dir) {
        let n = e.file_name().unwrap().to_string_lossy().to_string();
        if n.starts_with(".sandbox-agent-") {
            out.push(e.display().to_string());
        }
    }
    out
}

fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    if let Ok(rd) = std::fs::read_dir(dir) {
        for e in rd.flatten() {
            let p = e.path();
            out.push(p.clone());
            if e.file_type().map(|t| t.is_dir()).unwrap_or(false) {
                out.extend(walk(&p));
            }
        }
    }
    out
}

#[tokio::test]
async fn binary_files_round_trip_byte_for_byte() {
    let d = Daemon::start();
    for (i, len) in [0usize, 1, 5 << 20].into_iter().enumerate() {
        let data = pattern(len, i as u64);
        let path = format!("bin/f{len}.bin");
        let r = put(&d, &path, data.clone()).await;
        assert_eq!(r.status(), 200);
        let body: Value = r.json().await.unwrap();
        assert_eq!(body["bytesWritten"], len as u64);
        assert_eq!(body["path"], d.path(&path).display().to_string());
        assert_eq!(std::fs::read(d.path(&path)).unwrap(), data, "on disk");
        let r = d
            .client()
            .get(d.url(&format!("/v1/fs/file?path={path}")))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        assert_eq!(r.content_length(), Some(len as u64));
        let got = r.bytes().await.unwrap();
        assert_eq!(hex(Sha256::digest(&got)), hex(Sha256::digest(&data)));
    }
    assert!(leftovers(&d.work_dir()).is_empty());
}

#[tokio::test]
async fn one_gib_file_round_trips_with_identical_sha256() {
    const CHUNK: usize = 1 << 20;
    const CHUNKS: u64 = 1024;
    let d = Daemon::start();
    let block = Bytes::from(pattern(CHUNK, 7));
    let (htx, hrx) = std::sync::mpsc::channel::<Bytes>();
    let hasher = std::thread::spawn(move || {
        let mut h = Sha256::new();
        for b in hrx {
            h.update(&b);
        }
        hex(h.finalize())
    });
    // Each chunk differs (its index in the first bytes) so a misplaced chunk changes the hash.
    let stream = futures_util::stream::iter((0..CHUNKS).map(move |i| {
        let mut c = block.to_vec();
        c[..8].copy_from_slice(&i.to_le_bytes());
        let c = Bytes::from(c);
        htx.send(c.clone()).unwrap();
        Ok::<_, std::io::Error>(c)
    }));
    let r = put(&d, "big.bin", reqwest::Body::wrap_stream(stream)).await;
    assert_eq!(r.status(), 200, "{:?}", r.text().await);
    let sent = hasher.join().unwrap();
    assert_eq!(
        std::fs::metadata(d.path("big.bin")).unwrap().len(),
        CHUNKS * CHUNK as u64
    );

    let mut r = d
        .client()
        .get(d.url("/v1/fs/file?path=big.bin"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.content_length(), Some(CHUNKS * CHUNK as u64));
    let mut h = Sha256::new();
    let mut n = 0u64;
    while let Some(c) = r.chunk().await.unwrap() {
        n += c.len() as u64;
        h.update(&c);
    }
    assert_eq!(n, CHUNKS * CHUNK as u64);
    assert_eq!(hex(h.finalize()), sent);
    std::fs::remove_file(d.path("big.bin")).unwrap();
}

#[tokio::test]
async fn put_aborted_half_way_keeps_old_content_and_leaves_no_temporary() {
    use std::io::Read;
    let d = Daemon::start();
    assert_eq!(put(&d, "keep.txt", "old content").await.status(), 200);
    let mut s = std::net::TcpStream::connect(&d.addr).unwrap();
    write!(
        s,
        "PUT /v1/fs/file?path=keep.txt HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/octet-stream\r\nContent-Length: 4000000\r\n\r\n"
    )
    .unwrap();
    s.write_all(&pattern(2_000_000, 1)).unwrap();
    s.flush().unwrap();
    // Give the daemon the half body (a temporary file exists now), then vanish.
    eventually(
        Duration::from_secs(10),
        "a temporary file to appear",
        || (!leftovers(&d.work_dir()).is_empty()).then_some(()),
    );
    s.shutdown(std::net::Shutdown::Both).unwrap();
    let mut rest = Vec::new();
    let _ = s.read_to_end(&mut rest);
    drop(s);
    eventually(Duration::from_secs(10), "the temporary file to go", || {
        leftovers(&d.work_dir()).is_empty().then_some(())
    });
    assert_eq!(
        std::fs::read_to_string(d.path("keep.txt")).unwrap(),
        "old content"
    );
}

#[tokio::test]
async fn put_over_the_upload_limit_is_413_with_the_limit_and_keeps_the_old_file() {
    let d = Daemon::builder().args(["--upload-limit", "1K"]).start();
    assert_eq!(put(&d, "f", "old").await.status(), 200);
    // Declared length over the limit.
    let r = put(&d, "f", vec![7u8; 2000]).await;
    assert_eq!(r.status(), 413);
    assert_eq!(r.headers()["content-type"], "application/problem+json");
    assert_eq!(r.json::<Value>().await.unwrap()["limit"], 1024);
    // Chunked body that only turns out too large while streaming.
    let chunks = (0..4).map(|_| Ok::<_, std::io::Error>(Bytes::from(vec![1u8; 400])));
    let r = put(
        &d,
        "f",
        reqwest::Body::wrap_stream(futures_util::stream::iter(chunks)),
    )
    .await;
    assert_eq!(r.status(), 413);
    assert_eq!(r.json::<Value>().await.unwrap()["limit"], 1024);
    assert_eq!(std::fs::read_to_string(d.path("f")).unwrap(), "old");
    assert!(leftovers(&d.work_dir()).is_empty());
    // Exactly the limit is fine.
    assert_eq!(put(&d, "f", vec![1u8; 1024]).await.status(), 200);
}

#[tokio::test]
async fn put_on_a_full_disk_is_507_and_keeps_the_old_file() {
    if !is_root() {
        return skip("mounting a small tmpfs needs root");
    }
    let mnt = tempfile::tempdir().unwrap();
    // A private mount namespace: the 1 MiB tmpfs exists only for the daemon.
    let d = Daemon::builder()
        .wrapper([
            "unshare",
            "-m",
            "sh",
            "-c",
            "mount -t tmpfs -o size=1m tmpfs \"$SA_TEST_MNT\" && exec \"$0\" \"$@\"",
        ])
        .env("SA_TEST_MNT", mnt.path())
        .start();
    let target = format!("{}/f", mnt.path().display());
    assert_eq!(put(&d, &target, "old").await.status(), 200);
    // Declared length: refused by the up-front reservation.
    let r = put(&d, &target, vec![9u8; 3 << 20]).await;
    assert_eq!(r.status(), 507, "{:?}", r.text().await);
    // Chunked: the disk fills while the body streams.
    let chunks = (0..48).map(|_| Ok::<_, std::io::Error>(Bytes::from(vec![9u8; 64 << 10])));
    let r = put(
        &d,
        &target,
        reqwest::Body::wrap_stream(futures_util::stream::iter(chunks)),
    )
    .await;
    assert_eq!(r.status(), 507, "{:?}", r.text().await);
    // Look through the daemon's own mount namespace.
    let seen = PathBuf::from(format!("/proc/{}/root{}", d.pid(), mnt.path().display()));
    assert_eq!(std::fs::read_to_string(seen.join("f")).unwrap(), "old");
    assert!(leftovers(&seen).is_empty(), "{:?}", leftovers(&seen));
}

// ---- tar uploads -------------------------------------------------------------------------

fn octal(field: &mut [u8], v: u64) {
    let s = format!("{:0w$o}", v, w = field.len() - 1);
    field[..s.len()].copy_from_slice(s.as_bytes());
}

/// Appends one raw ustar entry; written by hand so hostile names and links are possible.
fn entry(out: &mut Vec<u8>, name: &str, kind: u8, link: &str, data: &[u8]) {
    let mut h = [0u8; 512];
    h[..name.len()].copy_from_slice(name.as_bytes());
    octal(&mut h[100..108], if kind == b'5' { 0o755 } else { 0o644 });
    octal(&mut h[108..116], 0);
    octal(&mut h[116..124], 0);
    octal(&mut h[124..136], data.len() as u64);
    octal(&mut h[136..148], 1_700_000_000);
    h[156] = kind;
    h[157..157 + link.len()].copy_from_slice(link.as_bytes());
    h[257..263].copy_from_slice(b"ustar\0");
    h[263..265].copy_from_slice(b"00");
    h[148..156].fill(b' ');
    let sum: u64 = h.iter().map(|&b| b as u64).sum();
    let s = format!("{sum:06o}\0 ");
    h[148..156].copy_from_slice(s.as_bytes());
    out.extend_from_slice(&h);
    out.extend_from_slice(data);
    out.resize(out.len().div_ceil(512) * 512, 0);
}

fn finish(mut out: Vec<u8>) -> Vec<u8> {
    out.extend_from_slice(&[0u8; 1024]);
    out
}

fn gzip(data: &[u8]) -> Vec<u8> {
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    e.write_all(data).unwrap();
    e.finish().unwrap()
}

async fn upload(d: &Daemon, dest: &str, body: Vec<u8>, ctype: &str) -> (StatusCode, Value) {
    let r = d
        .client()
        .post(d.url(&format!("/v1/fs/upload-batch?path={dest}")))
        .header("content-type", ctype)
        .body(body)
        .send()
        .await
        .unwrap();
    let s = r.status();
    (s, r.json().await.unwrap_or(Value::Null))
}

fn nested_tar() -> Vec<u8> {
    let mut t = Vec::new();
    entry(&mut t, "./", b'5', "", b"");
    entry(&mut t, "src/", b'5', "", b"");
    entry(&mut t, "src/lib/deep/mod.rs", b'0', "", b"pub fn f() {}\n");
    entry(&mut t, "README.md", b'0', "", b"# hi\n");
    entry(&mut t, "src/lib/link.rs", b'2', "deep/mod.rs", b"");
    entry(&mut t, "src/hard.rs", b'1', "README.md", b"");
    finish(t)
}

#[tokio::test]
async fn upload_batch_extracts_nested_trees_plain_and_gzip() {
    let d = Daemon::start();
    let tar = nested_tar();
    for (dest, body, ctype) in [
        ("plain", tar.clone(), "application/x-tar"),
        ("gz", gzip(&tar), "application/gzip"),
        ("sniffed", gzip(&tar), "application/octet-stream"),
    ] {
        let (s, v) = upload(&d, dest, body, ctype).await;
        assert_eq!(s, 200, "{dest}: {v}");
        assert_eq!(v["truncated"], false);
        let paths: Vec<String> = v["paths"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p.as_str().unwrap().to_string())
            .collect();
        assert!(
            paths.contains(
                &d.path(&format!("{dest}/src/lib/deep/mod.rs"))
                    .display()
                    .to_string()
            ),
            "{paths:?}"
        );
        assert_eq!(
            std::fs::read_to_string(d.path(&format!("{dest}/src/lib/deep/mod.rs"))).unwrap(),
            "pub fn f() {}\n"
        );
        assert_eq!(
            std::fs::read_to_string(d.path(&format!("{dest}/src/lib/link.rs"))).unwrap(),
            "pub fn f() {}\n"
        );
        assert_eq!(
            std::fs::read_to_string(d.path(&format!("{dest}/src/hard.rs"))).unwrap(),
            "# hi\n"
        );
    }
    // Content-Encoding: gzip is honoured too, and a second upload merges into the tree.
    let mut t = Vec::new();
    entry(&mut t, "src/new.rs", b'0', "", b"new");
    entry(&mut t, "README.md", b'0', "", b"replaced");
    let r = d
        .client()
        .post(d.url("/v1/fs/upload-batch?path=plain"))
        .header("content-type", "application/x-tar")
        .header("content-encoding", "gzip")
        .body(gzip(&finish(t)))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(
        std::fs::read_to_string(d.path("plain/README.md")).unwrap(),
        "replaced"
    );
    assert_eq!(
        std::fs::read_to_string(d.path("plain/src/new.rs")).unwrap(),
        "new"
    );
    assert!(
        d.path("plain/src/lib/deep/mod.rs").exists(),
        "merged, not replaced"
    );
    assert!(
        leftovers(&d.work_dir()).is_empty(),
        "{:?}",
        leftovers(&d.work_dir())
    );
}

#[tokio::test]
async fn upload_batch_refuses_hostile_entries_and_writes_nothing() {
    let d = Daemon::start();
    // The destination exists with content that must survive every refused archive.
    std::fs::create_dir_all(d.path("dest/sub")).unwrap();
    std::fs::write(d.path("dest/keep.txt"), "keep").unwrap();
    let outside = d.work_dir().join("outside");
    std::fs::create_dir_all(&outside).unwrap();
    // A symlink already in the destination, pointing out of it.
    std::os::unix::fs::symlink(&outside, d.path("dest/out")).unwrap();
    let before = walk(&d.work_dir());

    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("absolute path", {
            let mut t = Vec::new();
            entry(&mut t, "ok.txt", b'0', "", b"1");
            entry(&mut t, "/tmp/sa-evil", b'0', "", b"x");
            t
        }),
        ("dotdot path", {
            let mut t = Vec::new();
            entry(&mut t, "ok.txt", b'0', "", b"1");
            entry(&mut t, "sub/../../outside/evil", b'0', "", b"x");
            t
        }),
        ("character device", {
            let mut t = Vec::new();
            entry(&mut t, "null", b'3', "", b"");
            t
        }),
        ("fifo", {
            let mut t = Vec::new();
            entry(&mut t, "pipe", b'6', "", b"");
            t
        }),
        ("absolute symlink", {
            let mut t = Vec::new();
            entry(&mut t, "l", b'2', "/etc", b"");
            t
        }),
        ("symlink climbing out", {
            let mut t = Vec::new();
            entry(&mut t, "sub/l", b'2', "../../outside", b"");
            t
        }),
        ("write through an archive symlink", {
            let mut t = Vec::new();
            entry(&mut t, "l", b'2', "sub", b"");
            entry(&mut t, "l/evil", b'0', "", b"x");
            t
        }),
        ("write through a destination symlink", {
            let mut t = Vec::new();
            entry(&mut t, "out/evil", b'0', "", b"x");
            t
        }),
        ("symlink chain escaping on disk", {
            let mut t = Vec::new();
            entry(&mut t, "p/q/", b'5', "", b"");
            entry(&mut t, "p/q/s", b'2', "../..", b"");
            entry(&mut t, "t", b'2', "p/q/s/..", b"");
            t
        }),
        ("symlink via a destination symlink", {
            let mut t = Vec::new();
            entry(&mut t, "v", b'2', "out/..", b"");
            t
        }),
        ("hard link out", {
            let mut t = Vec::new();
            entry(&mut t, "h", b'1', "../outside/x", b"");
            t
        }),
        ("hard link absolute", {
            let mut t = Vec::new();
            entry(&mut t, "h", b'1', "/etc/passwd", b"");
            t
        }),
        ("hard link to a symlink", {
            let mut t = Vec::new();
            entry(&mut t, "a/b/", b'5', "", b"");
            entry(&mut t, "a/b/l", b'2', "../x", b"");
            entry(&mut t, "h", b'1', "a/b/l", b"");
            t
        }),
        ("hard link to nothing extracted", {
            let mut t = Vec::new();
            entry(&mut t, "h", b'1', "keep.txt", b"");
            t
        }),
        ("file over a directory", {
            let mut t = Vec::new();
            entry(&mut t, "ok.txt", b'0', "", b"1");
            entry(&mut t, "sub", b'0', "", b"x");
            t
        }),
        ("truncated archive", {
            let mut t = Vec::new();
            entry(&mut t, "ok.txt", b'0', "", &[1u8; 2000]);
            t.truncate(1024);
            t
        }),
    ];
    for (what, t) in cases {
        let body = if what == "truncated archive" {
            t
        } else {
            finish(t)
        };
        let (s, v) = upload(&d, "dest", body, "application/x-tar").await;
        assert!(s == 400 || s == 409, "{what}: {s} {v}");
        let expected = match what {
            "absolute path" => "absolute paths",
            "dotdot path" => "`..`",
            "character device" | "fifo" => "device nodes",
            "absolute symlink" => "absolute symlink",
            "write through an archive symlink" => "crosses a symlink",
            "write through a destination symlink" => "crosses a symlink in the destination",
            "hard link out" | "hard link absolute" => "hard link target leaves",
            "hard link to nothing extracted" | "hard link to a symlink" => "not an earlier file",
            "file over a directory" => "a directory exists",
            "truncated archive" => "malformed",
            _ => "symlink target leaves the destination",
        };
        let detail = v["detail"].as_str().unwrap_or_default();
        assert!(detail.contains(expected), "{what}: {v}");
        assert_eq!(walk(&d.work_dir()), before, "{what}: the disk changed");
    }
    assert!(!Path::new("/tmp/sa-evil").exists());
    assert_eq!(
        std::fs::read_to_string(d.path("dest/keep.txt")).unwrap(),
        "keep"
    );
    assert_eq!(std::fs::read_dir(&outside).unwrap().count(), 0);

    // A refused archive into a destination that did not exist leaves no directory behind.
    let mut t = Vec::new();
    entry(&mut t, "a/ok", b'0', "", b"1");
    entry(&mut t, "../x", b'0', "", b"x");
    let (s, _) = upload(&d, "fresh/nested/dest", finish(t), "application/x-tar").await;
    assert_eq!(s, 400);
    assert!(!d.path("fresh").exists());
}

#[tokio::test]
async fn upload_batch_enforces_entry_and_byte_limits() {
    let d = Daemon::builder()
        .args(["--upload-max-entries", "3", "--upload-limit", "64K"])
        .start();
    let mut t = Vec::new();
    for i in 0..4 {
        entry(&mut t, &format!("f{i}"), b'0', "", b"x");
    }
    let (s, v) = upload(&d, "a", finish(t), "application/x-tar").await;
    assert_eq!(s, 413, "{v}");
    assert_eq!(v["limit"], 3);
    assert!(!d.path("a").exists());
    // A gzip bomb: tiny on the wire, over the limit once extracted.
    let mut t = Vec::new();
    entry(&mut t, "big", b'0', "", &vec![0u8; 200 << 10]);
    let (s, v) = upload(&d, "b", gzip(&finish(t)), "application/gzip").await;
    assert_eq!(s, 413, "{v}");
    assert_eq!(v["limit"], 64 << 10);
    assert!(!d.path("b").exists());
    assert!(leftovers(&d.work_dir()).is_empty());
}

#[tokio::test]
async fn upload_batch_lists_the_first_1024_paths() {
    let d = Daemon::start();
    let mut t = Vec::new();
    for i in 0..1100 {
        entry(&mut t, &format!("f{i:04}"), b'0', "", b"");
    }
    let (s, v) = upload(&d, "many", finish(t), "application/x-tar").await;
    assert_eq!(s, 200);
    assert_eq!(v["paths"].as_array().unwrap().len(), 1024);
    assert_eq!(v["truncated"], true);
    assert_eq!(std::fs::read_dir(d.path("many")).unwrap().count(), 1100);
}

// ---- fs root ------------------------------------------------------------------------------

#[tokio::test]
async fn fs_root_confines_every_endpoint_including_symlinks() {
    let outer = tempfile::tempdir().unwrap();
    let root = outer.path().join("root");
    let secret = outer.path().join("secret");
    std::fs::create_dir_all(root.join("inside")).unwrap();
    std::fs::create_dir_all(&secret).unwrap();
    std::fs::write(secret.join("s.txt"), "secret").unwrap();
    std::fs::write(root.join("inside/ok.txt"), "ok").unwrap();
    std::os::unix::fs::symlink(&secret, root.join("abs-out")).unwrap();
    std::os::unix::fs::symlink("../secret", root.join("rel-out")).unwrap();
    std::os::unix::fs::symlink("inside", root.join("rel-in")).unwrap();
    // The harness's work dir lies outside this root, so every path here is absolute.
    let d = Daemon::builder().arg("--fs-root").arg(&root).start();
    let r_ = root.display().to_string();
    let u = |q: &str| d.url(&q.replace("R/", &format!("{r_}/")));
    let c = d.client();
    let forbidden = [
        c.get(u("/v1/fs/file?path=/etc/hostname")),
        c.get(u("/v1/fs/file?path=hello.txt")),
        c.get(u("/v1/fs/file?path=R/../secret/s.txt")),
        c.get(u("/v1/fs/file?path=R/abs-out/s.txt")),
        c.get(u("/v1/fs/file?path=R/rel-out/s.txt")),
        c.get(u("/v1/fs/entries?path=R/rel-out")),
        c.get(u("/v1/fs/stat?path=R/abs-out")),
        c.put(u("/v1/fs/file?path=R/rel-out/new.txt"))
            .header("content-type", "application/octet-stream")
            .body("x"),
        c.put(u("/v1/fs/file?path=R/abs-out/sub/new.txt"))
            .header("content-type", "application/octet-stream")
            .body("x"),
        c.post(u("/v1/fs/mkdir?path=R/rel-out/dir")),
        c.delete(u("/v1/fs/entry?path=R/rel-out/s.txt")),
        c.post(u("/v1/fs/move"))
            .json(&json!({"from":format!("{r_}/rel-out/s.txt"),"to":format!("{r_}/stolen")})),
        c.post(u("/v1/fs/move")).json(
            &json!({"from":format!("{r_}/inside/ok.txt"),"to":format!("{r_}/abs-out/ok.txt")}),
        ),
        c.post(u("/v1/fs/upload-batch?path=R/rel-out"))
            .header("content-type", "application/x-tar")
            .body(finish(Vec::new())),
        c.get(u(&format!(
            "/v1/config/mcp?directory={}&mcpName=x",
            secret.display()
        ))),
    ];
    for req in forbidden {
        let r = req.send().await.unwrap();
        let url = r.url().to_string();
        assert_eq!(r.status(), 403, "{url}: {:?}", r.text().await);
    }
    assert_eq!(
        std::fs::read_dir(&secret).unwrap().count(),
        1,
        "nothing written outside"
    );
    assert_eq!(
        std::fs::read_to_string(secret.join("s.txt")).unwrap(),
        "secret"
    );
    assert!(root.join("inside/ok.txt").exists());
    // Symlinks that stay beneath the root work; the root itself is listable.
    let r = c
        .get(u("/v1/fs/file?path=R/rel-in/ok.txt"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.text().await.unwrap(), "ok");
    let (s, v) = get_json(&d, &format!("/v1/fs/entries?path={r_}")).await;
    assert_eq!(s, 200);
    assert_eq!(v.as_array().unwrap().len(), 4);
    // Deleting the link removes the link, not what it points to.
    let r = c
        .delete(u("/v1/fs/entry?path=R/abs-out"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert!(secret.join("s.txt").exists());
}

#[tokio::test]
async fn upload_batch_aborted_half_way_leaves_nothing_behind() {
    use std::io::Read;
    let d = Daemon::start();
    let mut t = Vec::new();
    for i in 0..40 {
        entry(&mut t, &format!("d/f{i}"), b'0', "", &pattern(100_000, i));
    }
    let tar = finish(t);
    let mut s = std::net::TcpStream::connect(&d.addr).unwrap();
    write!(
        s,
        "POST /v1/fs/upload-batch?path=new/dest HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/x-tar\r\nContent-Length: {}\r\n\r\n",
        tar.len()
    )
    .unwrap();
    s.write_all(&tar[..tar.len() / 2]).unwrap();
    // The half-received body is spooled into an unnamed file under the data dir: it is on
    // disk once the daemon holds it open (a deleted `/proc/<pid>/fd` target).
    let spool = d.data_dir().join("tmp");
    eventually(Duration::from_secs(10), "the body to be spooled", || {
        spooled_bytes(d.pid(), &spool)
            .filter(|&n| n > 0)
            .map(|_| ())
    });
    // The entries that arrived whole are being extracted, into a hidden staging directory
    // beside the destination (its missing parent made for it); the destination does not exist
    // before the whole body arrived, and the spool has no name.
    eventually(Duration::from_secs(10), "the first entries staged", || {
        walk(&d.work_dir())
            .iter()
            .any(|p| p.file_name().is_some_and(|n| n == "f0"))
            .then_some(())
    });
    assert!(!d.path("new/dest").exists());
    let staging = d.path("new");
    for p in walk(&d.work_dir()) {
        let under_staging = p
            .strip_prefix(&staging)
            .ok()
            .and_then(|r| r.components().next())
            .is_some_and(|c| {
                c.as_os_str()
                    .to_string_lossy()
                    .starts_with(".sandbox-agent-upload-")
            });
        assert!(
            p == staging || under_staging,
            "outside the staging directory: {p:?}"
        );
    }
    assert!(walk(&spool).is_empty(), "{:?}", walk(&spool));
    s.shutdown(std::net::Shutdown::Both).unwrap();
    let _ = s.read_to_end(&mut Vec::new());
    // The spool is closed (and so gone); the staging directory and the parent the upload made
    // are removed: nothing was created.
    eventually(Duration::from_secs(10), "the spool to be closed", || {
        spooled_bytes(d.pid(), &spool).is_none().then_some(())
    });
    eventually(
        Duration::from_secs(10),
        "the staging directory removed",
        || (leftovers(&d.work_dir()).is_empty() && !d.path("new").exists()).then_some(()),
    );
}

/// The size of the daemon's open unnamed spool file under `dir`, if it holds one.
fn spooled_bytes(pid: u32, dir: &Path) -> Option<u64> {
    let prefix = dir.to_string_lossy().to_string();
    for e in std::fs::read_dir(format!("/proc/{pid}/fd")).ok()?.flatten() {
        let Ok(target) = std::fs::read_link(e.path()) else {
            continue;
        };
        let t = target.to_string_lossy();
        if t.starts_with(&prefix) && t.ends_with("(deleted)") {
            return std::fs::metadata(e.path()).ok().map(|m| m.len());
        }
    }
    None
}

#[tokio::test]
async fn move_of_a_file_across_filesystems_copies_then_removes_the_source() {
    use std::os::unix::fs::MetadataExt;
    let shm = Path::new("/dev/shm");
    let d = Daemon::start();
    let same_fs = std::fs::metadata(shm)
        .map(|m| m.dev() == std::fs::metadata(d.work_dir()).unwrap().dev())
        .unwrap_or(true);
    if same_fs {
        return skip("no /dev/shm on another filesystem than the work dir");
    }
    let src = tempfile::tempdir_in(shm).unwrap();
    let from = src.path().join("a.bin");
    let data = pattern(3 << 20, 11);
    std::fs::write(&from, &data).unwrap();
    let c = d.client();
    let r = c
        .post(d.url("/v1/fs/move"))
        .json(&json!({"from": from, "to": "moved/a.bin"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200, "{:?}", r.text().await);
    assert_eq!(std::fs::read(d.path("moved/a.bin")).unwrap(), data);
    assert!(!from.exists());
    assert!(leftovers(&d.work_dir()).is_empty());
    // Directories do not move across filesystems: a clear 400, nothing touched.
    std::fs::create_dir_all(src.path().join("dir")).unwrap();
    let r = c
        .post(d.url("/v1/fs/move"))
        .json(&json!({"from": src.path().join("dir"), "to": "dir"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    assert!(src.path().join("dir").is_dir());
}

#[tokio::test]
async fn put_keeps_the_permission_bits_of_the_file_it_replaces_but_not_setuid() {
    use std::os::unix::fs::PermissionsExt;
    let d = Daemon::start();
    std::fs::write(d.path("run.sh"), "old").unwrap();
    std::fs::set_permissions(d.path("run.sh"), std::fs::Permissions::from_mode(0o4750)).unwrap();
    assert_eq!(put(&d, "run.sh", "#!/bin/sh\n").await.status(), 200);
    let mode = std::fs::metadata(d.path("run.sh"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o7777, 0o750);
    assert_eq!(
        std::fs::read_to_string(d.path("run.sh")).unwrap(),
        "#!/bin/sh\n"
    );
}
