//! What a new user or operator meets in the first hour, seen through the real binary: log
//! levels spelt as people spell them (and never a filter that hides the fatal error), errors that
//! name what the user actually set, a config file's typos, `--host localhost`, a data directory
//! that cannot be written, agents that die between requests, JSON log lists, the mock agent's
//! `--help`, and process logs for humans (`?encoding=utf8`).

use std::net::TcpListener;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::{Value, json};

use crate::support::{BIN, Daemon, eventually, eventually_async, is_root};

fn run_to_exit(args: &[&str], envs: &[(&str, &str)]) -> (i32, String) {
    let out = Command::new(BIN)
        .args(args)
        .env_remove("SANDBOX_AGENT_TOKEN")
        .env_remove("SANDBOX_AGENT_LOG_LEVEL")
        .envs(envs.iter().copied())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .output()
        .expect("run sandbox-agent");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Every usual spelling of a level, in any case, keeps the fatal "cannot listen" error on
/// stderr (exit 69) — `warning` used to be read as a module name and silence everything.
#[test]
fn every_level_spelling_still_shows_the_fatal_error() {
    let taken = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port().to_string();
    let data = tempfile::tempdir().unwrap();
    let data = data.path().to_str().unwrap();
    for level in [
        "error",
        "ERROR",
        "warn",
        "Warn",
        "warning",
        "WARNING",
        "info",
        "INFO",
        "debug",
        "verbose",
        "trace",
        "Warning,sandbox_agent::acp=Verbose",
    ] {
        for format in ["text", "json"] {
            let (code, err) = run_to_exit(
                &[
                    "--port",
                    &port,
                    "--data-dir",
                    data,
                    "--log-level",
                    level,
                    "--log-format",
                    format,
                ],
                &[],
            );
            assert_eq!(code, 69, "{level} ({format}): {err}");
            assert!(
                err.contains("cannot listen") && err.contains(&port),
                "{level} ({format}) hid the fatal error: {err:?}"
            );
        }
    }
    // The same through the environment variable.
    let (code, err) = run_to_exit(
        &["--port", &port, "--data-dir", data],
        &[("SANDBOX_AGENT_LOG_LEVEL", "WARNING")],
    );
    assert_eq!(code, 69, "{err}");
    assert!(err.contains("cannot listen"), "{err:?}");
}

/// A filter that would show none of the daemon's own errors is refused (78), naming the source.
#[test]
fn a_log_filter_that_hides_our_errors_is_refused_with_78() {
    for filter in [
        "hyper=debug",
        "off",
        "info,sandbox_agent=off",
        "sandbox_agent::acp=debug",
        "loud",
        ",",
    ] {
        let (code, err) = run_to_exit(&["--port", "0", "--log-level", filter], &[]);
        assert_eq!(code, 78, "{filter}: {err}");
        assert!(err.contains("--log-level"), "{filter}: {err}");
    }
    let (code, err) = run_to_exit(&["--port", "0"], &[("SANDBOX_AGENT_LOG_LEVEL", "verbosee")]);
    assert_eq!(code, 78, "{err}");
    assert!(
        err.contains("environment variable SANDBOX_AGENT_LOG_LEVEL"),
        "{err}"
    );
}

/// A bad value from the environment names the variable, not a flag the user never typed; a bad
/// flag names the flag.
#[test]
fn errors_name_the_environment_variable_the_user_set() {
    let (code, err) = run_to_exit(&[], &[("SANDBOX_AGENT_PORT", "eighty")]);
    assert_eq!(code, 64, "{err}");
    assert!(err.contains("SANDBOX_AGENT_PORT"), "{err}");
    let (code, err) = run_to_exit(&[], &[("SANDBOX_AGENT_REQUIRE_PREINSTALL", "maybe")]);
    assert_eq!(code, 64, "{err}");
    assert!(err.contains("SANDBOX_AGENT_REQUIRE_PREINSTALL"), "{err}");
    let (code, err) = run_to_exit(&[], &[("SANDBOX_AGENT_REQUEST_TIMEOUT", "soon")]);
    assert_eq!(code, 78, "{err}");
    assert!(
        err.contains("environment variable SANDBOX_AGENT_REQUEST_TIMEOUT")
            && !err.contains("--request-timeout"),
        "{err}"
    );
    let (code, err) = run_to_exit(&["--request-timeout", "soon"], &[]);
    assert_eq!(code, 78, "{err}");
    assert!(
        err.contains("--request-timeout") && !err.contains("SANDBOX_AGENT_REQUEST_TIMEOUT"),
        "{err}"
    );
    // A flag given on the command line is still named as the flag when clap refuses it.
    let (code, err) = run_to_exit(&["--port", "eighty"], &[("SANDBOX_AGENT_PORT", "8080")]);
    assert_eq!(code, 64, "{err}");
    assert!(err.contains("--port"), "{err}");
}

/// An unknown key gets the nearest known one; agent tables are pointed at `--agents-file`.
#[test]
fn config_file_typos_get_the_nearest_key_and_agents_the_agents_file() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("c.toml");
    std::fs::write(
        &file,
        "request_timout = '5s'\nlog-levle = 'info'\nzzzzzzzz = 1\n\n\
         [[agent]]\nid = 'mine'\ncommand = '/bin/true'\n",
    )
    .unwrap();
    let (code, err) = run_to_exit(&["--config", file.to_str().unwrap()], &[]);
    assert_eq!(code, 78, "{err}");
    assert!(
        err.contains("unknown key `request_timout`; did you mean `request_timeout`?"),
        "{err}"
    );
    assert!(
        err.contains("unknown key `log_levle`; did you mean `log_level`?"),
        "{err}"
    );
    let far = err
        .lines()
        .find(|l| l.contains("`zzzzzzzz`"))
        .expect("the far key");
    assert!(!far.contains("did you mean"), "{far}");
    let agent = err
        .lines()
        .find(|l| l.contains("`agent`"))
        .expect("the agent table");
    assert!(agent.contains("--agents-file"), "{agent}");
}

/// `--host localhost` listens on loopback; a name that is not loopback is refused with the
/// address to use.
#[tokio::test]
async fn host_localhost_listens_on_loopback() {
    let free = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = free.local_addr().unwrap().port();
    drop(free);
    let data = tempfile::tempdir().unwrap();
    let mut child = Command::new(BIN)
        .args(["--host", "localhost", "--port", &port.to_string()])
        .arg("--data-dir")
        .arg(data.path())
        .env_remove("SANDBOX_AGENT_TOKEN")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let url = format!("http://127.0.0.1:{port}/v1/health");
    let client = crate::support::http();
    eventually_async(Duration::from_secs(20), "health on 127.0.0.1", || {
        let client = client.clone();
        let url = url.clone();
        async move {
            let r = client.get(&url).send().await.ok()?;
            (r.status() == 200).then_some(())
        }
    })
    .await;
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    assert_eq!(child.wait().unwrap().code(), Some(0));

    let (code, err) = run_to_exit(&["--host", "no-such-host.invalid", "--port", "0"], &[]);
    assert_eq!(code, 78, "{err}");
    assert!(
        err.contains("127.0.0.1") && err.contains("0.0.0.0"),
        "{err}"
    );
}

/// A data directory that can never exist is refused at start (73); one that exists but cannot
/// be written is a warning at start and is reported by `/v1/health`.
#[tokio::test]
async fn data_dir_problems_are_found_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("a-file");
    std::fs::write(&file, "not a directory").unwrap();
    let impossible = file.join("data");
    let (code, err) = run_to_exit(
        &["--port", "0", "--data-dir", impossible.to_str().unwrap()],
        &[],
    );
    assert_eq!(code, 73, "{err}");
    assert!(err.contains(impossible.to_str().unwrap()), "{err}");

    // Control: a writable one is reported as such.
    let d = Daemon::start();
    let health = d.get_json("/v1/health").await;
    assert_eq!(health["status"], "ok", "{health}");
    assert_eq!(health["dataDir"]["writable"], true, "{health}");
    drop(d);

    let ro = dir.path().join("read-only");
    std::fs::create_dir(&ro).unwrap();
    let ro_str = ro.to_str().unwrap().to_string();
    let builder = if is_root() {
        // Root writes through any mode: a read-only bind mount in a private namespace instead.
        let script = format!(
            "mount --bind {ro_str} {ro_str} && mount -o remount,bind,ro {ro_str} && exec \"$@\""
        );
        Daemon::builder().wrapper(["unshare", "-m", "sh", "-c", &script, "sh"])
    } else {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&ro, std::fs::Permissions::from_mode(0o555)).unwrap();
        Daemon::builder()
    };
    let d = builder.data_dir(&ro).args(["--log-format", "json"]).start();
    let health = d.get_json("/v1/health").await;
    assert_eq!(health["dataDir"]["writable"], false, "{health}");
    assert_eq!(health["dataDir"]["path"], ro_str, "{health}");
    assert!(health["dataDir"]["problem"].is_string(), "{health}");
    let warned = d
        .stderr()
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .any(|e| e["level"] == "WARN" && e["data_dir"] == ro_str.as_str());
    assert!(warned, "no warning at start:\n{}", d.stderr());
}

/// Writes `agents.toml` declaring each `(id, shell script)` as an agent run by `/bin/sh`.
fn agents_file(dir: &Path, agents: &[(&str, &str)]) -> std::path::PathBuf {
    let mut toml = String::new();
    for (id, script) in agents {
        let path = dir.join(format!("{id}.sh"));
        std::fs::write(&path, script).unwrap();
        toml.push_str(&format!(
            "[[agent]]\nid = \"{id}\"\ncommand = \"/bin/sh\"\nargs = [\"{}\"]\n\n",
            path.display()
        ));
    }
    let file = dir.join("agents.toml");
    std::fs::write(&file, toml).unwrap();
    file
}

fn log_entries(d: &Daemon) -> Vec<Value> {
    d.stderr()
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

/// An agent that answers, then dies on its own between requests (non-zero exit, or a signal), is
/// one WARN line with its exit code or signal and its last stderr words — visible at
/// `--log-level warn` — while a stop we asked for stays below warn, and each end is logged once.
#[tokio::test]
async fn agents_dying_between_requests_are_warnings_with_their_last_words() {
    let dir = tempfile::tempdir().unwrap();
    let answer = r#"read line; printf '%s\n' '{"jsonrpc":"2.0","id":1,"result":{}}'"#;
    let file = agents_file(
        dir.path(),
        &[
            (
                "quitter",
                &format!("{answer}\necho 'fatal: out of tokens' >&2\nexit 3\n"),
            ),
            (
                "killed",
                &format!("{answer}\necho 'about to be killed' >&2\nkill -9 $$\n"),
            ),
            ("calm", &format!("{answer}\nexec sleep 600\n")),
        ],
    );
    let d = Daemon::builder()
        .arg("--agents-file")
        .arg(&file)
        .args(["--log-format", "json", "--log-level", "warn"])
        .start();
    for agent in ["quitter", "killed", "calm"] {
        let r = d
            .client()
            .post(d.url(&format!("/v1/acp/{agent}?agent={agent}")))
            .header("content-type", "application/json")
            .body(json!({"jsonrpc": "2.0", "id": 1, "method": "initialize"}).to_string())
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200, "{agent}");
    }
    let quitter = eventually(Duration::from_secs(10), "the quitter's warning", || {
        log_entries(&d)
            .into_iter()
            .find(|e| e["server_id"] == "quitter" && e["message"] == "agent ended unexpectedly")
    });
    assert_eq!(quitter["level"], "WARN", "{quitter}");
    assert_eq!(quitter["code"], 3, "{quitter}");
    assert_eq!(quitter["reason"], "exited", "{quitter}");
    assert!(
        quitter["stderr_tail"]
            .as_str()
            .unwrap()
            .contains("fatal: out of tokens"),
        "{quitter}"
    );
    let killed = eventually(
        Duration::from_secs(10),
        "the killed agent's warning",
        || {
            log_entries(&d)
                .into_iter()
                .find(|e| e["server_id"] == "killed" && e["message"] == "agent ended unexpectedly")
        },
    );
    assert_eq!(killed["signal"], 9, "{killed}");
    assert_eq!(killed["reason"], "crashed", "{killed}");
    assert!(
        killed["stderr_tail"]
            .as_str()
            .unwrap()
            .contains("about to be killed"),
        "{killed}"
    );
    // A DELETE's graceful stop is no warning.
    let r = d
        .client()
        .delete(d.url("/v1/acp/calm"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 204);
    eventually_async(Duration::from_secs(10), "the calm agent gone", || async {
        d.servers()
            .await
            .iter()
            .all(|s| s["serverId"] != "calm")
            .then_some(())
    })
    .await;
    let log = log_entries(&d);
    for id in ["quitter", "killed"] {
        let ends = log
            .iter()
            .filter(|e| e["server_id"] == id && e["reason"].is_string())
            .count();
        assert_eq!(ends, 1, "{id} logged {ends} ends:\n{}", d.stderr());
    }
    assert!(
        !log.iter()
            .any(|e| e["server_id"] == "calm" && e["reason"].is_string()),
        "a graceful stop reached the warn level:\n{}",
        d.stderr()
    );
}

/// In JSON logs a list field is a JSON array (the start-up line of the agents' cgroups lists
/// its directories and controllers).
#[tokio::test]
async fn json_log_lists_are_arrays() {
    if !is_root() {
        crate::support::skip("the cgroup start-up line needs root");
        return;
    }
    let d = Daemon::builder().args(["--log-format", "json"]).start();
    let ready = eventually(Duration::from_secs(5), "the cgroups line", || {
        log_entries(&d)
            .into_iter()
            .find(|e| e["message"] == "agent cgroups ready")
    });
    assert!(ready["dirs"].is_array(), "{ready}");
    assert!(ready["controllers"].is_array(), "{ready}");
    assert!(
        ready["controllers"]
            .as_array()
            .unwrap()
            .iter()
            .all(Value::is_string),
        "{ready}"
    );
}

/// The commands the mock's prompt dispatch knows, read from its source.
fn mock_commands() -> Vec<String> {
    let src = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/src/agents/mock.rs"))
        .unwrap();
    let mut out: Vec<String> = src
        .lines()
        .filter_map(|l| {
            let l = l.trim_start();
            let rest = l.strip_prefix("\"/")?;
            let (name, tail) = rest.split_once('"')?;
            tail.trim_start()
                .starts_with("=>")
                .then(|| format!("/{name}"))
        })
        .collect();
    out.sort();
    out.dedup();
    out
}

/// Every prompt command of the mock agent is in `mock-agent --help` and in docs/acp.md.
#[test]
fn mock_agent_help_and_docs_list_every_command() {
    let commands = mock_commands();
    assert!(commands.len() >= 10, "{commands:?}");
    let out = Command::new(BIN)
        .args(["mock-agent", "--help"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0));
    let help = String::from_utf8_lossy(&out.stdout);
    let docs =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/acp.md")).unwrap();
    for c in &commands {
        assert!(
            help.lines().any(|l| l.trim_start().starts_with(c.as_str())),
            "mock-agent --help lacks {c}:\n{help}"
        );
        assert!(docs.contains(&format!("`{c}")), "docs/acp.md lacks {c}");
    }
}

/// `?encoding=utf8` gives process log entries as text (lossy), base64 stays the default, and an
/// unknown encoding is a 400.
#[tokio::test]
async fn process_logs_as_utf8_for_humans() {
    let d = Daemon::start();
    let r = d
        .client()
        .post(d.url("/v1/processes"))
        .json(
            &json!({"command": "sh", "args": ["-c", "printf 'héllo\\n'; printf '\\377x\\n' >&2"]}),
        )
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success());
    let id = r.json::<Value>().await.unwrap()["id"]
        .as_str()
        .unwrap()
        .to_string();
    let logs = |q: &'static str| {
        let client = d.client();
        let url = d.url(&format!("/v1/processes/{id}/logs{q}"));
        async move {
            let r = client.get(url).send().await.unwrap();
            (r.status().as_u16(), r.json::<Value>().await.unwrap())
        }
    };
    let text = eventually_async(Duration::from_secs(10), "both lines", || async {
        let (status, v) = logs("?encoding=utf8").await;
        assert_eq!(status, 200, "{v}");
        let all: String = v["entries"]
            .as_array()?
            .iter()
            .map(|e| {
                assert_eq!(e["encoding"], "utf8", "{e}");
                e["data"].as_str().unwrap().to_string()
            })
            .collect();
        (all.contains("héllo") && all.contains("x\n")).then_some(all)
    })
    .await;
    assert!(
        text.contains("\u{fffd}x"),
        "invalid UTF-8 is replaced: {text:?}"
    );
    let (status, v) = logs("").await;
    assert_eq!(status, 200);
    assert!(
        v["entries"]
            .as_array()
            .unwrap()
            .iter()
            .all(|e| e["encoding"] == "base64"),
        "{v}"
    );
    let (status, v) = logs("?encoding=latin1").await;
    assert_eq!(status, 400, "{v}");
    // The follow stream too.
    let body = d
        .client()
        .get(d.url(&format!(
            "/v1/processes/{id}/logs?follow=true&encoding=utf8"
        )))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        body.contains("\"encoding\":\"utf8\"") && body.contains("héllo"),
        "{body}"
    );
}

/// Not a check of its own: the subject of `a_skipped_test_says_so_in_cargos_output`, skipped
/// only when that test asks for it.
#[test]
#[ignore = "run only by a_skipped_test_says_so_in_cargos_output"]
fn skip_probe() {
    if std::env::var_os("SANDBOX_AGENT_SKIP_PROBE").is_some() {
        crate::support::skip("the probe was asked to skip");
    }
}

/// cargo counts a skipped test as passed; the skip must still be visible in cargo's own output
/// (not only in the captured output cargo shows for failures), and in the report.
#[test]
fn a_skipped_test_says_so_in_cargos_output() {
    let dir = tempfile::tempdir().unwrap();
    let report = dir.path().join("skipped.txt");
    let out = Command::new(std::env::current_exe().unwrap())
        .args(["--ignored", "--exact", "operator_messages::skip_probe"])
        .env("SANDBOX_AGENT_SKIP_PROBE", "1")
        .env("SANDBOX_AGENT_SKIP_REPORT", &report)
        .env_remove("SANDBOX_AGENT_TESTS_STRICT")
        .output()
        .unwrap();
    let all = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{all}");
    assert!(
        all.contains("test operator_messages::skip_probe ... ok"),
        "{all}"
    );
    assert!(
        all.contains("SKIPPED: operator_messages::skip_probe: the probe was asked to skip"),
        "the skip is not in the harness's output:\n{all}"
    );
    let listed = std::fs::read_to_string(&report).unwrap();
    assert!(listed.contains("operator_messages::skip_probe"), "{listed}");
}
