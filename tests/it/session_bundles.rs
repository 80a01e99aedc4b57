//! Session bundles (`/v1/acp/{serverId}/bundle`): a mock session exported from daemon A,
//! A's HOME, state dir and work dir removed, imported into daemon B (other HOME, state dir, work
//! dir, a cwd mapping) remembers its codeword through the restore's `session/load` and replays
//! its events with the original ids; tampered, truncated and hostile bundles are refused with
//! nothing written; conflicts and a turn in progress are 409.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::{Value, json};

use crate::durable::{Sse, chunk_text, post, prompt, request, server, state_args};
use crate::support::Daemon;

const SECS10: Duration = Duration::from_secs(10);

struct Dirs {
    _tmp: tempfile::TempDir,
    work: PathBuf,
    state: PathBuf,
    home: PathBuf,
}

fn dirs() -> Dirs {
    let tmp = tempfile::tempdir().unwrap();
    let (work, state, home) = (
        tmp.path().join("work"),
        tmp.path().join("state"),
        tmp.path().join("home"),
    );
    for d in [&work, &home] {
        std::fs::create_dir_all(d).unwrap();
    }
    Dirs {
        _tmp: tmp,
        work,
        state,
        home,
    }
}

fn daemon(d: &Dirs, extra: &[&str]) -> Daemon {
    let mut args = state_args(&d.state);
    args.extend(extra.iter().map(|s| s.to_string()));
    Daemon::builder()
        .work_dir(&d.work)
        .env("HOME", &d.home)
        .args(args)
        .start()
}

/// `initialize` + `session/new` (cwd: the daemon's work dir) on the mock; the session id.
async fn session(d: &Daemon, id: &str, cwd: &Path) -> String {
    let (s, b) = post(
        d,
        &format!("/v1/acp/{id}?agent=mock"),
        &request(
            json!(0),
            "initialize",
            json!({"protocolVersion": 1, "clientCapabilities": {}}),
        ),
    )
    .await;
    assert_eq!(s, 200, "{b}");
    let servers = json!([{"name": "m", "command": "/bin/true", "args": [],
        "env": [{"name": "TOKEN", "value": "s3cret"}]}]);
    let (s, b) = post(
        d,
        &format!("/v1/acp/{id}"),
        &request(
            json!(1),
            "session/new",
            json!({"cwd": cwd, "mcpServers": servers}),
        ),
    )
    .await;
    assert_eq!(s, 200, "{b}");
    b["result"]["sessionId"].as_str().unwrap().to_string()
}

pub(crate) async fn export(d: &Daemon, id: &str) -> (u16, Vec<u8>) {
    let r = d
        .client()
        .get(d.url(&format!("/v1/acp/{id}/bundle")))
        .send()
        .await
        .unwrap();
    let s = r.status().as_u16();
    if s == 200 {
        assert_eq!(r.headers()["content-type"], "application/gzip");
    }
    (s, r.bytes().await.unwrap().to_vec())
}

pub(crate) async fn import(d: &Daemon, id: &str, query: &str, bundle: Vec<u8>) -> (u16, Value) {
    let r = d
        .client()
        .post(d.url(&format!("/v1/acp/{id}/bundle{query}")))
        .header("content-type", "application/gzip")
        .body(bundle)
        .send()
        .await
        .unwrap();
    let s = r.status().as_u16();
    (
        s,
        serde_json::from_slice(&r.bytes().await.unwrap()).unwrap_or(Value::Null),
    )
}

/// A mock session with a codeword in daemon A: (A, its dirs, the session id, the ids A's
/// stream showed).
async fn a_with_codeword() -> (Daemon, Dirs, String, Vec<u64>) {
    let da = dirs();
    let a = daemon(&da, &[]);
    let sid = session(&a, "s1", &da.work).await;
    let (s, b) = post(
        &a,
        "/v1/acp/s1",
        &prompt(json!(2), &sid, "codeword PLUM-42"),
    )
    .await;
    assert_eq!(s, 200, "{b}");
    let mut sse = Sse::open(&a, "s1", None).await;
    let evs = sse
        .until(SECS10, |e| {
            e.iter().any(|e| chunk_text(e).contains("codeword PLUM-42"))
        })
        .await;
    let ids = evs.iter().filter_map(|e| e.id).collect();
    (a, da, sid, ids)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mock_session_moves_to_a_fresh_daemon_and_remembers_its_codeword() {
    let (a, da, sid, ids) = a_with_codeword().await;
    let (s, bundle) = export(&a, "s1").await;
    assert_eq!(s, 200);
    // The manifest: the session with its cwd, the MCP secret not carried, every file hashed.
    let m = manifest_of(&bundle);
    assert_eq!(m["version"], 1);
    assert_eq!(m["agent"], "mock");
    assert_eq!(m["sessions"][0]["sessionId"], sid.as_str());
    assert_eq!(m["sessions"][0]["cwd"], da.work.display().to_string());
    assert!(!String::from_utf8_lossy(&bundle).contains("s3cret"));
    assert!(!m.to_string().contains("s3cret"), "{m}");
    let paths: Vec<&str> = m["files"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["path"].as_str().unwrap())
        .collect();
    assert_eq!(
        paths,
        [
            "events.log".to_string(),
            format!("files/workdir/.mock-agent-sessions/{sid}.json")
        ]
    );
    // A goes, with everything it had on disk.
    drop(a);
    let old_work = da.work.display().to_string();
    for d in [&da.work, &da.state, &da.home] {
        std::fs::remove_dir_all(d).unwrap();
    }

    let db = dirs();
    let b = daemon(&db, &[]);
    let q = format!("?cwd={}={}", old_work, db.work.display());
    let (s, body) = import(&b, "s1", &q, bundle).await;
    assert_eq!(s, 201, "{body}");
    assert_eq!(body["sessions"], json!([sid]));
    let row = server(&b, "s1").await;
    assert_eq!(row["status"], "exited", "{row}");
    assert_eq!(row["agent"], "mock");
    // The session inventory lists the imported session, under its mapped cwd.
    let inv = b.get_json("/v1/sessions?serverId=s1").await;
    let listed = &inv["sessions"][0];
    assert_eq!(listed["sessionId"], sid, "{inv}");
    assert_eq!(listed["cwd"], db.work.display().to_string(), "{inv}");
    // The session's cwd is the mapped one.
    let meta: Value =
        serde_json::from_slice(&std::fs::read(db.state.join("acp/s1/meta.json")).unwrap()).unwrap();
    assert_eq!(
        meta["sessions"][0]["cwd"],
        db.work.display().to_string(),
        "{meta}"
    );

    // The log replays with A's ids.
    let mut all = Sse::open(&b, "s1", None).await;
    let replay = all.until(SECS10, |e| e.len() >= ids.len()).await;
    let got: Vec<u64> = replay.iter().filter_map(|e| e.id).collect();
    assert_eq!(&got[..ids.len()], &ids[..]);

    // The next prompt restores the session (session/load) and the agent remembers.
    let (s, body) = post(&b, "/v1/acp/s1", &prompt(json!(3), &sid, "/history")).await;
    assert_eq!(s, 200, "{body}");
    let after = all
        .until(SECS10, |e| {
            e.iter().any(|e| chunk_text(e).starts_with("history:"))
        })
        .await;
    let restored = after
        .iter()
        .find(|e| e.data["method"] == "_sandboxagent/restored")
        .expect("a restored notification");
    assert_eq!(restored.data["params"]["reason"], "import");
    assert_eq!(
        restored.data["params"]["sessions"],
        json!([{"sessionId": sid, "how": "session/load"}])
    );
    let h = after
        .iter()
        .find(|e| chunk_text(e).starts_with("history:"))
        .unwrap();
    assert_eq!(chunk_text(h), "history: codeword PLUM-42");
    // New ids continue past the imported ones.
    let last = *ids.last().unwrap();
    assert!(
        after
            .iter()
            .filter_map(|e| e.id)
            .skip(ids.len())
            .all(|i| i > last)
    );
    // A second import of the same serverId is a conflict.
    let (s, _) = export(&b, "s1").await;
    assert_eq!(s, 200);
}

/// The bundle's manifest.json.
fn manifest_of(bundle: &[u8]) -> Value {
    for (path, _, data) in entries(bundle) {
        if path == "manifest.json" {
            return serde_json::from_slice(&data).unwrap();
        }
    }
    panic!("no manifest");
}

/// (path, entry type, bytes) of every entry.
fn entries(bundle: &[u8]) -> Vec<(String, tar::EntryType, Vec<u8>)> {
    let mut ar = tar::Archive::new(flate2::read::GzDecoder::new(bundle));
    ar.entries()
        .unwrap()
        .map(|e| {
            let mut e = e.unwrap();
            let p = e.path().unwrap().display().to_string();
            let t = e.header().entry_type();
            let mut v = Vec::new();
            e.read_to_end(&mut v).unwrap();
            (p, t, v)
        })
        .collect()
}

/// A bundle of these entries; `raw_name` writes the name bytes as given (no checks).
fn build(items: &[(&str, tar::EntryType, &[u8], &str)]) -> Vec<u8> {
    let gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    let mut b = tar::Builder::new(gz);
    for (name, kind, data, link) in items {
        let mut h = tar::Header::new_gnu();
        {
            let old = h.as_old_mut();
            old.name = [0; 100];
            old.name[..name.len()].copy_from_slice(name.as_bytes());
            if !link.is_empty() {
                old.linkname[..link.len()].copy_from_slice(link.as_bytes());
            }
        }
        h.set_size(data.len() as u64);
        h.set_mode(0o600);
        h.set_entry_type(*kind);
        h.set_cksum();
        b.append(&h, *data).unwrap();
    }
    b.into_inner().unwrap().finish().unwrap()
}

/// Nothing of serverId `id` in daemon B: not listed, no state entry, no staging left, no mock
/// session file.
async fn nothing_written(b: &Daemon, d: &Dirs, id: &str) {
    assert!(
        !b.servers().await.iter().any(|s| s["serverId"] == id),
        "{id} listed"
    );
    assert!(!d.state.join("acp").join(id).exists());
    let staged = d.state.join("imports");
    assert!(
        !staged.exists() || std::fs::read_dir(&staged).unwrap().next().is_none(),
        "staging left behind"
    );
    assert!(!d.work.join(".mock-agent-sessions").exists());
    assert!(std::fs::read_dir(&d.home).unwrap().next().is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tampered_truncated_and_hostile_bundles_are_refused_with_nothing_written() {
    let (a, _da, sid, _) = a_with_codeword().await;
    let (s, good) = export(&a, "s1").await;
    assert_eq!(s, 200);
    let items = entries(&good);
    let session_file = format!("files/workdir/.mock-agent-sessions/{sid}.json");

    let db = dirs();
    let b = daemon(&db, &["--bundle-max-bytes", "64K"]);

    // Tampered: one byte of the agent's file changed, the manifest left as it was.
    let tampered: Vec<(String, tar::EntryType, Vec<u8>)> = items
        .iter()
        .map(|(p, t, d)| {
            let mut d = d.clone();
            if *p == session_file {
                d[2] ^= 1;
            }
            (p.clone(), *t, d)
        })
        .collect();
    let owned: Vec<(&str, tar::EntryType, &[u8], &str)> = tampered
        .iter()
        .map(|(p, t, d)| (p.as_str(), *t, &d[..], ""))
        .collect();
    let (s, p) = import(&b, "t1", "", build(&owned)).await;
    assert_eq!(s, 400, "{p}");
    assert!(p["detail"].as_str().unwrap().contains("sha256"), "{p}");
    nothing_written(&b, &db, "t1").await;

    // Truncated: the good bundle cut anywhere.
    for cut in [good.len() / 3, good.len() - 5] {
        let (s, p) = import(&b, "t2", "", good[..cut].to_vec()).await;
        assert_eq!(s, 400, "{p}");
        nothing_written(&b, &db, "t2").await;
    }

    // Hostile entries, each placed before the rest of a valid bundle.
    let hostile: [(&str, tar::EntryType, &str); 5] = [
        ("files/workdir/../../escape", tar::EntryType::Regular, ""),
        ("/tmp/absolute-escape", tar::EntryType::Regular, ""),
        ("files/workdir/link", tar::EntryType::Symlink, "/etc"),
        ("files/workdir/hard", tar::EntryType::Link, "/etc/passwd"),
        ("files/workdir/dev", tar::EntryType::Char, ""),
    ];
    for (name, kind, link) in hostile {
        let mut all: Vec<(&str, tar::EntryType, &[u8], &str)> = vec![(name, kind, b"x", link)];
        all.extend(items.iter().map(|(p, t, d)| (p.as_str(), *t, &d[..], "")));
        let (s, p) = import(&b, "h1", "", build(&all)).await;
        assert_eq!(s, 400, "{name}: {p}");
        nothing_written(&b, &db, "h1").await;
    }
    assert!(!db.work.parent().unwrap().join("escape").exists());
    assert!(!Path::new("/tmp/absolute-escape").exists());

    // Not a gzip at all, a bad mapping, a wrong content type.
    let (s, _) = import(&b, "h2", "", b"plain text".to_vec()).await;
    assert_eq!(s, 400);
    let (s, p) = import(&b, "h2", "?cwd=relative=/x", good.clone()).await;
    assert_eq!(s, 400, "{p}");
    nothing_written(&b, &db, "h2").await;

    // Over --bundle-max-bytes: 413, nothing written.
    let big = {
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::none());
        gz.write_all(&vec![7u8; 100 * 1024]).unwrap();
        gz.finish().unwrap()
    };
    let (s, p) = import(&b, "h3", "", big).await;
    assert_eq!(s, 413, "{p}");
    nothing_written(&b, &db, "h3").await;
    // Small as sent, over the cap unpacked (1 MiB of zeros).
    let zeros = vec![0u8; 1 << 20];
    let bomb = build(&[("files/workdir/zeros", tar::EntryType::Regular, &zeros, "")]);
    assert!(bomb.len() < 64 * 1024);
    let (s, p) = import(&b, "h4", "", bomb).await;
    assert_eq!(s, 413, "{p}");
    nothing_written(&b, &db, "h4").await;

    // An unknown agent: 409 naming it.
    let renamed: Vec<(String, tar::EntryType, Vec<u8>)> = items
        .iter()
        .map(|(p, t, d)| {
            let mut d = d.clone();
            if p == "manifest.json" {
                let mut m: Value = serde_json::from_slice(&d).unwrap();
                m["agent"] = json!("no-such-agent");
                d = serde_json::to_vec(&m).unwrap();
            }
            (p.clone(), *t, d)
        })
        .collect();
    let owned: Vec<(&str, tar::EntryType, &[u8], &str)> = renamed
        .iter()
        .map(|(p, t, d)| (p.as_str(), *t, &d[..], ""))
        .collect();
    let (s, p) = import(&b, "u1", "", build(&owned)).await;
    assert_eq!(s, 409, "{p}");
    assert_eq!(p["agent"], "no-such-agent");
    nothing_written(&b, &db, "u1").await;

    // The good bundle goes in; the same serverId again is 409.
    let (s, p) = import(&b, "ok", "", good.clone()).await;
    assert_eq!(s, 201, "{p}");
    let (s, p) = import(&b, "ok", "", good.clone()).await;
    assert_eq!(s, 409, "{p}");
    // Under another serverId its session file would overwrite the first import's: 409.
    let (s, p) = import(&b, "ok2", "", good).await;
    assert_eq!(s, 409, "{p}");
    assert!(p["path"].as_str().unwrap().ends_with(".json"), "{p}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn export_is_refused_while_a_turn_runs_and_for_unknown_ids() {
    let da = dirs();
    let a = daemon(&da, &[]);
    let sid = session(&a, "s1", &da.work).await;
    // A prompt waiting for a permission answer holds the turn open.
    let (client, url) = (a.client(), a.url("/v1/acp/s1"));
    let body = prompt(json!(5), &sid, "/permission").to_string();
    let turn = tokio::spawn(async move {
        client
            .post(url)
            .header("content-type", "application/json")
            .body(body)
            .send()
            .await
    });
    let mut sse = Sse::open(&a, "s1", None).await;
    sse.until(SECS10, |e| {
        e.iter()
            .any(|e| e.data["method"] == "session/request_permission")
    })
    .await;
    let (s, body) = export(&a, "s1").await;
    assert_eq!(s, 409, "{}", String::from_utf8_lossy(&body));
    turn.abort();
    let (s, _) = export(&a, "nope").await;
    assert_eq!(s, 404);
    // Without --state-dir there is nothing durable to export or import into.
    let dn = dirs();
    let n = Daemon::builder()
        .work_dir(&dn.work)
        .env("HOME", &dn.home)
        .start();
    let (s, body) = import(&n, "x", "", b"\x1f\x8b".to_vec()).await;
    assert_eq!(s, 409, "{body}");
}

/// The CLI: `acp export > f.tgz` from A, `acp import --cwd OLD=NEW < f.tgz` into B.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_exports_to_stdout_and_imports_from_stdin() {
    let (a, da, sid, _) = a_with_codeword().await;
    let file = da._tmp.path().join("s1.tgz");
    let bin = env!("CARGO_BIN_EXE_sandbox-agent");
    let out = std::process::Command::new(bin)
        .args(["acp", "export", "s1", "--url", &a.url("")])
        .stdout(std::fs::File::create(&file).unwrap())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        manifest_of(&std::fs::read(&file).unwrap())["sessions"][0]["sessionId"],
        sid.as_str()
    );

    let db = dirs();
    let b = daemon(&db, &[]);
    let map = format!("{}={}", da.work.display(), db.work.display());
    let out = std::process::Command::new(bin)
        .args([
            "acp",
            "import",
            "moved",
            "--cwd",
            &map,
            "--json",
            "--url",
            &b.url(""),
        ])
        .stdin(std::fs::File::open(&file).unwrap())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let done: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(done["sessions"], json!([sid]));
    let (s, body) = post(&b, "/v1/acp/moved", &prompt(json!(3), &sid, "/history")).await;
    assert_eq!(s, 200, "{body}");
    let mut sse = Sse::open(&b, "moved", None).await;
    sse.until(SECS10, |e| {
        e.iter()
            .any(|e| chunk_text(e) == "history: codeword PLUM-42")
    })
    .await;
    // Importing the same again is refused (exit 65, a problem on stderr).
    let out = std::process::Command::new(bin)
        .args(["acp", "import", "moved", "--url", &b.url("")])
        .stdin(std::fs::File::open(&file).unwrap())
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(65),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
