//! Directory-scoped MCP and skills configuration behind /v1/config: one JSON map (name → entry)
//! per kind in `<directory>/.sandbox-agent/config/{mcp,skills}.json`. Invariants: entries are
//! validated before they are stored; each file is rewritten atomically under a lock keyed on the
//! directory's identity on disk (device and inode), so concurrent writes of different names are
//! all kept however the directory is spelled; nothing is stored that could not be read back
//! (an entry is at most [`ENTRY_MAX`] bytes, a file at most [`MAX_FILE`]); parsing, validation and
//! serialisation run on the blocking pool, never on the runtime thread.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use serde::Deserialize;
use serde_json::{Map, Value};

use crate::files::{FileError, FileService, SandboxPath};

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
    #[error("{what} is larger than the limit of {limit} bytes")]
    TooLarge { what: String, limit: u64 },
    #[error(transparent)]
    File(#[from] FileError),
}

/// Stored files larger than this are refused rather than read whole, and a write that would
/// make the file larger is refused (413) before anything is written.
pub const MAX_FILE: u64 = 16 << 20;
/// Largest single entry (an MCP server or a skill source list is a few hundred bytes).
pub const ENTRY_MAX: u64 = 1 << 20;

/// The lock key: the directory's device and inode, and the kind.
type LockKey = (u64, u64, &'static str);

pub struct ConfigStore {
    files: Arc<FileService>,
    locks: Mutex<HashMap<LockKey, std::sync::Weak<tokio::sync::Mutex<()>>>>,
}

/// Runs CPU work (JSON of up to [`MAX_FILE`]) on the blocking pool.
async fn off_thread<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, ConfigError> + Send + 'static,
) -> Result<T, ConfigError> {
    tokio::task::spawn_blocking(f)
        .await
        .unwrap_or_else(|e| Err(ConfigError::File(crate::files::internal(e))))
}

#[derive(Deserialize)]
#[serde(untagged)]
enum McpCommand {
    One(String),
    Many(Vec<String>),
}

// The shapes `validate` checks entries against (the store keeps the original JSON).
// `http::wire::config` mirrors them as the API's schema; a test there keeps the two in step.
/// One MCP server entry: a local (stdio) command or a remote (HTTP/SSE) server.
#[derive(Deserialize)]
#[serde(tag = "type", rename_all = "lowercase", deny_unknown_fields)]
#[allow(dead_code)] // fields exist to be validated, the stored entry is the original JSON
enum McpEntry {
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

#[derive(Deserialize)]
#[serde(rename_all = "lowercase")]
enum McpTransport {
    Http,
    Sse,
}

/// One skills entry: where its skills come from.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct SkillsEntry {
    sources: Vec<SkillSource>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)]
struct SkillSource {
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
    if raw.len() as u64 > ENTRY_MAX {
        return Err(ConfigError::TooLarge {
            what: "the entry".into(),
            limit: ENTRY_MAX,
        });
    }
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
                    if let Some(o) = oauth
                        && !(o.is_object() || o.is_boolean() || o.is_null())
                    {
                        return Err(invalid("`oauth` must be an object or a boolean".into()));
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

    /// The config file of `kind` for `directory`, which must be an existing directory, and the
    /// key of its lock (the directory's identity on disk).
    async fn file_of(
        &self,
        kind: ConfigKind,
        directory: &str,
    ) -> Result<(SandboxPath, LockKey), ConfigError> {
        let (dev, ino, is_dir) = self.files.identity(directory).await?;
        let dir = self.files.policy().resolve(directory)?;
        if !is_dir {
            return Err(ConfigError::NotADirectory { path: dir.abs });
        }
        let file = dir
            .join(".sandbox-agent".as_ref())
            .join("config".as_ref())
            .join(kind.file_name().as_ref());
        Ok((file, (dev, ino, kind.file_name())))
    }

    fn lock_for(&self, key: LockKey) -> Arc<tokio::sync::Mutex<()>> {
        let mut locks = crate::sys::lock(&self.locks);
        if let Some(l) = locks.get(&key).and_then(|w| w.upgrade()) {
            return l;
        }
        // Forget the locks nobody holds, so the map stays as small as the writes in flight.
        locks.retain(|_, w| w.strong_count() > 0);
        let l = Arc::new(tokio::sync::Mutex::new(()));
        locks.insert(key, Arc::downgrade(&l));
        l
    }

    async fn load(&self, file: &SandboxPath) -> Result<Map<String, Value>, ConfigError> {
        let Some(bytes) = self.files.read_small(file.clone(), MAX_FILE).await? else {
            return Ok(Map::new());
        };
        let path = file.abs.clone();
        off_thread(move || match serde_json::from_slice::<Value>(&bytes) {
            Ok(Value::Object(m)) => Ok(m),
            Ok(_) => Err(ConfigError::Corrupt {
                path,
                reason: "not an object".into(),
            }),
            Err(e) => Err(ConfigError::Corrupt {
                path,
                reason: e.to_string(),
            }),
        })
        .await
    }

    async fn store(&self, file: &SandboxPath, map: Map<String, Value>) -> Result<(), ConfigError> {
        let bytes = off_thread(move || {
            let mut bytes = serde_json::to_vec_pretty(&Value::Object(map)).map_err(|e| {
                ConfigError::InvalidEntry {
                    reason: e.to_string(),
                }
            })?;
            bytes.push(b'\n');
            // Refuse what could not be read back: the directory would be stuck for good.
            if bytes.len() as u64 > MAX_FILE {
                return Err(ConfigError::TooLarge {
                    what: "the directory's configuration file with this entry".into(),
                    limit: MAX_FILE,
                });
            }
            Ok(bytes)
        })
        .await?;
        self.files.write_small(file.clone(), bytes).await?;
        Ok(())
    }

    pub async fn get(
        &self,
        kind: ConfigKind,
        directory: &str,
        name: &str,
    ) -> Result<Value, ConfigError> {
        let (file, _) = self.file_of(kind, directory).await?;
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
        if raw.len() as u64 > ENTRY_MAX {
            return Err(ConfigError::TooLarge {
                what: "the entry".into(),
                limit: ENTRY_MAX,
            });
        }
        let raw = raw.to_vec();
        let entry = off_thread(move || validate(kind, &raw)).await?;
        let (file, key) = self.file_of(kind, directory).await?;
        let lock = self.lock_for(key);
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
        let (file, key) = self.file_of(kind, directory).await?;
        let lock = self.lock_for(key);
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

    /// Property (seeded generator; `CONFIG_PROPTEST_CASES`, default 3,000): random JSON built
    /// from the contract's field names and hostile values never panics validation, and what is
    /// accepted is an object that serialises back to what was stored.
    #[test]
    fn property_validation_never_panics_and_accepts_only_objects() {
        const KEYS: &[&str] = &[
            "type",
            "command",
            "args",
            "env",
            "url",
            "sources",
            "source",
            "skills",
            "ref",
            "oauth",
            "timeoutMs",
            "transport",
            "enabled",
            "headers",
            "cwd",
            "subpath",
            "x",
        ];
        let cases: u64 = std::env::var("CONFIG_PROPTEST_CASES")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(3_000);
        let mut x: u64 = 0xA076_1D64_78BD_642F;
        let mut next = move || {
            x ^= x >> 12;
            x ^= x << 25;
            x ^= x >> 27;
            x.wrapping_mul(0x2545_F491_4F6C_DD1D)
        };
        fn value(next: &mut dyn FnMut() -> u64, depth: u32) -> Value {
            const STRS: &[&str] = &[
                "local",
                "remote",
                "https://x",
                "",
                "npx",
                "sse",
                "é",
                "github",
            ];
            match next() % if depth > 2 { 5 } else { 7 } {
                0 => Value::Null,
                1 => Value::Bool(next().is_multiple_of(2)),
                2 => Value::from(next() as i64),
                3 | 4 => Value::from(STRS[(next() % STRS.len() as u64) as usize]),
                5 => Value::Array((0..next() % 3).map(|_| value(next, depth + 1)).collect()),
                _ => {
                    let mut m = Map::new();
                    for _ in 0..next() % 5 {
                        let k = KEYS[(next() % KEYS.len() as u64) as usize];
                        m.insert(k.into(), value(next, depth + 1));
                    }
                    Value::Object(m)
                }
            }
        }
        let mut accepted = 0;
        for _ in 0..cases {
            let v = value(&mut next, 0);
            let raw = serde_json::to_vec(&v).unwrap();
            for kind in [ConfigKind::Mcp, ConfigKind::Skills] {
                if let Ok(stored) = validate(kind, &raw) {
                    accepted += 1;
                    assert!(stored.is_object(), "{v}");
                    assert_eq!(stored, v);
                }
            }
            // Cut anywhere: still no panic.
            let cut = (next() as usize) % (raw.len() + 1);
            let _ = validate(ConfigKind::Mcp, &raw[..cut]);
        }
        let _ = accepted;
    }
}
