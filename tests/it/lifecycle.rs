//! The daemon's foundation seen from outside: readiness, auth, problem+json errors, config
//! precedence and validation, signals, the watchdog, socket activation and PID 1.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::support::{BIN, Daemon, children_of, eventually, is_root, skip, zombies_among};

async fn problem(resp: reqwest::Response, status: u16) -> Value {
    assert_eq!(resp.status().as_u16(), status, "status");
    let ct = resp.headers()[reqwest::header::CONTENT_TYPE]
        .to_str()
        .unwrap()
        .to_string();
    assert_eq!(ct, "application/problem+json");
    let body: Value = resp.json().await.unwrap();
    assert_eq!(body["status"], status);
    assert!(body["title"].is_string() && body["detail"].is_string() && body["type"].is_string());
    body
}

#[tokio::test]
async fn root_and_health_answer() {
    let d = Daemon::start();
    let c = d.client();
    let root = d.get_json("/").await;
    assert_eq!(root["name"], "Sandbox Agent");
    assert_eq!(root["version"], env!("CARGO_PKG_VERSION"));
    let health = c.get(d.url("/v1/health")).send().await.unwrap();
    assert_eq!(health.status(), 200);
    let health = health.json::<Value>().await.unwrap();
    assert_eq!(health["status"], "ok", "{health}");
    assert_eq!(health["dataDir"]["writable"], true, "{health}");
}

#[tokio::test]
async fn token_is_required_on_v1_and_never_logged() {
    let d = Daemon::builder().token("s3cret-token").start();
    let anon = crate::support::http();
    // `/` stays open so probes and humans can see what is running.
    assert_eq!(anon.get(d.url("/")).send().await.unwrap().status(), 200);

    let resp = anon.get(d.url("/v1/health")).send().await.unwrap();
    assert_eq!(resp.headers()["www-authenticate"], "Bearer");
    problem(resp, 401).await;
    let wrong = anon
        .get(d.url("/v1/health"))
        .bearer_auth("s3cret-tokeN")
        .send()
        .await
        .unwrap();
    problem(wrong, 401).await;
    let longer = anon
        .get(d.url("/v1/health"))
        .bearer_auth("s3cret-token2")
        .send()
        .await
        .unwrap();
    problem(longer, 401).await;
    // Unknown /v1 routes need the token too: nothing about the surface leaks without it.
    problem(anon.get(d.url("/v1/nope")).send().await.unwrap(), 401).await;
    // An unmatched method is refused by the edge (401) and axum adds `Allow` to that answer:
    // CONNECT (HTTP/2's extended CONNECT of the WebSocket routes) is not listed there either.
    let resp = anon
        .request(reqwest::Method::OPTIONS, d.url("/v1/acp/s1"))
        .send()
        .await
        .unwrap();
    let allow = resp.headers()["allow"].to_str().unwrap().to_string();
    assert!(
        allow.contains("POST") && !allow.contains("CONNECT"),
        "{allow}"
    );
    problem(resp, 401).await;

    let ok = d.client().get(d.url("/v1/health")).send().await.unwrap();
    assert_eq!(ok.status(), 200);
    assert!(
        !d.stderr().contains("s3cret-token"),
        "the token reached the log"
    );
}

#[tokio::test]
async fn unknown_routes_and_methods_are_problems() {
    let d = Daemon::start();
    let c = d.client();
    let body = problem(c.get(d.url("/v1/nope")).send().await.unwrap(), 404).await;
    assert!(body["detail"].as_str().unwrap().contains("/v1/nope"));
    // (`/opencode/*` is served again, by the OpenCode bridge: tests/it/opencode.rs.)
    for removed in ["/v1/rpc", "/v1/rpc/session"] {
        problem(c.get(d.url(removed)).send().await.unwrap(), 404).await;
        let r = c
            .post(d.url(removed))
            .header("content-type", "application/json")
            .body("{}");
        problem(r.send().await.unwrap(), 404).await;
    }
    let resp = c.delete(d.url("/v1/health")).send().await.unwrap();
    assert!(resp.headers().contains_key("allow"));
    problem(resp, 405).await;
    problem(c.post(d.url("/")).send().await.unwrap(), 405).await;
    // The WebSocket routes take CONNECT only as HTTP/2's extended CONNECT; `Allow` lists the
    // methods of the resource, which CONNECT is not.
    let resp = c
        .patch(d.url("/v1/acp/s1"))
        .header("content-type", "application/json")
        .body("{}")
        .send()
        .await
        .unwrap();
    let allow = resp.headers()["allow"].to_str().unwrap().to_string();
    assert!(
        allow.contains("POST") && !allow.contains("CONNECT"),
        "{allow}"
    );
    problem(resp, 405).await;
}

fn run_to_exit(args: &[&str], envs: &[(&str, &str)]) -> (i32, String) {
    let out = Command::new(BIN)
        .args(args)
        .envs(envs.iter().copied())
        .env_remove("SANDBOX_AGENT_TOKEN")
        .stdin(Stdio::null())
        .output()
        .expect("run sandbox-agent");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn bad_config_file_names_every_bad_key_and_exits_78() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("bad.toml");
    std::fs::write(
        &file,
        "port = 'eighty'\nrequest_timeout = 'soon'\nbogus_key = 1\nanother-unknown = true\n\
         agent_memory_max = '12Q'\nlog_format = 'xml'\n",
    )
    .unwrap();
    let (code, stderr) = run_to_exit(&["--config", file.to_str().unwrap()], &[]);
    assert_eq!(code, 78, "stderr: {stderr}");
    for key in [
        "`port`",
        "`request_timeout`",
        "`bogus_key`",
        "`another_unknown`",
        "`agent_memory_max`",
        "`log_format`",
    ] {
        assert!(stderr.contains(key), "{key} not named in:\n{stderr}");
    }
    assert!(stderr.contains("6 problem(s)"), "{stderr}");
}

#[test]
fn public_address_without_token_is_refused() {
    let (code, stderr) = run_to_exit(&["--host", "0.0.0.0", "--port", "0"], &[]);
    assert_eq!(code, 78);
    assert!(
        stderr.contains("--token") && stderr.contains("--no-token"),
        "{stderr}"
    );
}

#[test]
fn usage_errors_exit_64_and_help_exits_0() {
    let (code, stderr) = run_to_exit(&["--no-such-flag"], &[]);
    assert_eq!(code, 64, "{stderr}");
    let (code, _) = run_to_exit(&["--port", "not-a-port"], &[]);
    assert_eq!(code, 64);
    let out = Command::new(BIN).arg("--help").output().unwrap();
    assert_eq!(out.status.code(), Some(0));
    let help = String::from_utf8_lossy(&out.stdout);
    for flag in [
        "--host",
        "--port",
        "--token",
        "--no-token",
        "--config",
        "--request-timeout",
    ] {
        assert!(help.contains(flag), "--help lacks {flag}");
    }
    let out = Command::new(BIN).arg("--version").output().unwrap();
    assert!(String::from_utf8_lossy(&out.stdout).contains(env!("CARGO_PKG_VERSION")));
}

/// flag > environment > config file > default, shown through the token each source sets.
#[tokio::test]
async fn flag_beats_env_beats_config_file() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("c.toml");
    std::fs::write(&file, "token = 'from-file'\nkeepalive = '20s'\n").unwrap();
    let file_arg = file.to_str().unwrap().to_string();

    async fn accepted(d: &Daemon, token: &str) -> bool {
        crate::support::http()
            .get(d.url("/v1/health"))
            .bearer_auth(token)
            .send()
            .await
            .unwrap()
            .status()
            == 200
    }

    let d = Daemon::builder().args(["--config", &file_arg]).start();
    assert!(accepted(&d, "from-file").await);
    drop(d);

    let d = Daemon::builder()
        .args(["--config", &file_arg])
        .env("SANDBOX_AGENT_TOKEN", "from-env")
        .start();
    assert!(accepted(&d, "from-env").await);
    assert!(!accepted(&d, "from-file").await);
    drop(d);

    let d = Daemon::builder()
        .env("SANDBOX_AGENT_CONFIG", &file_arg)
        .env("SANDBOX_AGENT_TOKEN", "from-env")
        .args(["--token", "from-flag"])
        .start();
    assert!(accepted(&d, "from-flag").await);
    assert!(!accepted(&d, "from-env").await);
}

#[test]
fn sigterm_sends_stopping_and_exits_zero() {
    let mut d = Daemon::start();
    d.signal(nix::sys::signal::Signal::SIGTERM);
    d.wait_notify("STOPPING=1", Duration::from_secs(5));
    assert_eq!(d.wait_exit(Duration::from_secs(10), "SIGTERM"), 0);
}

/// SIGHUP reloads (it does not stop the daemon), and a SIGINT sent while that reload runs is
/// not lost, whichever step of the reload it meets.
#[test]
fn sigint_stops_gracefully_even_in_the_middle_of_a_reload() {
    let mut d = Daemon::start();
    d.signal(nix::sys::signal::Signal::SIGHUP);
    eventually(Duration::from_secs(5), "SIGHUP logged", || {
        d.stderr().contains("SIGHUP").then_some(())
    });
    assert!(
        crate::support::pid_alive(d.pid()),
        "SIGHUP must not stop the daemon"
    );
    d.signal(nix::sys::signal::Signal::SIGINT);
    d.wait_notify("STOPPING=1", Duration::from_secs(10));
    assert_eq!(d.wait_exit(Duration::from_secs(10), "SIGINT"), 0);
}

/// The window a handler-based design lost signals in: the reload has written its hand-off and
/// is about to exec. The test hook holds the reload there; a SIGTERM sent then must stay
/// pending across the exec and stop the new image, gracefully.
#[test]
fn a_stop_signal_sent_just_before_a_reloads_exec_stops_the_new_image() {
    let mut d = Daemon::builder()
        .env("SANDBOX_AGENT_TEST_RELOAD_PAUSE_MS", "1500")
        .start();
    let pid = d.pid();
    d.signal(nix::sys::signal::Signal::SIGHUP);
    eventually(Duration::from_secs(15), "the reload at its exec", || {
        d.stderr()
            .contains("reload: executing the new image")
            .then_some(())
    });
    d.signal(nix::sys::signal::Signal::SIGTERM);
    d.wait_notify("STOPPING=1", Duration::from_secs(15));
    assert_eq!(d.pid(), pid);
    assert_eq!(d.wait_exit(Duration::from_secs(10), "SIGTERM"), 0);
    let log = d.stderr();
    let exec = log.find("reload: executing the new image").unwrap();
    let stop = log
        .find("stop signal received")
        .expect("the SIGTERM is logged");
    assert!(
        stop > exec,
        "the SIGTERM must be read by the new image, after the exec:\n{log}"
    );
    // The new image took over (and then stopped) rather than the old one stopping.
    assert!(log[exec..].contains("reloaded; listening"), "{log}");
}

#[test]
fn watchdog_pings_arrive_when_systemd_asks() {
    // WATCHDOG_PID names the daemon itself, which we only know after spawning: leave it unset
    // (systemd omits it too when the main pid is the one it started).
    let mut d = Daemon::builder().env("WATCHDOG_USEC", "200000").start();
    let started = Instant::now();
    eventually(Duration::from_secs(5), "three WATCHDOG=1 pings", || {
        d.read_notify();
        let pings = d
            .messages
            .iter()
            .filter(|m| m.lines().any(|l| l == "WATCHDOG=1"))
            .count();
        (pings >= 3).then_some(())
    });
    // Three pings at a 100 ms interval cannot take less than ~200 ms.
    assert!(started.elapsed() >= Duration::from_millis(150));
}

#[test]
fn no_watchdog_pings_unless_asked() {
    let mut d = Daemon::start();
    std::thread::sleep(Duration::from_millis(600));
    d.read_notify();
    assert!(
        !d.messages.iter().any(|m| m.contains("WATCHDOG=1")),
        "{:?}",
        d.messages
    );
}

/// The test plays systemd: a listening socket handed over as fd 3 with LISTEN_FDS/LISTEN_PID.
#[tokio::test]
async fn socket_activation_serves_on_the_inherited_socket() {
    let dir = tempfile::tempdir().unwrap();
    let port_file = dir.path().join("port");
    let launcher = format!(
        "import os, socket, sys\n\
         s = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen(16)\n\
         open({port:?}, 'w').write(str(s.getsockname()[1]))\n\
         fd = s.fileno()\n\
         if fd != 3:\n    os.dup2(fd, 3)\n\
         os.set_inheritable(3, True)\n\
         os.environ['LISTEN_FDS'] = '1'; os.environ['LISTEN_PID'] = str(os.getpid())\n\
         os.execv(sys.argv[1], sys.argv[1:])\n",
        port = port_file.to_str().unwrap()
    );
    if Command::new("python3").arg("--version").output().is_err() {
        return skip("python3 is needed to play systemd's socket activation");
    }
    let d = Daemon::builder()
        .wrapper(["python3", "-c", &launcher])
        .start();
    let port: u16 = std::fs::read_to_string(&port_file)
        .unwrap()
        .parse()
        .unwrap();
    assert_eq!(
        d.addr,
        format!("127.0.0.1:{port}"),
        "STATUS= must name the inherited socket"
    );
    let resp = d
        .client()
        .get(format!("http://127.0.0.1:{port}/v1/health"))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
}

/// Host pid of the process that is PID 1 inside the namespace `unshare --fork` made.
fn namespace_init(unshare_pid: u32) -> u32 {
    eventually(Duration::from_secs(5), "the namespace's PID 1", || {
        children_of(unshare_pid).first().copied()
    })
}

fn make_orphans(ns_init: u32, count: u32) {
    let script = format!("for i in $(seq {count}); do (sleep 0.2 &); done");
    let status = Command::new("nsenter")
        .args(["-t", &ns_init.to_string(), "-p", "-m", "sh", "-c", &script])
        .status()
        .expect("nsenter");
    assert!(status.success());
}

fn zombie_children(pid: u32) -> Vec<u32> {
    zombies_among(&children_of(pid))
}

fn unshare_available() -> bool {
    is_root()
        && Command::new("unshare")
            .args(["--pid", "--fork", "--mount-proc", "true"])
            .status()
            .is_ok_and(|s| s.success())
}

#[test]
fn as_pid1_reaps_orphans_and_exits_zero_on_sigterm() {
    if !unshare_available() {
        return skip("needs root and unshare --pid to run the daemon as PID 1");
    }
    // Negative control: a PID 1 that never reaps leaves zombies our check can see.
    let mut control = Command::new("unshare")
        .args(["--pid", "--fork", "--mount-proc", "sleep", "30"])
        .spawn()
        .unwrap();
    let control_init = namespace_init(control.id());
    make_orphans(control_init, 20);
    eventually(
        Duration::from_secs(5),
        "zombies under the non-reaping control",
        || (zombie_children(control_init).len() >= 20).then_some(()),
    );
    // Its init (`sleep`) first: killing `unshare` alone left it, and the test's output pipes
    // with it, for the rest of its 30 s. The namespace's other processes end with their init.
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(control_init as i32),
        nix::sys::signal::Signal::SIGKILL,
    );
    let _ = control.kill();
    let _ = control.wait();

    let mut d = Daemon::builder()
        .wrapper(["unshare", "--pid", "--fork", "--mount-proc"])
        .expect_exit(None)
        .start();
    let init = namespace_init(d.pid());
    let daemon_child = eventually(Duration::from_secs(5), "the daemon under our init", || {
        children_of(init).first().copied()
    });
    make_orphans(init, 100);
    // Every orphan sleeps 0.2 s then exits; our init must reap all of them.
    std::thread::sleep(Duration::from_millis(100));
    eventually(Duration::from_secs(10), "every orphan reaped", || {
        let kids = children_of(init);
        (kids == vec![daemon_child] && zombie_children(init).is_empty()).then_some(())
    });

    // SIGTERM to PID 1 reaches the daemon, which stops gracefully; the namespace ends with 0.
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(init as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    d.wait_notify("STOPPING=1", Duration::from_secs(5));
    let mut child = d.child.take().unwrap();
    let status = eventually(Duration::from_secs(15), "the namespace to end", || {
        child.try_wait().unwrap()
    });
    assert_eq!(status.code(), Some(0), "stderr:\n{}", d.stderr());
}

#[test]
fn init_flag_forwards_sigterm_and_exits_with_the_daemon_status() {
    let mut d = Daemon::builder().arg("--init").start();
    let init = d.pid();
    let daemon_child = eventually(Duration::from_secs(5), "the daemon child", || {
        children_of(init).first().copied()
    });
    assert_ne!(daemon_child, init);
    // SIGTERM to the init is forwarded: the daemon stops gracefully and the init exits 0.
    d.signal(nix::sys::signal::Signal::SIGTERM);
    d.wait_notify("STOPPING=1", Duration::from_secs(5));
    assert_eq!(d.wait_exit(Duration::from_secs(10), "SIGTERM"), 0);

    // A daemon killed outright is reported as 128 + signal.
    let mut d = Daemon::builder().arg("--init").expect_exit(None).start();
    let init = d.pid();
    let daemon_child = eventually(Duration::from_secs(5), "the daemon child", || {
        children_of(init).first().copied()
    });
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(daemon_child as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    let mut child = d.child.take().unwrap();
    let status = eventually(Duration::from_secs(10), "the init to exit", || {
        child.try_wait().unwrap()
    });
    assert_eq!(status.code(), Some(137));
}
