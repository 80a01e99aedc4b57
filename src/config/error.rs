//! The errors of the configuration: one refused value (`InvalidValue`, what every value parser
//! returns), one problem of a load (`ConfigError`, a variant per kind, whose text is what the
//! operator reads) and every problem of a load together (`ConfigErrors`, exit 78).

use std::fmt;
use std::net::IpAddr;
use std::path::PathBuf;

/// Why a value is refused, in words that quote the value (`` `soon` is not a duration … ``);
/// the caller adds where it came from.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct InvalidValue(pub String);

impl From<String> for InvalidValue {
    fn from(s: String) -> Self {
        InvalidValue(s)
    }
}

impl From<&str> for InvalidValue {
    fn from(s: &str) -> Self {
        InvalidValue(s.to_string())
    }
}

/// Where a value came from, as an error names it: the file's key, the variable, or the flag.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Origin {
    /// `config file <path>: key `<key>``
    File { path: PathBuf, key: String },
    /// `environment variable SANDBOX_AGENT_…`
    Env { var: String },
    /// `--<flag>`
    Flag { flag: String },
}

impl fmt::Display for Origin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Origin::File { path, key } => write!(f, "config file {}: key `{key}`", path.display()),
            Origin::Env { var } => write!(f, "environment variable {var}"),
            Origin::Flag { flag } => write!(f, "--{flag}"),
        }
    }
}

/// What an unknown file key looks like, for the hint its error gives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum UnknownKeyHint {
    /// `agent`/`agents` tables: agents are declared in their own file.
    Agents,
    /// Any other table: the file has only top-level keys.
    Table,
    /// A known key close to it.
    Nearest(String),
    /// Nothing to suggest.
    None,
}

/// One problem of a load (the daemon's `Config::load` or the client's `ClientTarget::load`).
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config file {}: {error}", path.display())]
    UnreadableFile {
        path: PathBuf,
        error: std::io::Error,
    },
    /// Where (1-based line and column) and what, never the offending line itself: the message is
    /// shown by a reload's refusal, and the line may hold a secret (`token = "…`).
    #[error("config file {} is not valid TOML{}: {message}", path.display(), at_line(*at))]
    NotToml {
        path: PathBuf,
        at: Option<(usize, usize)>,
        message: String,
    },
    /// A file key holding a value of the wrong TOML type.
    #[error("config file {}: key `{key}`: expected {expected}, got {got}", path.display())]
    FileKeyType {
        path: PathBuf,
        key: String,
        expected: &'static str,
        got: &'static str,
    },
    #[error("{}", unknown_key(path, key, hint))]
    UnknownKey {
        path: PathBuf,
        key: String,
        hint: UnknownKeyHint,
    },
    /// A setting's value its parser refused.
    #[error("{origin}: {why}")]
    InvalidSetting { origin: Origin, why: InvalidValue },
    #[error("--process-max-log-bytes is larger than --process-max-total-log-bytes")]
    ProcessLogBytesOverTotal,
    #[error("--token-file {}: {why}", path.display())]
    TokenFile { path: PathBuf, why: InvalidValue },
    #[error(
        "refusing to listen on {host} without authentication: pass --token <TOKEN> \
         (or SANDBOX_AGENT_TOKEN), or --no-token to serve without one"
    )]
    NoAuthentication { host: IpAddr },
    #[error("the OTLP endpoint `{url}` is not an http:// or https:// URL")]
    OtlpEndpoint { url: String },
    #[error("OTEL_TRACES_SAMPLER: {0}")]
    TraceSampler(InvalidValue),
    /// The client's `--url`.
    #[error("--url (or SANDBOX_AGENT_URL): `{url}` is not an http:// or https:// URL")]
    ClientUrl { url: String },
    /// The client's port from the config file.
    #[error("{origin}: `{raw}` is not a port (0-65535)")]
    ClientPort { origin: Origin, raw: String },
    #[error(
        "port 0 means \"any free port\" to the daemon: pass the port it reported \
         (--port or SANDBOX_AGENT_PORT)"
    )]
    ClientPortZero,
    #[error("--token (or SANDBOX_AGENT_TOKEN): the token is empty")]
    ClientEmptyToken,
}

fn at_line(at: Option<(usize, usize)>) -> String {
    at.map(|(l, c)| format!(" at line {l}, column {c}"))
        .unwrap_or_default()
}

fn unknown_key(path: &std::path::Path, key: &str, hint: &UnknownKeyHint) -> String {
    let base = format!("config file {}: unknown key `{key}`", path.display());
    match hint {
        UnknownKeyHint::Agents => format!(
            "{base}: agents are declared in their own file with `[[agent]]` tables, \
             passed with --agents-file (see docs/agents.md)"
        ),
        UnknownKeyHint::Table => {
            format!("{base}: the config file has no tables, only top-level keys")
        }
        UnknownKeyHint::Nearest(k) => format!("{base}; did you mean `{k}`?"),
        UnknownKeyHint::None => base,
    }
}

/// Every problem found while building the config, one line each, reported together.
#[derive(Debug)]
pub struct ConfigErrors(pub Vec<ConfigError>);

impl fmt::Display for ConfigErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "invalid configuration ({} problem(s)):", self.0.len())?;
        for e in &self.0 {
            writeln!(f, "  - {e}")?;
        }
        Ok(())
    }
}

impl std::error::Error for ConfigErrors {}
