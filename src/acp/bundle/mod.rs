//! Session bundles: one serverId's sessions carried to another daemon (docs/acp.md, "Session
//! bundles"). `export.rs` writes a bundle (tar + gzip) as a stream, `import.rs` reads one into
//! a staging directory, checks all of it and only then puts it in place, `agent_files.rs` knows
//! where each agent keeps its own session files.
//!
//! The layout (version 1), in this order in the tar:
//! - `events.log`: the event log, one event per line: its decimal id, one space, the JSON line;
//! - `files/home/<path>` and `files/workdir/<path>`: the agent's own session files, relative to
//!   the agent's HOME or to its working directory (the daemon's `--work-dir`);
//! - `manifest.json` (last, so that it can hold every file's size and sha256): [`Manifest`].
//!
//! Only regular files; no links, devices or directories beyond the ones their paths imply.

pub mod agent_files;
pub mod export;
pub mod import;

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// `manifest.json`'s `format`.
pub const FORMAT: &str = "sandbox-agent-session-bundle";
/// The layout's version; an import refuses any other.
pub const VERSION: u32 = 1;
pub const EVENTS: &str = "events.log";
pub const MANIFEST: &str = "manifest.json";
/// Most files a bundle may hold (besides the log and the manifest).
pub const MAX_FILES: usize = 4096;
/// Largest manifest read.
pub const MAX_MANIFEST: u64 = 16 << 20;
/// Deepest path of a file in a bundle.
pub const MAX_DEPTH: usize = 32;

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Manifest {
    pub format: String,
    pub version: u32,
    pub server_id: String,
    pub agent: String,
    pub created_at_ms: u64,
    pub exported_at_ms: u64,
    /// The client's `initialize` params (replayed by the restore).
    #[serde(default)]
    pub initialize: Option<Value>,
    #[serde(default)]
    pub load_session: bool,
    #[serde(default)]
    pub resume_session: bool,
    /// The agent advertised `sessionCapabilities.list`.
    #[serde(default)]
    pub list_sessions: bool,
    pub sessions: Vec<BundleSession>,
    pub events: EventsInfo,
    /// Every file of the bundle but the manifest, `events.log` first.
    pub files: Vec<FileEntry>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BundleSession {
    pub session_id: String,
    #[serde(default)]
    pub cwd: Value,
    /// The MCP servers as the client sent them, every `env` and `headers` value an empty string
    /// (secrets are never exported).
    #[serde(default)]
    pub mcp_servers: Value,
    /// How many values were blanked.
    #[serde(default)]
    pub redacted: usize,
    /// When the exporting daemon first saw the session (0: unknown), kept by the import so the
    /// session inventory shows the conversation's real age.
    #[serde(default)]
    pub created_at_ms: u64,
    /// The title the agent gave the session, if it gave one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub title: Option<String>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EventsInfo {
    pub count: u64,
    pub first_id: u64,
    pub last_id: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct FileEntry {
    pub path: String,
    pub size: u64,
    pub sha256: String,
    /// The session an agent file belongs to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_id: Option<String>,
}

/// Why an export or import was refused.
#[derive(Debug, thiserror::Error)]
pub enum BundleError {
    #[error("serverId `{server_id}` does not exist")]
    NotFound { server_id: String },
    #[error("session bundles need durable state: start the daemon with --state-dir")]
    NoStateDir,
    #[error("serverId `{server_id}` has {pending} request(s) in progress: export it between turns")]
    Busy { server_id: String, pending: usize },
    #[error("serverId `{server_id}` exists already: delete it first or import under another id")]
    Exists { server_id: String },
    #[error(
        "the bundle is for agent `{agent}`, which this daemon does not know (add it to the agents file)"
    )]
    UnknownAgent { agent: String },
    #[error("{path} exists already: the import would overwrite another session's file")]
    TargetExists { path: String },
    #[error("the agents have no HOME to put `{path}` under")]
    NoHome { path: String },
    #[error("invalid bundle: {why}")]
    Invalid { why: String },
    #[error("invalid cwd mapping `{given}`: use OLD=NEW, both absolute paths")]
    BadMapping { given: String },
    #[error("the bundle is larger than --bundle-max-bytes ({limit} bytes)")]
    TooLarge { limit: u64 },
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
}

impl BundleError {
    pub fn invalid(why: impl Into<String>) -> Self {
        BundleError::Invalid { why: why.into() }
    }

    pub fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> Self {
        let what = what.into();
        move |source| BundleError::Io { what, source }
    }
}

/// One `?cwd=OLD=NEW` mapping.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CwdMap {
    pub old: String,
    pub new: String,
}

impl CwdMap {
    pub fn parse(given: &str) -> Result<Self, BundleError> {
        let bad = || BundleError::BadMapping {
            given: given.to_string(),
        };
        let (old, new) = given.split_once('=').ok_or_else(bad)?;
        let ok = |p: &str| {
            p.starts_with('/')
                && !p.contains('\0')
                && !std::path::Path::new(p)
                    .components()
                    .any(|c| matches!(c, std::path::Component::ParentDir))
        };
        if !ok(old) || !ok(new) {
            return Err(bad());
        }
        let trim = |p: &str| {
            let t = p.trim_end_matches('/');
            if t.is_empty() { "/" } else { t }.to_string()
        };
        Ok(CwdMap {
            old: trim(old),
            new: trim(new),
        })
    }

    /// `path` with this mapping applied, when it names `old` or a path beneath it.
    pub fn apply(&self, path: &str) -> Option<String> {
        if path == self.old {
            return Some(self.new.clone());
        }
        let rest = path.strip_prefix(&self.old)?;
        if self.old == "/" {
            return Some(format!("{}/{}", self.new.trim_end_matches('/'), rest));
        }
        rest.starts_with('/').then(|| format!("{}{rest}", self.new))
    }
}

/// `path` through the first mapping that applies (unchanged when none does).
pub fn map_cwd(maps: &[CwdMap], path: &str) -> String {
    maps.iter()
        .find_map(|m| m.apply(path))
        .unwrap_or_else(|| path.to_string())
}

pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cwd_maps_apply_to_the_dir_and_beneath_only() {
        let m = CwdMap::parse("/work/a=/srv/b").unwrap();
        assert_eq!(m.apply("/work/a").as_deref(), Some("/srv/b"));
        assert_eq!(m.apply("/work/a/x").as_deref(), Some("/srv/b/x"));
        assert_eq!(m.apply("/work/ab"), None);
        assert!(CwdMap::parse("work=/x").is_err());
        assert!(CwdMap::parse("/a/../b=/x").is_err());
        assert!(CwdMap::parse("/a").is_err());
    }
}
