//! The command-line client of a running daemon: `sandbox-agent status`, `instances`, `acp …`,
//! `processes …`, `fs …`. Each command is one or a few HTTP calls on a current-thread runtime;
//! bodies that can be large (file transfers, followed streams) are streamed, never held whole.
//! Every failure maps to one exit code by its class (`ClientError::exit_code`, docs/cli.md).

mod acp;
mod api;
mod fs;
mod processes;
mod sse;
mod status;
mod table;
mod workspace;

use std::io::Write;
use std::process::ExitCode;

use crate::cli::{ClientArgs, Command};
use crate::config::ClientTarget;
use api::{Api, ClientError};

/// Runs one client command; `command` is one of the client variants of [`Command`].
pub fn run(command: Command) -> ExitCode {
    let Some(args) = client_args(&command) else {
        eprintln!("sandbox-agent: not a client command");
        return ExitCode::from(api::EX_USAGE);
    };
    let json = args.json;
    let result = match ClientTarget::load(args) {
        Ok(target) => {
            hide_token(&target);
            execute(command, target, json)
        }
        Err(e) => Err(ClientError::Config(e.to_string())),
    };
    match result {
        Ok(code) => ExitCode::from(code),
        Err(e) if e.is_broken_pipe() => ExitCode::SUCCESS,
        // Interrupted on purpose (Ctrl-C): no message, the shell's usual 128 + signal.
        Err(ClientError::Interrupted(signal)) => ExitCode::from((128 + signal).clamp(0, 255) as u8),
        Err(e) => {
            report(&e, json);
            ExitCode::from(e.exit_code())
        }
    }
}

/// A client that follows a stream can run for hours: its token is overwritten in its own argv
/// and environment, as the daemon does with its own (before any thread exists).
fn hide_token(target: &ClientTarget) {
    if let Some(token) = &target.token
        && let Err(e) = crate::sys::scrub_from_proc(token.as_bytes(), "SANDBOX_AGENT_TOKEN")
    {
        eprintln!("sandbox-agent: warning: cannot hide the token in /proc/self: {e}");
    }
}

fn client_args(command: &Command) -> Option<&ClientArgs> {
    use crate::cli::{AcpCommand as A, FsCommand as F, ProcessesCommand as P};
    Some(match command {
        Command::Status { client }
        | Command::Instances { client }
        | Command::Sessions { client } => client,
        Command::Acp { command } => match command {
            A::Send { client, .. }
            | A::Stream { client, .. }
            | A::Stop { client, .. }
            | A::Export { client, .. }
            | A::Import { client, .. } => client,
        },
        Command::Processes { command } => match command {
            P::Run { client, .. }
            | P::Start { client, .. }
            | P::List { client }
            | P::Logs { client, .. }
            | P::Stop { client, .. } => client,
        },
        Command::Fs { command } => match command {
            F::Ls { client, .. } | F::Get { client, .. } | F::Put { client, .. } => client,
        },
        Command::Git { command } => match command {
            crate::cli::GitCommand::Status { client, .. }
            | crate::cli::GitCommand::Diff { client, .. } => client,
        },
        Command::Grep { client, .. } | Command::Ports { client } => client,
        _ => return None,
    })
}

/// Builds the runtime and the HTTP client, then runs the command to its exit code.
fn execute(command: Command, target: ClientTarget, json: bool) -> Result<u8, ClientError> {
    crate::install_crypto_provider();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(ClientError::Runtime)?;
    let api = Api::new(target)?;
    runtime.block_on(async move {
        let work = async {
            match command {
                Command::Status { .. } => status::status(&api, json).await,
                Command::Instances { .. } => status::instances(&api, json).await,
                Command::Sessions { .. } => status::sessions(&api, json).await,
                Command::Acp { command } => acp::run(&api, command, json).await,
                Command::Processes { command } => processes::run(&api, command, json).await,
                Command::Fs { command } => fs::run(&api, command, json).await,
                Command::Git { command } => workspace::git(&api, command, json).await,
                c @ Command::Grep { .. } => workspace::grep(&api, c, json).await,
                Command::Ports { .. } => workspace::ports(&api, json).await,
                _ => Err(ClientError::Usage("not a client command".into())),
            }
        };
        // A stop signal drops the command's future, so what it holds is released as on any
        // other error: a half-downloaded temporary file is removed, not left behind.
        tokio::select! {
            result = work => result,
            signal = stop_signal() => Err(ClientError::Interrupted(signal)),
        }
    })
}

/// The first SIGINT, SIGTERM or SIGHUP; never resolves if the handlers cannot be installed
/// (the signal then ends the process as it would without them).
async fn stop_signal() -> i32 {
    use tokio::signal::unix::{SignalKind, signal};
    let kinds = [
        SignalKind::interrupt(),
        SignalKind::terminate(),
        SignalKind::hangup(),
    ];
    let mut streams = Vec::new();
    for kind in kinds {
        match signal(kind) {
            Ok(s) => streams.push((kind.as_raw_value(), s)),
            Err(_) => return std::future::pending().await,
        }
    }
    let waits = streams.iter_mut().map(|(n, s)| {
        let n = *n;
        Box::pin(async move {
            s.recv().await;
            n
        })
    });
    futures_util::future::select_all(waits).await.0
}

/// One line on stderr: plain words, or with `--json` one JSON object a script can parse.
fn report(e: &ClientError, json: bool) {
    let mut err = std::io::stderr().lock();
    if json {
        let line = serde_json::json!({
            "error": e.class(),
            "exitCode": e.exit_code(),
            "message": e.to_string(),
            "status": e.status(),
            "problem": e.problem(),
        });
        let _ = writeln!(err, "{line}");
    } else {
        let _ = writeln!(err, "sandbox-agent: {}", e.to_string().trim_end());
    }
}

/// Writes to stdout; a failed write is a `ClientError::Stdout` (a closed pipe ends quietly).
fn out(bytes: &[u8]) -> Result<(), ClientError> {
    let mut stdout = std::io::stdout().lock();
    stdout
        .write_all(bytes)
        .and_then(|()| stdout.flush())
        .map_err(ClientError::Stdout)
}

/// Writes one JSON document (or event) as one line on stdout.
fn out_json(value: &serde_json::Value) -> Result<(), ClientError> {
    let mut line = serde_json::to_vec(value).expect("a Value always serializes");
    line.push(b'\n');
    out(&line)
}
