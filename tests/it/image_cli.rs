//! The command-line client inside the container image, where docs/cli.md sends operators
//! (`podman exec CONTAINER sandbox-agent …`): `status`, `instances` and `acp` over plain HTTP on
//! loopback with the address and token the image's environment gives the daemon, the same with
//! no CA certificates to be found (the blocker of a CLI whose HTTP client needed them), and
//! `reload --pid 1` re-executing the daemon in place with its agent kept. The image is the one
//! tests/system/build-image.sh builds offline (shared with the provider tests).

use std::process::{Command, Output};
use std::time::{Duration, Instant};

use crate::support::{is_root, on_path, skip};

const TOKEN: &str = "image-cli-token";

/// podman with the runtime tests/system/build-image.sh uses (runc when installed).
fn podman() -> Command {
    let mut cmd = Command::new("podman");
    if on_path("runc") {
        cmd.args(["--runtime", "runc"]);
    }
    cmd
}

fn text(o: &Output) -> String {
    format!(
        "exit {:?}\nstdout: {}\nstderr: {}",
        o.status.code(),
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// Removes the container however the test ends.
struct Container(String);
impl Drop for Container {
    fn drop(&mut self) {
        let _ = podman().args(["rm", "-f", "-t", "0", &self.0]).output();
    }
}

/// `podman exec` of the CLI in the container, as the image's user, with extra env `envs`.
fn exec(ctr: &str, envs: &[(&str, &str)], args: &[&str]) -> Output {
    let mut cmd = podman();
    cmd.args(["exec"]);
    for (k, v) in envs {
        cmd.arg("-e").arg(format!("{k}={v}"));
    }
    cmd.arg(ctr).arg("sandbox-agent").args(args);
    cmd.output().expect("podman exec")
}

#[test]
fn the_cli_works_inside_the_image_over_http_and_for_reload() {
    if !is_root() {
        skip("podman: needs root");
        return;
    }
    for tool in ["podman", "debootstrap", "node", "npm"] {
        if !on_path(tool) {
            skip(&format!(
                "image cli: `{tool}` is not installed (.ci/install-pkg.sh installs it)"
            ));
            return;
        }
    }
    let image = crate::providers::image();
    let name = format!("sandbox-agent-cli-{}", std::process::id());
    let run = podman()
        .args([
            "run",
            "-d",
            "--name",
            &name,
            "--pull=never",
            "--network=none",
        ])
        .args([
            "--ulimit",
            "nofile=20000:20000",
            "--ulimit",
            "nproc=32768:32768",
        ])
        .args(["-e", &format!("SANDBOX_AGENT_TOKEN={TOKEN}"), &image])
        .output()
        .expect("podman run");
    assert!(run.status.success(), "podman run: {}", text(&run));
    let ctr = Container(name);

    // `status` with nothing but the image's environment (host 0.0.0.0, port, token).
    let started = Instant::now();
    let status = loop {
        let o = exec(&ctr.0, &[], &["status"]);
        if o.status.success() || started.elapsed() > Duration::from_secs(30) {
            break o;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    assert!(status.status.success(), "status: {}", text(&status));
    let out = String::from_utf8_lossy(&status.stdout).to_string();
    assert!(out.contains("http://127.0.0.1:2468"), "{out}");
    assert!(
        out.lines()
            .any(|l| l.split_whitespace().eq(["health", "ok"])),
        "{out}"
    );
    assert!(
        out.contains("/var/lib/sandbox-agent (writable: yes)"),
        "{out}"
    );

    // No CA certificates to be found: plain HTTP is unaffected.
    let no_ca = [
        ("SSL_CERT_FILE", "/nowhere.pem"),
        ("SSL_CERT_DIR", "/nowhere"),
    ];
    let o = exec(
        &ctr.0,
        &no_ca,
        &["instances", "--url", "http://127.0.0.1:2468"],
    );
    assert!(
        o.status.success(),
        "instances without CA files: {}",
        text(&o)
    );
    assert!(
        String::from_utf8_lossy(&o.stdout).starts_with("no instances"),
        "{}",
        text(&o)
    );
    // …and an https:// address says what is missing, not "builder error".
    let o = exec(
        &ctr.0,
        &no_ca,
        &["status", "--url", "https://127.0.0.1:2468"],
    );
    assert_eq!(o.status.code(), Some(78), "{}", text(&o));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("no CA certificates were found"),
        "{}",
        text(&o)
    );

    // An agent through the CLI, listed by `instances`.
    let init = r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":1}}"#;
    let o = exec(
        &ctr.0,
        &[],
        &["acp", "send", "img", init, "--agent", "mock"],
    );
    assert!(o.status.success(), "acp send: {}", text(&o));
    let pid_of = |o: &Output| -> String {
        let out = String::from_utf8_lossy(&o.stdout).to_string();
        let row: Vec<String> = out
            .lines()
            .find(|l| l.starts_with("img "))
            .unwrap_or_else(|| panic!("no row for img: {out}"))
            .split_whitespace()
            .map(str::to_string)
            .collect();
        assert_eq!(row[2], "running", "{out}");
        row[3].clone()
    };
    let o = exec(&ctr.0, &[], &["instances"]);
    assert!(o.status.success(), "instances: {}", text(&o));
    let agent_pid = pid_of(&o);

    // `reload --pid 1` (the image's init forwards the SIGHUP): the new image serves and the
    // agent is the same process.
    let o = exec(&ctr.0, &[], &["reload", "--pid", "1"]);
    assert!(o.status.success(), "reload --pid 1: {}", text(&o));
    let o = exec(&ctr.0, &[], &["instances"]);
    assert!(o.status.success(), "instances after reload: {}", text(&o));
    assert_eq!(
        pid_of(&o),
        agent_pid,
        "the agent was not kept across the reload"
    );
    let o = exec(&ctr.0, &[], &["acp", "stop", "img"]);
    assert!(o.status.success(), "acp stop: {}", text(&o));
    let o = exec(&ctr.0, &[], &["acp", "stop", "img"]);
    assert_eq!(o.status.code(), Some(66), "{}", text(&o));
}
