//! Logging setup (tracing). Under systemd, when stderr is the journal (`JOURNAL_STREAM` names
//! stderr's device and inode), events go to journald with structured fields; otherwise they are
//! written as text or JSON lines to stderr. Nothing of ours is ever written to stdout.

use std::os::fd::AsFd;

use tracing_subscriber::EnvFilter;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

use crate::config::{Config, LogFormat};

/// True when fd 2 is the stream systemd connected to the journal.
fn stderr_is_journal(journal_stream: Option<&str>) -> bool {
    let Some((dev, ino)) = journal_stream.and_then(|s| s.split_once(':')) else {
        return false;
    };
    let (Ok(dev), Ok(ino)) = (dev.parse::<u64>(), ino.parse::<u64>()) else {
        return false;
    };
    match nix::sys::stat::fstat(std::io::stderr().as_fd()) {
        Ok(st) => st.st_dev == dev && st.st_ino == ino,
        Err(_) => false,
    }
}

/// The format actually used once `auto` is resolved.
pub fn resolve_format(config: &Config) -> LogFormat {
    match config.log_format {
        LogFormat::Auto if stderr_is_journal(config.systemd.journal_stream.as_deref()) => {
            LogFormat::Journald
        }
        LogFormat::Auto => LogFormat::Text,
        other => other,
    }
}

/// Installs the global subscriber. Falls back to text on stderr if the journal is unreachable.
pub fn init(config: &Config) {
    let filter = EnvFilter::try_new(&config.log_level).unwrap_or_else(|_| EnvFilter::new("info"));
    let registry = tracing_subscriber::registry().with(filter);
    match resolve_format(config) {
        LogFormat::Journald => match tracing_journald::layer() {
            Ok(layer) => {
                registry
                    .with(
                        layer
                            .with_syslog_identifier("sandbox-agent".into())
                            .with_field_prefix(None),
                    )
                    .init();
            }
            Err(e) => {
                eprintln!("sandbox-agent: journald unavailable ({e}); logging text to stderr");
                registry
                    .with(tracing_subscriber::fmt::layer().with_writer(std::io::stderr))
                    .init();
            }
        },
        LogFormat::Json => registry
            .with(
                tracing_subscriber::fmt::layer()
                    .json()
                    .flatten_event(true)
                    .with_writer(std::io::stderr),
            )
            .init(),
        LogFormat::Text | LogFormat::Auto => registry
            .with(
                tracing_subscriber::fmt::layer()
                    .with_writer(std::io::stderr)
                    .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr())),
            )
            .init(),
    }
}
