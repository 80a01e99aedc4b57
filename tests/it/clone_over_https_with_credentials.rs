//! `POST /v1/git/clone` from a real https git server on loopback that requires Basic auth
//! (`git http-backend` behind Python's TLS server, a self-signed certificate made here and
//! trusted through the daemon's `GIT_SSL_CAINFO`, and refused by a daemon without it): the right
//! credentials clone (Basic, or the password alone as a Bearer token); none, or wrong ones, are
//! a 422 problem+json (not 401: that means the daemon's own token) with nothing left behind; and
//! the secret is nowhere afterwards —
//! not in any file of the clone (its `.git/config` included), not in the daemon's log at debug
//! level, and not in any process's argv while git was fetching (the server reads every
//! `/proc/<pid>/cmdline` at each request it gets).

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use base64::Engine;
use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::support::{Daemon, eventually, on_path, skip};

const SERVER: &str = include_str!("support/git_https_server.py");

struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn run(dir: &Path, prog: &str, args: &[&str]) {
    let out = Command::new(prog)
        .current_dir(dir)
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("{prog} runs: {e}"));
    assert!(
        out.status.success(),
        "{prog} {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Every file beneath `dir` whose bytes hold one of `needles`.
fn files_holding(dir: &Path, needles: &[&str]) -> Vec<String> {
    let mut hits = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    let mut seen = 0;
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            let ft = e.file_type().unwrap();
            if ft.is_dir() {
                stack.push(e.path());
            } else if ft.is_file() {
                seen += 1;
                let bytes = std::fs::read(e.path()).unwrap();
                if needles
                    .iter()
                    .any(|n| bytes.windows(n.len()).any(|w| w == n.as_bytes()))
                {
                    hits.push(e.path().display().to_string());
                }
            }
        }
    }
    assert!(seen > 0, "{} holds no file", dir.display());
    hits
}

async fn clone(d: &Daemon, body: Value) -> (StatusCode, String, Value) {
    let r = d
        .client()
        .post(d.url("/v1/git/clone"))
        .json(&body)
        .send()
        .await
        .unwrap();
    let st = r.status();
    let ct = r
        .headers()
        .get("content-type")
        .map(|v| v.to_str().unwrap().to_string())
        .unwrap_or_default();
    (st, ct, r.json().await.unwrap_or(Value::Null))
}

#[tokio::test]
async fn an_https_clone_with_basic_credentials_never_stores_or_shows_the_secret() {
    for tool in ["git", "python3", "openssl"] {
        if !on_path(tool) {
            return skip(&format!("{tool} is not installed"));
        }
    }
    let tmp = tempfile::tempdir().unwrap();
    let t = tmp.path();
    // A repository to serve, as a bare repo under the server's project root.
    let src = t.join("src");
    std::fs::create_dir_all(&src).unwrap();
    run(&src, "git", &["init", "-q", "-b", "main"]);
    std::fs::write(src.join("a.txt"), "served over https\n").unwrap();
    run(&src, "git", &["add", "-A"]);
    run(
        &src,
        "git",
        &[
            "-c",
            "user.name=T",
            "-c",
            "user.email=t@example.com",
            "commit",
            "-qm",
            "first",
        ],
    );
    let head = String::from_utf8(
        Command::new("git")
            .current_dir(&src)
            .args(["rev-parse", "HEAD"])
            .output()
            .unwrap()
            .stdout,
    )
    .unwrap()
    .trim()
    .to_string();
    let root = t.join("served");
    std::fs::create_dir_all(&root).unwrap();
    run(
        t,
        "git",
        &["clone", "-q", "--bare", "src", "served/repo.git"],
    );
    // A self-signed certificate for 127.0.0.1, made now.
    run(
        t,
        "openssl",
        &[
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            "key.pem",
            "-out",
            "cert.pem",
            "-days",
            "1",
            "-subj",
            "/CN=127.0.0.1",
            "-addext",
            "subjectAltName=IP:127.0.0.1",
        ],
    );
    std::fs::write(t.join("server.py"), SERVER).unwrap();
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    let user = "clone-user";
    let password = format!("pw-{nanos:x}-{}", std::process::id());
    let basic = base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"));
    let _server = Server(
        Command::new("python3")
            .current_dir(t)
            .arg("server.py")
            .args([&root, &t.join("cert.pem"), &t.join("key.pem")])
            .args([&t.join("port"), &t.join("seen")])
            .env("CLONE_AUTH", format!("{user}:{password}"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .spawn()
            .expect("python3 starts"),
    );
    let port = eventually(Duration::from_secs(20), "the https server's port", || {
        std::fs::read_to_string(t.join("port")).ok()
    });
    let url = format!("https://127.0.0.1:{port}/repo.git");

    let d = Daemon::builder()
        .confine_to_work_dir()
        .env("GIT_SSL_CAINFO", t.join("cert.pem"))
        .args(["--log-level", "debug", "--access-log"])
        .start();

    // No credentials, then a wrong password: 422 problem+json, no directory left.
    for (dest, body) in [
        ("clones/none", json!({"url": url, "dest": "clones/none"})),
        (
            "clones/wrong",
            json!({"url": url, "dest": "clones/wrong", "username": user, "password": "not-it"}),
        ),
    ] {
        let (st, ct, b) = clone(&d, body).await;
        assert_eq!(st, StatusCode::UNPROCESSABLE_ENTITY, "{dest}: {b}");
        assert_eq!(ct, "application/problem+json", "{dest}");
        assert_eq!(b["status"], 422, "{b}");
        assert!(!d.work_dir().join(dest).exists(), "{dest} was left behind");
    }

    // The right ones: the clone is made, at the server's HEAD.
    let (st, _, b) = clone(
        &d,
        json!({"url": url, "dest": "clones/ok", "username": user, "password": password}),
    )
    .await;
    assert_eq!(st, StatusCode::CREATED, "{b}");
    assert_eq!(b["head"], head.as_str(), "{b}");
    assert_eq!(b["branch"], "main", "{b}");
    let ok = d.work_dir().join("clones/ok");
    assert_eq!(
        std::fs::read_to_string(ok.join("a.txt")).unwrap(),
        "served over https\n"
    );
    // The password alone goes as a Bearer token, which this server takes too.
    let (st, _, b) = clone(
        &d,
        json!({"url": url, "dest": "clones/bearer", "password": password}),
    )
    .await;
    assert_eq!(st, StatusCode::CREATED, "{b}");
    assert_eq!(b["head"], head.as_str(), "{b}");
    // The clone knows its remote (so the search below looks at a real config)...
    let config = std::fs::read_to_string(ok.join(".git/config")).unwrap();
    assert!(config.contains(&url), "{config}");

    // ...but the secret, plain or as the Basic token, is in no file of it.
    let needles = [password.as_str(), basic.as_str()];
    assert_eq!(files_holding(&ok, &needles), Vec::<String>::new());
    let bearer = d.work_dir().join("clones/bearer");
    assert_eq!(files_holding(&bearer, &needles), Vec::<String>::new());
    assert_eq!(files_holding(&d.data_dir(), &needles), Vec::<String>::new());
    let log = d.stderr();
    assert!(
        log.contains("/v1/git/clone"),
        "the access log saw the clones"
    );
    assert!(
        !needles.iter().any(|n| log.contains(n)),
        "the daemon's log holds the secret"
    );
    // While the daemon's git fetched, its processes were seen, and none held the secret in argv.
    let seen = std::fs::read_to_string(t.join("seen")).unwrap_or_default();
    assert!(
        seen.lines()
            .any(|l| l.starts_with("git ") && l.contains("remote-https") && l.contains(&url)),
        "the server never saw git's processes: {seen}"
    );
    let leaks: Vec<&str> = seen.lines().filter(|l| l.starts_with("LEAK")).collect();
    assert!(leaks.is_empty(), "the secret was in argv: {leaks:?}");

    // The certificate is trusted only through the daemon's GIT_SSL_CAINFO: a daemon without it
    // refuses the server, the right credentials notwithstanding, and leaves nothing behind.
    let plain = Daemon::builder().confine_to_work_dir().start();
    let (st, ct, b) = clone(
        &plain,
        json!({"url": url, "dest": "clones/untrusted", "username": user, "password": password}),
    )
    .await;
    assert_eq!(st, 502, "{b}");
    assert_eq!(ct, "application/problem+json");
    assert!(
        b["detail"].as_str().unwrap_or("").contains("certificate"),
        "{b}"
    );
    assert!(!plain.work_dir().join("clones/untrusted").exists());

    // Nothing listening at all: the remote cannot be reached, 502 as well.
    let (st, _, b) = clone(
        &plain,
        json!({"url": "http://127.0.0.1:1/nothing.git", "dest": "clones/unreachable"}),
    )
    .await;
    assert_eq!(st, 502, "{b}");
    assert!(!plain.work_dir().join("clones/unreachable").exists());
}
