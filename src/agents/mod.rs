//! What can run (the catalog of known agents plus the operator's agents file) and getting it onto
//! the machine (the installer). The proxy asks `prepare_launch` for a command line; everything
//! about where that command comes from stays here. One install per agent runs at a time.

pub mod catalog;
pub mod cli;
pub mod install;
pub mod mock;
pub mod registry;

use std::collections::{BTreeMap, HashMap};
use std::ffi::OsString;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use serde::Serialize;

use crate::config::Config;
use catalog::{AgentDef, Catalog, Fallback};
pub use install::InstallRequest;
use install::{Artifact, InstallError, LogProgress, Manifest, Progress};

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
    #[error("cannot install agent `{agent}`: {source}")]
    InstallFailed {
        agent: String,
        #[source]
        source: InstallError,
    },
    /// The request cannot be honoured as asked (e.g. a version pin the agent has no use for).
    #[error("agent `{agent}`: {reason}")]
    InvalidRequest { agent: String, reason: String },
}

/// The answer of an install.
#[derive(Debug, Clone)]
pub struct InstallOutcome {
    pub already_installed: bool,
    pub source: String,
    pub version: Option<String>,
    pub artifacts: Vec<Artifact>,
}

/// One agent as `GET /v1/agents` and `sandbox-agent agents list --json` show it (without
/// `serverStatus`, which the proxy knows); `http::wire::agents::AgentStatus` is its API schema.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct AgentStatus {
    pub id: String,
    pub name: String,
    pub installed: bool,
    pub version: Option<String>,
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

pub struct Agents {
    /// The HOME agents get (see `with_agent_home`).
    home: Option<PathBuf>,
    config: Arc<Config>,
    catalog: Catalog,
    /// One lock per agent id: concurrent installs of one agent wait for the first.
    locks: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    /// Built on first use (see `LazyClient`).
    client: install::LazyClient,
}

const MOCK: &str = "mock";

impl Agents {
    pub fn new(config: Arc<Config>) -> Result<Self, catalog::CatalogError> {
        let catalog = Catalog::load(config.agents_file.as_deref())?;
        let home = config
            .agent_base_env
            .iter()
            .find(|(k, _)| k == "HOME")
            .map(|(_, v)| PathBuf::from(v));
        Ok(Agents {
            config,
            home,
            catalog,
            locks: Mutex::new(HashMap::new()),
            client: install::LazyClient::default(),
        })
    }

    /// True for every agent id the daemon knows (catalog, agents file, `mock`).
    pub fn is_known(&self, agent: &str) -> bool {
        agent == MOCK || self.catalog.get(agent).is_some()
    }

    /// Every known agent id, `mock` last.
    pub fn ids(&self) -> Vec<String> {
        let mut ids: Vec<String> = self.catalog.agents.iter().map(|a| a.id.clone()).collect();
        ids.push(MOCK.to_string());
        ids
    }

    fn agent_dir(&self, agent: &str) -> PathBuf {
        self.config.data_dir.join("agents").join(agent)
    }

    /// PATH as the agents (and npm) see it.
    fn agent_path(&self) -> OsString {
        self.config
            .agent_base_env
            .iter()
            .find(|(k, _)| k == "PATH")
            .map(|(_, v)| v.clone())
            .unwrap_or_else(|| OsString::from("/usr/local/bin:/usr/bin:/bin"))
    }

    pub fn home(&self) -> Option<PathBuf> {
        self.home.clone()
    }

    /// A variable the operator or the catalog sets for `agent` (agents file `env`, then the
    /// catalog's launch environment), as its start would see it; the installed package's own
    /// variables are not looked at.
    pub fn agent_var(&self, agent: &str, name: &str) -> Option<String> {
        let def = self.catalog.get(agent)?;
        def.env
            .get(name)
            .or_else(|| def.launch_env.get(name))
            .cloned()
    }

    /// The HOME `agent` runs with: its own `HOME` variable, else the agents' HOME.
    pub fn home_of(&self, agent: &str) -> Option<PathBuf> {
        self.agent_var(agent, "HOME")
            .map(PathBuf::from)
            .or_else(|| self.home())
    }

    /// The HOME agents are started with, as the supervisor decided it (an `--agent-user` gets
    /// its own, not the daemon's): where their credentials files are looked for.
    pub fn with_agent_home(mut self, home: Option<PathBuf>) -> Self {
        self.home = home;
        self
    }

    /// The status of one agent; `None` if unknown.
    pub fn status(&self, agent: &str) -> Option<AgentStatus> {
        if agent == MOCK {
            return Some(AgentStatus {
                id: MOCK.into(),
                name: "Mock agent (built in)".into(),
                installed: true,
                version: Some(env!("CARGO_PKG_VERSION").into()),
                path: Some(self.config.exe.clone()),
                source: "builtin".into(),
                credentials_available: true,
                credentials_env: Vec::new(),
                credentials_files: Vec::new(),
                capabilities: serde_json::json!({"builtin": true, "platforms": ["any"]}),
                install_command: None,
                verified: None,
            });
        }
        let def = self.catalog.get(agent)?;
        let mut status = AgentStatus {
            id: def.id.clone(),
            name: def.name.clone().unwrap_or_else(|| def.id.clone()),
            installed: false,
            version: None,
            path: None,
            source: if def.registry_id.is_some() {
                "registry"
            } else {
                "fallback"
            }
            .into(),
            credentials_available: self.credentials_available(def),
            credentials_env: def.credentials_env.clone(),
            credentials_files: def
                .credentials_files
                .iter()
                .map(|f| format!("~/{f}"))
                .collect(),
            capabilities: capabilities(def),
            install_command: None,
            verified: None,
        };
        if let Some(cmd) = &def.command {
            status.source = "user".into();
            status.path = install::find_on_path(cmd, &self.agent_path());
            status.installed = status.path.is_some();
            return Some(status);
        }
        if let Some(m) = Manifest::read(&self.agent_dir(agent)) {
            status.installed = true;
            status.version = Some(m.version);
            status.path = Some(m.program);
            status.source = m.source;
            status.verified = m.verified;
        } else if let Some((p, _)) = self.local(def) {
            status.installed = true;
            status.path = Some(p);
            status.source = "local".into();
        } else {
            status.install_command = Some(install_command(agent));
        }
        Some(status)
    }

    pub fn statuses(&self) -> Vec<AgentStatus> {
        self.ids().iter().filter_map(|id| self.status(id)).collect()
    }

    /// An operator-installed copy on PATH.
    fn local(&self, def: &AgentDef) -> Option<(PathBuf, Vec<String>)> {
        let path = self.agent_path();
        def.local_bins
            .iter()
            .find_map(|b| install::find_on_path(b, &path))
            .map(|p| (p, def.local_args.clone()))
    }

    /// True when the agent will find one of its credentials: a variable it reads, set (not
    /// empty) in what it is started with, or one of its credentials files under the HOME it
    /// is started with (its own `env` may move HOME).
    fn credentials_available(&self, def: &AgentDef) -> bool {
        let has_env = |name: &str| {
            def.env.get(name).is_some_and(|v| !v.is_empty())
                || self
                    .config
                    .agent_env
                    .iter()
                    .any(|(k, v)| k == name && !v.is_empty())
                || self
                    .config
                    .agent_base_env
                    .iter()
                    .any(|(k, v)| k == name && !v.is_empty())
        };
        if def.credentials_env.iter().any(|n| has_env(n)) {
            return true;
        }
        let home = def
            .env
            .get("HOME")
            .map(PathBuf::from)
            .or_else(|| self.home());
        match home {
            Some(home) => def.credentials_files.iter().any(|f| home.join(f).is_file()),
            None => false,
        }
    }

    /// Installs the agent if needed (lazy install, unless `--require-preinstall`) and returns how
    /// to start it.
    pub async fn prepare_launch(&self, agent: &str) -> Result<LaunchSpec, AgentError> {
        if agent == MOCK {
            return Ok(LaunchSpec {
                program: self.config.exe.clone(),
                args: vec!["mock-agent".into()],
                env: Vec::new(),
            });
        }
        let def = self.catalog.get(agent).ok_or_else(|| AgentError::Unknown {
            agent: agent.to_string(),
        })?;
        let mut env: BTreeMap<String, String> = def.launch_env.clone();
        let (program, args, prepend) = if let Some(cmd) = &def.command {
            let program = install::find_on_path(cmd, &self.agent_path()).ok_or_else(|| {
                AgentError::InstallFailed {
                    agent: agent.to_string(),
                    source: InstallError::UserCommandMissing {
                        command: cmd.clone(),
                    },
                }
            })?;
            env.extend(def.env.clone());
            (program, def.args.clone(), Vec::new())
        } else if let Some(m) = Manifest::read(&self.agent_dir(agent)) {
            env.extend(m.env);
            (m.program, m.args, m.path_prepend)
        } else if let Some((p, args)) = self.local(def) {
            (p, args, Vec::new())
        } else if self.config.require_preinstall {
            return Err(AgentError::PreinstallRequired {
                agent: agent.to_string(),
                command: install_command(agent),
            });
        } else {
            self.install_with(agent, InstallRequest::default(), &LogProgress)
                .await?;
            let m = Manifest::read(&self.agent_dir(agent)).ok_or_else(|| {
                AgentError::InstallFailed {
                    agent: agent.to_string(),
                    source: InstallError::ProgramMissing,
                }
            })?;
            env.extend(m.env);
            (m.program, m.args, m.path_prepend)
        };
        // The operator's own environment for this agent (agents file `env`) comes last, so it
        // wins over the catalog's and the installed package's.
        env.extend(def.env.clone());
        if !def.is_user()
            && (!def.credentials_env.is_empty() || !def.credentials_files.is_empty())
            && !self.credentials_available(def)
        {
            tracing::warn!(
                agent,
                needs_one_of_env = def.credentials_env.join(","),
                or_one_of_files = def.credentials_files.join(","),
                "starting an agent that has no credentials: it will answer \
                 'authentication required' to prompts; set one of the variables (agents file \
                 `env`, or --agent-env) or provide one of the files under its HOME"
            );
        }
        let mut spec_env: Vec<(OsString, OsString)> =
            env.into_iter().map(|(k, v)| (k.into(), v.into())).collect();
        // HOME stays the operator's (credentials such as ~/.claude live there); the temporary
        // files agents write in bulk go to a per-agent directory under the data dir instead.
        let tmp = self.agent_dir(agent).join("tmp");
        if std::fs::create_dir_all(&tmp).is_ok() {
            use std::os::unix::fs::PermissionsExt;
            // Sticky and world-writable like /tmp, so an `--agent-user` can use it too.
            let _ = std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o1777));
            spec_env.push(("TMPDIR".into(), tmp.into_os_string()));
        }
        if !prepend.is_empty() {
            let mut dirs = prepend;
            dirs.extend(std::env::split_paths(&self.agent_path()));
            if let Ok(p) = std::env::join_paths(dirs) {
                spec_env.push(("PATH".into(), p));
            }
        }
        Ok(LaunchSpec {
            program,
            args: args.into_iter().map(OsString::from).collect(),
            env: spec_env,
        })
    }

    /// Installs (or finds already installed) one agent, logging progress.
    pub async fn install(
        &self,
        agent: &str,
        req: InstallRequest,
    ) -> Result<InstallOutcome, AgentError> {
        self.install_with(agent, req, &LogProgress).await
    }

    /// Installs one agent. Concurrent calls for one agent run one after the other, so the second
    /// finds the first's install and downloads nothing.
    pub async fn install_with(
        &self,
        agent: &str,
        req: InstallRequest,
        progress: &dyn Progress,
    ) -> Result<InstallOutcome, AgentError> {
        let result = tracing::Instrument::instrument(
            self.install_inner(agent, req, progress),
            crate::telemetry::task_span("agent install", agent),
        )
        .await;
        if let Err(AgentError::InstallFailed { .. }) = &result {
            crate::metrics::install_failed();
        }
        result
    }

    async fn install_inner(
        &self,
        agent: &str,
        req: InstallRequest,
        progress: &dyn Progress,
    ) -> Result<InstallOutcome, AgentError> {
        let fail = |source: InstallError| AgentError::InstallFailed {
            agent: agent.to_string(),
            source,
        };
        if agent == MOCK {
            let exe = self.config.exe.clone();
            return Ok(InstallOutcome {
                already_installed: true,
                source: "builtin".into(),
                version: Some(env!("CARGO_PKG_VERSION").into()),
                artifacts: vec![Artifact {
                    kind: "agent_process".into(),
                    path: exe,
                    version: env!("CARGO_PKG_VERSION").into(),
                    source: "builtin".into(),
                    verified: None,
                }],
            });
        }
        let def = self.catalog.get(agent).ok_or_else(|| AgentError::Unknown {
            agent: agent.to_string(),
        })?;
        if def.is_user() {
            let status = self.status(agent).ok_or_else(|| AgentError::Unknown {
                agent: agent.to_string(),
            })?;
            return match status.path {
                Some(p) => Ok(InstallOutcome {
                    already_installed: true,
                    source: "user".into(),
                    version: None,
                    artifacts: vec![Artifact {
                        kind: "agent_process".into(),
                        path: p,
                        version: "unknown".into(),
                        source: "user".into(),
                        verified: None,
                    }],
                }),
                None => Err(fail(InstallError::UserAgentNotInstalled {
                    command: def.command.clone().unwrap_or_default(),
                })),
            };
        }
        if req.agent_version.is_some() && def.native_npm.is_none() {
            return Err(AgentError::InvalidRequest {
                agent: agent.to_string(),
                reason: "this agent has no separately installed native CLI, so `agentVersion` \
                         cannot be honoured; pin the ACP process with `agentProcessVersion`"
                    .into(),
            });
        }
        let lock = {
            let mut locks = crate::sys::lock(&self.locks);
            locks.entry(agent.to_string()).or_default().clone()
        };
        let _guard = lock.lock().await;
        // Another process (`sandbox-agent agents install` next to a running daemon) may be
        // installing the same agent: a file lock beside the agent's directory serialises them.
        let _file_lock = self.file_lock(agent).await.map_err(fail)?;

        let dir = self.agent_dir(agent);
        if !req.reinstall
            && let Some(m) = Manifest::read(&dir)
        {
            let process_ok = req
                .agent_process_version
                .as_ref()
                .is_none_or(|v| *v == m.version);
            let native_ok = req
                .agent_version
                .as_ref()
                .is_none_or(|v| Some(v) == m.native_version.as_ref());
            if process_ok && native_ok {
                return Ok(InstallOutcome {
                    already_installed: true,
                    source: m.source,
                    version: Some(m.version),
                    artifacts: m.artifacts,
                });
            }
        }
        let installer = install::Installer {
            config: &self.config,
            client: &self.client,
            agent_path: self.agent_path(),
        };
        let manifest = installer
            .install_fresh(def, &req, &dir, progress)
            .await
            .map_err(fail)?;
        manifest.write_async(&dir).await.map_err(|source| {
            fail(InstallError::Io {
                what: format!("cannot write {}", Manifest::path(&dir).display()),
                source,
            })
        })?;
        progress.step(&format!(
            "installed {agent} {} from {} into {}",
            manifest.version,
            manifest.source,
            manifest.dir.display()
        ));
        Ok(InstallOutcome {
            already_installed: false,
            source: manifest.source,
            version: Some(manifest.version),
            artifacts: manifest.artifacts,
        })
    }

    /// An exclusive `flock` on `<data-dir>/agents/.<id>.lock`, released on drop.
    async fn file_lock(
        &self,
        agent: &str,
    ) -> Result<nix::fcntl::Flock<std::fs::File>, InstallError> {
        let io = |what: String| move |source| InstallError::Io { what, source };
        let root = self.config.data_dir.join("agents");
        std::fs::create_dir_all(&root).map_err(io(format!("cannot create {}", root.display())))?;
        let path = root.join(format!(".{agent}.lock"));
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .map_err(io(format!("cannot open {}", path.display())))?;
        tokio::task::spawn_blocking(move || {
            nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusive).map_err(|(_, e)| {
                InstallError::Io {
                    what: format!("cannot lock {}", path.display()),
                    source: e.into(),
                }
            })
        })
        .await?
    }
}

pub fn install_command(agent: &str) -> String {
    format!("sandbox-agent agents install {agent}")
}

fn capabilities(def: &AgentDef) -> serde_json::Value {
    serde_json::json!({
        "registryId": def.registry_id,
        "nativeCli": def.native,
        "fallback": match &def.fallback {
            Some(Fallback::Npm { package, version, .. }) => Some(format!("npm:{package}@{version}")),
            Some(Fallback::Binary { version, .. }) => Some(format!("binary:{version}")),
            None => None,
        },
        "platforms": def.platforms,
        "userCommand": def.command,
    })
}
