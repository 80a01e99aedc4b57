//! What can run (the catalog of known agents plus the operator's agents file) and getting it onto
//! the machine (the installer). The proxy asks `prepare_launch` for a command line; everything
//! about where that command comes from stays here. One install per agent runs at a time.

pub mod catalog;
pub mod cli;
pub mod install;
pub mod mock;
pub mod registry;

use std::collections::{BTreeMap, HashMap};
use std::ffi::{OsStr, OsString};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::Serialize;

use crate::config::Config;
use catalog::{AgentDef, Catalog, Fallback};
use install::{Artifact, LogProgress, Manifest, Progress, Staging};

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
    /// The request cannot be honoured as asked (e.g. a version pin the agent has no use for).
    #[error("agent `{agent}`: {reason}")]
    InvalidRequest { agent: String, reason: String },
}

/// Options of one install (`POST /v1/agents/{id}/install`, `sandbox-agent agents install`).
#[derive(Debug, Clone, Default)]
pub struct InstallRequest {
    pub reinstall: bool,
    /// Version of the native CLI (only for agents installing one separately).
    pub agent_version: Option<String>,
    /// Version of the ACP agent process.
    pub agent_process_version: Option<String>,
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
    /// Built on first use: a machine without CA certificates must still start the daemon (and
    /// run local or pre-installed agents); only an `https://` download then fails, with the
    /// reason. `plain_client` serves `http://` (and `file://`) URLs and needs no CA roots.
    client: std::sync::OnceLock<Result<reqwest::Client, String>>,
    plain_client: std::sync::OnceLock<Result<reqwest::Client, String>>,
}

const MOCK: &str = "mock";

impl Agents {
    pub fn new(config: Arc<Config>) -> anyhow::Result<Self> {
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
            client: std::sync::OnceLock::new(),
            plain_client: std::sync::OnceLock::new(),
        })
    }

    /// The HTTP client for registry look-ups and downloads of `url`.
    fn http(&self, url: &str) -> Result<&reqwest::Client, String> {
        let https = !crate::http_client::is_plain_http(url) && !url.starts_with("file:");
        let cell = if https {
            &self.client
        } else {
            &self.plain_client
        };
        let built = cell.get_or_init(|| {
            crate::install_crypto_provider();
            let builder = reqwest::Client::builder()
                .connect_timeout(Duration::from_secs(15))
                // A stalled transfer fails instead of hanging an install (and the POST waiting
                // on it).
                .read_timeout(Duration::from_secs(60))
                .user_agent(concat!("sandbox-agent/", env!("CARGO_PKG_VERSION")));
            let builder = if https {
                builder
            } else {
                crate::http_client::plain_http(builder)
            };
            builder.build().map_err(|e| {
                format!(
                    "cannot set up the HTTP client: {}",
                    crate::http_client::build_error(&e)
                )
            })
        });
        built.as_ref().map_err(Clone::clone)
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

    fn home(&self) -> Option<PathBuf> {
        self.home.clone()
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
                    reason: format!("the command `{cmd}` of this user agent was not found"),
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
                    reason: "the install finished but its program is missing".into(),
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
        let fail = |reason: String| AgentError::InstallFailed {
            agent: agent.to_string(),
            reason,
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
            let status = self.status(agent).ok_or_else(|| fail("unknown".into()))?;
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
                None => Err(fail(format!(
                    "user agents are not installed by sandbox-agent; the command `{}` was not found",
                    def.command.as_deref().unwrap_or_default()
                ))),
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
        let manifest = self
            .install_fresh(def, &req, &dir, progress)
            .await
            .map_err(fail)?;
        manifest.write_async(&dir).await.map_err(|e| {
            fail(format!(
                "cannot write {}: {e}",
                Manifest::path(&dir).display()
            ))
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
    async fn file_lock(&self, agent: &str) -> Result<nix::fcntl::Flock<std::fs::File>, String> {
        let root = self.config.data_dir.join("agents");
        std::fs::create_dir_all(&root)
            .map_err(|e| format!("cannot create {}: {e}", root.display()))?;
        let path = root.join(format!(".{agent}.lock"));
        let file = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .map_err(|e| format!("cannot open {}: {e}", path.display()))?;
        tokio::task::spawn_blocking(move || {
            nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusive)
                .map_err(|(_, e)| format!("cannot lock {}: {e}", path.display()))
        })
        .await
        .map_err(|e| e.to_string())?
    }

    /// Chooses the source (registry, then fallback) and installs from it.
    async fn install_fresh(
        &self,
        def: &AgentDef,
        req: &InstallRequest,
        dir: &Path,
        progress: &dyn Progress,
    ) -> Result<Manifest, String> {
        let pin = req.agent_process_version.as_deref();
        let mut registry_note = String::new();
        if let Some(rid) = &def.registry_id {
            progress.step(&format!(
                "reading the ACP registry {}",
                self.config.acp_registry_url
            ));
            let fetched = match self.http(&self.config.acp_registry_url) {
                Ok(client) => {
                    registry::fetch(
                        client,
                        &self.config.acp_registry_url,
                        self.config.registry_max_bytes,
                    )
                    .await
                }
                Err(e) => Err(e),
            };
            match fetched {
                Err(e) => {
                    tracing::warn!(agent = %def.id, error = %e, "the ACP registry is unreachable; using the pinned fallback");
                    progress.step(&format!(
                        "the ACP registry is unreachable ({e}); trying the pinned fallback"
                    ));
                    registry_note = format!("the ACP registry could not be used ({e})");
                }
                Ok(reg) => match reg.agents.iter().find(|a| &a.id == rid) {
                    None => registry_note = format!("the ACP registry has no agent `{rid}`"),
                    Some(entry) => match self.plan_registry(entry, pin) {
                        Ok(plan) => return self.run_plan(def, plan, req, dir, progress).await,
                        Err(why) => {
                            tracing::info!(agent = %def.id, reason = %why, "registry entry not usable; trying the fallback");
                            registry_note = why;
                        }
                    },
                },
            }
        }
        let Some(fallback) = &def.fallback else {
            return Err(if registry_note.is_empty() {
                "no source to install from".into()
            } else {
                format!("{registry_note}, and the agent has no pinned fallback")
            });
        };
        let plan = match fallback {
            Fallback::Npm {
                package,
                version,
                bin,
                args,
                env,
            } => {
                let version = pin.unwrap_or(version).to_string();
                let is_path = ["/", "./", "../", "file:", "http://", "https://"]
                    .iter()
                    .any(|p| package.starts_with(p));
                Plan::Npm {
                    spec: if is_path {
                        package.clone()
                    } else {
                        format!("{package}@{version}")
                    },
                    package: (!is_path).then(|| package.clone()),
                    version,
                    bin: bin.clone(),
                    args: args.clone(),
                    env: env.clone(),
                    source: "fallback",
                }
            }
            Fallback::Binary {
                url,
                sha256,
                cmd,
                version,
                args,
                env,
            } => {
                if pin.is_some_and(|p| p != version) {
                    return Err(format!(
                        "version {} was asked for but the pinned fallback provides {version}{}",
                        pin.unwrap_or_default(),
                        if registry_note.is_empty() {
                            String::new()
                        } else {
                            format!(" ({registry_note})")
                        }
                    ));
                }
                Plan::Binary {
                    url: url.clone(),
                    sha256: sha256.clone(),
                    cmd: cmd.clone(),
                    version: version.clone(),
                    args: args.clone(),
                    env: env.clone(),
                    source: "fallback",
                }
            }
        };
        self.run_plan(def, plan, req, dir, progress).await
    }

    fn plan_registry(
        &self,
        entry: &registry::RegistryAgent,
        pin: Option<&str>,
    ) -> Result<Plan, String> {
        let dist = &entry.distribution;
        let platform = registry::platform_key();
        let entry_version = entry.version.clone().unwrap_or_else(|| "unknown".into());
        if let Some(target) = dist.binary.as_ref().and_then(|b| b.get(&platform))
            && pin.is_none_or(|p| p == entry_version)
        {
            return Ok(Plan::Binary {
                url: target.archive.clone(),
                sha256: target.sha256.clone(),
                cmd: target.cmd.clone(),
                version: entry_version,
                args: target.args.clone(),
                env: target.env.clone(),
                source: "registry",
            });
        }
        if let Some(npx) = &dist.npx {
            let (name, version) = registry::split_package(&npx.package);
            let version = pin
                .map(str::to_string)
                .or(version.map(str::to_string))
                .unwrap_or(entry_version);
            return Ok(Plan::Npm {
                spec: format!("{name}@{version}"),
                package: Some(name.to_string()),
                version,
                bin: npx.cmd.clone(),
                args: npx.args.clone(),
                env: npx.env.clone(),
                source: "registry",
            });
        }
        if dist
            .binary
            .as_ref()
            .is_some_and(|b| b.contains_key(&platform))
        {
            return Err(format!(
                "the registry has version {entry_version}, not the requested {}",
                pin.unwrap_or_default()
            ));
        }
        if dist.uvx.is_some() {
            return Err(
                "the registry distributes this agent only through uvx (Python), which is \
                        not supported"
                    .into(),
            );
        }
        Err(format!(
            "the registry has no build of this agent for {platform}"
        ))
    }

    async fn run_plan(
        &self,
        def: &AgentDef,
        plan: Plan,
        req: &InstallRequest,
        dir: &Path,
        progress: &dyn Progress,
    ) -> Result<Manifest, String> {
        let mut staging = Staging::new_async(dir)
            .await
            .map_err(|e| format!("cannot create a staging directory: {e}"))?;
        let res = self
            .run_plan_in(def, plan, req, dir, progress, &mut staging)
            .await;
        // On failure the staging tree is gone before the failure is reported.
        staging.discard().await;
        res
    }

    async fn run_plan_in(
        &self,
        def: &AgentDef,
        plan: Plan,
        req: &InstallRequest,
        dir: &Path,
        progress: &dyn Progress,
        staging: &mut Staging,
    ) -> Result<Manifest, String> {
        match plan {
            Plan::Binary {
                url,
                sha256,
                cmd,
                version,
                args,
                env,
                source,
            } => {
                let final_dir = dir.join(version_dir(&version));
                let verified = sha256.is_some();
                if !verified {
                    if self.config.require_checksums {
                        return Err(format!(
                            "refused: {url} comes without a sha256 and --require-checksums is set"
                        ));
                    }
                    tracing::warn!(agent = %def.id, %url, "installing a binary without a sha256 to check it against (unverified)");
                    progress.step(&format!(
                        "warning: {url} has no sha256; it is installed unverified"
                    ));
                }
                progress.step(&format!("downloading {url}"));
                let mut file =
                    install::download(self.http(&url)?, &url, sha256.as_deref(), dir, progress)
                        .await?;
                let program_in_staging = {
                    let staging_path = staging.path.clone();
                    let url = url.clone();
                    let cmd = cmd.clone();
                    tokio::task::spawn_blocking(move || {
                        install::unpack(&mut file.file, &url, &cmd, &staging_path)
                    })
                    .await
                    .map_err(|e| format!("unpacking failed: {e}"))??
                };
                let rel = program_in_staging
                    .strip_prefix(&staging.path)
                    .map_err(|e| e.to_string())?
                    .to_path_buf();
                staging
                    .commit_async(&final_dir)
                    .await
                    .map_err(|e| format!("cannot move the install into place: {e}"))?;
                let program = final_dir.join(rel);
                Ok(Manifest {
                    agent: def.id.clone(),
                    source: source.into(),
                    version: version.clone(),
                    native_version: None,
                    dir: final_dir,
                    program: program.clone(),
                    args,
                    env,
                    path_prepend: Vec::new(),
                    artifacts: vec![Artifact {
                        kind: "agent_process".into(),
                        path: program,
                        version,
                        source: source.into(),
                        verified: Some(verified),
                    }],
                    installed_at: install::now_secs(),
                    verified: Some(verified),
                })
            }
            Plan::Npm {
                spec,
                package,
                version,
                bin,
                args,
                env,
                source,
            } => {
                let mut specs = vec![spec];
                let native = def.native_npm.as_ref().map(|n| {
                    let v = req
                        .agent_version
                        .clone()
                        .unwrap_or_else(|| n.version.clone());
                    (n, v)
                });
                if let Some((n, v)) = &native {
                    specs.push(format!("{}@{v}", n.package));
                }
                let env_for_npm: Vec<(OsString, OsString)> = self
                    .config
                    .agent_base_env
                    .iter()
                    .filter(|(k, _)| k != "PATH")
                    .cloned()
                    .collect();
                install::npm_install(
                    &specs,
                    &staging.path,
                    &env_for_npm,
                    &self.agent_path(),
                    progress,
                )
                .await?;
                let package = match package {
                    Some(p) => p,
                    None => install::npm_first_dependency(&staging.path)
                        .ok_or("npm installed no package")?,
                };
                let program_in_staging = install::npm_bin(&staging.path, &package, bin.as_deref())?;
                let bin_name = program_in_staging
                    .file_name()
                    .map(|n| n.to_os_string())
                    .unwrap_or_default();
                let native_bin = match &native {
                    Some((n, _)) => Some(install::npm_bin(
                        &staging.path,
                        &n.package,
                        n.bin.as_deref(),
                    )?),
                    None => None,
                };
                let final_dir = dir.join(version_dir(&version));
                staging
                    .commit_async(&final_dir)
                    .await
                    .map_err(|e| format!("cannot move the install into place: {e}"))?;
                let bin_dir = final_dir.join("node_modules/.bin");
                let program = bin_dir.join(bin_name);
                let mut artifacts = vec![Artifact {
                    kind: "agent_process".into(),
                    path: program.clone(),
                    version: version.clone(),
                    source: source.into(),
                    verified: None,
                }];
                if let (Some((_, v)), Some(nb)) = (&native, &native_bin) {
                    artifacts.push(Artifact {
                        kind: "native_agent".into(),
                        path: bin_dir.join(nb.file_name().unwrap_or(OsStr::new(""))),
                        version: v.clone(),
                        source: source.into(),
                        verified: None,
                    });
                }
                Ok(Manifest {
                    agent: def.id.clone(),
                    source: source.into(),
                    version,
                    native_version: native.map(|(_, v)| v),
                    dir: final_dir,
                    program,
                    args,
                    env,
                    path_prepend: vec![bin_dir],
                    artifacts,
                    installed_at: install::now_secs(),
                    verified: None,
                })
            }
        }
    }
}

/// A chosen source, ready to install.
enum Plan {
    Binary {
        url: String,
        sha256: Option<String>,
        cmd: String,
        version: String,
        args: Vec<String>,
        env: BTreeMap<String, String>,
        source: &'static str,
    },
    Npm {
        spec: String,
        /// The package name, when `spec` is not a tarball path.
        package: Option<String>,
        version: String,
        bin: Option<String>,
        args: Vec<String>,
        env: BTreeMap<String, String>,
        source: &'static str,
    },
}

/// A version as a directory name: path separators and leading dots cannot sneak in.
fn version_dir(version: &str) -> String {
    let s: String = version
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || "-_.+".contains(c) {
                c
            } else {
                '_'
            }
        })
        .collect();
    let s = s.trim_start_matches('.').to_string();
    if s.is_empty() { "unknown".into() } else { s }
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
