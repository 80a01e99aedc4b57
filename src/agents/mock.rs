//! The built-in deterministic ACP agent (`sandbox-agent mock-agent`).

use std::process::ExitCode;

pub fn run() -> ExitCode {
    ExitCode::SUCCESS
}
