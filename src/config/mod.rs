//! One `Config`, built once at start-up from flags, environment, the optional TOML file and the
//! built-in defaults (in that order of precedence). Every bad value and every unknown file key is
//! collected and reported together, so an operator fixes a config file in one pass.
//! This is the only module that reads the process environment (systemd's variables included).
//!
//! Where things are: `settings.rs` is the table (every setting declared once), `declare.rs` what
//! is made of it (clap arguments, resolution, the docs rows), `sources.rs` where a value comes
//! from, `keys.rs` the file keys known, `parse.rs` the value parsers, `types.rs` the word-valued types, `env.rs` the rest of
//! the environment (what agents inherit, tracing, systemd, reload), `client.rs` the client
//! commands' share, `test_hooks.rs` what only the daemon's own tests may switch on.

use std::ffi::OsString;
use std::fmt;
use std::path::PathBuf;

mod client;
mod declare;
mod env;
mod error;
mod keys;
mod parse;
mod settings;
mod sources;
pub mod test_hooks;
mod types;

pub use client::{ClientArgs, ClientTarget};
use declare::{Ctx, Resolver};
pub use env::{HANDOFF_FD_VAR, launch_env, take_handoff_fd};
pub use error::{ConfigError, ConfigErrors, InvalidValue, Origin, UnknownKeyHint};
use keys::unknown_key;
use parse::read_token_file;
pub use parse::{
    MAX_WARM_SPAWNS, normalise_log_filter, normalise_origin, parse_duration, parse_size,
};
pub use settings::{Config, ServerArgs};
use settings::{Derived, Settings};
use sources::FileValues;
pub use sources::{env_name, env_value_error};
pub use types::{AgentCgroups, LogFormat, StateSync, SystemdEnv, TraceSampler};

/// The public ACP registry, used unless `--acp-registry-url` says otherwise.
pub const DEFAULT_ACP_REGISTRY_URL: &str =
    "https://cdn.agentclientprotocol.com/registry/v1/latest/registry.json";

impl fmt::Debug for Config {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Hand-written so that the token can never reach a log line through `{:?}`.
        f.debug_struct("Config")
            .field("host", &self.host)
            .field("port", &self.port)
            .field("token", &self.token.as_ref().map(|_| "<redacted>"))
            .field("data_dir", &self.data_dir)
            .field("work_dir", &self.work_dir)
            .field("fs_root", &self.fs_root)
            .field("request_timeout", &self.request_timeout)
            .field("shutdown_grace", &self.shutdown_grace)
            .finish_non_exhaustive()
    }
}

impl Config {
    /// Builds the config from parsed flags (which already include the environment) and the
    /// optional file they name; `env` is the process environment.
    pub fn load(args: &ServerArgs) -> Result<Config, ConfigErrors> {
        Self::load_with_env(args, std::env::vars_os().collect())
    }

    pub fn load_with_env(
        args: &ServerArgs,
        env: Vec<(OsString, OsString)>,
    ) -> Result<Config, ConfigErrors> {
        let mut errors = Vec::new();
        let file = match &args.config {
            Some(path) => FileValues::load(path, &mut errors),
            None => FileValues::empty(),
        };
        let cx = Ctx {
            cwd: std::env::current_dir().unwrap_or_else(|_| PathBuf::from("/")),
            env,
        };
        let mut r = Resolver {
            file,
            cx: &cx,
            errors,
        };
        let mut s = Settings::resolve(args, &mut r);
        let Resolver {
            mut file,
            mut errors,
            ..
        } = r;

        // What no single setting can check.
        if s.process_max_log_bytes > s.process_max_total_log_bytes {
            errors.push(ConfigError::ProcessLogBytesOverTotal);
        }
        // The config file may not name itself, and nothing else is known.
        file.map.remove("config");
        for (key, value) in &file.map {
            errors.push(unknown_key(key, value, &file.path));
        }
        if s.token.is_none()
            && let Some(path) = &s.token_file
        {
            match read_token_file(path) {
                Ok(t) => s.token = Some(t),
                Err(why) => errors.push(ConfigError::TokenFile {
                    path: path.clone(),
                    why,
                }),
            }
        }
        if !s.host.is_loopback() && s.token.is_none() && !s.no_token {
            errors.push(ConfigError::NoAuthentication { host: s.host });
        }
        let tracing = env::tracing(&cx, s.otlp_endpoint.as_deref(), &mut errors);
        if !errors.is_empty() {
            return Err(ConfigErrors(errors));
        }
        if s.no_token {
            s.token = None;
        }
        let derived = Derived {
            exe: env::own_exe(),
            agent_base_env: env::agent_base_env(&cx.env, &s.agent_env_pass),
            systemd: env::systemd(&cx),
            otlp_traces_endpoint: tracing.endpoint,
            otel_service_name: tracing.service_name,
            otel_sampler: tracing.sampler,
        };
        Ok(s.into_config(derived))
    }

    /// A config with every default, for unit tests and benches.
    pub fn defaults() -> Config {
        Self::load_with_env(&ServerArgs::default(), Vec::new()).expect("defaults are valid")
    }
}

/// The clap arguments of the settings `keep` names, for commands that take only a few of them
/// (the installer); `hide` keeps them out of the command's help (`sandbox-agent` without a
/// subcommand takes every server flag but lists them only under `server --help`).
pub fn server_args(cmd: clap::Command, keep: impl Fn(&str) -> bool, hide: bool) -> clap::Command {
    ServerArgs::augment(cmd, keep, hide)
}

/// Whether `name` is a setting's name (a file key, `port`, or a flag, `--port`): what a reload's
/// refusal may quote of a configuration error, unlike a value.
pub fn is_setting_name(name: &str) -> bool {
    let key = name.trim_start_matches("--").replace('-', "_");
    !key.is_empty() && keys::known_file_keys().contains(&key)
}

/// The settings table of docs/config.md, as the table in `settings.rs` makes it.
pub fn docs_table() -> String {
    let mut out = String::from(
        "| flag | environment | file key | default | meaning |\n|---|---|---|---|---|\n\
         | `--config FILE` | `SANDBOX_AGENT_CONFIG` | – | none | TOML file with any of the keys below |\n\
         | `--ready-fd FD` | – | – | none | once listening, write one JSON line `{\"url\",\"host\",\"port\",\"pid\"}` to the inherited descriptor FD and close it: how a program that started the daemon (e.g. on port `0`) learns its address without reading the log (the Python SDK's `start_local` passes a pipe); a descriptor that is not open is a usage error (exit 78); not repeated after a reload |\n",
    );
    for m in settings::table() {
        out.push_str(&m.docs_row());
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests;
