//! `/v1/agents`: an agent's install status and the answer of an install, on the wire. The
//! listing's envelope (`AgentInfo`, `AgentList`) is next to its handlers in `http/agents.rs`.

use std::path::PathBuf;

use crate::agents as svc;

/// One agent as `GET /v1/agents` shows it (without `serverStatus`, which the proxy knows).
#[derive(Debug, Clone, serde::Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct AgentStatus {
    pub id: String,
    pub name: String,
    pub installed: bool,
    pub version: Option<String>,
    #[schema(value_type = Option<String>)]
    pub path: Option<PathBuf>,
    /// `registry|fallback|builtin|local|user`; for an agent not installed, where an install would
    /// look first (`registry` or `fallback`).
    pub source: String,
    pub credentials_available: bool,
    /// Where this agent looks for credentials: any one of these variables (set in the daemon's
    /// environment, `--agent-env` or the agent's `env` in the agents file) ...
    pub credentials_env: Vec<String>,
    /// ... or any one of these files (`~` is the agent's HOME).
    pub credentials_files: Vec<String>,
    pub capabilities: serde_json::Value,
    /// The install command, for agents that are not installed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub install_command: Option<String>,
    /// For an installed downloaded binary: whether its sha256 was checked.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub verified: Option<bool>,
}

impl From<svc::AgentStatus> for AgentStatus {
    fn from(s: svc::AgentStatus) -> Self {
        Self {
            id: s.id,
            name: s.name,
            installed: s.installed,
            version: s.version,
            path: s.path,
            source: s.source,
            credentials_available: s.credentials_available,
            credentials_env: s.credentials_env,
            credentials_files: s.credentials_files,
            capabilities: s.capabilities,
            install_command: s.install_command,
            verified: s.verified,
        }
    }
}

/// The answer of an install.
#[derive(Debug, Clone, serde::Serialize, utoipa::ToSchema)]
pub struct InstallOutcome {
    #[serde(rename = "alreadyInstalled")]
    pub already_installed_camel: bool,
    /// The spelling the existing npm client reads.
    pub already_installed: bool,
    pub source: String,
    pub version: Option<String>,
    pub artifacts: Vec<Artifact>,
}

impl From<svc::InstallOutcome> for InstallOutcome {
    fn from(o: svc::InstallOutcome) -> Self {
        Self {
            already_installed_camel: o.already_installed,
            already_installed: o.already_installed,
            source: o.source,
            version: o.version,
            artifacts: o.artifacts.into_iter().map(Into::into).collect(),
        }
    }
}

#[derive(Debug, Clone, serde::Serialize, utoipa::ToSchema)]
pub struct Artifact {
    /// `agent_process` (the ACP program) or `native_agent` (the CLI it drives).
    pub kind: String,
    #[schema(value_type = String)]
    pub path: PathBuf,
    pub version: String,
    pub source: String,
    /// For a downloaded binary: whether its sha256 was checked (`false`: the source gave none).
    /// Absent for npm installs (npm checks its own integrity).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub verified: Option<bool>,
}

impl From<svc::install::Artifact> for Artifact {
    fn from(a: svc::install::Artifact) -> Self {
        Self {
            kind: a.kind,
            path: a.path,
            version: a.version,
            source: a.source,
            verified: a.verified,
        }
    }
}
