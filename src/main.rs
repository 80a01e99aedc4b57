//! Entry point: parse the command line, then hand over to the subcommand. Exit codes are
//! documented in docs/install-systemd.md, "Exit codes" (sysexits style).

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
/// sysexits: cannot create a (user) output file, here the data directory.
const EX_CANTCREAT: u8 = 73;
/// sysexits: temporary failure, try again later (the state dir is locked by another daemon).
const EX_TEMPFAIL: u8 = 75;
/// sysexits: configuration error.
const EX_CONFIG: u8 = 78;

fn main() -> ExitCode {
    // Before anything else: the stop and reload signals are blocked (a SIGHUP in the first
    // millisecond would otherwise end the process with its default action). The daemon reads
    // them from a signalfd later (`daemon/signals.rs`); every other command unblocks them below.
    // A reload's image inherits them blocked.
    if let Err(e) = daemon::signals::block() {
        eprintln!("sandbox-agent: cannot block the stop signals: {e}");
        return ExitCode::from(71);
    }
    // Then, while the process has one thread: a reload's hand-off (its variable removed from
    // the environment), then how the daemon was started (before the token is overwritten).
    let received = match sandbox_agent::config::take_handoff_fd() {
        Some(v) => match daemon::reload::receive(&v) {
            Ok(r) => Some(r),
            Err(e) => {
                eprintln!("sandbox-agent: cannot take over after a reload: {e}");
                return ExitCode::from(1);
            }
        },
        None => None,
    };
    let launch = daemon::reload::Launch::capture();
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            let code = if e.use_stderr() { EX_USAGE } else { 0 };
            let argv: Vec<std::ffi::OsString> = std::env::args_os().collect();
            match sandbox_agent::config::env_value_error(&e, &argv) {
                Some(msg) => eprintln!("sandbox-agent: {msg}"),
                None => {
                    let _ = e.print();
                }
            }
            return ExitCode::from(code);
        }
    };
    if !matches!(cli.command, None | Some(Command::Server(_))) {
        // Not the daemon: the signals keep their usual meaning (Ctrl-C ends a client command).
        if let Err(e) = daemon::signals::unblock() {
            eprintln!("sandbox-agent: cannot unblock signals: {e}");
            return ExitCode::from(71);
        }
    }
    match cli.command {
        Some(Command::MockAgent {
            no_load_session,
            list_sessions,
            resume_session,
        }) => sandbox_agent::agents::mock::run(sandbox_agent::agents::mock::Options {
            load_session: !no_load_session,
            list_sessions,
            resume_session,
        }),
        Some(Command::Agents { command }) => sandbox_agent::agents::cli::run(command),
        Some(Command::Openapi) => print_openapi(),
        Some(Command::Install { what, dry_run }) => {
            sandbox_agent::desktop::install::run(what, dry_run)
        }
        Some(Command::SpawnStub { fd }) => sandbox_agent::supervisor::stub_main(fd),
        Some(Command::ReloadCheck {
            state_version,
            with_token,
            args,
        }) => daemon::reload::check_main(state_version, with_token, args),
        Some(Command::Reload { pid, timeout }) => daemon::reload::wait_main(pid, &timeout),
        Some(Command::Server(args)) => serve(&args, launch, received),
        Some(
            command @ (Command::Status { .. }
            | Command::Instances { .. }
            | Command::Sessions { .. }
            | Command::Acp { .. }
            | Command::Processes { .. }
            | Command::Git { .. }
            | Command::Grep { .. }
            | Command::Ports { .. }
            | Command::Fs { .. }),
        ) => sandbox_agent::client::run(command),
        None => serve(&cli.server, launch, received),
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

fn serve(
    args: &ServerArgs,
    launch: daemon::reload::Launch,
    received: Option<daemon::reload::Received>,
) -> ExitCode {
    // `--ready-fd`: taken first, before this process opens descriptors of its own (a number that
    // was not inherited must not become one of ours). A reload's image was told nothing new.
    let mut ready_fd = None;
    if let (Some(n), None) = (args.ready_fd, &received) {
        match sandbox_agent::sys::inherited_fd(n) {
            Ok(fd) => {
                // Not handed on to agents or processes.
                let _ = nix::fcntl::fcntl(
                    &fd,
                    nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::FD_CLOEXEC),
                );
                ready_fd = Some(fd);
            }
            Err(e) => {
                eprintln!("sandbox-agent: --ready-fd {n}: {e}");
                return ExitCode::from(EX_CONFIG);
            }
        }
    }
    // Before the config: the default --max-connections is derived from the open-file limit.
    let nofile = sandbox_agent::sys::raise_nofile_limit();
    // After a reload the token given by flag or environment comes from the hand-off (the new
    // image was started without it); it stays a flag-level setting.
    let mut args = args.clone();
    if let Some(r) = &received
        && args.token.is_none()
    {
        args.token = r.handoff.token.clone();
    }
    let flag_token = args.token.clone();
    let args = &args;
    let config = match Config::load(args) {
        Ok(c) => c,
        Err(e) => {
            eprint!("sandbox-agent: {e}");
            return ExitCode::from(EX_CONFIG);
        }
    };
    protect_secrets(&config);
    // As PID 1 (a container entrypoint) the process splits before any thread exists: the parent
    // stays a tiny init that reaps and forwards signals, the child goes on to be the daemon.
    let pid1 = std::process::id() == 1;
    let mut parent_init = None;
    // A reload's new image is already the daemon (under its init, when there is one).
    if received.is_none() && (pid1 || config.init) {
        let init_pid = std::process::id();
        if let Some(code) = daemon::init::split_off_daemon(pid1) {
            return code;
        }
        parent_init = Some(init_pid);
    }
    // The stop and reload signals were blocked first thing in `main` (`daemon/signals.rs`).
    // Before any thread: buffers of 1 MiB and more are mapped on their own and handed back
    // when freed (docs/performance.md, "Memory after file attacks": 256 KiB cost PUT ~60 % more
    // CPU, 1 MiB nothing measurable).
    sandbox_agent::sys::fix_mmap_threshold(1 << 20);
    // One arena per worker thread and one for the main thread (a current-thread runtime runs on
    // the main thread alone), shared by the blocking threads: their own arenas kept what a burst
    // of starts and stops freed (docs/performance.md, "Arenas").
    let workers = config.worker_threads;
    sandbox_agent::sys::cap_malloc_arenas(if workers <= 1 { 1 } else { workers + 1 });
    // Flushes the log queue (bounded wait) when `serve` returns.
    let _log_guard = sandbox_agent::logging::init(&config);
    match nofile {
        Ok((before, after)) if after > before => {
            tracing::info!(
                before,
                after,
                "raised the open-file limit to its hard limit"
            )
        }
        Ok((_, after)) => tracing::info!(limit = after, "open-file limit"),
        Err(e) => tracing::warn!(error = %e, "cannot read or raise the open-file limit"),
    }
    install_panic_hook();
    sandbox_agent::install_crypto_provider();
    let runtime = match build_runtime(config.worker_threads) {
        Ok(rt) => rt,
        Err(e) => {
            tracing::error!(error = %e, "cannot start the async runtime");
            return ExitCode::from(71);
        }
    };
    let reloads = daemon::Reloads {
        launch,
        token: flag_token,
        received,
        ready_fd,
    };
    let result = runtime.block_on(daemon::run(Arc::new(config), parent_init, reloads));
    // Background tasks (SSE streams, stderr readers) must not hold up the exit.
    runtime.shutdown_timeout(std::time::Duration::from_millis(100));
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e @ StartError::Bind { .. }) => {
            tracing::error!(error = %e, "cannot start");
            ExitCode::from(EX_UNAVAILABLE)
        }
        Err(e @ StartError::DataDir { .. }) => {
            tracing::error!(error = %e, "cannot start");
            ExitCode::from(EX_CANTCREAT)
        }
        Err(StartError::State(e)) => {
            tracing::error!(error = %e, "cannot start");
            match e {
                sandbox_agent::state::StateError::Locked { .. } => ExitCode::from(EX_TEMPFAIL),
                _ => ExitCode::from(EX_CONFIG),
            }
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

/// Leaves nothing of the token readable by another process of ours or of an agent: its copies in
/// argv (`--token`) and in `SANDBOX_AGENT_TOKEN` are overwritten in place, and the process is
/// made non-dumpable, so `/proc/<pid>/environ`, `mem` and ptrace need CAP_SYS_PTRACE even for
/// processes of the same user. Done before the PID-1 fork, so the init parent is covered too.
fn protect_secrets(config: &Config) {
    if let Some(token) = &config.token
        && let Err(e) = sandbox_agent::sys::scrub_from_proc(token.as_bytes(), "SANDBOX_AGENT_TOKEN")
    {
        eprintln!("sandbox-agent: warning: cannot hide the token in /proc/self: {e}");
    }
    if let Err(e) = nix::sys::prctl::set_dumpable(false) {
        eprintln!("sandbox-agent: warning: cannot make the process non-dumpable: {e}");
    }
}

/// One worker (the default on small machines) is tokio's current-thread runtime: the daemon is
/// I/O-bound (CPU-heavy work goes to `spawn_blocking`), and on the 2-core VMs it targets a second
/// worker mostly adds cross-thread wake-ups (measured: docs/performance.md). More workers give
/// the multi-thread runtime, for machines where one core is not enough for the proxy.
/// The blocking pool's threads are named `blocking`, the workers `tokio-rt-worker` (tokio names
/// both alike), so that `top -H` and `/proc/<pid>/task/*/comm` tell them apart: tokio starts
/// its workers first, when the runtime is built, and every later thread is the pool's.
fn build_runtime(workers: usize) -> std::io::Result<tokio::runtime::Runtime> {
    if workers <= 1 {
        tokio::runtime::Builder::new_current_thread()
            .thread_name("blocking")
            .enable_all()
            .build()
    } else {
        let started = std::sync::atomic::AtomicUsize::new(0);
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(workers)
            .thread_name_fn(move || {
                let n = started.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                if n < workers {
                    "tokio-rt-worker"
                } else {
                    "blocking"
                }
                .to_string()
            })
            .enable_all()
            .build()
    }
}

/// Every panic is logged once, through tracing (so it reaches the journal with the rest), with
/// its location; the HTTP layer answers the request with a plain 500 and the daemon goes on.
fn install_panic_hook() {
    std::panic::set_hook(Box::new(|info| {
        let message = info
            .payload()
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| info.payload().downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "(no message)".to_string());
        let location = info
            .location()
            .map(|l| format!("{}:{}", l.file(), l.line()))
            .unwrap_or_default();
        let thread = std::thread::current();
        let backtrace = std::backtrace::Backtrace::capture();
        if backtrace.status() == std::backtrace::BacktraceStatus::Captured {
            tracing::error!(
                thread = thread.name().unwrap_or("unnamed"),
                %location,
                %backtrace,
                "panic: {message}"
            );
        } else {
            tracing::error!(
                thread = thread.name().unwrap_or("unnamed"),
                %location,
                "panic: {message}"
            );
        }
    }));
}
