//! Where a setting's value comes from: the TOML file (read key by key, so every bad key is
//! reported), the environment variable of a flag, and the words used to name each in errors.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::path::{Path, PathBuf};

use super::error::{ConfigError, Origin};

/// Values from the TOML file, taken key by key so that every bad key is reported.
pub(super) struct FileValues {
    pub(super) map: BTreeMap<String, toml::Value>,
    pub(super) path: PathBuf,
}

impl FileValues {
    pub(super) fn empty() -> Self {
        FileValues {
            map: BTreeMap::new(),
            path: PathBuf::new(),
        }
    }

    pub(super) fn load(path: &Path, errors: &mut Vec<ConfigError>) -> Self {
        let text = match std::fs::read_to_string(path) {
            Ok(t) => t,
            Err(e) => {
                errors.push(ConfigError::UnreadableFile {
                    path: path.to_path_buf(),
                    error: e,
                });
                return Self::empty();
            }
        };
        let table: toml::Table = match toml::from_str(&text) {
            Ok(t) => t,
            Err(e) => {
                // Where and what, never the offending line itself: the message is shown by
                // a reload's refusal, and the line may hold a secret (`token = "…`).
                errors.push(ConfigError::NotToml {
                    path: path.to_path_buf(),
                    at: e.span().map(|sp| line_column(&text, sp.start)),
                    message: e.message().trim_end().to_string(),
                });
                return Self::empty();
            }
        };
        let map = table
            .into_iter()
            .map(|(k, v)| (k.replace('-', "_"), v))
            .collect();
        FileValues {
            map,
            path: path.to_path_buf(),
        }
    }

    /// A scalar rendered as the string the command line would have carried.
    pub(super) fn take_string(
        &mut self,
        key: &str,
        errors: &mut Vec<ConfigError>,
    ) -> Option<String> {
        let v = self.map.remove(key)?;
        match v {
            toml::Value::String(s) => Some(s),
            toml::Value::Integer(i) => Some(i.to_string()),
            toml::Value::Float(f) => Some(f.to_string()),
            toml::Value::Boolean(b) => Some(b.to_string()),
            other => {
                errors.push(self.bad(key, "a string or number", other.type_str()));
                None
            }
        }
    }

    pub(super) fn take_bool(&mut self, key: &str, errors: &mut Vec<ConfigError>) -> Option<bool> {
        match self.map.remove(key)? {
            toml::Value::Boolean(b) => Some(b),
            other => {
                errors.push(self.bad(key, "true or false", other.type_str()));
                None
            }
        }
    }

    pub(super) fn take_list(
        &mut self,
        key: &str,
        errors: &mut Vec<ConfigError>,
    ) -> Option<Vec<String>> {
        match self.map.remove(key)? {
            toml::Value::String(s) => Some(s.split(',').map(str::to_owned).collect()),
            toml::Value::Array(items) => {
                let mut out = Vec::new();
                for item in items {
                    match item {
                        toml::Value::String(s) => out.push(s),
                        other => {
                            errors.push(self.bad(key, "strings", other.type_str()));
                            return None;
                        }
                    }
                }
                Some(out)
            }
            other => {
                errors.push(self.bad(key, "a list of strings", other.type_str()));
                None
            }
        }
    }

    pub(super) fn bad(&self, key: &str, expected: &'static str, got: &'static str) -> ConfigError {
        ConfigError::FileKeyType {
            path: self.path.clone(),
            key: key.to_string(),
            expected,
            got,
        }
    }
}

/// The environment variable of a flag: `request-timeout` → `SANDBOX_AGENT_REQUEST_TIMEOUT`.
pub fn env_name(flag: &str) -> String {
    format!(
        "SANDBOX_AGENT_{}",
        flag.trim_start_matches('-')
            .replace('-', "_")
            .to_uppercase()
    )
}

/// Where a value came from, for error messages: the file's key, the variable, or the flag.
pub(super) fn origin(flag: &str, from_file: bool, from_env: bool, file: &Path) -> Origin {
    if from_file {
        Origin::File {
            path: file.to_path_buf(),
            key: flag.replace('-', "_"),
        }
    } else if from_env {
        Origin::Env {
            var: env_name(flag),
        }
    } else {
        Origin::Flag {
            flag: flag.to_string(),
        }
    }
}

/// A clap error about a value that came from the environment, reworded to name the variable
/// the user set (clap names the flag, which the user never typed). `None` when the value was
/// on the command line or the error is of another kind.
pub fn env_value_error(e: &clap::Error, argv: &[OsString]) -> Option<String> {
    use clap::error::{ContextKind, ContextValue, ErrorKind};
    if !matches!(
        e.kind(),
        ErrorKind::InvalidValue | ErrorKind::ValueValidation
    ) {
        return None;
    }
    let arg = match e.get(ContextKind::InvalidArg)? {
        ContextValue::String(s) => s.clone(),
        _ => return None,
    };
    let value = match e.get(ContextKind::InvalidValue)? {
        ContextValue::String(s) => s.clone(),
        _ => return None,
    };
    // `--port <PORT>` → `port`
    let flag = arg
        .split_whitespace()
        .next()?
        .trim_start_matches('-')
        .to_string();
    let long = format!("--{flag}");
    let on_command_line = argv.iter().any(|a| {
        let a = a.to_string_lossy();
        a == long || a.starts_with(&format!("{long}="))
    });
    if on_command_line {
        return None;
    }
    let var = env_name(&flag);
    let set = std::env::var_os(&var)?;
    if set.to_string_lossy() != value {
        return None;
    }
    let why = e
        .to_string()
        .lines()
        .next()
        .and_then(|l| l.rsplit_once(": ").map(|(_, why)| why.to_string()))
        .unwrap_or_else(|| "invalid value".to_string());
    Some(format!(
        "environment variable {var}: `{value}` is not valid for --{flag}: {why}"
    ))
}

/// The 1-based line and column (in characters) of byte `at` of `text`.
fn line_column(text: &str, at: usize) -> (usize, usize) {
    let before = &text.as_bytes()[..at.min(text.len())];
    let line = before.iter().filter(|b| **b == b'\n').count() + 1;
    let start = before
        .iter()
        .rposition(|b| *b == b'\n')
        .map_or(0, |i| i + 1);
    let column = String::from_utf8_lossy(&before[start..]).chars().count() + 1;
    (line, column)
}
