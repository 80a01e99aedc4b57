//! The workspace API seen from a client: git on repositories built here (status, diff, log,
//! commit, branches, checkout, worktrees, clone from a local bare repo), the option-injection
//! and repository-config defences (canary files that must not appear), glob/grep semantics,
//! ports and their change feed, the port proxy (large bodies both ways, a WebSocket) and
//! preview links (no token, tampered, expired).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use reqwest::StatusCode;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use crate::support::{Daemon, eventually_async, http, on_path, skip};

/// Runs git in `dir` with no system or global config and a fixed author; answers its trimmed
/// stdout (a failure panics with git's stderr).
pub(crate) fn git(dir: &Path, args: &[&str]) -> String {
    let out = Command::new("git")
        .current_dir(dir)
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .args([
            "-c",
            "user.name=Test",
            "-c",
            "user.email=test@example.com",
            "-c",
            "init.defaultBranch=main",
        ])
        .args(args)
        .output()
        .expect("git runs");
    assert!(
        out.status.success(),
        "git {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// A repository with one commit (`a.txt`, `b.txt`) on `main`.
fn repo(dir: &Path) -> PathBuf {
    std::fs::create_dir_all(dir).unwrap();
    git(dir, &["init", "-q"]);
    std::fs::write(dir.join("a.txt"), "one\ntwo\n").unwrap();
    std::fs::write(dir.join("b.txt"), "bee\n").unwrap();
    git(dir, &["add", "-A"]);
    git(dir, &["commit", "-qm", "first"]);
    dir.to_path_buf()
}

fn have_git() -> bool {
    if on_path("git") {
        return true;
    }
    skip("git is not installed");
    false
}

/// `?k=v&…`, percent-encoded.
fn qs(query: &[(&str, &str)]) -> String {
    let enc = |v: &str| -> String {
        v.bytes()
            .map(|b| {
                if b.is_ascii_alphanumeric() || b"-_.~/".contains(&b) {
                    (b as char).to_string()
                } else {
                    format!("%{b:02X}")
                }
            })
            .collect()
    };
    let parts: Vec<String> = query
        .iter()
        .map(|(k, v)| format!("{k}={}", enc(v)))
        .collect();
    format!("?{}", parts.join("&"))
}

async fn get(d: &Daemon, path: &str, query: &[(&str, &str)]) -> (StatusCode, Value) {
    let r = d
        .client()
        .get(d.url(&format!("{path}{}", qs(query))))
        .send()
        .await
        .unwrap();
    let s = r.status();
    (s, r.json().await.unwrap_or(Value::Null))
}

async fn post(d: &Daemon, path: &str, body: Value) -> (StatusCode, Value) {
    let r = d
        .client()
        .post(d.url(path))
        .json(&body)
        .send()
        .await
        .unwrap();
    let s = r.status();
    (s, r.json().await.unwrap_or(Value::Null))
}

fn s(p: &Path) -> String {
    p.display().to_string()
}

#[tokio::test]
async fn git_status_diff_log_commit_and_branches_follow_the_work_tree() {
    if !have_git() {
        return;
    }
    let d = Daemon::builder().confine_to_work_dir().start();
    let r = repo(&d.work_dir().join("repo"));
    let base = git(&r, &["rev-parse", "HEAD"]);
    std::fs::write(r.join("a.txt"), "one\nTWO\nthree\n").unwrap();
    std::fs::remove_file(r.join("b.txt")).unwrap();
    std::fs::write(r.join("new.txt"), "fresh\n").unwrap();
    std::fs::write(r.join("bin.dat"), [0u8, 1, 2, 3, 0, 255]).unwrap();

    let (st, body) = get(&d, "/v1/git/status", &[("path", &s(&r))]).await;
    assert_eq!(st, StatusCode::OK, "{body}");
    assert_eq!(body["branch"], "main");
    assert_eq!(body["head"], base.as_str());
    let mut files: Vec<(String, String, bool)> = body["files"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| {
            (
                f["path"].as_str().unwrap().to_string(),
                f["status"].as_str().unwrap().to_string(),
                f["staged"].as_bool().unwrap(),
            )
        })
        .collect();
    files.sort();
    assert_eq!(
        files,
        vec![
            ("a.txt".into(), "modified".into(), false),
            ("b.txt".into(), "deleted".into(), false),
            ("bin.dat".into(), "untracked".into(), false),
            ("new.txt".into(), "untracked".into(), false),
        ]
    );

    // The diff includes the untracked files and leaves the real index alone.
    let (st, diff) = get(
        &d,
        "/v1/git/diff",
        &[("path", &s(&r.join("."))), ("base", "HEAD")],
    )
    .await;
    assert_eq!(st, StatusCode::OK, "{diff}");
    assert_eq!(diff["base"], base.as_str());
    let by_path = |p: &str| {
        diff["files"]
            .as_array()
            .unwrap()
            .iter()
            .find(|f| f["path"] == p)
            .unwrap_or_else(|| panic!("{p} in {diff}"))
            .clone()
    };
    let a = by_path("a.txt");
    assert_eq!(
        (
            a["status"].as_str(),
            a["additions"].as_u64(),
            a["deletions"].as_u64()
        ),
        (Some("modified"), Some(2), Some(1))
    );
    assert!(a["patch"].as_str().unwrap().contains("+TWO"), "{a}");
    assert_eq!(by_path("b.txt")["status"], "deleted");
    let n = by_path("new.txt");
    assert_eq!(n["status"], "added");
    assert!(n["patch"].as_str().unwrap().contains("+fresh"));
    assert_eq!(by_path("bin.dat")["binary"], true);
    assert_eq!(
        git(&r, &["diff", "--cached", "--name-only"]),
        "",
        "the index was touched"
    );

    // Nothing staged: 409; `all` stages everything and commits.
    let (st, p) = post(&d, "/v1/git/commit", json!({"path": s(&r), "message": "x"})).await;
    assert_eq!(st, StatusCode::CONFLICT, "{p}");
    let (st, c) = post(
        &d,
        "/v1/git/commit",
        json!({"path": s(&r), "message": "second", "all": true,
               "author": {"name": "Agent", "email": "agent@example.com"}}),
    )
    .await;
    assert_eq!(st, StatusCode::OK, "{c}");
    let sha = c["sha"].as_str().unwrap().to_string();
    assert_eq!(git(&r, &["rev-parse", "HEAD"]), sha);
    assert_eq!(git(&r, &["status", "--porcelain"]), "");
    // The agent's whole change stays visible against the recorded base after its commit.
    let (_, since) = get(&d, "/v1/git/diff", &[("path", &s(&r)), ("base", &base)]).await;
    assert_eq!(since["files"].as_array().unwrap().len(), 4, "{since}");
    let (st, _) = post(
        &d,
        "/v1/git/commit",
        json!({"path": s(&r), "message": "again", "all": true}),
    )
    .await;
    assert_eq!(st, StatusCode::CONFLICT);

    let (st, log) = get(&d, "/v1/git/log", &[("path", &s(&r)), ("limit", "5")]).await;
    assert_eq!(st, StatusCode::OK);
    let commits = log["commits"].as_array().unwrap();
    assert_eq!(commits.len(), 2);
    assert_eq!(commits[0]["sha"], sha.as_str());
    assert_eq!(commits[0]["subject"], "second");
    assert_eq!(commits[0]["author"]["email"], "agent@example.com");
    assert_eq!(commits[0]["parents"][0], base.as_str());
    assert!(commits[0]["time"].as_i64().unwrap() > 1_600_000_000);

    // Branches and checkout; a dirty tree that a switch would overwrite is 409.
    let (st, b) = post(
        &d,
        "/v1/git/checkout",
        json!({"path": s(&r), "branch": "feature", "create": true}),
    )
    .await;
    assert_eq!(st, StatusCode::OK, "{b}");
    let (_, br) = get(&d, "/v1/git/branches", &[("path", &s(&r))]).await;
    assert_eq!(br["current"], "feature");
    assert_eq!(br["branches"].as_array().unwrap().len(), 2, "{br}");
    std::fs::write(r.join("a.txt"), "feature\n").unwrap();
    git(&r, &["commit", "-qam", "on feature"]);
    std::fs::write(r.join("a.txt"), "dirty\n").unwrap();
    let (st, p) = post(
        &d,
        "/v1/git/checkout",
        json!({"path": s(&r), "branch": "main"}),
    )
    .await;
    assert_eq!(st, StatusCode::CONFLICT, "{p}");
    assert_eq!(std::fs::read_to_string(r.join("a.txt")).unwrap(), "dirty\n");
    let (st, _) = post(
        &d,
        "/v1/git/checkout",
        json!({"path": s(&r), "branch": "nope"}),
    )
    .await;
    assert_eq!(st, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn git_refuses_paths_outside_the_root_non_repositories_and_option_like_values() {
    if !have_git() {
        return;
    }
    let d = Daemon::builder().confine_to_work_dir().start();
    let r = repo(&d.work_dir().join("repo"));
    std::fs::create_dir_all(d.work_dir().join("plain")).unwrap();
    let (st, p) = get(
        &d,
        "/v1/git/status",
        &[("path", &s(&d.work_dir().join("plain")))],
    )
    .await;
    assert_eq!(st, StatusCode::NOT_FOUND, "{p}");
    assert_eq!(p["status"], 404);
    let (st, _) = get(&d, "/v1/git/status", &[("path", "/etc")]).await;
    assert_eq!(st, StatusCode::FORBIDDEN);
    let (st, _) = get(&d, "/v1/git/status", &[("path", "repo/../../..")]).await;
    assert_eq!(st, StatusCode::FORBIDDEN);
    // A symlink out of the root is resolved by the kernel and refused.
    std::os::unix::fs::symlink("/", d.work_dir().join("out")).unwrap();
    let (st, _) = get(&d, "/v1/git/log", &[("path", "out/tmp")]).await;
    assert_eq!(st, StatusCode::FORBIDDEN);

    let canary = d.work_dir().join("canary");
    let hostile = [
        format!("--output={}", s(&canary)),
        format!("--upload-pack=touch {}", s(&canary)),
        format!("-c core.sshCommand=touch {}", s(&canary)),
    ];
    for h in &hostile {
        let (st, p) = get(&d, "/v1/git/diff", &[("path", &s(&r)), ("base", h)]).await;
        assert_eq!(st, StatusCode::BAD_REQUEST, "{h}: {p}");
        let (st, p) = post(&d, "/v1/git/checkout", json!({"path": s(&r), "branch": h})).await;
        assert_eq!(st, StatusCode::BAD_REQUEST, "{h}: {p}");
        let (st, p) = post(
            &d,
            "/v1/git/worktrees",
            json!({"path": s(&r), "dest": s(&d.work_dir().join("wt")), "branch": "x", "base": h}),
        )
        .await;
        assert_eq!(st, StatusCode::BAD_REQUEST, "{h}: {p}");
        let (st, p) = post(
            &d,
            "/v1/git/clone",
            json!({"url": h, "dest": s(&d.work_dir().join("c"))}),
        )
        .await;
        assert_eq!(st, StatusCode::BAD_REQUEST, "{h}: {p}");
    }
    let (st, _) = get(
        &d,
        "/v1/git/diff",
        &[("path", &s(&r)), ("base", "no-such-rev")],
    )
    .await;
    assert_eq!(st, StatusCode::BAD_REQUEST);
    // An `ext::` transport would run a command.
    let (st, _) = post(
        &d,
        "/v1/git/clone",
        json!({"url": format!("ext::sh -c touch% {}", s(&canary)), "dest": s(&d.work_dir().join("c"))}),
    )
    .await;
    assert_eq!(st, StatusCode::BAD_REQUEST);
    assert!(!canary.exists(), "a hostile value reached git as an option");
    assert!(!d.work_dir().join("c").exists());
}

#[tokio::test]
async fn a_repository_config_cannot_make_the_daemon_run_a_program() {
    if !have_git() {
        return;
    }
    let d = Daemon::builder().confine_to_work_dir().start();
    let r = repo(&d.work_dir().join("repo"));
    let marker = d.work_dir().join("MARKER");
    let script = d.work_dir().join("evil.sh");
    std::fs::write(
        &script,
        format!("#!/bin/sh\necho \"$0 $*\" >> {}\ncat\n", s(&marker)),
    )
    .unwrap();
    std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let hooks = r.join(".git/hooks");
    for h in [
        "pre-commit",
        "commit-msg",
        "post-commit",
        "post-checkout",
        "reference-transaction",
    ] {
        std::fs::copy(&script, hooks.join(h)).unwrap();
    }
    let sc = s(&script);
    for (k, v) in [
        ("core.fsmonitor", sc.as_str()),
        ("diff.external", sc.as_str()),
        ("diff.evil.textconv", sc.as_str()),
        ("diff.evil.command", sc.as_str()),
        ("filter.evil.clean", sc.as_str()),
        ("filter.evil.smudge", sc.as_str()),
        ("filter.evil.process", sc.as_str()),
        ("core.pager", sc.as_str()),
        ("core.sshCommand", sc.as_str()),
        ("commit.gpgSign", "true"),
        ("gpg.program", sc.as_str()),
        ("credential.helper", sc.as_str()),
    ] {
        git(&r, &["config", k, v]);
    }
    std::fs::write(r.join(".gitattributes"), "* diff=evil filter=evil\n").unwrap();
    std::fs::write(r.join("a.txt"), "changed\n").unwrap();

    let p = s(&r);
    let (st, b) = get(&d, "/v1/git/status", &[("path", &p)]).await;
    assert_eq!(st, StatusCode::OK, "{b}");
    let (st, b) = get(&d, "/v1/git/diff", &[("path", &p)]).await;
    assert_eq!(st, StatusCode::OK, "{b}");
    let (st, b) = post(
        &d,
        "/v1/git/commit",
        json!({"path": p, "message": "m", "all": true}),
    )
    .await;
    assert_eq!(st, StatusCode::OK, "{b}");
    let (st, b) = post(
        &d,
        "/v1/git/checkout",
        json!({"path": p, "branch": "other", "create": true}),
    )
    .await;
    assert_eq!(st, StatusCode::OK, "{b}");
    let (st, b) = post(
        &d,
        "/v1/git/worktrees",
        json!({"path": p, "dest": s(&d.work_dir().join("wt")), "branch": "wt"}),
    )
    .await;
    assert_eq!(st, StatusCode::CREATED, "{b}");
    let (st, _) = get(&d, "/v1/git/log", &[("path", &p)]).await;
    assert_eq!(st, StatusCode::OK);
    assert!(
        !marker.exists(),
        "the repository made the daemon run: {}",
        std::fs::read_to_string(&marker).unwrap_or_default()
    );
    // The control: the same repository does run the script for a plain git.
    std::fs::write(r.join("a.txt"), "again\n").unwrap();
    let _ = Command::new("git")
        .current_dir(&r)
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .args(["status", "--porcelain"])
        .output();
    assert!(
        marker.exists(),
        "the canary script never runs, the test proves nothing"
    );
}

#[tokio::test]
async fn two_worktrees_of_one_repository_are_isolated_and_removal_guards_changes() {
    if !have_git() {
        return;
    }
    let d = Daemon::builder().confine_to_work_dir().start();
    let r = repo(&d.work_dir().join("repo"));
    let w1 = d.work_dir().join("trees/agent-1");
    let w2 = d.work_dir().join("trees/agent-2");
    for (w, b) in [(&w1, "agent-1"), (&w2, "agent-2")] {
        let (st, body) = post(
            &d,
            "/v1/git/worktrees",
            json!({"path": s(&r), "dest": s(w), "branch": b, "base": "HEAD"}),
        )
        .await;
        assert_eq!(st, StatusCode::CREATED, "{body}");
        assert_eq!(body["branch"], b);
        assert_eq!(body["path"], s(w));
    }
    let (st, _) = post(
        &d,
        "/v1/git/worktrees",
        json!({"path": s(&r), "dest": s(&w1), "branch": "agent-3"}),
    )
    .await;
    assert_eq!(st, StatusCode::CONFLICT, "a non-empty destination");
    std::fs::write(w1.join("a.txt"), "agent one\n").unwrap();
    std::fs::write(w2.join("only-two.txt"), "two\n").unwrap();
    let (_, s1) = get(&d, "/v1/git/diff", &[("path", &s(&w1))]).await;
    let (_, s2) = get(&d, "/v1/git/diff", &[("path", &s(&w2))]).await;
    let paths = |v: &Value| -> Vec<String> {
        v["files"]
            .as_array()
            .unwrap()
            .iter()
            .map(|f| f["path"].as_str().unwrap().to_string())
            .collect()
    };
    assert_eq!(paths(&s1), vec!["a.txt"]);
    assert_eq!(paths(&s2), vec!["only-two.txt"]);
    let (_, main) = get(&d, "/v1/git/status", &[("path", &s(&r))]).await;
    assert_eq!(main["files"].as_array().unwrap().len(), 0, "{main}");

    let (_, list) = get(&d, "/v1/git/worktrees", &[("path", &s(&r))]).await;
    let l = list["worktrees"].as_array().unwrap();
    assert_eq!(l.len(), 3, "{list}");
    assert_eq!(l[1]["branch"], "agent-1");

    let del = |p: &Path, force: bool| {
        let c = d.client();
        let url = d.url("/v1/git/worktrees");
        let p = s(p);
        async move {
            c.delete(format!(
                "{url}{}",
                qs(&[
                    ("path", p.as_str()),
                    ("force", if force { "true" } else { "false" })
                ])
            ))
            .send()
            .await
            .unwrap()
            .status()
        }
    };
    assert_eq!(del(&w1, false).await, StatusCode::CONFLICT);
    assert!(w1.join("a.txt").exists());
    assert_eq!(del(&w1, true).await, StatusCode::NO_CONTENT);
    assert!(!w1.exists());
    std::fs::remove_file(w2.join("only-two.txt")).unwrap();
    assert_eq!(del(&w2, false).await, StatusCode::NO_CONTENT);
    assert_eq!(
        del(&r, true).await,
        StatusCode::BAD_REQUEST,
        "the main work tree"
    );
}

#[tokio::test]
async fn clone_from_a_local_bare_repository_inside_the_root_only() {
    if !have_git() {
        return;
    }
    let d = Daemon::builder().confine_to_work_dir().start();
    let r = repo(&d.work_dir().join("src"));
    git(&r, &["branch", "dev"]);
    let bare = d.work_dir().join("remote.git");
    git(&d.work_dir(), &["clone", "-q", "--bare", &s(&r), &s(&bare)]);
    let head = git(&r, &["rev-parse", "HEAD"]);

    let (st, b) = post(
        &d,
        "/v1/git/clone",
        json!({"url": format!("file://{}", s(&bare)), "dest": "clones/one"}),
    )
    .await;
    assert_eq!(st, StatusCode::CREATED, "{b}");
    assert_eq!(b["head"], head.as_str());
    assert!(d.work_dir().join("clones/one/a.txt").exists());
    let (st, b) = post(
        &d,
        "/v1/git/clone",
        json!({"url": s(&bare), "dest": "clones/two", "depth": 1, "branch": "dev"}),
    )
    .await;
    assert_eq!(st, StatusCode::CREATED, "{b}");
    assert_eq!(b["branch"], "dev");
    let (st, _) = post(
        &d,
        "/v1/git/clone",
        json!({"url": s(&bare), "dest": "clones/one"}),
    )
    .await;
    assert_eq!(st, StatusCode::CONFLICT);
    let (st, _) = post(
        &d,
        "/v1/git/clone",
        json!({"url": s(&bare), "dest": "/tmp/escape"}),
    )
    .await;
    assert_eq!(st, StatusCode::FORBIDDEN);
    let (st, _) = post(
        &d,
        "/v1/git/clone",
        json!({"url": "/etc", "dest": "clones/three"}),
    )
    .await;
    assert_eq!(st, StatusCode::FORBIDDEN);
    let (st, _) = post(
        &d,
        "/v1/git/clone",
        json!({"url": "https://user:secret@example.invalid/r.git", "dest": "clones/four"}),
    )
    .await;
    assert_eq!(st, StatusCode::BAD_REQUEST);
    let (st, _) = post(
        &d,
        "/v1/git/clone",
        json!({"url": s(&d.work_dir().join("none.git")), "dest": "clones/five"}),
    )
    .await;
    assert_eq!(st, StatusCode::NOT_FOUND);
    assert!(
        !d.work_dir().join("clones/five").exists(),
        "a failed clone left its directory"
    );
    assert!(!d.stderr().contains("secret"));
}

/// A tree with a `.gitignore`, dotfiles, a binary file and nested directories.
fn search_tree(root: &Path) {
    for (p, c) in [
        (
            "src/main.rs",
            "fn main() {\n    println!(\"Needle here\");\n}\n",
        ),
        ("src/lib.rs", "pub fn needle() {}\n"),
        ("src/deep/x/y.rs", "// needle deep\n"),
        ("docs/readme.md", "nothing\n"),
        ("target/out.rs", "needle in ignored\n"),
        (".hidden/h.rs", "needle hidden\n"),
        (".gitignore", "target/\n"),
    ] {
        let f = root.join(p);
        std::fs::create_dir_all(f.parent().unwrap()).unwrap();
        std::fs::write(f, c).unwrap();
    }
    std::fs::write(root.join("src/blob.bin"), b"needle\0\x01\x02").unwrap();
}

#[tokio::test]
async fn glob_and_grep_respect_gitignore_hidden_binary_and_limits() {
    let d = Daemon::builder().confine_to_work_dir().start();
    let root = d.work_dir().join("tree");
    search_tree(&root);
    let t = s(&root);
    let (st, g) = get(&d, "/v1/fs/glob", &[("path", &t), ("pattern", "*.rs")]).await;
    assert_eq!(st, StatusCode::OK, "{g}");
    let want: Vec<String> = ["src/deep/x/y.rs", "src/lib.rs", "src/main.rs"]
        .iter()
        .map(|p| s(&root.join(p)))
        .collect();
    assert_eq!(g["paths"], json!(want));
    assert_eq!(g["truncated"], false);
    let (_, g) = get(
        &d,
        "/v1/fs/glob",
        &[("path", &t), ("pattern", "*.rs"), ("hidden", "true")],
    )
    .await;
    assert_eq!(g["paths"].as_array().unwrap().len(), 4);
    let (_, g) = get(&d, "/v1/fs/glob", &[("path", &t), ("pattern", "src/*.rs")]).await;
    assert_eq!(g["paths"].as_array().unwrap().len(), 2, "{g}");
    let (_, g) = get(
        &d,
        "/v1/fs/glob",
        &[("path", &t), ("pattern", "*.rs"), ("limit", "2")],
    )
    .await;
    assert_eq!(g["paths"].as_array().unwrap().len(), 2);
    assert_eq!(g["truncated"], true);
    let (st, _) = get(&d, "/v1/fs/glob", &[("path", &t), ("pattern", "a{b")]).await;
    assert_eq!(st, StatusCode::BAD_REQUEST);

    let (st, m) = get(&d, "/v1/fs/grep", &[("path", &t), ("pattern", "needle")]).await;
    assert_eq!(st, StatusCode::OK, "{m}");
    let hits: Vec<(String, u64)> = m["matches"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| {
            (
                x["path"].as_str().unwrap().to_string(),
                x["line"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        hits,
        vec![
            (s(&root.join("src/deep/x/y.rs")), 1),
            (s(&root.join("src/lib.rs")), 1)
        ],
        "ignored, hidden and binary files are skipped; the match is case-sensitive"
    );
    assert_eq!(m["matches"][1]["column"], 8);
    assert_eq!(m["matches"][1]["text"], "pub fn needle() {}");
    let (_, m) = get(
        &d,
        "/v1/fs/grep",
        &[
            ("path", &t),
            ("pattern", "needle"),
            ("ignoreCase", "true"),
            ("glob", "main.rs"),
        ],
    )
    .await;
    assert_eq!(m["matches"].as_array().unwrap().len(), 1, "{m}");
    assert_eq!(m["matches"][0]["line"], 2);
    let (_, m) = get(
        &d,
        "/v1/fs/grep",
        &[
            ("path", &t),
            ("pattern", "needle"),
            ("hidden", "true"),
            ("limit", "1"),
        ],
    )
    .await;
    assert_eq!(m["matches"].as_array().unwrap().len(), 1);
    assert_eq!(m["truncated"], true);
    let (st, p) = get(&d, "/v1/fs/grep", &[("path", &t), ("pattern", "(unclosed")]).await;
    assert_eq!(st, StatusCode::BAD_REQUEST, "{p}");
    let (st, _) = get(&d, "/v1/fs/grep", &[("path", "/etc"), ("pattern", "root")]).await;
    assert_eq!(st, StatusCode::FORBIDDEN);
    let (st, _) = get(&d, "/v1/fs/grep", &[("path", "missing"), ("pattern", "x")]).await;
    assert_eq!(st, StatusCode::NOT_FOUND);
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A Python HTTP app: `GET /big?n=BYTES` streams a deterministic body, `POST /upload` answers
/// the sha256 and length of what it read, `GET /hello` echoes headers it got, anything else 404.
const APP: &str = r#"
import hashlib, http.server, json, sys
class H(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def log_message(self, *a): pass
    def do_GET(self):
        if self.path.startswith("/big"):
            n = int(self.path.split("n=")[1])
            self.send_response(200)
            self.send_header("Content-Length", str(n))
            self.end_headers()
            block = bytes(range(256)) * 256
            while n > 0:
                k = min(n, len(block))
                self.wfile.write(block[:k]); n -= k
        elif self.path.startswith("/hello"):
            body = json.dumps({"path": self.path, "auth": self.headers.get("Authorization"),
                "host": self.headers.get("Host"), "xfh": self.headers.get("X-Forwarded-Host"),
                "prefix": self.headers.get("X-Forwarded-Prefix"),
                "xff": self.headers.get("X-Forwarded-For"),
                "xfp": self.headers.get("X-Forwarded-Proto")}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers(); self.wfile.write(body)
        else:
            self.send_response(404); self.send_header("Content-Length", "3"); self.end_headers()
            self.wfile.write(b"app")
    def do_POST(self):
        h = hashlib.sha256(); n = 0
        left = int(self.headers.get("Content-Length", "0"))
        while left > 0:
            b = self.rfile.read(min(left, 65536))
            if not b: break
            h.update(b); n += len(b); left -= len(b)
        body = json.dumps({"sha256": h.hexdigest(), "len": n}).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers(); self.wfile.write(body)
http.server.ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
"#;

struct App(Child);

impl Drop for App {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

async fn start_app(port: u16) -> Option<App> {
    if !on_path("python3") {
        skip("python3 is not installed");
        return None;
    }
    let child = Command::new("python3")
        .args(["-c", APP, &port.to_string()])
        .stdin(Stdio::null())
        .spawn()
        .expect("python3 starts");
    let app = App(child);
    eventually_async(Duration::from_secs(20), "the app listens", || async {
        tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .ok()
            .map(|_| ())
    })
    .await;
    Some(app)
}

#[tokio::test]
async fn ports_lists_a_listener_with_its_pid_and_the_feed_reports_open_and_close() {
    let d = Daemon::start();
    let port = free_port();
    let client = d.client();
    let resp = client.get(d.url("/v1/ports/events")).send().await.unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    let mut stream = resp.bytes_stream();
    let Some(app) = start_app(port).await else {
        return;
    };
    let pid = app.0.id();
    let (_, list) = get(&d, "/v1/ports", &[]).await;
    let row = list["ports"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["port"] == port)
        .unwrap_or_else(|| panic!("{port} in {list}"))
        .clone();
    assert_eq!(row["pid"], pid);
    assert_eq!(row["address"], "127.0.0.1");
    assert!(row["command"].as_str().unwrap().contains("python3"));
    assert!(
        !list["ports"]
            .as_array()
            .unwrap()
            .iter()
            .any(|p| p["pid"] == d.pid()),
        "the daemon's own listener is listed: {list}"
    );

    let mut buf = String::new();
    let want_open = format!("event: open\ndata: {{\"port\":{port},");
    let want_close = format!("event: close\ndata: {{\"port\":{port},");
    let mut app = Some(app);
    tokio::time::timeout(Duration::from_secs(30), async {
        while let Some(chunk) = stream.next().await {
            buf.push_str(&String::from_utf8_lossy(&chunk.unwrap()));
            if buf.contains(&want_open) && app.is_some() {
                drop(app.take());
            }
            if buf.contains(&want_close) {
                return;
            }
        }
    })
    .await
    .unwrap_or_else(|_| panic!("no open/close for {port}: {buf}"));
}

#[tokio::test]
async fn the_port_proxy_streams_large_bodies_both_ways_and_keeps_the_token_from_the_app() {
    let d = Daemon::builder().token("secret-token").start();
    let port = free_port();
    let Some(_app) = start_app(port).await else {
        return;
    };
    let c = d.client();
    let base = d.url(&format!("/v1/ports/{port}/proxy"));

    let n: usize = 50 << 20;
    let resp = c.get(format!("{base}/big?n={n}")).send().await.unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    let mut h = Sha256::new();
    let mut got = 0usize;
    let mut body = resp.bytes_stream();
    while let Some(chunk) = body.next().await {
        let chunk = chunk.unwrap();
        got += chunk.len();
        h.update(&chunk);
    }
    let block: Vec<u8> = (0..=255u8).collect::<Vec<_>>().repeat(256);
    let mut want = Sha256::new();
    let mut left = n;
    while left > 0 {
        let k = left.min(block.len());
        want.update(&block[..k]);
        left -= k;
    }
    assert_eq!(got, n);
    assert_eq!(h.finalize(), want.finalize());

    let up: Vec<u8> = (0..(20u32 << 20))
        .map(|i| (i.wrapping_mul(2654435761) >> 24) as u8)
        .collect();
    let up_sha: String = Sha256::digest(&up)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let r = c
        .post(format!("{base}/upload"))
        .header("content-type", "application/octet-stream")
        .body(up)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["len"], 20u64 << 20);
    assert_eq!(v["sha256"], up_sha.as_str());

    let v: Value = c
        .get(format!("{base}/hello?x=1"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(v["path"], "/hello?x=1");
    assert_eq!(v["auth"], Value::Null, "the daemon's token reached the app");
    assert_eq!(v["host"], format!("127.0.0.1:{port}"));
    assert_eq!(v["prefix"], format!("/v1/ports/{port}/proxy"));
    assert_eq!(v["xfh"], d.addr.as_str());
    assert_eq!(v["xff"], "127.0.0.1", "the client's address");
    assert_eq!(v["xfp"], "http");
    // A client's own X-Forwarded-For (from a proxy in front) is appended to, not replaced.
    let v: Value = c
        .get(format!("{base}/hello"))
        .header("x-forwarded-for", "203.0.113.7")
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(v["xff"], "203.0.113.7, 127.0.0.1");
    // The daemon's own port is not a target: 400, and nothing is sent back to the daemon.
    let own = d.addr.rsplit(':').next().unwrap().to_string();
    let r = c
        .get(d.url(&format!("/v1/ports/{own}/proxy/v1/health")))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::BAD_REQUEST);
    assert_eq!(r.headers()["content-type"], "application/problem+json");
    let p: Value = r.json().await.unwrap();
    assert_eq!(p["port"].to_string(), own, "{p}");

    // The app's own 404 is passed on, not rewritten.
    let r = c.get(format!("{base}/missing")).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::NOT_FOUND);
    assert_eq!(r.text().await.unwrap(), "app");
    // A path of several segments reaches the app too (not the daemon's router's 404).
    let v: Value = c
        .get(format!("{base}/hello/deeper/still?y=2"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(v["path"], "/hello/deeper/still?y=2");
    // Without the token: 401; nothing listening: 502 problem+json.
    let r = http().get(format!("{base}/hello")).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
    let dead = free_port();
    let r = c
        .get(d.url(&format!("/v1/ports/{dead}/proxy/")))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::BAD_GATEWAY);
    assert_eq!(r.headers()["content-type"], "application/problem+json");
}

#[tokio::test]
async fn a_websocket_passes_through_the_port_proxy() {
    let d = Daemon::builder().token("tok").start();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((s, _)) = listener.accept().await {
            tokio::spawn(async move {
                let Ok(mut ws) = tokio_tungstenite::accept_async(s).await else {
                    return;
                };
                while let Some(Ok(m)) = ws.next().await {
                    if (m.is_text() || m.is_binary()) && ws.send(m).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    let url = format!("ws://{}/v1/ports/{port}/proxy/echo", d.addr);
    let mut req =
        tokio_tungstenite::tungstenite::client::IntoClientRequest::into_client_request(url)
            .unwrap();
    req.headers_mut()
        .insert("authorization", "Bearer tok".parse().unwrap());
    let (mut ws, _) = tokio_tungstenite::connect_async(req)
        .await
        .expect("upgrade through the proxy");
    for i in 0..3 {
        let text = format!("ping {i}");
        ws.send(tokio_tungstenite::tungstenite::Message::text(text.clone()))
            .await
            .unwrap();
        let m = ws.next().await.unwrap().unwrap();
        assert_eq!(m.into_text().unwrap().as_str(), text);
    }
    let big = vec![7u8; 1 << 20];
    ws.send(tokio_tungstenite::tungstenite::Message::binary(big.clone()))
        .await
        .unwrap();
    let m = ws.next().await.unwrap().unwrap();
    assert_eq!(m.into_data().as_ref(), &big[..]);
}

#[tokio::test]
async fn preview_links_work_without_the_token_and_refuse_tampering_and_expiry() {
    let d = Daemon::builder().token("secret-token").start();
    let port = free_port();
    let Some(_app) = start_app(port).await else {
        return;
    };
    let (st, p) = post(
        &d,
        &format!("/v1/ports/{port}/preview"),
        json!({"ttl": "10m"}),
    )
    .await;
    assert_eq!(st, StatusCode::CREATED, "{p}");
    let url = p["url"].as_str().unwrap().to_string();
    assert!(url.starts_with("/preview/") && url.ends_with('/'), "{url}");
    assert!(p["expiresAt"].as_str().unwrap().ends_with('Z'));
    let anon = http();
    let v: Value = anon
        .get(d.url(&format!("{url}hello?q=2")))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(v["path"], "/hello?q=2");
    // Tampered: another byte anywhere, or another port's link re-labelled.
    let opaque = url.trim_start_matches("/preview/").trim_end_matches('/');
    let mut bad = opaque.as_bytes().to_vec();
    bad[1] = if bad[1] == b'A' { b'B' } else { b'A' };
    let bad = String::from_utf8(bad).unwrap();
    let r = anon
        .get(d.url(&format!("/preview/{bad}/hello")))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::FORBIDDEN);
    let r = anon.get(d.url("/preview/garbage/")).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::FORBIDDEN);
    // The link reaches its own port only: the path cannot name another.
    let r = anon
        .get(d.url(&format!("{url}..%2F..%2Fv1%2Fports")))
        .send()
        .await
        .unwrap();
    assert_ne!(r.status(), StatusCode::OK);

    let (_, p) = post(
        &d,
        &format!("/v1/ports/{port}/preview"),
        json!({"ttl": "1s"}),
    )
    .await;
    let short = p["url"].as_str().unwrap().to_string();
    eventually_async(Duration::from_secs(10), "the link expires", || {
        let anon = anon.clone();
        let u = d.url(&format!("{short}hello"));
        async move {
            let r = anon.get(u).send().await.unwrap();
            (r.status() == StatusCode::GONE).then_some(())
        }
    })
    .await;
    let (st, _) = post(
        &d,
        &format!("/v1/ports/{port}/preview"),
        json!({"ttl": "soon"}),
    )
    .await;
    assert_eq!(st, StatusCode::BAD_REQUEST);
}

#[tokio::test]
async fn a_session_records_its_git_base_and_the_diff_against_it_survives_a_commit() {
    if !have_git() {
        return;
    }
    let d = Daemon::start();
    let r = repo(&d.work_dir().join("repo"));
    let base = git(&r, &["rev-parse", "HEAD"]);
    let sub = r.join("sub");
    std::fs::create_dir_all(&sub).unwrap();
    let post_rpc = |body: Value| {
        let c = d.client();
        let u = d.url("/v1/acp/gb-1?agent=mock");
        async move {
            let r = c.post(u).json(&body).send().await.unwrap();
            assert_eq!(r.status(), StatusCode::OK);
            r.json::<Value>().await.unwrap()
        }
    };
    post_rpc(json!({"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":1}}))
        .await;
    let a = post_rpc(json!({"jsonrpc":"2.0","id":2,"method":"session/new","params":{"cwd": s(&sub),"mcpServers":[]}})).await;
    let sid = a["result"]["sessionId"].as_str().unwrap().to_string();
    // Outside any repository: no entry.
    post_rpc(json!({"jsonrpc":"2.0","id":3,"method":"session/new","params":{"cwd": "/","mcpServers":[]}})).await;
    let servers = d.servers().await;
    let row = servers.iter().find(|s| s["serverId"] == "gb-1").unwrap();
    assert_eq!(
        row["sessions"],
        json!([{"sessionId": sid, "cwd": s(&sub), "gitBase": base}])
    );

    // The agent changes and commits; the session's diff still shows its whole change.
    std::fs::write(r.join("a.txt"), "agent\n").unwrap();
    git(&r, &["commit", "-qam", "agent"]);
    let (_, diff) = get(&d, "/v1/git/diff", &[("path", &s(&r)), ("base", &base)]).await;
    assert_eq!(diff["files"][0]["path"], "a.txt", "{diff}");
    let (_, now) = get(&d, "/v1/git/diff", &[("path", &s(&r))]).await;
    assert_eq!(now["files"].as_array().unwrap().len(), 0);
}

/// A file changed (same size) right after the index was written is "racily clean": git must look
/// at its content. The diff works on a copy of the index, which must keep the index's mtime or
/// git would trust the stale stat and miss the change (it did, about one run in two).
#[tokio::test]
async fn the_diff_sees_a_same_size_change_made_in_the_second_of_the_commit() {
    if !have_git() {
        return;
    }
    let d = Daemon::start();
    let r = repo(&d.work_dir().join("racy"));
    for i in 0..6 {
        let (before, after) = if i % 2 == 0 {
            ("one\ntwo\n", "one\nTWO\n")
        } else {
            ("one\nTWO\n", "one\ntwo\n")
        };
        assert_eq!(std::fs::read_to_string(r.join("a.txt")).unwrap(), before);
        std::fs::write(r.join("a.txt"), after).unwrap();
        let (st, diff) = get(&d, "/v1/git/diff", &[("path", &s(&r))]).await;
        assert_eq!(st, StatusCode::OK);
        assert_eq!(diff["files"][0]["path"], "a.txt", "run {i}: {diff}");
        git(&r, &["commit", "-qam", &format!("c{i}")]);
    }
}

/// The `gitBase` row of session `sid` on `server` in `GET /v1/acp`, once the answer was seen.
async fn git_base_row(d: &Daemon, server: &str, sid: &str) -> Value {
    eventually_async(
        Duration::from_secs(10),
        "the session's gitBase is listed",
        || async {
            let servers = d.servers().await;
            let row = servers.iter().find(|s| s["serverId"] == server)?;
            row["sessions"]
                .as_array()?
                .iter()
                .find(|x| x["sessionId"] == sid && x.get("gitBase").is_some())
                .cloned()
        },
    )
    .await
}

#[tokio::test]
async fn sessions_created_over_the_websocket_and_the_rfd_transport_record_their_git_base() {
    use crate::transports::{Stream, request, rfd_initialize, rfd_post};
    use tokio_tungstenite::tungstenite::Message;
    if !have_git() {
        return;
    }
    let d = Daemon::builder().token(crate::transports::TOKEN).start();
    let r = repo(&d.work_dir().join("repo"));
    let base = git(&r, &["rev-parse", "HEAD"]);

    // WebSocket: the answer goes to the socket, never to a waiting POST.
    let url = d
        .url("/v1/acp/gb-ws?agent=mock")
        .replacen("http://", "ws://", 1);
    let mut req =
        tokio_tungstenite::tungstenite::client::IntoClientRequest::into_client_request(url)
            .unwrap();
    req.headers_mut().insert(
        "authorization",
        format!("Bearer {}", crate::transports::TOKEN)
            .parse()
            .unwrap(),
    );
    let (mut ws, _) = tokio_tungstenite::connect_async(req).await.unwrap();
    for m in [
        request(json!(1), "initialize", json!({"protocolVersion": 1})),
        request(
            json!(2),
            "session/new",
            json!({"cwd": s(&r), "mcpServers": []}),
        ),
    ] {
        ws.send(Message::text(m.to_string())).await.unwrap();
    }
    let sid = loop {
        let frame = tokio::time::timeout(Duration::from_secs(20), ws.next())
            .await
            .expect("a frame within 20 s")
            .expect("the socket is open")
            .unwrap();
        if let Message::Text(t) = frame {
            let v: Value = serde_json::from_str(&t).unwrap();
            if v["id"] == 2 {
                break v["result"]["sessionId"].as_str().unwrap().to_string();
            }
        }
    };
    let row = git_base_row(&d, "gb-ws", &sid).await;
    assert_eq!(
        row,
        json!({"sessionId": sid, "cwd": s(&r), "gitBase": base})
    );

    // The RFD transport: the POST is answered 202 and the answer comes on the connection stream.
    // A commit in between: the RFD session's base is the HEAD when it was created.
    std::fs::write(r.join("a.txt"), "second\n").unwrap();
    git(&r, &["commit", "-qam", "second"]);
    let base2 = git(&r, &["rev-parse", "HEAD"]);
    assert_ne!(base, base2);
    let conn = rfd_initialize(&d).await;
    let mut stream = Stream::open(&d, &conn, None).await.unwrap();
    let a = rfd_post(
        &d,
        &[("acp-connection-id", &conn)],
        &request(
            json!(7),
            "session/new",
            json!({"cwd": s(&r), "mcpServers": []}),
        )
        .to_string(),
    )
    .await;
    assert_eq!(a.status, 202, "{}", a.text);
    let sid2 = loop {
        let m = stream.next().await.expect("the stream is open");
        if m["id"] == 7 {
            break m["result"]["sessionId"].as_str().unwrap().to_string();
        }
    };
    let row = git_base_row(&d, &format!("acp-conn-{conn}"), &sid2).await;
    assert_eq!(
        row,
        json!({"sessionId": sid2, "cwd": s(&r), "gitBase": base2})
    );
    // The WebSocket session kept its own.
    let row = git_base_row(&d, "gb-ws", &sid).await;
    assert_eq!(row["gitBase"], json!(base));
}

/// The command line client over the same routes.
fn cli(d: &Daemon, args: &[&str]) -> std::process::Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_sandbox-agent"));
    cmd.args(args).env("SANDBOX_AGENT_URL", d.url(""));
    if let Some(t) = &d.token {
        cmd.env("SANDBOX_AGENT_TOKEN", t);
    }
    cmd.stdin(Stdio::null()).output().expect("the client runs")
}

#[test]
fn the_cli_prints_git_status_diff_grep_and_ports() {
    if !have_git() {
        return;
    }
    let d = Daemon::builder().token("cli-token").start();
    let r = repo(&d.work_dir().join("repo"));
    std::fs::write(r.join("a.txt"), "one\nchanged \x1b[31mred\n").unwrap();
    let p = s(&r);
    let d2 = &d;
    let run = move |args: Vec<String>| {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        cli(d2, &args)
    };
    let o = run(vec!["git".into(), "status".into(), p.clone()]);
    assert!(o.status.success(), "{o:?}");
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(
        text.contains("branch main") && text.contains("modified") && text.contains("a.txt"),
        "{text}"
    );
    let o = run(vec!["git".into(), "diff".into(), p.clone()]);
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(
        text.contains("+changed \\x1b[31mred"),
        "control characters escaped: {text}"
    );
    let o = run(vec![
        "grep".into(),
        "-i".into(),
        "CHANGED".into(),
        p.clone(),
    ]);
    assert!(o.status.success(), "{o:?}");
    assert!(
        String::from_utf8_lossy(&o.stdout)
            .starts_with(&format!("{}:2:1:changed", s(&r.join("a.txt"))))
    );
    let o = run(vec!["grep".into(), "nothing-like-this".into(), p.clone()]);
    assert_eq!(o.status.code(), Some(1));
    let o = run(vec!["ports".into(), "--json".into()]);
    assert!(o.status.success(), "{o:?}");
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert!(v["ports"].is_array());
    let o = run(vec![
        "git".into(),
        "status".into(),
        "/nonexistent-dir".into(),
    ]);
    assert!(!o.status.success());
}

/// A repository the daemon can read but not write (a read-only bind mount in the daemon's own
/// mount namespace) diffs like any other, untracked files included: the private copy of the
/// index lives outside the repository.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_repository_the_daemon_cannot_write_still_diffs() {
    if !have_git() {
        return;
    }
    let work = tempfile::tempdir().unwrap();
    let r = repo(&work.path().join("ro"));
    std::fs::write(r.join("a.txt"), "one\nTWO\n").unwrap();
    std::fs::write(r.join("new.txt"), "fresh\n").unwrap();
    let script = format!(
        "mount --bind {0} {0} && mount -o remount,bind,ro {0} && exec \"$@\"",
        r.display()
    );
    let d = Daemon::builder()
        .work_dir(work.path())
        .wrapper(["unshare", "-m", "sh", "-c", &script, "sh"])
        .start();
    // The daemon really cannot write there.
    let (st, p) = post(
        &d,
        "/v1/git/commit",
        json!({"path": r.display().to_string(), "message": "x", "all": true}),
    )
    .await;
    assert!(st.is_client_error() || st.is_server_error(), "{st} {p}");
    let (st, diff) = get(&d, "/v1/git/diff", &[("path", &r.display().to_string())]).await;
    assert_eq!(st, StatusCode::OK, "{diff}");
    let mut seen: Vec<(String, String)> = diff["files"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| {
            (
                f["path"].as_str().unwrap().to_string(),
                f["status"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    seen.sort();
    assert_eq!(
        seen,
        vec![
            ("a.txt".to_string(), "modified".to_string()),
            ("new.txt".to_string(), "added".to_string()),
        ]
    );
}
