//! The command-line client (`sandbox-agent status|instances|acp|processes|fs`) run as the real
//! binary against a real daemon with the mock agent: what each command prints, in tables and
//! with `--json`, that transfers and followed streams are streamed, and the exit code of every
//! failure class (daemon down, token refused, not found, bad request, server error, usage).

use std::io::{Read, Write};
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

use serde_json::Value;

use crate::support::{BIN, Daemon, pid_alive};

/// The client binary with none of the daemon's variables from the test's environment.
fn command(args: &[&str]) -> Command {
    let mut cmd = Command::new(BIN);
    cmd.args(args).stdin(Stdio::null());
    for (k, _) in std::env::vars_os() {
        if k.to_string_lossy().starts_with("SANDBOX_AGENT_") {
            cmd.env_remove(k);
        }
    }
    cmd
}

/// Runs a client command against `d` (its URL and token in the environment, as an operator's
/// shell would have them, so that trailing arguments stay the command's own).
fn cli(d: &Daemon, args: &[&str]) -> Output {
    let mut cmd = command(args);
    cmd.env("SANDBOX_AGENT_URL", d.url(""));
    if let Some(t) = &d.token {
        cmd.env("SANDBOX_AGENT_TOKEN", t);
    }
    run_to_end(cmd)
}

fn run_to_end(mut cmd: Command) -> Output {
    let child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn the client");
    wait_bounded(child, Duration::from_secs(60))
}

/// Waits for the child's output, killing it after `limit` (a hung client fails the test).
fn wait_bounded(child: Child, limit: Duration) -> Output {
    let pid = child.id();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    match rx.recv_timeout(limit) {
        Ok(out) => out.expect("client output"),
        Err(_) => {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid as i32),
                nix::sys::signal::Signal::SIGKILL,
            );
            panic!("the client did not finish within {limit:?}");
        }
    }
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Asserts the exit code, showing both streams when it differs.
fn assert_code(o: &Output, code: i32) {
    assert_eq!(
        o.status.code(),
        Some(code),
        "exit status {:?}\nstdout: {}\nstderr: {}",
        o.status,
        stdout(o),
        stderr(o)
    );
}

fn json_of(o: &Output) -> Value {
    serde_json::from_slice(&o.stdout)
        .unwrap_or_else(|e| panic!("stdout is not one JSON document ({e}): {}", stdout(o)))
}

const INIT: &str =
    r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":1}}"#;
const NEW_SESSION: &str =
    r#"{"jsonrpc":"2.0","id":2,"method":"session/new","params":{"cwd":"/tmp","mcpServers":[]}}"#;

fn prompt(id: u64, text: &str) -> String {
    serde_json::json!({"jsonrpc":"2.0","id":id,"method":"session/prompt",
        "params":{"sessionId":"mock-1","prompt":[{"type":"text","text":text}]}})
    .to_string()
}

/// Starts a mock instance `id` with a session through the client.
fn start_instance(d: &Daemon, id: &str) {
    let o = cli(d, &["acp", "send", id, INIT, "--agent", "mock"]);
    assert_code(&o, 0);
    let answer = json_of(&o);
    assert_eq!(answer["id"], 1);
    assert_eq!(answer["result"]["agentInfo"]["name"], "mock");
    assert_code(&cli(d, &["acp", "send", id, NEW_SESSION]), 0);
}

#[test]
fn status_reports_version_health_and_counts() {
    let d = Daemon::builder().token("tok-status").start();
    start_instance(&d, "st1");
    let o = cli(&d, &["processes", "start", "--", "sleep", "30"]);
    assert_code(&o, 0);

    let o = cli(&d, &["status", "--json"]);
    assert_code(&o, 0);
    let s = json_of(&o);
    assert_eq!(s["version"], env!("CARGO_PKG_VERSION"));
    assert_eq!(s["health"]["status"], "ok");
    assert_eq!(s["url"], d.url(""));
    assert_eq!(s["instances"]["total"], 1);
    assert_eq!(s["instances"]["running"], 1);
    assert_eq!(s["processes"]["total"], 1);
    assert_eq!(s["processes"]["running"], 1);

    let o = cli(&d, &["status"]);
    assert_code(&o, 0);
    let text = stdout(&o);
    assert!(
        text.contains(&format!("Sandbox Agent {}", env!("CARGO_PKG_VERSION"))),
        "{text}"
    );
    let line = |name: &str| {
        text.lines()
            .find(|l| l.starts_with(name))
            .unwrap_or_else(|| panic!("no `{name}` line in {text}"))
            .split_whitespace()
            .skip(1)
            .collect::<Vec<_>>()
            .join(" ")
    };
    assert_eq!(line("health"), "ok");
    assert_eq!(line("instances"), "1 (1 running)");
    assert_eq!(line("processes"), "1 (1 running)");
}

#[test]
fn instances_lists_each_instance_with_its_pid_and_figures() {
    let d = Daemon::start();
    start_instance(&d, "inst-a");
    start_instance(&d, "inst-b");
    let rt = tokio::runtime::Runtime::new().unwrap();
    let servers = rt.block_on(d.servers());

    let o = cli(&d, &["instances", "--json"]);
    assert_code(&o, 0);
    let listed = json_of(&o);
    let ids: Vec<&str> = listed["servers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["serverId"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["inst-a", "inst-b"]);

    let o = cli(&d, &["instances"]);
    assert_code(&o, 0);
    let text = stdout(&o);
    let mut lines = text.lines();
    let header: Vec<&str> = lines
        .next()
        .unwrap()
        .split("  ")
        .filter(|c| !c.is_empty())
        .collect();
    let header: Vec<&str> = header.iter().map(|c| c.trim()).collect();
    assert_eq!(
        header,
        [
            "SERVER ID",
            "AGENT",
            "STATUS",
            "PID",
            "RSS",
            "CPU",
            "SUBSCRIBERS"
        ]
    );
    for server in &servers {
        let id = server["serverId"].as_str().unwrap();
        let row: Vec<&str> = lines
            .clone()
            .find(|l| l.starts_with(id))
            .unwrap_or_else(|| panic!("no row for {id} in {text}"))
            .split_whitespace()
            .collect();
        assert_eq!(row[1], "mock");
        assert_eq!(row[2], "running");
        assert_eq!(row[3], server["pid"].to_string());
        assert!(pid_alive(server["pid"].as_u64().unwrap() as u32));
        assert!(row[4].ends_with(['K', 'M']), "RSS cell {:?}", row[4]);
        assert!(row[5].ends_with('s'), "CPU cell {:?}", row[5]);
        assert_eq!(row[6], "0");
    }
}

#[test]
fn acp_send_prints_answers_and_stream_follows_until_the_instance_goes() {
    let d = Daemon::start();
    start_instance(&d, "talk");

    // Follow from the start, before the prompt: the events arrive as the agent writes them.
    let follow = command(&["acp", "stream", "talk", "--url", &d.url("")])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let o = cli(&d, &["acp", "send", "talk", &prompt(3, "/stream 3")]);
    assert_code(&o, 0);
    assert_eq!(json_of(&o)["result"]["stopReason"], "end_turn");
    assert_eq!(
        stdout(&o).lines().count(),
        1,
        "the answer is one line: {}",
        stdout(&o)
    );

    // A message from stdin; a notification is accepted with nothing to print.
    let mut cmd = command(&["acp", "send", "talk", "-", "--url", &d.url("")]);
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(
            br#"{"jsonrpc":"2.0","method":"session/cancel","params":{"sessionId":"mock-1"}}"#,
        )
        .unwrap();
    let o = wait_bounded(child, Duration::from_secs(30));
    assert_code(&o, 0);
    assert_eq!(stdout(&o), "");
    assert!(stderr(&o).contains("accepted"), "{}", stderr(&o));

    // `--from` resumes after an id: only the third chunk, then the reader is stopped.
    let mut from = command(&["acp", "stream", "talk", "--from", "2", "--url", &d.url("")])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut reader = std::io::BufReader::new(from.stdout.take().unwrap());
    let mut line = String::new();
    std::io::BufRead::read_line(&mut reader, &mut line).unwrap();
    let event: Value = serde_json::from_str(&line).unwrap();
    assert_eq!(event["id"], 3);
    assert_eq!(
        event["data"]["params"]["update"]["content"]["text"],
        "chunk 3 of 3"
    );
    let _ = from.kill();
    let _ = from.wait();

    // Stopping the instance ends the follower, which exits 0 with every event printed.
    let o = cli(&d, &["acp", "stop", "talk"]);
    assert_code(&o, 0);
    assert_eq!(stdout(&o), "stopped talk\n");
    let o = wait_bounded(follow, Duration::from_secs(30));
    assert_code(&o, 0);
    let events: Vec<Value> = stdout(&o)
        .lines()
        .map(|l| serde_json::from_str(l).expect("each line is JSON"))
        .collect();
    assert_eq!(events.len(), 3, "{}", stdout(&o));
    for (i, e) in events.iter().enumerate() {
        assert_eq!(e["event"], "message");
        assert_eq!(e["id"], i as u64 + 1);
        assert_eq!(
            e["data"]["params"]["update"]["content"]["text"],
            format!("chunk {} of 3", i + 1)
        );
    }
    rt_servers_empty(&d);
}

fn rt_servers_empty(d: &Daemon) {
    let rt = tokio::runtime::Runtime::new().unwrap();
    assert!(rt.block_on(d.servers()).is_empty());
}

#[test]
fn acp_failures_exit_by_class() {
    let d = Daemon::start();
    start_instance(&d, "crashy");
    // The agent dies during the request: 502, the server-error class, with the stderr tail.
    let o = cli(
        &d,
        &["acp", "send", "crashy", &prompt(3, "/stderr last words")],
    );
    assert_code(&o, 0);
    let o = cli(&d, &["acp", "send", "crashy", &prompt(4, "/crash 3")]);
    assert_code(&o, 70);
    assert!(stderr(&o).contains("502"), "{}", stderr(&o));
    assert!(stderr(&o).contains("last words"), "{}", stderr(&o));
    // Its stream delivers what is left and ends: exit 0, then 410 for a new reader (not found).
    let o = cli(&d, &["acp", "stream", "crashy"]);
    assert_code(&o, 66);
    assert!(stderr(&o).contains("410"), "{}", stderr(&o));
    // A first message without an agent is refused by the daemon: 400, the refused class.
    let o = cli(&d, &["acp", "send", "fresh", INIT]);
    assert_code(&o, 65);
    // A message that is not JSON is refused before anything is sent: usage.
    let o = cli(
        &d,
        &["acp", "send", "fresh", "{not json", "--agent", "mock"],
    );
    assert_code(&o, 64);
    let o = cli(&d, &["acp", "send", "fresh", "[1,2]", "--agent", "mock"]);
    assert_code(&o, 64);
    let rt = tokio::runtime::Runtime::new().unwrap();
    let ids: Vec<Value> = rt
        .block_on(d.servers())
        .iter()
        .map(|s| s["serverId"].clone())
        .collect();
    assert_eq!(ids, ["crashy"]);
    // An unknown serverId has no stream.
    let o = cli(&d, &["acp", "stream", "nobody"]);
    assert_code(&o, 66);
    assert!(stderr(&o).contains("404"), "{}", stderr(&o));
}

#[test]
fn processes_run_passes_output_and_exit_code() {
    let d = Daemon::start();
    let o = cli(
        &d,
        &[
            "processes",
            "run",
            "--env",
            "WHO=cli",
            "--",
            "sh",
            "-c",
            "echo out $WHO; echo err >&2; exit 3",
        ],
    );
    assert_code(&o, 3);
    assert_eq!(stdout(&o), "out cli\n");
    assert!(stderr(&o).starts_with("err\n"), "{}", stderr(&o));

    let o = cli(
        &d,
        &["processes", "run", "--json", "--", "sh", "-c", "echo hi"],
    );
    assert_code(&o, 0);
    let r = json_of(&o);
    assert_eq!(r["stdout"], "hi\n");
    assert_eq!(r["exitCode"], 0);

    let o = cli(
        &d,
        &[
            "processes",
            "run",
            "--timeout",
            "300ms",
            "--",
            "sleep",
            "30",
        ],
    );
    assert_code(&o, 124);
    assert!(stderr(&o).contains("timed out"), "{}", stderr(&o));

    let o = cli(&d, &["processes", "run", "--", "sh", "-c", "kill -TERM $$"]);
    assert_code(&o, 128 + 15);

    let o = cli(&d, &["processes", "run", "--env", "NOEQUALS", "--", "true"]);
    assert_code(&o, 64);
}

#[test]
fn processes_start_list_logs_follow_and_stop() {
    let d = Daemon::start();
    // The program waits for a file the test creates after the follower is attached, so the
    // follower provably prints output that did not exist when it connected.
    let gate = d.work_dir().join("gate");
    let script = format!(
        "echo first; while [ ! -e {} ]; do sleep 0.05; done; echo second; echo oops >&2",
        gate.display()
    );
    let o = cli(&d, &["processes", "start", "--", "sh", "-c", &script]);
    assert_code(&o, 0);
    let id = stdout(&o).trim().to_string();
    assert!(id.starts_with("proc_"), "{id}");

    let mut follow = command(&["processes", "logs", "-f", &id, "--url", &d.url("")])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut follow_out = std::io::BufReader::new(follow.stdout.take().unwrap());
    let mut line = String::new();
    std::io::BufRead::read_line(&mut follow_out, &mut line).unwrap();
    assert_eq!(line, "first\n");
    std::fs::write(&gate, "").unwrap();
    let mut rest = String::new();
    follow_out.read_to_string(&mut rest).unwrap();
    assert_eq!(rest, "second\n");
    let o = wait_bounded(follow, Duration::from_secs(30));
    assert_code(&o, 0);
    assert_eq!(stderr(&o), "oops\n");

    // The log without --follow, and as JSON (base64 entries, as the daemon gives them).
    let o = cli(&d, &["processes", "logs", &id, "--stream", "stdout"]);
    assert_code(&o, 0);
    assert_eq!(stdout(&o), "first\nsecond\n");
    let o = cli(&d, &["processes", "logs", &id, "--json"]);
    assert_code(&o, 0);
    assert_eq!(json_of(&o)["entries"].as_array().unwrap().len(), 3);

    let o = cli(&d, &["processes", "start", "--", "sleep", "60"]);
    assert_code(&o, 0);
    let sleeper = stdout(&o).trim().to_string();
    let o = cli(&d, &["processes", "list", "--json"]);
    let list = json_of(&o);
    let pid = list["processes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["id"] == sleeper.as_str())
        .unwrap()["pid"]
        .as_u64()
        .unwrap() as u32;
    assert!(pid_alive(pid));

    let o = cli(&d, &["processes", "list"]);
    assert_code(&o, 0);
    let text = stdout(&o);
    let row = |id: &str| -> Vec<String> {
        text.lines()
            .find(|l| l.starts_with(&format!("{id} ")))
            .unwrap_or_else(|| panic!("no row for {id}: {text}"))
            .split_whitespace()
            .map(str::to_string)
            .collect()
    };
    assert_eq!(row(&id)[1..4], ["exited", "-", "0"]);
    assert_eq!(
        row(&sleeper)[1..4],
        ["running".to_string(), pid.to_string(), "-".into()]
    );
    assert_eq!(row(&sleeper)[6..], ["sleep", "60"]);

    let o = cli(&d, &["processes", "stop", &sleeper]);
    assert_code(&o, 0);
    assert_eq!(stdout(&o), format!("{sleeper} exited (signal 15)\n"));
    assert!(!pid_alive(pid));

    let o = cli(&d, &["processes", "stop", "proc_999"]);
    assert_code(&o, 66);
    let o = cli(&d, &["processes", "logs", "proc_999", "-f"]);
    assert_code(&o, 66);
}

/// The peak resident memory of a running process, from /proc.
fn vm_hwm_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmHWM")
}

/// Deterministic bytes that do not compress.
fn pattern(len: usize) -> Vec<u8> {
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

#[test]
fn fs_ls_get_put_move_files_both_ways() {
    let d = Daemon::start();
    let local = tempfile::tempdir().unwrap();
    let data = pattern(3 << 20);
    std::fs::write(local.path().join("up.bin"), &data).unwrap();

    let up = local.path().join("up.bin");
    let o = cli(&d, &["fs", "put", up.to_str().unwrap(), "dir/copy.bin"]);
    assert_code(&o, 0);
    assert_eq!(
        stdout(&o),
        format!(
            "wrote {} bytes to {}\n",
            data.len(),
            d.path("dir/copy.bin").display()
        )
    );
    assert_eq!(std::fs::read(d.path("dir/copy.bin")).unwrap(), data);

    // Download into a file, into a directory, and to stdout.
    let down = local.path().join("down.bin");
    let o = cli(&d, &["fs", "get", "dir/copy.bin", down.to_str().unwrap()]);
    assert_code(&o, 0);
    assert_eq!(std::fs::read(&down).unwrap(), data);
    let o = cli(
        &d,
        &[
            "fs",
            "get",
            "dir/copy.bin",
            local.path().to_str().unwrap(),
            "--json",
        ],
    );
    assert_code(&o, 0);
    assert_eq!(json_of(&o)["bytes"], data.len());
    assert_eq!(std::fs::read(local.path().join("copy.bin")).unwrap(), data);
    let o = cli(&d, &["fs", "get", "dir/copy.bin"]);
    assert_code(&o, 0);
    assert!(o.stdout == data, "stdout differs from the file");

    // Upload from stdin.
    let mut child = command(&[
        "fs",
        "put",
        "-",
        "dir/stdin.txt",
        "--json",
        "--url",
        &d.url(""),
    ])
    .stdin(Stdio::piped())
    .stdout(Stdio::piped())
    .stderr(Stdio::piped())
    .spawn()
    .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(b"from stdin\n")
        .unwrap();
    let o = wait_bounded(child, Duration::from_secs(30));
    assert_code(&o, 0);
    assert_eq!(json_of(&o)["bytesWritten"], 11);
    assert_eq!(
        std::fs::read(d.path("dir/stdin.txt")).unwrap(),
        b"from stdin\n"
    );

    let o = cli(&d, &["fs", "ls", "dir", "--json"]);
    assert_code(&o, 0);
    let names: Vec<String> = json_of(&o)
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["name"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(names, ["copy.bin", "stdin.txt"]);
    let o = cli(&d, &["fs", "ls"]);
    assert_code(&o, 0);
    let text = stdout(&o);
    assert!(text.starts_with("TYPE  SIZE"), "{text}");
    assert!(
        text.lines()
            .any(|l| l.starts_with("dir ") && l.ends_with(" dir/")),
        "{text}"
    );
    let o = cli(&d, &["fs", "ls", "dir"]);
    let text = stdout(&o);
    assert!(
        text.lines()
            .any(|l| l.starts_with("file  3145728  ") && l.ends_with(" copy.bin")),
        "{text}"
    );

    // A missing file: not found, and nothing left beside the local target.
    let before: Vec<_> = std::fs::read_dir(local.path()).unwrap().collect();
    let o = cli(&d, &["fs", "get", "nope.bin", down.to_str().unwrap()]);
    assert_code(&o, 66);
    assert_eq!(std::fs::read(&down).unwrap(), data, "the old file is kept");
    assert_eq!(
        std::fs::read_dir(local.path()).unwrap().count(),
        before.len()
    );
    let o = cli(&d, &["fs", "ls", "nope"]);
    assert_code(&o, 66);
    // A local file that does not exist: an I/O error, nothing sent.
    let o = cli(&d, &["fs", "put", "/nonexistent/x", "dir/x"]);
    assert_code(&o, 74);
    assert!(!d.path("dir/x").exists());
}

#[test]
fn fs_transfers_stream_without_holding_the_file() {
    const SIZE: usize = 96 << 20;
    let d = Daemon::start();
    let data = pattern(1 << 20);
    {
        let mut f = std::fs::File::create(d.path("big.bin")).unwrap();
        for _ in 0..SIZE >> 20 {
            f.write_all(&data).unwrap();
        }
    }
    // Download to a pipe the test reads: the client cannot finish before the test has read
    // everything, so its peak memory can be read while it still runs.
    let mut get = command(&["fs", "get", "big.bin", "--url", &d.url("")])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut pipe = get.stdout.take().unwrap();
    let mut buf = vec![0u8; 1 << 20];
    let mut got = 0usize;
    while got < SIZE - (1 << 20) {
        let n = pipe.read(&mut buf).unwrap();
        assert!(n > 0, "the download ended early at {got}");
        got += n;
    }
    let peak = vm_hwm_kib(get.id());
    std::io::copy(&mut pipe, &mut std::io::sink()).unwrap();
    assert!(get.wait().unwrap().success());
    assert!(
        peak < 48 * 1024,
        "the client's peak RSS was {peak} KiB for a {} MiB download",
        SIZE >> 20
    );

    // Upload from a pipe: all but the last MiB written, then the peak, then the rest.
    let mut put = command(&["fs", "put", "-", "copy.bin", "--url", &d.url("")])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let mut input = put.stdin.take().unwrap();
    for _ in 0..(SIZE >> 20) - 1 {
        input.write_all(&data).unwrap();
    }
    let peak = vm_hwm_kib(put.id());
    input.write_all(&data).unwrap();
    drop(input);
    assert!(put.wait().unwrap().success());
    assert!(
        peak < 48 * 1024,
        "the client's peak RSS was {peak} KiB for a {} MiB upload",
        SIZE >> 20
    );
    let copy = std::fs::metadata(d.path("copy.bin")).unwrap();
    assert_eq!(copy.len() as usize, SIZE);
}

#[test]
fn connection_and_token_failures_exit_by_class() {
    let mut d = Daemon::builder().token("right-token").start();
    let url = d.url("");

    // Wrong or missing token: the auth class, with the daemon's words on stderr.
    let o = run_to_end(command(&["status", "--url", &url, "--token", "wrong"]));
    assert_code(&o, 77);
    assert!(stderr(&o).contains("401"), "{}", stderr(&o));
    let o = run_to_end(command(&["instances", "--url", &url]));
    assert_code(&o, 77);
    // With --json the failure is one JSON object on stderr.
    let o = run_to_end(command(&["fs", "ls", "--url", &url, "--json"]));
    assert_code(&o, 77);
    let e: Value = serde_json::from_str(stderr(&o).trim()).expect("a JSON error line");
    assert_eq!(e["error"], "auth");
    assert_eq!(e["exitCode"], 77);
    assert_eq!(e["status"], 401);
    assert_eq!(e["problem"]["status"], 401);
    assert_eq!(stdout(&o), "");

    // The token from the environment, from --token-file, and from the config file.
    let mut cmd = command(&["status", "--url", &url]);
    cmd.env("SANDBOX_AGENT_TOKEN", "right-token");
    assert_code(&run_to_end(cmd), 0);
    let dir = tempfile::tempdir().unwrap();
    let token_file = dir.path().join("token");
    std::fs::write(&token_file, "right-token\n").unwrap();
    let o = run_to_end(command(&[
        "status",
        "--url",
        &url,
        "--token-file",
        token_file.to_str().unwrap(),
    ]));
    assert_code(&o, 0);
    let port = d.addr.rsplit(':').next().unwrap().to_string();
    let config = dir.path().join("config.toml");
    std::fs::write(
        &config,
        format!(
            "host = \"0.0.0.0\"\nport = {port}\ntoken_file = \"{}\"\nmax_agents = 3\n",
            token_file.display()
        ),
    )
    .unwrap();
    let mut cmd = command(&["status", "--json"]);
    cmd.env("SANDBOX_AGENT_CONFIG", &config);
    let o = run_to_end(cmd);
    assert_code(&o, 0);
    assert_eq!(json_of(&o)["url"], format!("http://127.0.0.1:{port}"));
    // Flags and variables win over the file.
    let o = run_to_end(command(&[
        "status",
        "--config",
        config.to_str().unwrap(),
        "--token",
        "wrong",
    ]));
    assert_code(&o, 77);

    // Bad client settings: the configuration class.
    std::fs::write(dir.path().join("empty"), "").unwrap();
    let o = run_to_end(command(&[
        "status",
        "--url",
        &url,
        "--token-file",
        dir.path().join("empty").to_str().unwrap(),
    ]));
    assert_code(&o, 78);
    let o = run_to_end(command(&["status", "--url", "ftp://x"]));
    assert_code(&o, 78);
    // Usage errors of the command line.
    let o = run_to_end(command(&["processes", "logs"]));
    assert_code(&o, 64);
    let o = run_to_end(command(&["status", "--max-agents", "3"]));
    assert_code(&o, 64);

    // The daemon gone: nothing listens at its address.
    assert_eq!(d.stop(Duration::from_secs(30)), 0);
    for args in [
        vec!["status"],
        vec!["instances"],
        vec!["acp", "send", "x", INIT, "--agent", "mock"],
        vec!["acp", "stream", "x"],
        vec!["processes", "list"],
        vec!["fs", "get", "f"],
    ] {
        let mut cmd = command(&args);
        cmd.args(["--url", &url, "--token", "right-token"]);
        let o = run_to_end(cmd);
        assert_code(&o, 69);
        assert!(
            stderr(&o).contains("cannot reach the daemon"),
            "{}",
            stderr(&o)
        );
    }
}

/// Every client command's `--help`: its own options and the connection options, none of the
/// daemon's settings.
#[test]
fn help_of_each_client_command_shows_only_its_own_options() {
    let cases: &[(&[&str], &[&str])] = &[
        (&["status"], &[]),
        (&["instances"], &[]),
        (&["acp", "send"], &["--agent"]),
        (&["acp", "stream"], &["--from"]),
        (&["acp", "stop"], &[]),
        (&["processes", "run"], &["--timeout", "--cwd", "--env"]),
        (&["processes", "start"], &["--cwd", "--env"]),
        (&["processes", "list"], &[]),
        (&["processes", "logs"], &["--follow", "--stream", "--tail"]),
        (&["processes", "stop"], &["--kill", "--wait"]),
        (&["fs", "ls"], &[]),
        (&["fs", "get"], &[]),
        (&["fs", "put"], &[]),
    ];
    let own_everywhere = [
        "--host",
        "--port",
        "--url",
        "--token",
        "--token-file",
        "--config",
        "--json",
    ];
    for (path, own) in cases {
        let mut args = path.to_vec();
        args.push("--help");
        let o = run_to_end(command(&args));
        assert_code(&o, 0);
        let help = stdout(&o);
        // The long option each option line declares.
        let mut shown: Vec<String> = help
            .lines()
            .map(str::trim_start)
            .filter(|l| l.starts_with('-'))
            .filter_map(|l| {
                l.split([' ', ',', '='])
                    .find(|w| w.starts_with("--"))
                    .map(str::to_string)
            })
            .collect();
        shown.sort();
        let mut expected: Vec<String> = own
            .iter()
            .chain(own_everywhere.iter())
            .chain(["--help"].iter())
            .map(|f| f.to_string())
            .collect();
        expected.sort();
        assert_eq!(shown, expected, "{path:?} --help:\n{help}");
    }
    // The daemon's flags are still where they belong.
    let o = run_to_end(command(&["server", "--help"]));
    assert!(stdout(&o).contains("--max-agents"));
}

#[test]
fn broken_pipe_on_stdout_ends_the_client_quietly() {
    let d = Daemon::start();
    std::fs::write(d.path("big.txt"), "x\n".repeat(4 << 20)).unwrap();
    let mut child = command(&["fs", "get", "big.txt", "--url", &d.url("")])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut first = [0u8; 2];
    child
        .stdout
        .as_mut()
        .unwrap()
        .read_exact(&mut first)
        .unwrap();
    drop(child.stdout.take());
    let o = wait_bounded(child, Duration::from_secs(30));
    assert_code(&o, 0);
    assert_eq!(stderr(&o), "");
}

#[test]
fn a_following_client_hides_its_token_from_other_processes() {
    let d = Daemon::builder().token("cli-secret-token").start();
    start_instance(&d, "quiet");
    let o = cli(&d, &["acp", "send", "quiet", &prompt(3, "/stream 1")]);
    assert_code(&o, 0);
    let mut follow = command(&[
        "acp",
        "stream",
        "quiet",
        "--url",
        &d.url(""),
        "--token",
        "cli-secret-token",
    ])
    .env("SANDBOX_AGENT_TOKEN", "cli-secret-token")
    .stdout(Stdio::piped())
    .spawn()
    .unwrap();
    // The first event is printed after the token was read and hidden.
    let mut reader = std::io::BufReader::new(follow.stdout.take().unwrap());
    let mut line = String::new();
    std::io::BufRead::read_line(&mut reader, &mut line).unwrap();
    assert!(line.contains("chunk 1 of 1"), "{line}");
    let cmdline = std::fs::read(format!("/proc/{}/cmdline", follow.id())).unwrap();
    let environ = std::fs::read(format!("/proc/{}/environ", follow.id())).unwrap();
    let _ = follow.kill();
    let _ = follow.wait();
    let has = |hay: &[u8]| hay.windows(16).any(|w| w == b"cli-secret-token");
    assert!(!has(&cmdline), "the token is in the command line");
    assert!(!has(&environ), "the token is in the environment");
    assert!(
        String::from_utf8_lossy(&cmdline).contains("--token"),
        "the flag itself stays visible"
    );
}

/// A follower that cannot keep up is cut off by the daemon (more than twice `--event-buffer`
/// events queued for it); the client reconnects after the last id it printed, reports the gap
/// and goes on to the end.
#[test]
fn acp_stream_reconnects_after_falling_behind() {
    const EVENTS: u64 = 60_000;
    let d = Daemon::builder().args(["--event-buffer", "8"]).start();
    start_instance(&d, "flood");
    let mut follow = command(&["acp", "stream", "flood", "--url", &d.url("")])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let subscribers = || -> u64 { rt.block_on(d.servers())[0]["subscribers"].as_u64().unwrap() };
    crate::support::eventually(Duration::from_secs(20), "the follower to subscribe", || {
        (subscribers() == 1).then_some(())
    });
    // Nobody reads the client's stdout yet: it blocks, its socket fills, the daemon cuts it off.
    let o = cli(
        &d,
        &[
            "acp",
            "send",
            "flood",
            &prompt(3, &format!("/stream {EVENTS}")),
        ],
    );
    assert_code(&o, 0);
    crate::support::eventually(
        Duration::from_secs(30),
        "the follower to be cut off",
        || (subscribers() == 0).then_some(()),
    );
    let stdout_pipe = follow.stdout.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut lines = Vec::new();
        for line in std::io::BufRead::lines(std::io::BufReader::new(stdout_pipe)) {
            let event: Value = serde_json::from_str(&line.unwrap()).expect("a JSON line");
            let last = event["id"] == EVENTS;
            lines.push(event);
            if last {
                break;
            }
        }
        lines
    });
    let events = reader.join().unwrap();
    // It reconnected: it follows again and received the very last event.
    assert_eq!(events.last().unwrap()["id"], EVENTS);
    assert_eq!(subscribers(), 1);
    let gaps: Vec<&Value> = events.iter().filter(|e| e["event"] == "gap").collect();
    assert!(!gaps.is_empty(), "the dropped events are reported as a gap");
    // Ids only grow, and every id is either printed or inside a reported gap.
    let mut next = 1u64;
    for e in &events {
        if e["event"] == "gap" {
            assert_eq!(e["data"]["from"], next, "{e}");
            next = e["data"]["to"].as_u64().unwrap() + 1;
        } else {
            assert_eq!(e["id"], next, "{e}");
            next += 1;
        }
    }
    assert_code(&cli(&d, &["acp", "stop", "flood"]), 0);
    let o = wait_bounded(follow, Duration::from_secs(30));
    assert_code(&o, 0);
}

/// Ctrl-C during a download into a file: exit 130 and nothing left beside the target (neither
/// the temporary nor a partial file under the target's name).
#[test]
fn an_interrupted_download_leaves_nothing_behind() {
    let d = Daemon::start();
    // Sparse: instant to make, long enough to download that the signal lands mid-transfer.
    let big = std::fs::File::create(d.path("huge.bin")).unwrap();
    big.set_len(8 << 30).unwrap();
    let local = tempfile::tempdir().unwrap();
    let target = local.path().join("huge.bin");
    let mut get = command(&[
        "fs",
        "get",
        "huge.bin",
        target.to_str().unwrap(),
        "--url",
        &d.url(""),
    ])
    .stdout(Stdio::piped())
    .stderr(Stdio::piped())
    .spawn()
    .unwrap();
    crate::support::eventually(
        Duration::from_secs(30),
        "a part file with bytes in it",
        || {
            std::fs::read_dir(local.path())
                .unwrap()
                .filter_map(Result::ok)
                .find(|e| e.metadata().map(|m| m.len() > 0).unwrap_or(false))
                .map(|_| ())
        },
    );
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(get.id() as i32),
        nix::sys::signal::Signal::SIGINT,
    )
    .unwrap();
    let status = crate::support::eventually(Duration::from_secs(30), "the client to exit", || {
        get.try_wait().unwrap()
    });
    assert_eq!(status.code(), Some(130), "{status:?}");
    let left: Vec<_> = std::fs::read_dir(local.path()).unwrap().collect();
    assert!(left.is_empty(), "left behind: {left:?}");
}

/// A local file goes with its length, so the daemon refuses one over `--upload-limit` up front:
/// the refused class, the limit named, nothing written.
#[test]
fn fs_put_over_the_upload_limit_is_refused() {
    let d = Daemon::builder().args(["--upload-limit", "1K"]).start();
    let local = tempfile::tempdir().unwrap();
    let file = local.path().join("big.bin");
    std::fs::write(&file, pattern(64 << 10)).unwrap();
    let o = cli(
        &d,
        &["fs", "put", file.to_str().unwrap(), "big.bin", "--json"],
    );
    assert_code(&o, 65);
    let e: Value = serde_json::from_str(stderr(&o).trim()).expect("a JSON error line");
    assert_eq!(e["status"], 413);
    assert_eq!(e["problem"]["limit"], 1024);
    assert!(!d.path("big.bin").exists());
}

// The messages a person meets first, each in the terms of the command typed (its flags and
// variables), never in those of the HTTP request the daemon saw.

#[test]
fn acp_send_without_agent_says_to_pass_the_agent_flag() {
    let d = Daemon::start();
    let o = cli(&d, &["acp", "send", "fresh", INIT]);
    assert_code(&o, 65);
    let e = stderr(&o);
    assert!(e.contains("pass --agent <id>"), "{e}");
    assert!(e.contains("`fresh`"), "{e}");
    assert!(!e.contains("?agent="), "the HTTP query shows through: {e}");
    // With --json the daemon's own problem is still there for scripts.
    let o = cli(&d, &["acp", "send", "fresh", INIT, "--json"]);
    assert_code(&o, 65);
    let line: Value = serde_json::from_str(stderr(&o).trim()).unwrap();
    assert_eq!(line["status"], 400);
    assert!(line["message"].as_str().unwrap().contains("--agent"));
    assert_eq!(line["problem"]["serverId"], "fresh");
}

#[test]
fn a_missing_or_wrong_token_names_the_flag_and_the_variable() {
    let d = Daemon::builder().token("the-token").start();
    let url = d.url("");
    let o = run_to_end(command(&["instances", "--url", &url]));
    assert_code(&o, 77);
    let e = stderr(&o);
    assert!(e.contains("--token"), "{e}");
    assert!(e.contains("SANDBOX_AGENT_TOKEN"), "{e}");
    assert!(
        !e.contains("Authorization"),
        "the HTTP header shows through: {e}"
    );
    let o = run_to_end(command(&["status", "--url", &url, "--token", "wrong"]));
    assert_code(&o, 77);
    let e = stderr(&o);
    assert!(e.contains("refused the token"), "{e}");
    assert!(!e.contains("Authorization"), "{e}");
}

#[test]
fn acp_stop_of_an_unknown_instance_is_not_found_while_the_api_delete_stays_idempotent() {
    let d = Daemon::start();
    let o = cli(&d, &["acp", "stop", "never-existed"]);
    assert_code(&o, 66);
    assert!(
        stderr(&o).contains("no instance `never-existed`"),
        "{}",
        stderr(&o)
    );
    assert_eq!(stdout(&o), "");
    let o = cli(&d, &["acp", "stop", "never-existed", "--json"]);
    assert_code(&o, 66);
    let line: Value = serde_json::from_str(stderr(&o).trim()).unwrap();
    assert_eq!(line["error"], "not-found");
    // The API itself: 204 whether or not the instance existed.
    let rt = tokio::runtime::Runtime::new().unwrap();
    let status = rt.block_on(async {
        d.client()
            .delete(d.url("/v1/acp/never-existed"))
            .send()
            .await
            .unwrap()
            .status()
    });
    assert_eq!(status, 204);
    // One that exists is stopped (and a second stop is then not found).
    start_instance(&d, "real");
    let o = cli(&d, &["acp", "stop", "real"]);
    assert_code(&o, 0);
    assert_eq!(stdout(&o), "stopped real\n");
    let o = cli(&d, &["acp", "stop", "real"]);
    assert_code(&o, 66);
}

#[test]
fn status_prints_words_not_json_and_instances_says_when_there_are_none() {
    let d = Daemon::start();
    let o = cli(&d, &["status"]);
    assert_code(&o, 0);
    let text = stdout(&o);
    assert!(
        !text.contains(['{', '}', '"']),
        "raw JSON in the status table: {text}"
    );
    let data_dir = text
        .lines()
        .find(|l| l.starts_with("dataDir"))
        .unwrap_or_else(|| panic!("no dataDir line: {text}"));
    assert!(
        data_dir.contains(&format!("{} (writable: yes", d.data_dir().display())),
        "{data_dir}"
    );
    let o = cli(&d, &["instances"]);
    assert_code(&o, 0);
    assert!(stdout(&o).starts_with("no instances"), "{}", stdout(&o));
    // --json stays the daemon's document.
    let o = cli(&d, &["instances", "--json"]);
    assert_code(&o, 0);
    assert_eq!(json_of(&o)["servers"], serde_json::json!([]));
}

/// A machine (or image) without CA certificates: plain HTTP works all the same; an https://
/// address fails saying the certificates are missing and where they were looked for.
#[test]
fn without_ca_certificates_plain_http_works_and_https_says_why_not() {
    let d = Daemon::start();
    let nowhere = tempfile::tempdir().unwrap();
    let file = nowhere.path().join("no-bundle.pem");
    let dir = nowhere.path().join("no-certs");
    let no_ca = |args: &[&str]| {
        let mut cmd = command(args);
        cmd.env("SSL_CERT_FILE", &file).env("SSL_CERT_DIR", &dir);
        run_to_end(cmd)
    };
    let url = d.url("");
    for args in [
        vec!["status", "--url", &url],
        vec!["instances", "--url", &url],
    ] {
        let o = no_ca(&args);
        assert_code(&o, 0);
    }
    let https = url.replacen("http://", "https://", 1);
    let o = no_ca(&["status", "--url", &https]);
    assert_code(&o, 78);
    let e = stderr(&o);
    assert!(e.contains("no CA certificates were found"), "{e}");
    assert!(e.contains(&*file.to_string_lossy()), "{e}");
    assert!(e.contains(&*dir.to_string_lossy()), "{e}");
    assert!(e.contains("ca-certificates"), "{e}");
    assert!(!e.trim_end().ends_with("builder error"), "{e}");
}
