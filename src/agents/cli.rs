//! `sandbox-agent agents list|install`: the installer from the command line, for pre-installing
//! agents into an image. A progress bar is drawn only on a terminal; otherwise plain lines.
//! Exit codes are sysexits-style: 0 done, 64 usage (unknown agent or bad pin), 69 install
//! failed, 78 bad configuration, 70 internal error.

use std::io::{IsTerminal, Write};
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::Mutex;

use super::install::Progress;
use super::{AgentError, Agents, InstallRequest};
use crate::cli::AgentsCommand;
use crate::config::Config;

const EX_USAGE: u8 = 64;
const EX_UNAVAILABLE: u8 = 69;
const EX_SOFTWARE: u8 = 70;
const EX_CONFIG: u8 = 78;

pub fn run(command: AgentsCommand) -> ExitCode {
    let server = match &command {
        AgentsCommand::List { server, .. } | AgentsCommand::Install { server, .. } => server,
    };
    let config = match Config::load(server) {
        Ok(c) => Arc::new(c),
        Err(e) => {
            eprint!("sandbox-agent: {e}");
            return ExitCode::from(EX_CONFIG);
        }
    };
    let agents = match Agents::new(config) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("sandbox-agent: {e:#}");
            return ExitCode::from(EX_CONFIG);
        }
    };
    match command {
        AgentsCommand::List { json, .. } => list(&agents, json),
        AgentsCommand::Install {
            agent,
            reinstall,
            agent_version,
            agent_process_version,
            ..
        } => {
            let runtime = match tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                Ok(rt) => rt,
                Err(e) => {
                    eprintln!("sandbox-agent: cannot start the async runtime: {e}");
                    return ExitCode::from(EX_SOFTWARE);
                }
            };
            let progress = TermProgress::new();
            let req = InstallRequest {
                reinstall,
                agent_version,
                agent_process_version,
            };
            match runtime.block_on(agents.install_with(&agent, req, &progress)) {
                Ok(outcome) => {
                    progress.clear();
                    if outcome.already_installed {
                        println!(
                            "{agent} is already installed ({} {}); pass --reinstall to install again",
                            outcome.source,
                            outcome.version.as_deref().unwrap_or("unknown version")
                        );
                    }
                    for a in &outcome.artifacts {
                        println!(
                            "{}\t{}\t{}\t{}",
                            a.kind,
                            a.version,
                            a.source,
                            a.path.display()
                        );
                    }
                    ExitCode::SUCCESS
                }
                Err(e) => {
                    progress.clear();
                    eprintln!("sandbox-agent: {e}");
                    ExitCode::from(match e {
                        AgentError::Unknown { .. } | AgentError::InvalidRequest { .. } => EX_USAGE,
                        AgentError::InstallFailed { .. }
                        | AgentError::PreinstallRequired { .. } => EX_UNAVAILABLE,
                    })
                }
            }
        }
    }
}

fn list(agents: &Agents, json: bool) -> ExitCode {
    let statuses = agents.statuses();
    if json {
        let v = serde_json::json!({ "agents": statuses });
        println!("{}", serde_json::to_string_pretty(&v).unwrap_or_default());
        return ExitCode::SUCCESS;
    }
    println!(
        "{:<10} {:<9} {:<9} {:<12} PATH",
        "AGENT", "INSTALLED", "SOURCE", "VERSION"
    );
    for s in statuses {
        println!(
            "{:<10} {:<9} {:<9} {:<12} {}",
            s.id,
            if s.installed { "yes" } else { "no" },
            s.source,
            s.version.as_deref().unwrap_or("-"),
            s.path
                .as_ref()
                .map(|p| p.display().to_string())
                .unwrap_or_else(|| s.install_command.unwrap_or_default())
        );
    }
    ExitCode::SUCCESS
}

/// Steps as lines on stderr; downloads as a `\r`-redrawn bar when stderr is a terminal.
struct TermProgress {
    tty: bool,
    /// Last drawn percentage (or MiB when the size is unknown), to redraw only on change.
    last: Mutex<Option<u64>>,
}

impl TermProgress {
    fn new() -> Self {
        TermProgress {
            tty: std::io::stderr().is_terminal(),
            last: Mutex::new(None),
        }
    }

    fn clear(&self) {
        if self.tty && self.last.lock().map(|l| l.is_some()).unwrap_or(false) {
            eprint!("\r\x1b[K");
        }
    }
}

impl Progress for TermProgress {
    fn step(&self, message: &str) {
        self.clear();
        eprintln!("{message}");
    }

    fn download(&self, done: u64, total: Option<u64>) {
        if !self.tty {
            return;
        }
        let mut last = self.last.lock().unwrap_or_else(|e| e.into_inner());
        let mib = done as f64 / (1024.0 * 1024.0);
        match total.filter(|t| *t > 0) {
            Some(total) => {
                let pct = done.saturating_mul(100) / total;
                if *last == Some(pct) {
                    return;
                }
                *last = Some(pct);
                let width = 30usize;
                let filled = (pct as usize * width / 100).min(width);
                eprint!(
                    "\r[{}{}] {pct:>3}% {mib:.1}/{:.1} MiB",
                    "#".repeat(filled),
                    "-".repeat(width - filled),
                    total as f64 / (1024.0 * 1024.0)
                );
            }
            None => {
                let whole = done >> 20;
                if *last == Some(whole) {
                    return;
                }
                *last = Some(whole);
                eprint!("\r{mib:.1} MiB");
            }
        }
        let _ = std::io::stderr().flush();
    }

    fn download_done(&self) {
        if self.tty && self.last.lock().map(|l| l.is_some()).unwrap_or(false) {
            eprintln!();
            if let Ok(mut l) = self.last.lock() {
                *l = None;
            }
        }
    }
}
