//! Where the client commands find the daemon: their flags (`ClientArgs`, flattened into each
//! client subcommand by `cli.rs`, as `ServerArgs` is into `server`) and what they resolve to
//! (`ClientTarget`).

use std::fmt;
use std::net::IpAddr;
use std::path::PathBuf;

use super::parse::*;
use super::sources::*;
use clap::Args;

use super::{ConfigError, ConfigErrors};

/// How the client commands (`status`, `instances`, `acp`, `processes`, `fs`) reach the daemon:
/// the server's own address and token settings (same flags, variables and config-file keys, so
/// the daemon's config file serves both), plus `--url` and `--json`.
#[derive(Debug, Clone, Default, Args)]
#[command(next_help_heading = "Daemon and output")]
pub struct ClientArgs {
    /// TOML file of the daemon's settings; only `host`, `port`, `token` and `token_file` are read
    #[arg(long, env = "SANDBOX_AGENT_CONFIG", value_name = "FILE")]
    pub config: Option<PathBuf>,

    /// The daemon's address; an unspecified one (0.0.0.0, ::) means loopback [default: 127.0.0.1]
    #[arg(long, env = "SANDBOX_AGENT_HOST", value_name = "ADDR")]
    pub host: Option<String>,

    /// The daemon's port [default: 2468]
    #[arg(long, env = "SANDBOX_AGENT_PORT", value_name = "PORT")]
    pub port: Option<u16>,

    /// The daemon's base URL (e.g. http://127.0.0.1:2468); overrides --host and --port
    #[arg(long, env = "SANDBOX_AGENT_URL", value_name = "URL")]
    pub url: Option<String>,

    /// Bearer token the daemon requires
    #[arg(
        long,
        env = "SANDBOX_AGENT_TOKEN",
        value_name = "TOKEN",
        hide_env_values = true
    )]
    pub token: Option<String>,

    /// Read the bearer token from this file (surrounding whitespace ignored)
    #[arg(
        long,
        env = "SANDBOX_AGENT_TOKEN_FILE",
        value_name = "FILE",
        conflicts_with = "token"
    )]
    pub token_file: Option<PathBuf>,

    /// Print JSON (one document, or one line per event when following) instead of tables
    #[arg(long)]
    pub json: bool,
}

/// Where the client commands (`sandbox-agent status`, `acp`, `fs`, …) find the daemon: read
/// from the same flags, variables and config-file keys as the daemon's own address and token.
#[derive(Clone)]
pub struct ClientTarget {
    /// `http://host:port` (or `--url`), without a trailing slash.
    pub base_url: String,
    pub token: Option<String>,
}

impl fmt::Debug for ClientTarget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClientTarget")
            .field("base_url", &self.base_url)
            .field("token", &self.token.as_ref().map(|_| "<redacted>"))
            .finish()
    }
}

impl ClientTarget {
    /// Precedence as for the daemon: flag > environment (both through clap) > config file >
    /// default; `--url` wins over host and port, a token over a token file. Only the four keys
    /// the client needs are read from the file: the rest belong to the daemon, which checks them.
    pub fn load(args: &ClientArgs) -> Result<ClientTarget, ConfigErrors> {
        let mut errors = Vec::new();
        let mut file = match &args.config {
            Some(path) => FileValues::load(path, &mut errors),
            None => FileValues::empty(),
        };
        let file_path = file.path.clone();
        let file_host = file.take_string("host", &mut errors);
        let file_port = file.take_string("port", &mut errors);
        let file_token = file.take_string("token", &mut errors);
        let file_token_file = file.take_string("token_file", &mut errors);

        let base_url = match &args.url {
            Some(url) => {
                let url = url.trim().trim_end_matches('/');
                if url.starts_with("http://") || url.starts_with("https://") {
                    url.to_string()
                } else {
                    errors.push(ConfigError::ClientUrl {
                        url: url.to_string(),
                    });
                    String::new()
                }
            }
            None => {
                let host = match (&args.host, file_host) {
                    (Some(h), _) => h.clone(),
                    (None, Some(h)) => h,
                    (None, None) => "127.0.0.1".to_string(),
                };
                let port = match (args.port, file_port) {
                    (Some(p), _) => p,
                    (None, Some(raw)) => raw.parse::<u16>().unwrap_or_else(|_| {
                        errors.push(ConfigError::ClientPort {
                            origin: origin("port", true, false, &file_path),
                            raw: raw.clone(),
                        });
                        0
                    }),
                    (None, None) => 2468,
                };
                if port == 0 && errors.is_empty() {
                    errors.push(ConfigError::ClientPortZero);
                }
                format!("http://{}:{port}", client_host(&host))
            }
        };

        let token = match (&args.token, file_token) {
            (Some(t), _) if t.is_empty() => {
                errors.push(ConfigError::ClientEmptyToken);
                None
            }
            (Some(t), _) => Some(t.clone()),
            (None, Some(t)) if args.token_file.is_none() => Some(t),
            _ => {
                let path = args
                    .token_file
                    .clone()
                    .or_else(|| file_token_file.map(PathBuf::from));
                path.and_then(|path| match read_token_file(&path) {
                    Ok(t) => Some(t),
                    Err(why) => {
                        errors.push(ConfigError::TokenFile { path, why });
                        None
                    }
                })
            }
        };
        if !errors.is_empty() {
            return Err(ConfigErrors(errors));
        }
        Ok(ClientTarget { base_url, token })
    }
}

/// The host part of the daemon's URL: an unspecified address (what a daemon listening on every
/// interface was given) is reached on loopback; IPv6 goes in brackets; a name stays a name.
pub(super) fn client_host(host: &str) -> String {
    let host = host.trim();
    match host
        .trim_start_matches('[')
        .trim_end_matches(']')
        .parse::<IpAddr>()
    {
        Ok(IpAddr::V4(v4)) if v4.is_unspecified() => "127.0.0.1".to_string(),
        Ok(IpAddr::V6(v6)) if v6.is_unspecified() => "[::1]".to_string(),
        Ok(IpAddr::V4(v4)) => v4.to_string(),
        Ok(IpAddr::V6(v6)) => format!("[{v6}]"),
        Err(_) => host.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check_client_host(input: &str, expected: &str) {
        assert_eq!(client_host(input), expected, "{input}");
    }

    #[test]
    fn client_hosts() {
        check_client_host("127.0.0.1", "127.0.0.1");
        check_client_host("0.0.0.0", "127.0.0.1");
        check_client_host("::", "[::1]");
        check_client_host("[::]", "[::1]");
        check_client_host("::1", "[::1]");
        check_client_host("10.1.2.3", "10.1.2.3");
        check_client_host("localhost", "localhost");
    }
}
