//! Agents and their installer, end to end: a loopback ACP registry served by the test (real
//! registry.json, real .tar.gz/.zip/.tar.bz2 archives holding an executable ACP agent), checksums, hostile
//! archives, fallback when the registry is down, one download for concurrent installs,
//! `--require-preinstall`, the CLI, and real agents installed from npm.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Body;
use axum::http::{Method, Request, header};
use serde_json::{Value, json};
use sha2::Digest;

use crate::support::app::App;
use crate::support::{BIN, Daemon, descendants, eventually_async, on_path, pid_alive};

/// A tiny HTTP/1.1 file server on loopback that counts the requests for each path.
struct FileServer {
    addr: String,
    hits: Arc<Mutex<HashMap<String, usize>>>,
}

impl FileServer {
    /// `routes`: path → (body, delay before answering).
    fn start(routes: Vec<(String, Vec<u8>, Duration)>) -> FileServer {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let hits: Arc<Mutex<HashMap<String, usize>>> = Arc::default();
        let routes: Arc<HashMap<String, (Vec<u8>, Duration)>> =
            Arc::new(routes.into_iter().map(|(p, b, d)| (p, (b, d))).collect());
        let h = hits.clone();
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                let Ok(conn) = conn else { continue };
                let (routes, hits) = (routes.clone(), h.clone());
                std::thread::spawn(move || serve_one(conn, &routes, &hits));
            }
        });
        FileServer { addr, hits }
    }

    fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    fn hits(&self, path: &str) -> usize {
        self.hits.lock().unwrap().get(path).copied().unwrap_or(0)
    }
}

fn serve_one(
    mut conn: TcpStream,
    routes: &HashMap<String, (Vec<u8>, Duration)>,
    hits: &Mutex<HashMap<String, usize>>,
) {
    let mut reader = BufReader::new(conn.try_clone().unwrap());
    let mut request_line = String::new();
    if reader.read_line(&mut request_line).is_err() {
        return;
    }
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).unwrap_or(0) == 0 || line == "\r\n" {
            break;
        }
    }
    let path = request_line
        .split_whitespace()
        .nth(1)
        .unwrap_or("/")
        .to_string();
    *hits.lock().unwrap().entry(path.clone()).or_default() += 1;
    let (status, body, delay) = match routes.get(&path) {
        Some((b, d)) => ("200 OK", b.clone(), *d),
        None => ("404 Not Found", b"not found".to_vec(), Duration::ZERO),
    };
    std::thread::sleep(delay);
    let _ = write!(
        conn,
        "HTTP/1.1 {status}\r\nContent-Length: {}\r\nContent-Type: application/octet-stream\r\nConnection: close\r\n\r\n",
        body.len()
    );
    let _ = conn.write_all(&body);
}

/// One entry of a test archive; paths are written raw so hostile names can be built.
#[derive(Clone)]
enum Item<'a> {
    File(&'a str, &'a [u8], u32),
    Symlink(&'a str, &'a str),
    Hardlink(&'a str, &'a str),
    CharDevice(&'a str),
}

fn tar_gz(items: &[Item]) -> Vec<u8> {
    let gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    tar_into(gz, items).finish().unwrap()
}

fn tar_bz2(items: &[Item]) -> Vec<u8> {
    let bz = bzip2::write::BzEncoder::new(Vec::new(), bzip2::Compression::fast());
    tar_into(bz, items).finish().unwrap()
}

/// A zip archive; unix modes go into the external attributes, as zip tools on Linux write them.
fn zip(items: &[Item]) -> Vec<u8> {
    use zip::write::SimpleFileOptions;
    let mut w = zip::ZipWriter::new(std::io::Cursor::new(Vec::new()));
    let opts = SimpleFileOptions::default().compression_method(zip::CompressionMethod::Deflated);
    for item in items {
        match item {
            Item::File(name, data, mode) => {
                w.start_file(*name, opts.unix_permissions(*mode)).unwrap();
                w.write_all(data).unwrap();
            }
            Item::Symlink(name, target) => w.add_symlink(*name, *target, opts).unwrap(),
            Item::Hardlink(..) | Item::CharDevice(..) => {
                panic!("zip archives have no hard links or devices")
            }
        }
    }
    w.finish().unwrap().into_inner()
}

/// A zip archive whose last entry `pkg/bomb` declares `declared` bytes in its local header and
/// in the central directory but inflates to `real` zero bytes (a bomb behind a small size).
fn lying_zip(script: &[u8], declared: u32, real: usize) -> Vec<u8> {
    let bomb = vec![0u8; real];
    let mut bytes = zip(&[
        Item::File("pkg/bin/test-agent", script, 0o755),
        Item::File("pkg/bomb", &bomb, 0o644),
    ]);
    let name = b"pkg/bomb";
    // (signature, offset of the uncompressed size, offset of the name length) of the local
    // file header and of the central directory header.
    for (sig, size_at, name_len_at, name_at) in [
        (*b"PK\x03\x04", 22usize, 26usize, 30usize),
        (*b"PK\x01\x02", 24, 28, 46),
    ] {
        let at = (0..bytes.len() - name_at)
            .find(|&i| {
                bytes[i..i + 4] == sig
                    && u16::from_le_bytes([bytes[i + name_len_at], bytes[i + name_len_at + 1]])
                        as usize
                        == name.len()
                    && &bytes[i + name_at..i + name_at + name.len()] == name
            })
            .expect("the bomb's header");
        bytes[at + size_at..at + size_at + 4].copy_from_slice(&declared.to_le_bytes());
    }
    bytes
}

fn tar_into<W: Write>(w: W, items: &[Item]) -> W {
    let mut b = tar::Builder::new(w);
    for item in items {
        let mut h = tar::Header::new_gnu();
        let (name, data): (&str, &[u8]) = match item {
            Item::File(name, data, mode) => {
                h.set_entry_type(tar::EntryType::Regular);
                h.set_mode(*mode);
                h.set_size(data.len() as u64);
                (name, data)
            }
            Item::Symlink(name, target) => {
                h.set_entry_type(tar::EntryType::Symlink);
                h.set_mode(0o777);
                h.set_size(0);
                let gnu = h.as_gnu_mut().unwrap();
                gnu.linkname[..target.len()].copy_from_slice(target.as_bytes());
                (name, &[])
            }
            Item::Hardlink(name, target) => {
                h.set_entry_type(tar::EntryType::Link);
                h.set_mode(0o644);
                h.set_size(0);
                let gnu = h.as_gnu_mut().unwrap();
                gnu.linkname[..target.len()].copy_from_slice(target.as_bytes());
                (name, &[])
            }
            Item::CharDevice(name) => {
                h.set_entry_type(tar::EntryType::Char);
                h.set_mode(0o666);
                h.set_size(0);
                (name, &[])
            }
        };
        let gnu = h.as_gnu_mut().unwrap();
        gnu.name[..name.len()].copy_from_slice(name.as_bytes());
        h.set_cksum();
        b.append(&h, data).unwrap();
    }
    b.into_inner().unwrap()
}

/// A shell script that runs the daemon's own mock ACP agent: a real executable ACP agent.
fn agent_script() -> Vec<u8> {
    format!("#!/bin/sh\nexec '{BIN}' mock-agent \"$@\"\n").into_bytes()
}

fn good_archive() -> Vec<u8> {
    tar_gz(&good_items(&agent_script()))
}

fn good_items(script: &[u8]) -> [Item<'_>; 3] {
    [
        Item::File("pkg/README", b"test agent\n", 0o644),
        Item::File("pkg/bin/test-agent", script, 0o755),
        Item::Symlink("pkg/bin/alias", "test-agent"),
    ]
}

fn sha256_hex(b: &[u8]) -> String {
    sha2::Sha256::digest(b)
        .iter()
        .map(|x| format!("{x:02x}"))
        .collect()
}

fn platform() -> String {
    format!("{}-{}", std::env::consts::OS, std::env::consts::ARCH)
}

fn registry_entry(id: &str, version: &str, archive_url: &str, sha: Option<&str>) -> Value {
    let mut target = json!({"archive": archive_url, "cmd": "./pkg/bin/test-agent"});
    if let Some(s) = sha {
        target["sha256"] = json!(s);
    }
    json!({"id": id, "name": id, "version": version, "description": "test",
           "distribution": {"binary": {platform(): target}}})
}

fn registry_json(entries: Vec<Value>) -> Vec<u8> {
    serde_json::to_vec(&json!({"version": "1.0.0", "agents": entries})).unwrap()
}

/// Writes an agents file into a fresh temp dir (kept alive by the returned guard).
fn agents_file(text: &str) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("agents.toml");
    std::fs::write(&p, text).unwrap();
    (dir, p)
}

/// A registry that lists `test-acp` at `version`, its archive at `path` on `srv` (with `sha`, or
/// no checksum), and an agents file declaring `testagent` from it. Keeps the registry's server and
/// the file for as long as it lives.
struct TestRegistry {
    regsrv: FileServer,
    _dir: tempfile::TempDir,
    file: PathBuf,
}

impl TestRegistry {
    fn new(srv: &FileServer, path: &str, version: &str, sha: Option<&str>) -> Self {
        let reg = registry_json(vec![registry_entry(
            "test-acp",
            version,
            &srv.url(path),
            sha,
        )]);
        let regsrv = FileServer::start(vec![("/registry.json".into(), reg, Duration::ZERO)]);
        let (_dir, file) =
            agents_file("[[agent]]\nid = \"testagent\"\nregistry_id = \"test-acp\"\n");
        TestRegistry { regsrv, _dir, file }
    }

    /// The daemon's arguments for this agents file and registry.
    fn args(&self) -> Vec<std::ffi::OsString> {
        vec![
            "--agents-file".into(),
            self.file.clone().into(),
            "--acp-registry-url".into(),
            self.regsrv.url("/registry.json").into(),
        ]
    }

    /// A daemon started with this agents file and registry.
    fn daemon(&self) -> crate::support::DaemonBuilder {
        Daemon::builder()
            .arg("--agents-file")
            .arg(&self.file)
            .arg("--acp-registry-url")
            .arg(self.regsrv.url("/registry.json"))
    }
}

/// Every regular file or link below `dir` (none if it does not exist).
fn files_below(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let Ok(rd) = std::fs::read_dir(dir) else {
        return out;
    };
    for e in rd.flatten() {
        let ft = e.file_type().unwrap();
        if ft.is_dir() {
            out.extend(files_below(&e.path()));
        } else {
            out.push(e.path());
        }
    }
    out
}

fn initialize(id: u64) -> Value {
    json!({"jsonrpc": "2.0", "id": id, "method": "initialize",
           "params": {"protocolVersion": 1, "clientCapabilities": {}}})
}

/// One JSON-RPC message through the proxy: `POST /v1/acp/{server}?agent=…`.
async fn acp_post(d: &Daemon, server: &str, agent: Option<&str>, msg: Value) -> (u16, Value) {
    let mut url = d.url(&format!("/v1/acp/{server}"));
    if let Some(a) = agent {
        url.push_str(&format!("?agent={a}"));
    }
    let r = d.client().post(url).json(&msg).send().await.unwrap();
    let status = r.status().as_u16();
    let text = r.text().await.unwrap();
    let v = serde_json::from_str(&text).unwrap_or_else(|e| panic!("not JSON ({e}): {text:?}"));
    (status, v)
}

async fn delete_server(d: &Daemon, server: &str) {
    let r = d
        .client()
        .delete(d.url(&format!("/v1/acp/{server}")))
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success(), "DELETE {server}: {}", r.status());
}

async fn post_install(d: &Daemon, agent: &str, body: Value) -> (u16, Value) {
    let r = d
        .client()
        .post(d.url(&format!("/v1/agents/{agent}/install")))
        .json(&body)
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    (status, r.json().await.unwrap())
}

async fn get_json(d: &Daemon, path: &str) -> (u16, Value) {
    let r = d.client().get(d.url(path)).send().await.unwrap();
    let status = r.status().as_u16();
    (status, r.json().await.unwrap())
}

/// A loopback port nothing listens on (bound, then released).
fn closed_port_url() -> String {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    drop(l);
    format!("http://127.0.0.1:{port}/registry.json")
}

#[tokio::test]
async fn registry_install_is_verified_recorded_and_runs() {
    let archive = good_archive();
    let sha = sha256_hex(&archive);
    let srv = FileServer::start(vec![(
        "/a/test-agent.tar.gz".into(),
        archive.clone(),
        Duration::ZERO,
    )]);
    let reg = TestRegistry::new(&srv, "/a/test-agent.tar.gz", "1.2.3", Some(&sha));
    let d = reg.daemon().start();

    let (s, before) = get_json(&d, "/v1/agents/testagent").await;
    assert_eq!(s, 200, "{before}");
    assert_eq!(before["installed"], false);

    let (s, body) = post_install(&d, "testagent", json!({})).await;
    assert_eq!(s, 200, "{body}");
    assert_eq!(body["alreadyInstalled"], false);
    assert_eq!(body["already_installed"], false);
    let art = &body["artifacts"][0];
    assert_eq!(art["source"], "registry");
    assert_eq!(art["version"], "1.2.3");
    assert_eq!(art["kind"], "agent_process");
    let program = PathBuf::from(art["path"].as_str().unwrap());
    let want_dir = d.data_dir().join("agents/testagent/1.2.3");
    assert!(program.starts_with(&want_dir), "{program:?}");
    assert!(want_dir.join("pkg/README").is_file());
    assert_eq!(
        std::fs::read_link(want_dir.join("pkg/bin/alias")).unwrap(),
        PathBuf::from("test-agent")
    );

    let (_, after) = get_json(&d, "/v1/agents/testagent").await;
    assert_eq!(after["installed"], true);
    assert_eq!(after["verified"], true, "{after}");
    assert_eq!(art["verified"], true, "{art}");
    assert_eq!(after["source"], "registry");
    assert_eq!(after["version"], "1.2.3");
    assert_eq!(after["serverStatus"]["running"], 0);

    // Idempotent: the second install downloads nothing.
    let (s, again) = post_install(&d, "testagent", json!({})).await;
    assert_eq!(s, 200);
    assert_eq!(again["alreadyInstalled"], true);
    assert_eq!(again["already_installed"], true);
    assert_eq!(srv.hits("/a/test-agent.tar.gz"), 1);
    // `reinstall` downloads again and replaces the install in place.
    let (s, re) = post_install(&d, "testagent", json!({"reinstall": true})).await;
    assert_eq!(s, 200, "{re}");
    assert_eq!(re["alreadyInstalled"], false);
    assert_eq!(srv.hits("/a/test-agent.tar.gz"), 2);
    // No staging or download leftovers next to the install.
    let leftovers: Vec<_> = std::fs::read_dir(d.data_dir().join("agents/testagent"))
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with('.'))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");

    // What was installed is a working ACP agent, reachable through the proxy.
    let (s, init) = acp_post(&d, "s1", Some("testagent"), initialize(1)).await;
    assert_eq!(s, 200, "{init}");
    assert!(init["result"]["protocolVersion"].is_number(), "{init}");
    let (_, st) = get_json(&d, "/v1/agents/testagent").await;
    assert_eq!(st["serverStatus"]["running"], 1, "{st}");
    delete_server(&d, "s1").await;
    eventually_async(
        Duration::from_secs(10),
        "serverStatus back to 0",
        || async {
            let (_, st) = get_json(&d, "/v1/agents/testagent").await;
            (st["serverStatus"]["running"] == 0).then_some(())
        },
    )
    .await;
    assert!(program.is_file());
}

#[tokio::test]
async fn first_acp_post_installs_lazily() {
    let archive = good_archive();
    let sha = sha256_hex(&archive);
    let srv = FileServer::start(vec![("/a.tar.gz".into(), archive, Duration::ZERO)]);
    let reg = TestRegistry::new(&srv, "/a.tar.gz", "3.0.0", Some(&sha));
    let d = reg.daemon().start();
    let (s, init) = acp_post(&d, "lazy", Some("testagent"), initialize(7)).await;
    assert_eq!(s, 200, "{init}");
    assert_eq!(init["id"], 7);
    assert_eq!(srv.hits("/a.tar.gz"), 1);
    let (_, st) = get_json(&d, "/v1/agents/testagent").await;
    assert_eq!(st["installed"], true);
    assert_eq!(st["source"], "registry");
    assert_eq!(st["version"], "3.0.0");
    // A second server of the same agent starts without installing again.
    let (s, _) = acp_post(&d, "lazy2", Some("testagent"), initialize(1)).await;
    assert_eq!(s, 200);
    assert_eq!(srv.hits("/a.tar.gz"), 1);
    let (_, st) = get_json(&d, "/v1/agents/testagent").await;
    assert_eq!(st["serverStatus"]["running"], 2, "{st}");
    delete_server(&d, "lazy").await;
    delete_server(&d, "lazy2").await;
}

#[tokio::test]
async fn zip_and_tar_bz2_archives_install_and_answer_through_the_proxy() {
    use std::os::unix::fs::PermissionsExt;
    let script = agent_script();
    let [readme, agent, alias] = good_items(&script);
    let items = [
        readme,
        agent,
        alias,
        Item::File("pkg/bin/helper", b"#!/bin/sh\n", 0o750),
    ];
    let zip_bytes = zip(&items);
    let bz2_bytes = tar_bz2(&items);
    // Not the same bytes under another name: these really are zip and bzip2 data.
    assert_eq!(&zip_bytes[..4], b"PK\x03\x04");
    assert_eq!(&bz2_bytes[..3], b"BZh");
    let srv = FileServer::start(vec![
        ("/dl/agent.zip".into(), zip_bytes.clone(), Duration::ZERO),
        (
            "/dl/agent.tar.bz2".into(),
            bz2_bytes.clone(),
            Duration::ZERO,
        ),
    ]);
    let reg = registry_json(vec![
        registry_entry(
            "zip-acp",
            "2.0.0",
            &srv.url("/dl/agent.zip"),
            Some(&sha256_hex(&zip_bytes)),
        ),
        registry_entry(
            "bz2-acp",
            "2.1.0",
            &srv.url("/dl/agent.tar.bz2"),
            Some(&sha256_hex(&bz2_bytes)),
        ),
    ]);
    let regsrv = FileServer::start(vec![("/registry.json".into(), reg, Duration::ZERO)]);
    let (_g, file) = agents_file(
        "[[agent]]\nid = \"zipagent\"\nregistry_id = \"zip-acp\"\n\
         [[agent]]\nid = \"bz2agent\"\nregistry_id = \"bz2-acp\"\n",
    );
    let d = Daemon::builder()
        .arg("--agents-file")
        .arg(&file)
        .arg("--acp-registry-url")
        .arg(regsrv.url("/registry.json"))
        .start();
    for (agent, version, path) in [
        ("zipagent", "2.0.0", "/dl/agent.zip"),
        ("bz2agent", "2.1.0", "/dl/agent.tar.bz2"),
    ] {
        // The first POST installs lazily; the installed program answers `initialize`.
        let server = format!("s-{agent}");
        let (s, init) = acp_post(&d, &server, Some(agent), initialize(3)).await;
        assert_eq!(s, 200, "{agent}: {init}");
        assert_eq!(init["id"], 3, "{agent}: {init}");
        assert!(
            init["result"]["protocolVersion"].is_number(),
            "{agent}: {init}"
        );
        assert_eq!(srv.hits(path), 1, "{agent}");
        let (_, st) = get_json(&d, &format!("/v1/agents/{agent}")).await;
        assert_eq!(st["installed"], true, "{agent}: {st}");
        assert_eq!(st["source"], "registry", "{agent}: {st}");
        assert_eq!(st["version"], version, "{agent}: {st}");
        let dir = d.data_dir().join("agents").join(agent).join(version);
        let mode = |p: &str| {
            std::fs::symlink_metadata(dir.join(p))
                .unwrap()
                .permissions()
                .mode()
                & 0o777
        };
        // Modes come from the archive (zip: its unix external attributes).
        assert_eq!(mode("pkg/bin/test-agent"), 0o755, "{agent}");
        assert_eq!(mode("pkg/bin/helper"), 0o750, "{agent}");
        assert_eq!(mode("pkg/README"), 0o644, "{agent}");
        assert_eq!(
            std::fs::read(dir.join("pkg/README")).unwrap(),
            b"test agent\n"
        );
        assert_eq!(
            std::fs::read_link(dir.join("pkg/bin/alias")).unwrap(),
            PathBuf::from("test-agent"),
            "{agent}"
        );
        let leftovers: Vec<_> = std::fs::read_dir(d.data_dir().join("agents").join(agent))
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with('.'))
            .collect();
        assert!(leftovers.is_empty(), "{agent}: {leftovers:?}");
        delete_server(&d, &server).await;
    }
}

/// In process (`App`): an install refused over the routes needs no daemon process.
#[tokio::test]
async fn wrong_sha256_is_refused_and_leaves_nothing() {
    let archive = good_archive();
    let srv = FileServer::start(vec![("/a.tar.gz".into(), archive, Duration::ZERO)]);
    let wrong = "0".repeat(64);
    let reg = TestRegistry::new(&srv, "/a.tar.gz", "1.0.0", Some(&wrong));
    let app = App::start(reg.args()).await;
    let r = app.post("/v1/agents/testagent/install", json!({})).await;
    let body = r.json();
    assert_eq!(r.status, 502, "{body}");
    assert_eq!(body["title"], "Agent Install Failed");
    let detail = body["detail"].as_str().unwrap();
    assert!(detail.contains("checksum mismatch"), "{detail}");
    assert_eq!(srv.hits("/a.tar.gz"), 1);
    let data_dir = app.data_dir();
    assert!(data_dir.is_dir());
    let left = files_below(&data_dir.join("agents/testagent"));
    assert!(left.is_empty(), "left behind: {left:?}");
    let st = app.get("/v1/agents/testagent").await.json();
    assert_eq!(st["installed"], false);
}

#[tokio::test]
async fn hostile_archives_are_refused_and_leave_nothing() {
    let outside = tempfile::tempdir().unwrap();
    let abs_target = outside.path().join("abs-written");
    let abs_name = abs_target.to_str().unwrap().to_string();
    let out_dir = outside.path().to_str().unwrap().to_string();
    let script = agent_script();
    let agent = || Item::File("pkg/bin/test-agent", &script, 0o755);
    // Each hostile entry, beside a good agent binary, in every archive format that can hold it.
    let hostile: Vec<(&str, &[&str], Item)> = vec![
        (
            "dotdot",
            &["tar.gz", "zip", "tar.bz2"],
            Item::File("../../../../escaped", b"x", 0o644),
        ),
        (
            "absolute",
            &["tar.gz", "zip"],
            Item::File(&abs_name, b"x", 0o644),
        ),
        (
            "symlinkup",
            &["tar.gz", "zip"],
            Item::Symlink("pkg/up", "../../../../../etc"),
        ),
        (
            "hardlink",
            &["tar.gz"],
            Item::Hardlink("pkg/passwd", "/etc/passwd"),
        ),
        ("device", &["tar.gz"], Item::CharDevice("pkg/null")),
    ];
    let prefix = |ext: &str| match ext {
        "zip" => "zip",
        "tar.bz2" => "bz2",
        _ => "",
    };
    let pack = |ext: &str, items: &[Item]| match ext {
        "zip" => zip(items),
        "tar.bz2" => tar_bz2(items),
        _ => tar_gz(items),
    };
    let mut cases: Vec<(String, &str, Vec<u8>)> = Vec::new();
    for (name, exts, item) in hostile {
        for ext in exts {
            let items = [agent(), item.clone()];
            cases.push((format!("{}{name}", prefix(ext)), ext, pack(ext, &items)));
        }
    }
    // A symlink out of the tree, then a file written through it.
    for ext in ["tar.gz", "zip"] {
        let items = [
            agent(),
            Item::Symlink("pkg/out", &out_dir),
            Item::File("pkg/out/through-link", b"x", 0o644),
        ];
        cases.push((format!("{}symlinkout", prefix(ext)), ext, pack(ext, &items)));
    }
    // Declares 4 KiB, inflates to 64 MiB: cut at its declared size and refused.
    cases.push(("ziplies".into(), "zip", lying_zip(&script, 4096, 64 << 20)));
    let mut routes = Vec::new();
    let mut entries = Vec::new();
    let mut file_text = String::new();
    let srv_addr_holder;
    {
        // Registry entries need the archive server's address, so start it first.
        for (name, ext, bytes) in &cases {
            routes.push((format!("/{name}.{ext}"), bytes.clone(), Duration::ZERO));
        }
        srv_addr_holder = FileServer::start(routes);
        for (name, ext, bytes) in &cases {
            entries.push(registry_entry(
                &format!("{name}-acp"),
                "1.0.0",
                &srv_addr_holder.url(&format!("/{name}.{ext}")),
                Some(&sha256_hex(bytes)),
            ));
            file_text.push_str(&format!(
                "[[agent]]\nid = \"{name}\"\nregistry_id = \"{name}-acp\"\n"
            ));
        }
    }
    // Distributions the installer does not take are refused by name, before anything is written.
    entries.push(json!({"id": "uvx-acp", "version": "1.0.0",
        "distribution": {"uvx": {"package": "some-agent@1.0.0"}}}));
    file_text.push_str("[[agent]]\nid = \"uvxonly\"\nregistry_id = \"uvx-acp\"\n");
    let regsrv = FileServer::start(vec![(
        "/registry.json".into(),
        registry_json(entries),
        Duration::ZERO,
    )]);
    let (_g, file) = agents_file(&file_text);
    let d = Daemon::builder()
        .arg("--agents-file")
        .arg(&file)
        .arg("--acp-registry-url")
        .arg(regsrv.url("/registry.json"))
        .start();
    for (name, ext, _) in &cases {
        let (s, body) = post_install(&d, name, json!({})).await;
        assert_eq!(s, 502, "{name}: {body}");
        let detail = body["detail"].as_str().unwrap();
        assert!(detail.contains("refused"), "{name}: {detail}");
        let left = files_below(&d.data_dir().join("agents").join(name));
        assert!(left.is_empty(), "{name} left {left:?}");
        assert_eq!(srv_addr_holder.hits(&format!("/{name}.{ext}")), 1, "{name}");
    }
    let (s, body) = post_install(&d, "uvxonly", json!({})).await;
    assert_eq!(s, 502, "{body}");
    assert!(body["detail"].as_str().unwrap().contains("uvx"), "{body}");
    assert!(!abs_target.exists());
    assert!(!outside.path().join("through-link").exists());
    assert!(!d.data_dir().join("escaped").exists());
    assert!(!d.work_dir().parent().unwrap().join("escaped").exists());
}

#[tokio::test]
async fn unreachable_registry_falls_back_to_the_pinned_source() {
    let archive = good_archive();
    let sha = sha256_hex(&archive);
    let srv = FileServer::start(vec![("/fallback.tar.gz".into(), archive, Duration::ZERO)]);
    let (_g, file) = agents_file(&format!(
        "[[agent]]\nid = \"testagent\"\nregistry_id = \"test-acp\"\n\
         [agent.fallback]\nkind = \"binary\"\nurl = \"{}\"\nsha256 = \"{sha}\"\n\
         cmd = \"pkg/bin/test-agent\"\nversion = \"0.9.0\"\n\
         [[agent]]\nid = \"nofallback\"\nregistry_id = \"nothing-acp\"\n",
        srv.url("/fallback.tar.gz")
    ));
    let d = Daemon::builder()
        .arg("--agents-file")
        .arg(&file)
        .arg("--acp-registry-url")
        .arg(closed_port_url())
        .start();
    let (s, body) = post_install(&d, "testagent", json!({})).await;
    assert_eq!(s, 200, "{body}");
    assert_eq!(body["artifacts"][0]["source"], "fallback");
    assert_eq!(body["artifacts"][0]["version"], "0.9.0");
    let (_, st) = get_json(&d, "/v1/agents/testagent").await;
    assert_eq!(st["source"], "fallback");
    assert!(d.stderr().contains("unreachable"), "{}", d.stderr());

    // A pin the fallback cannot honour is an install failure that says why.
    let (s, body) = post_install(
        &d,
        "testagent",
        json!({"reinstall": true, "agentProcessVersion": "5.0.0"}),
    )
    .await;
    assert_eq!(s, 502, "{body}");
    assert!(body["detail"].as_str().unwrap().contains("5.0.0"), "{body}");

    // Without a fallback, the registry failure is the reason given.
    let (s, body) = post_install(&d, "nofallback", json!({})).await;
    assert_eq!(s, 502, "{body}");
    let detail = body["detail"].as_str().unwrap();
    assert!(
        detail.contains("registry") && detail.contains("no pinned fallback"),
        "{detail}"
    );
}

#[tokio::test]
async fn concurrent_installs_download_once() {
    let archive = good_archive();
    let sha = sha256_hex(&archive);
    // A slow download, so the second request surely arrives while the first is installing.
    let srv = FileServer::start(vec![(
        "/slow.tar.gz".into(),
        archive,
        Duration::from_millis(800),
    )]);
    let reg = TestRegistry::new(&srv, "/slow.tar.gz", "2.0.0", Some(&sha));
    let d = reg.daemon().start();
    let (a, b) = tokio::join!(
        post_install(&d, "testagent", json!({})),
        post_install(&d, "testagent", json!({}))
    );
    assert_eq!((a.0, b.0), (200, 200), "{} {}", a.1, b.1);
    assert_eq!(srv.hits("/slow.tar.gz"), 1);
    let fresh = [&a.1, &b.1]
        .iter()
        .filter(|v| v["alreadyInstalled"] == false)
        .count();
    assert_eq!(fresh, 1, "{} {}", a.1, b.1);

    // Two CLI processes on one data dir (e.g. an image build next to a running daemon) are
    // serialised by a file lock: one download again.
    let data = tempfile::tempdir().unwrap();
    let cli = || {
        Command::new(BIN)
            .args(["agents", "install", "testagent", "--data-dir"])
            .arg(data.path())
            .arg("--agents-file")
            .arg(&reg.file)
            .arg("--acp-registry-url")
            .arg(reg.regsrv.url("/registry.json"))
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    };
    let (c1, c2) = (cli(), cli());
    let (o1, o2) = (
        c1.wait_with_output().unwrap(),
        c2.wait_with_output().unwrap(),
    );
    assert!(o1.status.success() && o2.status.success());
    assert_eq!(srv.hits("/slow.tar.gz"), 2);
    let already = [&o1, &o2]
        .iter()
        .filter(|o| String::from_utf8_lossy(&o.stdout).contains("already installed"))
        .count();
    assert_eq!(already, 1);
}

#[tokio::test]
async fn require_preinstall_refuses_run_time_installs_and_the_cli_installs() {
    let archive = good_archive();
    let sha = sha256_hex(&archive);
    let srv = FileServer::start(vec![("/a.tar.gz".into(), archive, Duration::ZERO)]);
    let reg = TestRegistry::new(&srv, "/a.tar.gz", "1.0.0", Some(&sha));
    let d = reg.daemon().arg("--require-preinstall").start();
    let (s, body) = post_install(&d, "testagent", json!({})).await;
    assert_eq!(s, 409, "{body}");
    assert_eq!(
        body["installCommand"],
        "sandbox-agent agents install testagent"
    );
    assert!(
        body["detail"]
            .as_str()
            .unwrap()
            .contains("sandbox-agent agents install testagent")
    );
    assert_eq!(srv.hits("/a.tar.gz"), 0);
    // The lazy install of the first ACP POST is refused the same way, with a 4xx.
    let (s, body) = acp_post(&d, "s1", Some("testagent"), initialize(1)).await;
    assert_eq!(s, 409, "{body}");
    assert_eq!(
        body["installCommand"],
        "sandbox-agent agents install testagent"
    );
    assert_eq!(body["serverId"], "s1");
    assert_eq!(srv.hits("/a.tar.gz"), 0);

    // The operator pre-installs with the CLI into the same data dir (plain lines: not a tty).
    let out = Command::new(BIN)
        .args(["agents", "install", "testagent", "--data-dir"])
        .arg(d.data_dir())
        .arg("--agents-file")
        .arg(&reg.file)
        .arg("--acp-registry-url")
        .arg(reg.regsrv.url("/registry.json"))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stderr}");
    assert!(!stderr.contains('\r'), "{stderr:?}");
    assert!(
        stdout.contains("agent_process\t1.0.0\tregistry\t"),
        "{stdout}"
    );
    assert_eq!(srv.hits("/a.tar.gz"), 1);

    let (s, body) = post_install(&d, "testagent", json!({})).await;
    assert_eq!(s, 200, "{body}");
    assert_eq!(body["alreadyInstalled"], true);
    let (s, init) = acp_post(&d, "s1", Some("testagent"), initialize(1)).await;
    assert_eq!(s, 200, "{init}");
    delete_server(&d, "s1").await;
    // Reinstalling is an install at run time too.
    let (s, _) = post_install(&d, "testagent", json!({"reinstall": true})).await;
    assert_eq!(s, 409);

    // The CLI lists it; an unknown agent is a usage error.
    let out = Command::new(BIN)
        .args(["agents", "list", "--json", "--data-dir"])
        .arg(d.data_dir())
        .arg("--agents-file")
        .arg(&reg.file)
        .output()
        .unwrap();
    assert!(out.status.success());
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    let t = v["agents"]
        .as_array()
        .unwrap()
        .iter()
        .find(|a| a["id"] == "testagent")
        .unwrap();
    assert_eq!(t["installed"], true);
    assert_eq!(t["source"], "registry");
    let out = Command::new(BIN)
        .args(["agents", "install", "no-such-agent", "--data-dir"])
        .arg(d.data_dir())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(64));
    assert!(String::from_utf8_lossy(&out.stderr).contains("unknown agent"));
}

/// In process (`App`): the listing, lookups and the built-in install need no daemon process.
#[tokio::test]
async fn agents_list_shows_every_known_agent() {
    let (_g, file) =
        agents_file("[[agent]]\nid = \"inhouse\"\ncommand = \"/bin/cat\"\nargs = [\"-u\"]\n");
    let registry = closed_port_url();
    let app = App::start([
        "--agents-file".as_ref(),
        file.as_os_str(),
        "--acp-registry-url".as_ref(),
        registry.as_ref(),
    ])
    .await;
    let r = app.get("/v1/agents").await;
    assert_eq!(r.status, 200);
    let body = r.json();
    let agents = body["agents"].as_array().unwrap();
    let ids: Vec<&str> = agents.iter().map(|a| a["id"].as_str().unwrap()).collect();
    for id in [
        "claude", "codex", "opencode", "gemini", "amp", "pi", "cursor", "mock", "inhouse",
    ] {
        assert!(ids.contains(&id), "{id} missing from {ids:?}");
    }
    for a in agents {
        for key in [
            "id",
            "installed",
            "version",
            "path",
            "source",
            "credentialsAvailable",
            "capabilities",
            "serverStatus",
        ] {
            assert!(a.get(key).is_some(), "{key} missing in {a}");
        }
    }
    let mock = agents.iter().find(|a| a["id"] == "mock").unwrap();
    assert_eq!(mock["installed"], true);
    assert_eq!(mock["source"], "builtin");
    let inhouse = agents.iter().find(|a| a["id"] == "inhouse").unwrap();
    assert_eq!(inhouse["source"], "user");
    assert_eq!(inhouse["installed"], true);
    assert_eq!(inhouse["path"], "/bin/cat");

    let r = app.get("/v1/agents/nope").await;
    assert_eq!(r.status, 404, "{}", String::from_utf8_lossy(&r.body));
    let r = app.post("/v1/agents/nope/install", json!({})).await;
    assert_eq!(r.status, 404);
    let r = app
        .send(
            Request::builder()
                .method(Method::POST)
                .uri("/v1/agents/mock/install")
                .header(header::HOST, "127.0.0.1")
                .header(header::CONTENT_TYPE, "application/json")
                .body(Body::from("{\"reinstall\": \"yes\"}"))
                .unwrap(),
        )
        .await;
    assert_eq!(r.status, 400);
    let r = app.post("/v1/agents/mock/install", json!({})).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.json()["artifacts"][0]["source"], "builtin");
    // A native-CLI pin for an agent without a separate native CLI is a 400 that says so.
    let r = app
        .post(
            "/v1/agents/claude/install",
            json!({"agentVersion": "1.0.0"}),
        )
        .await;
    assert_eq!(r.status, 400, "{}", String::from_utf8_lossy(&r.body));
}

#[test]
fn a_bad_agents_file_stops_start_up_naming_the_problem() {
    let (_g, file) = agents_file("[[agent]]\nid = \"broken\"\n");
    let data = tempfile::tempdir().unwrap();
    let out = Command::new(BIN)
        .args(["server", "--host", "127.0.0.1", "--port", "0", "--data-dir"])
        .arg(data.path())
        .arg("--agents-file")
        .arg(&file)
        .env_remove("NOTIFY_SOCKET")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("broken") && err.contains("nothing to run"),
        "{err}"
    );
}

/// The real Claude and Codex adapters, installed by our installer from the pinned npm fallbacks
/// (the registry URL points at a closed port, so the choice is deterministic and the CDN is not
/// needed), answer `initialize` and `session/new` through the proxy, and DELETE leaves none of
/// their processes behind (Claude starts a `claude` child; neither exits on stdin close).
#[tokio::test]
async fn real_claude_and_codex_from_npm_answer_through_the_proxy() {
    if !on_path("npm") || !on_path("node") {
        crate::support::skip("node/npm not installed (.ci/install-00-base.sh installs them)");
        return;
    }
    let d = Daemon::builder()
        .arg("--acp-registry-url")
        .arg(closed_port_url())
        .start();

    // Codex explicitly, Claude lazily on its first ACP POST.
    let (s, body) = post_install(&d, "codex", json!({})).await;
    assert_eq!(s, 200, "{body}\n{}", d.stderr());
    assert_eq!(body["artifacts"][0]["source"], "fallback");
    assert_eq!(body["artifacts"][0]["version"], "2.6.0");

    for (agent, server) in [("claude", "real-claude"), ("codex", "real-codex")] {
        let (s, init) = acp_post(&d, server, Some(agent), initialize(1)).await;
        assert_eq!(s, 200, "{agent}: {init}\n{}", d.stderr());
        assert!(
            init["result"]["protocolVersion"].is_number(),
            "{agent}: {init}"
        );
        let new = json!({"jsonrpc": "2.0", "id": 2, "method": "session/new",
                         "params": {"cwd": d.work_dir(), "mcpServers": []}});
        let (s, created) = acp_post(&d, server, None, new).await;
        assert_eq!(s, 200, "{agent}: {created}");
        assert_eq!(created["id"], 2, "{agent}: {created}");
        if agent == "claude" {
            // No key is needed to create a Claude session (only to prompt).
            assert!(created["result"]["sessionId"].is_string(), "{created}");
        } else {
            // Codex answers session/new, with a session or an auth error when no key is set.
            assert!(
                created["result"]["sessionId"].is_string() || created["error"]["code"].is_number(),
                "{created}"
            );
        }
        let (_, st) = get_json(&d, &format!("/v1/agents/{agent}")).await;
        assert_eq!(st["installed"], true);
        assert_eq!(st["source"], "fallback");
        assert_eq!(st["serverStatus"]["running"], 1, "{st}");

        let procs = descendants(d.pid());
        assert!(
            !procs.is_empty(),
            "{agent}: no agent process under the daemon"
        );
        delete_server(&d, server).await;
        eventually_async(
            Duration::from_secs(30),
            "the agent's processes to end",
            || {
                let procs = procs.clone();
                async move { procs.iter().all(|p| !pid_alive(*p)).then_some(()) }
            },
        )
        .await;
    }
}

/// The registry's `npx` distribution, for real: the registry names an npm package at an exact
/// version, the installer puts it in the agent's own prefix with npm (no npx at launch), and the
/// provenance says `registry`.
#[tokio::test]
async fn registry_npx_distribution_installs_the_named_package_from_npm() {
    if !on_path("npm") || !on_path("node") {
        crate::support::skip("node/npm not installed (.ci/install-00-base.sh installs them)");
        return;
    }
    let entry = json!({"id": "claude-acp", "name": "Claude", "version": "0.49.0",
        "description": "test",
        "distribution": {"npx": {"package": "@agentclientprotocol/claude-agent-acp@0.49.0"}}});
    let server = FileServer::start(vec![(
        "/registry.json".into(),
        registry_json(vec![entry]),
        Duration::ZERO,
    )]);
    let d = Daemon::builder()
        .arg("--acp-registry-url")
        .arg(server.url("/registry.json"))
        .start();
    let (s, body) = post_install(&d, "claude", json!({})).await;
    assert_eq!(s, 200, "{body}\n{}", d.stderr());
    assert_eq!(body["artifacts"][0]["source"], "registry", "{body}");
    assert_eq!(body["artifacts"][0]["version"], "0.49.0", "{body}");
    assert_eq!(server.hits("/registry.json"), 1);
    let installed = d.data_dir().join("agents/claude");
    assert!(
        files_below(&installed)
            .iter()
            .any(|p| p.ends_with("node_modules/@agentclientprotocol/claude-agent-acp/package.json")),
        "the package is installed under {}",
        installed.display()
    );

    let (s, init) = acp_post(&d, "npx-claude", Some("claude"), initialize(1)).await;
    assert_eq!(s, 200, "{init}\n{}", d.stderr());
    assert!(init["result"]["protocolVersion"].is_number(), "{init}");
    let (_, st) = get_json(&d, "/v1/agents/claude").await;
    assert_eq!(st["source"], "registry", "{st}");
    delete_server(&d, "npx-claude").await;
}

/// An npm package tarball (`package/…`) whose bin runs the mock agent.
fn npm_tarball() -> Vec<u8> {
    let pkg = br#"{"name":"test-npm-agent","version":"0.0.1","bin":{"test-npm-agent":"agent.sh"}}"#;
    tar_gz(&[
        Item::File("package/package.json", pkg, 0o644),
        Item::File("package/agent.sh", &agent_script(), 0o755),
    ])
}

#[tokio::test]
async fn npm_fallback_installs_into_the_agent_dir_and_runs() {
    if !on_path("npm") || !on_path("node") {
        crate::support::skip("node/npm not installed (.ci/install-00-base.sh installs them)");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let tgz = dir.path().join("test-npm-agent-0.0.1.tgz");
    std::fs::write(&tgz, npm_tarball()).unwrap();
    let (_g, file) = agents_file(&format!(
        "[[agent]]\nid = \"npmagent\"\nregistry_id = \"npm-acp\"\n\
         [agent.fallback]\nkind = \"npm\"\npackage = \"{}\"\nversion = \"0.0.1\"\n",
        tgz.display()
    ));
    let d = Daemon::builder()
        .arg("--agents-file")
        .arg(&file)
        .arg("--acp-registry-url")
        .arg(closed_port_url())
        .start();
    let (s, body) = post_install(&d, "npmagent", json!({})).await;
    assert_eq!(s, 200, "{body}");
    let art = &body["artifacts"][0];
    assert_eq!(art["source"], "fallback");
    let want = d
        .data_dir()
        .join("agents/npmagent/0.0.1/node_modules/.bin/test-npm-agent");
    assert_eq!(art["path"], want.to_str().unwrap());
    let (s, init) = acp_post(&d, "n1", Some("npmagent"), initialize(1)).await;
    assert_eq!(s, 200, "{init}");
    assert!(init["result"]["protocolVersion"].is_number(), "{init}");
    delete_server(&d, "n1").await;
}

#[tokio::test]
async fn a_registry_package_that_looks_like_an_npm_option_is_passed_after_a_double_dash() {
    // npm itself is replaced by a script that records its arguments: what matters is what the
    // daemon asks npm to do, and a real npm would go to the network.
    let tools = tempfile::tempdir().unwrap();
    let argv = tools.path().join("argv");
    let npm = tools.path().join("npm");
    std::fs::write(
        &npm,
        format!(
            "#!/bin/sh\nfor a in \"$@\"; do printf '%s\\n' \"$a\"; done > {}\nexit 1\n",
            argv.display()
        ),
    )
    .unwrap();
    std::fs::write(tools.path().join("node"), "#!/bin/sh\nexit 0\n").unwrap();
    for f in ["npm", "node"] {
        std::fs::set_permissions(
            tools.path().join(f),
            std::os::unix::fs::PermissionsExt::from_mode(0o755),
        )
        .unwrap();
    }
    let evil = json!({"id": "evil-acp", "version": "1",
        "distribution": {"npx": {"package": "--prefix=/tmp/sandbox-agent-evil@1"}}});
    let regsrv = FileServer::start(vec![(
        "/registry.json".into(),
        registry_json(vec![evil]),
        Duration::ZERO,
    )]);
    let (_g, file) = agents_file("[[agent]]\nid = \"evil\"\nregistry_id = \"evil-acp\"\n");
    let d = Daemon::builder()
        .arg("--agents-file")
        .arg(&file)
        .arg("--acp-registry-url")
        .arg(regsrv.url("/registry.json"))
        .env("PATH", format!("{}:/usr/bin:/bin", tools.path().display()))
        .start();
    let (s, body) = post_install(&d, "evil", json!({})).await;
    assert_eq!(s, 502, "{body}");
    let args: Vec<String> = std::fs::read_to_string(&argv)
        .expect("npm was run")
        .lines()
        .map(str::to_string)
        .collect();
    let spec = args
        .iter()
        .position(|a| a.starts_with("--prefix=/tmp/sandbox-agent-evil"))
        .expect("the spec was passed");
    assert_eq!(args[spec - 1], "--", "{args:?}");
    assert_eq!(
        args.iter().position(|a| a == "--"),
        Some(spec - 1),
        "options only before the `--`: {args:?}"
    );
    assert!(!Path::new("/tmp/sandbox-agent-evil").exists());
}

#[tokio::test]
async fn missing_npm_is_a_clear_install_error() {
    let empty = tempfile::tempdir().unwrap();
    let d = Daemon::builder()
        .arg("--acp-registry-url")
        .arg(closed_port_url())
        .env("PATH", empty.path())
        .start();
    let (s, body) = post_install(&d, "codex", json!({})).await;
    assert_eq!(s, 502, "{body}");
    let detail = body["detail"].as_str().unwrap();
    assert!(detail.contains("`npm` was not found"), "{detail}");
    let left = files_below(&d.data_dir().join("agents/codex"));
    assert!(left.is_empty(), "{left:?}");
    // The lazy path gives the same reason through the proxy.
    let (s, body) = acp_post(&d, "c1", Some("codex"), initialize(1)).await;
    assert_eq!(s, 502, "{body}");
    assert!(body["detail"].as_str().unwrap().contains("npm"), "{body}");
}

#[tokio::test]
async fn binaries_without_a_sha256_install_unverified_or_are_refused_with_require_checksums() {
    let archive = good_archive();
    let srv = FileServer::start(vec![(
        "/a/test-agent.tar.gz".into(),
        archive.clone(),
        Duration::ZERO,
    )]);
    let reg = TestRegistry::new(&srv, "/a/test-agent.tar.gz", "1.0.0", None);
    // With --require-checksums: refused before anything is downloaded.
    let strict = reg.daemon().arg("--require-checksums").start();
    let (s, body) = post_install(&strict, "testagent", json!({})).await;
    assert_eq!(s, 502, "{body}");
    let detail = body["detail"].as_str().unwrap();
    assert!(detail.contains("--require-checksums"), "{detail}");
    assert_eq!(srv.hits("/a/test-agent.tar.gz"), 0);
    assert!(files_below(&strict.data_dir().join("agents/testagent")).is_empty());
    // Without it: installed, logged and shown as unverified.
    let d = reg.daemon().start();
    let (s, body) = post_install(&d, "testagent", json!({})).await;
    assert_eq!(s, 200, "{body}");
    assert_eq!(body["artifacts"][0]["verified"], false, "{body}");
    let (_, st) = get_json(&d, "/v1/agents/testagent").await;
    assert_eq!(st["verified"], false, "{st}");
    let manifest: Value = serde_json::from_slice(
        &std::fs::read(d.data_dir().join("agents/testagent/manifest.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(manifest["verified"], false, "{manifest}");
    assert!(
        d.stderr().contains("unverified"),
        "the install is logged as unverified"
    );
}

#[tokio::test]
async fn hostile_registry_documents_fail_cleanly() {
    // A package name starting with a non-ASCII character (a byte slice used to panic on it).
    let weird = json!({"id": "weird-acp", "version": "1",
        "distribution": {"npx": {"package": "é@1"}}});
    // Padding that makes the document larger than the configured cap.
    let padding = json!({"id": "pad", "description": "p".repeat(4096)});
    let reg = registry_json(vec![weird.clone()]);
    let big = registry_json(vec![weird, padding]);
    let regsrv = FileServer::start(vec![
        ("/registry.json".into(), reg, Duration::ZERO),
        ("/big.json".into(), big, Duration::ZERO),
    ]);
    let (_g, file) = agents_file("[[agent]]\nid = \"weird\"\nregistry_id = \"weird-acp\"\n");
    let empty_path = tempfile::tempdir().unwrap();
    let d = Daemon::builder()
        .arg("--agents-file")
        .arg(&file)
        .arg("--acp-registry-url")
        .arg(regsrv.url("/registry.json"))
        // No npm on PATH: the install must fail fast and cleanly, after the name was split.
        .env("PATH", empty_path.path())
        .start();
    let (s, body) = post_install(&d, "weird", json!({})).await;
    assert_eq!(s, 502, "{body}");
    assert!(body["detail"].as_str().unwrap().contains("npm"), "{body}");
    let (s, _) = get_json(&d, "/v1/health").await;
    assert_eq!(s, 200);
    // A document over --registry-max-bytes is refused without being read whole.
    let small = Daemon::builder()
        .arg("--agents-file")
        .arg(&file)
        .arg("--acp-registry-url")
        .arg(regsrv.url("/big.json"))
        .args(["--registry-max-bytes", "2K"])
        .env("PATH", empty_path.path())
        .start();
    let (s, body) = post_install(&small, "weird", json!({})).await;
    assert_eq!(s, 502, "{body}");
    let detail = body["detail"].as_str().unwrap();
    assert!(detail.contains("registry limit"), "{detail}");
}

/// Under `--agent-user` an agent gets its own HOME, so that is where its credentials files are
/// looked for: a file under the daemon's HOME (root's) is not one the agent will find, and one
/// under the agent user's HOME is.
#[tokio::test]
async fn credentials_files_are_looked_for_under_the_agent_users_home() {
    if !crate::support::is_root() {
        crate::support::skip("needs root to switch the agent user");
        return;
    }
    let daemon_home = tempfile::tempdir().unwrap();
    let creds = ".gemini/oauth_creds.json";
    let put = |home: &Path| {
        let f = home.join(creds);
        std::fs::create_dir_all(f.parent().unwrap()).unwrap();
        std::fs::write(&f, b"{}").unwrap();
    };
    put(daemon_home.path());
    let d = Daemon::builder()
        .any_user_bin()
        .args(["--agent-user", "nobody"])
        .env("HOME", daemon_home.path())
        .env("GEMINI_API_KEY", "")
        .env("GOOGLE_API_KEY", "")
        .env("GOOGLE_APPLICATION_CREDENTIALS", "")
        .start();
    let available = || async {
        let (s, st) = get_json(&d, "/v1/agents/gemini").await;
        assert_eq!(s, 200, "{st}");
        st["credentialsAvailable"].as_bool().unwrap()
    };
    assert!(
        !available().await,
        "a file under the daemon's HOME counted for an agent that runs as nobody"
    );
    // nobody's home from the user database is not a directory it owns here, so it gets one
    // under the data dir; either way, the one the daemon made for it.
    let entry = nix::unistd::User::from_name("nobody").unwrap().unwrap();
    let home = if std::fs::metadata(&entry.dir).is_ok_and(|m| {
        use std::os::unix::fs::MetadataExt;
        m.is_dir() && m.uid() == entry.uid.as_raw()
    }) {
        entry.dir
    } else {
        d.data_dir()
            .join("home")
            .join(entry.uid.as_raw().to_string())
    };
    assert!(home.is_dir(), "{}", home.display());
    put(&home);
    assert!(available().await);
}
