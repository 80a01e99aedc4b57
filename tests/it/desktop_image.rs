//! The desktop image (`docker/Dockerfile.desktop`) checked without building it: an image build
//! needs a Docker engine or podman *and* the Debian mirror (apt-get installs ≈1 GB), which the
//! test machines do not have, so these tests prove what can be proven offline (docs/desktop.md,
//! "The desktop image", says exactly what is and is not tested):
//! - it is a layer on the plain image and changes nothing of how that runs: no ENTRYPOINT, CMD,
//!   HEALTHCHECK, EXPOSE, STOPSIGNAL or WORKDIR of its own, it ends as the plain image's user, and
//!   the plain image's entrypoint is the binary it copies in, with a CMD the binary accepts;
//! - it copies no file (so nothing it needs can be missing from the build context);
//! - its packages are the daemon's: it installs with `sandbox-agent install desktop`, whose
//!   package list (read back from the binary's `--dry-run` with nothing in `PATH`) is the one the
//!   desktop code declares (`desktop::PACKAGES`), and its build fails unless every program the
//!   desktop code runs (`install::programs`, plus `xdg-open` for `POST /v1/desktop/open`) is there.

use std::process::Command;

use sandbox_agent::desktop::install::{Target, packages, programs};

use crate::support::BIN;

const REPO: &str = env!("CARGO_MANIFEST_DIR");

fn read(file: &str) -> String {
    std::fs::read_to_string(format!("{REPO}/docker/{file}")).unwrap()
}

/// The instructions of a Dockerfile: comments dropped, continuation lines joined, runs of
/// whitespace made one space.
fn instructions(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    for line in text.lines() {
        let t = line.trim();
        if t.starts_with('#') || (t.is_empty() && cur.is_empty()) {
            continue;
        }
        if let Some(head) = t.strip_suffix('\\') {
            cur.push_str(head);
            cur.push(' ');
        } else {
            cur.push_str(t);
            let joined = cur.split_whitespace().collect::<Vec<_>>().join(" ");
            if !joined.is_empty() {
                out.push(joined);
            }
            cur.clear();
        }
    }
    out
}

fn keyword(i: &str) -> String {
    i.split_whitespace()
        .next()
        .unwrap_or("")
        .to_ascii_uppercase()
}

#[test]
fn desktop_image_is_a_layer_that_keeps_the_plain_images_entrypoint() {
    let desktop = instructions(&read("Dockerfile.desktop"));
    let plain = instructions(&read("Dockerfile"));
    let kinds: Vec<String> = desktop.iter().map(|i| keyword(i)).collect();
    assert_eq!(
        kinds,
        ["ARG", "FROM", "USER", "RUN", "USER"],
        "{desktop:#?}"
    );
    assert_eq!(desktop[0], "ARG IMAGE=sandbox-agent");
    assert_eq!(desktop[1], "FROM ${IMAGE}");
    for k in [
        "ENTRYPOINT",
        "CMD",
        "HEALTHCHECK",
        "EXPOSE",
        "STOPSIGNAL",
        "WORKDIR",
        "COPY",
        "ADD",
    ] {
        assert!(!kinds.iter().any(|x| x == k), "the desktop image sets {k}");
    }
    // It ends as the plain image's (last) user.
    let user = |v: &[String]| {
        v.iter()
            .rev()
            .find(|i| keyword(i) == "USER")
            .cloned()
            .unwrap()
    };
    assert_eq!(user(&desktop), user(&plain));
    assert_eq!(user(&plain), "USER 10001:10001");

    // The plain image's entrypoint is the binary it copies in, and its CMD is a subcommand the
    // binary has.
    let find = |k: &str| {
        plain
            .iter()
            .find(|i| keyword(i) == k)
            .unwrap_or_else(|| panic!("the plain Dockerfile has no {k}"))
            .clone()
    };
    let copy = find("COPY");
    let dest = copy.split_whitespace().last().unwrap();
    let entry = find("ENTRYPOINT");
    let entry: Vec<String> = serde_json::from_str(entry["ENTRYPOINT".len()..].trim()).unwrap();
    assert_eq!(entry, [dest], "{copy}");
    let cmd = find("CMD");
    let cmd: Vec<String> = serde_json::from_str(cmd["CMD".len()..].trim()).unwrap();
    let out = Command::new(BIN)
        .args(cmd.iter().map(String::as_str).chain(["--help"]))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "`sandbox-agent {cmd:?} --help`: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        plain.iter().any(|i| keyword(i) == "HEALTHCHECK"),
        "the plain image has a health check the desktop image inherits"
    );
}

#[test]
fn desktop_image_installs_the_packages_the_desktop_code_needs() {
    let text = read("Dockerfile.desktop");
    let run = instructions(&text)
        .into_iter()
        .find(|i| keyword(i) == "RUN")
        .unwrap();
    assert!(
        run.starts_with("RUN sandbox-agent install desktop &&"),
        "{run}"
    );
    // The build fails unless every program the desktop runs is there.
    let mut needed: Vec<&str> = programs(Target::Desktop)
        .into_iter()
        .map(|(p, _)| p)
        .collect();
    needed.push("xdg-open");
    for prog in &needed {
        assert!(
            run.contains(&format!("command -v {prog} "))
                || run.ends_with(&format!("command -v {prog}")),
            "the image build does not check for {prog}: {run}"
        );
    }
    // xdg-open's package is installed next to the daemon's list.
    assert!(run.contains("--no-install-recommends xdg-utils"), "{run}");
    // What `install desktop` installs where nothing is present is the desktop code's package
    // list, read from the binary itself.
    let empty = tempfile::tempdir().unwrap();
    let out = Command::new(BIN)
        .args(["install", "desktop", "--dry-run"])
        .env("PATH", empty.path())
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{said}");
    let line = said
        .lines()
        .find_map(|l| l.strip_prefix("sandbox-agent: would run: apt-get update && "))
        .unwrap_or_else(|| panic!("no command in: {said}"));
    let installed: Vec<&str> = line
        .strip_prefix("apt-get install -y --no-install-recommends ")
        .unwrap()
        .split_whitespace()
        .collect();
    assert_eq!(installed, packages(Target::Desktop), "{said}");
    // Every program's package is in that list, and the header names the same packages.
    for (prog, pkg) in programs(Target::Desktop) {
        assert!(
            installed.contains(&pkg),
            "{prog} comes from {pkg}, not installed"
        );
    }
    let header: String = text
        .lines()
        .take_while(|l| l.starts_with('#'))
        .collect::<Vec<_>>()
        .join(" ");
    for pkg in [
        "Xvfb",
        "openbox",
        "xdotool",
        "xclip",
        "ffmpeg",
        "x11-utils",
        "xdg-utils",
    ] {
        assert!(header.contains(pkg), "the header does not name {pkg}");
    }
}
