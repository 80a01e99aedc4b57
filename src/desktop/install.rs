//! `sandbox-agent install desktop|browser`: the Debian packages the desktop (or the browser)
//! needs, installed with apt-get when run as root on a machine that has it; otherwise the exact
//! command to run is printed and the exit code is 69 (EX_UNAVAILABLE).

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

pub fn run(target: Target) -> ExitCode {
    let pkgs = packages(target);
    let command = format!(
        "apt-get install -y --no-install-recommends {}",
        pkgs.join(" ")
    );
    let apt = std::path::Path::new("/usr/bin/apt-get");
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
