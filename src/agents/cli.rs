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
    let settings = match &command {
        AgentsCommand::List { settings, .. } | AgentsCommand::Install { settings, .. } => settings,
    };
    let config = match Config::load(&settings.to_server_args()) {
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
    // Written with `writeln!` rather than `println!`: a closed pipe (`agents list | head`) ends
    // the listing quietly instead of panicking.
    match write_list(agents, json, &mut std::io::stdout().lock()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("sandbox-agent: cannot write the listing: {e}");
            ExitCode::from(EX_SOFTWARE)
        }
    }
}

fn write_list(agents: &Agents, json: bool, out: &mut impl Write) -> std::io::Result<()> {
    let statuses = agents.statuses();
    if json {
        let v = serde_json::json!({ "agents": statuses });
        writeln!(
            out,
            "{}",
            serde_json::to_string_pretty(&v).unwrap_or_default()
        )?;
        return Ok(());
    }
    // SOURCE and PATH describe what is installed; an agent that is not installed has neither
    // (where it would come from is only known once the registry has been reached at install).
    writeln!(
        out,
        "{:<10} {:<9} {:<12} {:<9} PATH (or how to install)",
        "AGENT", "INSTALLED", "VERSION", "SOURCE"
    )?;
    for s in statuses {
        let (source, where_) = match (&s.path, s.installed) {
            (Some(p), true) => (s.source.as_str(), p.display().to_string()),
            _ => (
                "-",
                format!(
                    "not installed: {}",
                    s.install_command
                        .as_deref()
                        .unwrap_or("sandbox-agent agents install <id>")
                ),
            ),
        };
        writeln!(
            out,
            "{:<10} {:<9} {:<12} {:<9} {}",
            s.id,
            if s.installed { "yes" } else { "no" },
            s.version.as_deref().unwrap_or("-"),
            source,
            where_
        )?;
    }
    Ok(())
}

/// Steps as lines on stderr. On a terminal, the step under way gets a spinner with the time it
/// has taken (an npm install is silent for ~10 s) and downloads a `\r`-redrawn bar; otherwise
/// plain lines only. Long messages are wrapped so that a cause chain stays readable.
struct TermProgress {
    tty: bool,
    /// Last drawn percentage (or MiB when the size is unknown), to redraw only on change.
    last: Mutex<Option<u64>>,
    /// The step the spinner is drawing, if any.
    spinning: Arc<Mutex<Option<(String, std::time::Instant)>>>,
    stop: Arc<std::sync::atomic::AtomicBool>,
}

/// Width at which step messages are wrapped.
const WRAP: usize = 100;

impl TermProgress {
    fn new() -> Self {
        let progress = TermProgress {
            tty: std::io::stderr().is_terminal(),
            last: Mutex::new(None),
            spinning: Arc::new(Mutex::new(None)),
            stop: Arc::new(std::sync::atomic::AtomicBool::new(false)),
        };
        if progress.tty {
            let spinning = progress.spinning.clone();
            let stop = progress.stop.clone();
            std::thread::spawn(move || spin(&spinning, &stop));
        }
        progress
    }

    fn clear(&self) {
        let drawn = self.last.lock().map(|l| l.is_some()).unwrap_or(false)
            || self.spinning.lock().map(|s| s.is_some()).unwrap_or(false);
        if let Ok(mut s) = self.spinning.lock() {
            *s = None;
        }
        if self.tty && drawn {
            eprint!("\r\x1b[K");
        }
    }
}

impl Drop for TermProgress {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        self.clear();
    }
}

/// Redraws the current step with a spinner and its elapsed seconds, ten times a second.
fn spin(
    spinning: &Mutex<Option<(String, std::time::Instant)>>,
    stop: &std::sync::atomic::AtomicBool,
) {
    const FRAMES: [char; 4] = ['|', '/', '-', '\\'];
    let mut frame = 0usize;
    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
        std::thread::sleep(std::time::Duration::from_millis(100));
        if let Ok(current) = spinning.lock()
            && let Some((step, since)) = current.as_ref()
        {
            frame = (frame + 1) % FRAMES.len();
            let short: String = step.chars().take(WRAP - 12).collect();
            eprint!(
                "\r\x1b[K{} {short} ({}s)",
                FRAMES[frame],
                since.elapsed().as_secs()
            );
            let _ = std::io::stderr().flush();
        }
    }
}

/// Splits `message` into lines of at most `width` characters at spaces; continuation lines are
/// indented by two spaces. A single word longer than the width stays whole.
fn wrap(message: &str, width: usize) -> Vec<String> {
    let mut lines = Vec::new();
    let mut line = String::new();
    for word in message.split(' ') {
        let limit = if lines.is_empty() { width } else { width - 2 };
        if !line.is_empty() && line.chars().count() + 1 + word.chars().count() > limit {
            lines.push(std::mem::take(&mut line));
        }
        if !line.is_empty() {
            line.push(' ');
        }
        line.push_str(word);
    }
    lines.push(line);
    lines
        .into_iter()
        .enumerate()
        .map(|(i, l)| if i == 0 { l } else { format!("  {l}") })
        .collect()
}

impl Progress for TermProgress {
    fn step(&self, message: &str) {
        self.clear();
        for line in wrap(message, WRAP) {
            eprintln!("{line}");
        }
        if self.tty
            && let Ok(mut s) = self.spinning.lock()
        {
            *s = Some((message.to_string(), std::time::Instant::now()));
        }
    }

    fn download(&self, done: u64, total: Option<u64>) {
        if !self.tty {
            return;
        }
        // The bar replaces the spinner while bytes arrive.
        if let Ok(mut s) = self.spinning.lock() {
            *s = None;
        }
        let mut last = crate::sys::lock(&self.last);
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

#[cfg(test)]
mod tests {
    use super::wrap;

    fn check(input: &str, width: usize, expected: &[&str]) {
        assert_eq!(wrap(input, width), expected);
    }

    #[test]
    fn wraps_long_messages_at_spaces_and_indents_continuations() {
        check("short", 20, &["short"]);
        check(
            "the ACP registry is unreachable (cannot reach x)",
            20,
            &["the ACP registry is", "  unreachable", "  (cannot reach x)"],
        );
        check(
            "averyveryverylongword and",
            10,
            &["averyveryverylongword", "  and"],
        );
    }
}
