//! Entry point: parse the command line, then hand over to the subcommand. Exit codes are
//! documented in docs/operations.md (sysexits style).

use std::process::ExitCode;
use std::sync::Arc;

use clap::Parser;
use sandbox_agent::cli::{Cli, Command, ServerArgs};
use sandbox_agent::config::Config;
use sandbox_agent::daemon::{self, StartError};

/// sysexits: command line usage error.
const EX_USAGE: u8 = 64;
/// sysexits: service unavailable (e.g. the port is taken).
const EX_UNAVAILABLE: u8 = 69;
/// sysexits: configuration error.
const EX_CONFIG: u8 = 78;

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            let code = if e.use_stderr() { EX_USAGE } else { 0 };
            let _ = e.print();
            return ExitCode::from(code);
        }
    };
    match cli.command {
        Some(Command::MockAgent) => sandbox_agent::agents::mock::run(),
        Some(Command::Agents { command }) => sandbox_agent::agents::cli::run(command),
        Some(Command::Openapi) => print_openapi(),
        Some(Command::Server(args)) => serve(&args),
        None => serve(&cli.server),
    }
}

/// `sandbox-agent openapi`: the document on stdout, byte for byte what the daemon serves.
fn print_openapi() -> ExitCode {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    match out
        .write_all(sandbox_agent::http::openapi::document_json())
        .and_then(|()| out.flush())
    {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("sandbox-agent: writing the document: {e}");
            ExitCode::FAILURE
        }
    }
}

fn serve(args: &ServerArgs) -> ExitCode {
    let config = match Config::load(args) {
        Ok(c) => c,
        Err(e) => {
            eprint!("sandbox-agent: {e}");
            return ExitCode::from(EX_CONFIG);
        }
    };
    // As PID 1 (a container entrypoint) the process splits before any thread exists: the parent
    // stays a tiny init that reaps and forwards signals, the child goes on to be the daemon.
    let pid1 = std::process::id() == 1;
    let mut parent_init = None;
    if pid1 || config.init {
        let init_pid = std::process::id();
        if let Some(code) = daemon::init::split_off_daemon(pid1) {
            return code;
        }
        parent_init = Some(init_pid);
    }
    sandbox_agent::logging::init(&config);
    sandbox_agent::install_crypto_provider();
    // One thread runs every task: the daemon is I/O-bound (CPU-heavy work such as unpacking
    // archives or writing files goes to `spawn_blocking`), and on the small VMs it targets a
    // second worker mostly adds cross-thread wake-ups (futex + eventfd per request). Measured
    // with `cargo bench --bench acp` on the 2-core VM: 35 % fewer context switches, ~10 % less
    // CPU per request and +12–15 % requests/s at c=32; c=1 latency unchanged (docs/performance.md).
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            tracing::error!(error = %e, "cannot start the async runtime");
            return ExitCode::from(71);
        }
    };
    let result = runtime.block_on(daemon::run(Arc::new(config), parent_init));
    // Background tasks (SSE streams, stderr readers) must not hold up the exit.
    runtime.shutdown_timeout(std::time::Duration::from_millis(100));
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e @ StartError::Bind { .. }) => {
            tracing::error!(error = %e, "cannot start");
            ExitCode::from(EX_UNAVAILABLE)
        }
        Err(e @ StartError::Config(_)) => {
            tracing::error!(error = %e, "cannot start");
            ExitCode::from(EX_CONFIG)
        }
        Err(e) => {
            tracing::error!(error = format!("{e:#}"), "cannot start");
            ExitCode::from(1)
        }
    }
}
