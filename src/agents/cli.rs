//! `sandbox-agent agents list|install`: the installer from the command line.

use std::process::ExitCode;

use crate::cli::AgentsCommand;

pub fn run(_command: AgentsCommand) -> ExitCode {
    eprintln!("sandbox-agent: agents commands are not available yet");
    ExitCode::from(69)
}
