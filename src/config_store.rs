//! Directory-scoped MCP and skills configuration behind /v1/config: one JSON map (name → entry)
//! per kind in `<directory>/.sandbox-agent/config/{mcp,skills}.json`. Invariants: entries are
//! validated before they are stored; each file is rewritten atomically under a per-file lock, so
//! concurrent writes of different names are all kept.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use serde::Deserialize;
use serde_json::{Map, Value};

use crate::files::{EntryType, FileError, FileService, SandboxPath};

/// Which configuration file a request is about.
#[derive(Debug, Clone, Copy)]
pub enum ConfigKind {
    Mcp,
    Skills,
}

impl ConfigKind {
    fn file_name(self) -> &'static str {
        match self {
            ConfigKind::Mcp => "mcp.json",
            ConfigKind::Skills => "skills.json",
        }
    }

    /// The query parameter naming the entry.
    pub fn name_param(self) -> &'static str {
        match self {
            ConfigKind::Mcp => "mcpName",
            ConfigKind::Skills => "skillName",
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("the query parameter `{0}` is required")]
    MissingParam(&'static str),
    #[error("invalid entry: {reason}")]
    InvalidEntry { reason: String },
    #[error("no entry named {name:?} in {}", path.display())]
    NotFound { name: String, path: PathBuf },
    #[error("{}: not a directory", path.display())]
    NotADirectory { path: PathBuf },
    #[error("{}: the stored configuration is not a JSON object: {reason}", path.display())]
    Corrupt { path: PathBuf, reason: String },
    #[error(transparent)]
    File(#[from] FileError),
}

/// Stored files larger than this are refused rather than read whole.
const MAX_FILE: u64 = 16 << 20;

pub struct ConfigStore {
    files: Arc<FileService>,
    locks: Mutex<HashMap<PathBuf, Arc<tokio::sync::Mutex<()>>>>,
}

#[derive(Deserialize, utoipa::ToSchema)]
#[serde(untagged)]
pub(crate) enum McpCommand {
    One(String),
    Many(Vec<String>),
}

// Also the entry's OpenAPI schema (`utoipa::ToSchema`), so the document states what is validated.
/// One MCP server entry: a local (stdio) command or a remote (HTTP/SSE) server.
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(tag = "type", rename_all = "lowercase", deny_unknown_fields)]
#[allow(dead_code)] // fields exist to be validated, the stored entry is the original JSON
pub(crate) enum McpEntry {
    Local {
        command: McpCommand,
        args: Option<Vec<String>>,
        env: Option<BTreeMap<String, String>>,
        enabled: Option<bool>,
        #[serde(rename = "timeoutMs")]
        timeout_ms: Option<u64>,
        cwd: Option<String>,
    },
    Remote {
        url: String,
        headers: Option<BTreeMap<String, String>>,
        #[serde(rename = "bearerTokenEnvVar")]
        bearer_token_env_var: Option<String>,
        #[serde(rename = "envHeaders")]
        env_headers: Option<BTreeMap<String, String>>,
        oauth: Option<Value>,
        enabled: Option<bool>,
        #[serde(rename = "timeoutMs")]
        timeout_ms: Option<u64>,
        transport: Option<McpTransport>,
    },
}

#[derive(Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub(crate) enum McpTransport {
    Http,
    Sse,
}

/// One skills entry: where its skills come from.
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub(crate) struct SkillsEntry {
    sources: Vec<SkillSource>,
}

#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)]
pub(crate) struct SkillSource {
    #[serde(rename = "type")]
    kind: String,
    source: String,
    skills: Option<Vec<String>>,
    #[serde(rename = "ref")]
    git_ref: Option<String>,
    subpath: Option<String>,
}

/// Deserialises `v`, naming the offending field in the error (`sources[0].type: …`).
fn typed<T: serde::de::DeserializeOwned>(v: &Value) -> Result<T, ConfigError> {
    serde_path_to_error::deserialize(v.clone()).map_err(|e| {
        let at = e.path().to_string();
        let inner = e.into_inner();
        ConfigError::InvalidEntry {
            reason: if at == "." {
                inner.to_string()
            } else {
                format!("{at}: {inner}")
            },
        }
    })
}

/// Checks an entry body against the contract's shape; the reason names the offending field.
pub fn validate(kind: ConfigKind, raw: &[u8]) -> Result<Value, ConfigError> {
    let invalid = |reason: String| ConfigError::InvalidEntry { reason };
    let value: Value =
        serde_json::from_slice(raw).map_err(|e| invalid(format!("not JSON: {e}")))?;
    if !value.is_object() {
        return Err(invalid("the entry must be a JSON object".into()));
    }
    match kind {
        ConfigKind::Mcp => {
            let e: McpEntry = typed(&value)?;
            match e {
                McpEntry::Local { command, .. } => {
                    let empty = match &command {
                        McpCommand::One(c) => c.trim().is_empty(),
                        McpCommand::Many(v) => v.is_empty() || v[0].trim().is_empty(),
                    };
                    if empty {
                        return Err(invalid("`command` must not be empty".into()));
                    }
                }
                McpEntry::Remote { url, oauth, .. } => {
                    if !(url.starts_with("http://") || url.starts_with("https://")) {
                        return Err(invalid(format!(
                            "`url` must be an http(s) URL, got {url:?}"
                        )));
                    }
                    if let Some(o) = oauth {
                        if !(o.is_object() || o.is_boolean() || o.is_null()) {
                            return Err(invalid("`oauth` must be an object or a boolean".into()));
                        }
                    }
                }
            }
        }
        ConfigKind::Skills => {
            let e: SkillsEntry = typed(&value)?;
            for (i, s) in e.sources.iter().enumerate() {
                if s.kind.trim().is_empty() || s.source.trim().is_empty() {
                    return Err(invalid(format!(
                        "sources[{i}]: `type` and `source` must not be empty"
                    )));
                }
            }
        }
    }
    Ok(value)
}

impl ConfigStore {
    pub fn new(files: Arc<FileService>) -> Self {
        ConfigStore {
            files,
            locks: Mutex::new(HashMap::new()),
        }
    }

    /// The config file of `kind` for `directory`, which must be an existing directory.
    async fn file_of(&self, kind: ConfigKind, directory: &str) -> Result<SandboxPath, ConfigError> {
        let stat = self.files.stat(directory).await?;
        if stat.entry_type != EntryType::Directory {
            return Err(ConfigError::NotADirectory {
                path: stat.path.into(),
            });
        }
        let dir = self.files.policy().resolve(directory)?;
        Ok(dir
            .join(".sandbox-agent".as_ref())
            .join("config".as_ref())
            .join(kind.file_name().as_ref()))
    }

    fn lock_for(&self, file: &SandboxPath) -> Arc<tokio::sync::Mutex<()>> {
        let mut locks = self.locks.lock().unwrap_or_else(|p| p.into_inner());
        locks.entry(file.abs.clone()).or_default().clone()
    }

    async fn load(&self, file: &SandboxPath) -> Result<Map<String, Value>, ConfigError> {
        let Some(bytes) = self.files.read_small(file.clone(), MAX_FILE).await? else {
            return Ok(Map::new());
        };
        match serde_json::from_slice::<Value>(&bytes) {
            Ok(Value::Object(m)) => Ok(m),
            Ok(_) => Err(ConfigError::Corrupt {
                path: file.abs.clone(),
                reason: "not an object".into(),
            }),
            Err(e) => Err(ConfigError::Corrupt {
                path: file.abs.clone(),
                reason: e.to_string(),
            }),
        }
    }

    async fn store(&self, file: &SandboxPath, map: Map<String, Value>) -> Result<(), ConfigError> {
        let mut bytes = serde_json::to_vec_pretty(&Value::Object(map)).unwrap_or_default();
        bytes.push(b'\n');
        self.files.write_small(file.clone(), bytes).await?;
        Ok(())
    }

    pub async fn get(
        &self,
        kind: ConfigKind,
        directory: &str,
        name: &str,
    ) -> Result<Value, ConfigError> {
        let file = self.file_of(kind, directory).await?;
        let map = self.load(&file).await?;
        map.get(name).cloned().ok_or_else(|| ConfigError::NotFound {
            name: name.to_string(),
            path: file.abs.clone(),
        })
    }

    pub async fn put(
        &self,
        kind: ConfigKind,
        directory: &str,
        name: &str,
        raw: &[u8],
    ) -> Result<(), ConfigError> {
        let entry = validate(kind, raw)?;
        let file = self.file_of(kind, directory).await?;
        let lock = self.lock_for(&file);
        let _held = lock.lock().await;
        let mut map = self.load(&file).await?;
        map.insert(name.to_string(), entry);
        self.store(&file, map).await
    }

    /// Removes an entry; removing one that does not exist succeeds (DELETE is idempotent).
    pub async fn delete(
        &self,
        kind: ConfigKind,
        directory: &str,
        name: &str,
    ) -> Result<(), ConfigError> {
        let file = self.file_of(kind, directory).await?;
        let lock = self.lock_for(&file);
        let _held = lock.lock().await;
        let mut map = self.load(&file).await?;
        if map.remove(name).is_some() {
            self.store(&file, map).await?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(kind: ConfigKind, body: &str, ok: bool) {
        assert_eq!(validate(kind, body.as_bytes()).is_ok(), ok, "{body}");
    }

    #[test]
    fn entries_are_validated_against_the_contract() {
        use ConfigKind::*;
        check(
            Mcp,
            r#"{"type":"local","command":"npx","args":["x"]}"#,
            true,
        );
        check(
            Mcp,
            r#"{"type":"local","command":["npx","x"],"env":{"A":"b"},"timeoutMs":5}"#,
            true,
        );
        check(
            Mcp,
            r#"{"type":"remote","url":"https://x","transport":"sse","oauth":{}}"#,
            true,
        );
        check(Mcp, r#"{"type":"local","command":""}"#, false);
        check(Mcp, r#"{"type":"local"}"#, false);
        check(Mcp, r#"{"type":"remote","url":"ftp://x"}"#, false);
        check(
            Mcp,
            r#"{"type":"remote","url":"https://x","transport":"ws"}"#,
            false,
        );
        check(Mcp, r#"{"type":"other"}"#, false);
        check(Mcp, r#"{"type":"local","command":"a","bogus":1}"#, false);
        check(Mcp, r#"[1]"#, false);
        check(
            Skills,
            r#"{"sources":[{"type":"github","source":"o/r","skills":["a"],"ref":"main"}]}"#,
            true,
        );
        check(Skills, r#"{"sources":[{"type":"github"}]}"#, false);
        check(Skills, r#"{"sources":{}}"#, false);
    }
}
