//! `sandbox-agent install desktop|browser`: the Debian packages the desktop (or the browser)
//! needs, installed with apt-get when run as root on a machine that has it; otherwise the exact
//! command to run is printed and the exit code is 69 (EX_UNAVAILABLE). Packages whose program
//! is already in `PATH` are left alone: with everything present it says so and exits 0 without
//! touching apt (idempotent, and offline). `--dry-run` prints what it would run.

use std::process::ExitCode;
use std::time::Duration;

/// What `install` installs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Target {
    /// Xvfb, openbox, xdotool, xclip, ffmpeg, x11-utils (docs/desktop.md)
    Desktop,
    /// Chromium
    Browser,
}

pub fn packages(target: Target) -> &'static [&'static str] {
    match target {
        Target::Desktop => super::PACKAGES,
        Target::Browser => &["chromium"],
    }
}

/// Each program `target` uses, with the Debian package that provides it.
pub fn programs(target: Target) -> Vec<(&'static str, &'static str)> {
    match target {
        Target::Desktop => {
            let mut p = super::TOOLS.to_vec();
            p.push(("xprop", "x11-utils"));
            p
        }
        Target::Browser => vec![("chromium", "chromium")],
    }
}

/// The packages of `target` whose program is not in this process's `PATH`, in install order.
pub fn missing_packages(target: Target) -> Vec<&'static str> {
    let env: Vec<_> = std::env::vars_os().collect();
    let absent: Vec<&str> = programs(target)
        .into_iter()
        .filter(|(prog, _)| super::which(&env, prog).is_none())
        .map(|(_, pkg)| pkg)
        .collect();
    packages(target)
        .iter()
        .copied()
        .filter(|p| absent.contains(p))
        .collect()
}

pub fn run(target: Target, dry_run: bool) -> ExitCode {
    let name = match target {
        Target::Desktop => "desktop",
        Target::Browser => "browser",
    };
    let pkgs = missing_packages(target);
    if pkgs.is_empty() {
        let env: Vec<_> = std::env::vars_os().collect();
        let found: Vec<String> = programs(target)
            .into_iter()
            .filter_map(|(prog, _)| super::which(&env, prog).map(|p| p.display().to_string()))
            .collect();
        eprintln!(
            "sandbox-agent: {name}: already installed ({}); nothing to do",
            found.join(", ")
        );
        return ExitCode::SUCCESS;
    }
    let command = format!(
        "apt-get install -y --no-install-recommends {}",
        pkgs.join(" ")
    );
    eprintln!(
        "sandbox-agent: {name}: missing packages: {}",
        pkgs.join(" ")
    );
    let apt = std::path::Path::new("/usr/bin/apt-get");
    if dry_run {
        eprintln!("sandbox-agent: would run: apt-get update && {command}");
        return ExitCode::SUCCESS;
    }
    if !nix::unistd::geteuid().is_root() || !apt.exists() {
        eprintln!(
            "sandbox-agent: cannot install here ({}); on Debian or Ubuntu run as root:\n  apt-get update && {command}",
            if apt.exists() {
                "not root"
            } else {
                "no apt-get"
            }
        );
        return ExitCode::from(69);
    }
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("sandbox-agent: {e}");
            return ExitCode::from(71);
        }
    };
    let step = |args: Vec<&str>| {
        let mut cmd = tokio::process::Command::new(apt);
        cmd.args(&args).env("DEBIAN_FRONTEND", "noninteractive");
        rt.block_on(crate::supervisor::run_to_completion(
            cmd,
            Duration::from_secs(1800),
        ))
    };
    eprintln!("sandbox-agent: apt-get update && {command}");
    let mut install = vec!["install", "-y", "-q", "--no-install-recommends"];
    install.extend(pkgs.iter().copied());
    for args in [vec!["update", "-q"], install] {
        match step(args) {
            Ok(out) if out.status.success() => {}
            Ok(out) => {
                let err = String::from_utf8_lossy(&out.stderr);
                let tail: Vec<&str> = err.lines().rev().take(20).collect();
                eprintln!("sandbox-agent: apt-get failed ({}):", out.status);
                for l in tail.into_iter().rev() {
                    eprintln!("  {l}");
                }
                return ExitCode::from(1);
            }
            Err(e) => {
                eprintln!("sandbox-agent: {e}");
                return ExitCode::from(1);
            }
        }
    }
    eprintln!("sandbox-agent: installed {}", pkgs.join(" "));
    ExitCode::SUCCESS
}
