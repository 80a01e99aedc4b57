//! What can run (the catalog of known agents plus the operator's agents file) and getting it onto
//! the machine (the installer). The proxy asks `prepare_launch` for a command line; everything
//! about where that command comes from stays here.

pub mod cli;
pub mod mock;

use std::ffi::OsString;
use std::path::PathBuf;
use std::sync::Arc;

use crate::config::Config;

/// How to start one agent process.
#[derive(Debug, Clone)]
pub struct LaunchSpec {
    pub program: PathBuf,
    pub args: Vec<OsString>,
    /// Variables the agent needs on top of the daemon's filtered environment.
    pub env: Vec<(OsString, OsString)>,
}

#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    #[error("unknown agent `{agent}`")]
    Unknown { agent: String },
    #[error(
        "agent `{agent}` is not installed and installs at run time are disabled; run `{command}`"
    )]
    PreinstallRequired { agent: String, command: String },
    #[error("cannot install agent `{agent}`: {reason}")]
    InstallFailed { agent: String, reason: String },
}

pub struct Agents {
    #[allow(dead_code)]
    config: Arc<Config>,
}

impl Agents {
    pub fn new(config: Arc<Config>) -> anyhow::Result<Self> {
        Ok(Agents { config })
    }

    /// True for every agent id the daemon knows (catalog, agents file, `mock`).
    pub fn is_known(&self, agent: &str) -> bool {
        agent == "mock"
    }

    /// Installs the agent if needed (lazy install, unless `--require-preinstall`) and returns how
    /// to start it.
    pub async fn prepare_launch(&self, agent: &str) -> Result<LaunchSpec, AgentError> {
        match agent {
            "mock" => Ok(LaunchSpec {
                program: std::env::current_exe().map_err(|e| AgentError::InstallFailed {
                    agent: agent.to_string(),
                    reason: format!("cannot find the daemon's own executable: {e}"),
                })?,
                args: vec!["mock-agent".into()],
                env: Vec::new(),
            }),
            _ => Err(AgentError::Unknown {
                agent: agent.to_string(),
            }),
        }
    }
}
