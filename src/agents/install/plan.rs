//! Choosing where an agent comes from and putting it there: the ACP registry's entry for this
//! platform (a binary archive or an npm package), else the catalog's pinned fallback, each honouring
//! a version pin; then the download or npm install into a staging directory that is renamed into
//! `<agent dir>/<version>` and described by a `Manifest`. The agents service (`agents/mod.rs`)
//! decides *whether* to install (locks, an existing manifest, `--require-preinstall`); this
//! decides *what* and does it.

use std::collections::BTreeMap;
use std::ffi::{OsStr, OsString};
use std::path::Path;
use std::time::Duration;

use crate::agents::catalog::{AgentDef, Fallback};
use crate::agents::registry;
use crate::config::Config;

use super::{Artifact, InstallError, InstallRequest, Manifest, Progress, Staging};

/// The HTTP clients for registry look-ups and downloads, each built on first use: a machine
/// without CA certificates must still start the daemon (and run local or pre-installed agents);
/// only an `https://` download then fails, with the reason. The plain client serves `http://`
/// (and `file://`) URLs and needs no CA roots.
#[derive(Default)]
pub struct LazyClient {
    https: std::sync::OnceLock<Result<reqwest::Client, ClientUnbuilt>>,
    plain: std::sync::OnceLock<Result<reqwest::Client, ClientUnbuilt>>,
}

/// Why a client could not be built, kept so that every later use fails the same way (the text
/// names the cause and, for `https://`, where CA certificates were looked for).
#[derive(Debug, Clone, thiserror::Error)]
#[error("{reason}")]
pub struct ClientUnbuilt {
    reason: String,
}

impl LazyClient {
    /// The client for `url`.
    pub fn get(&self, url: &str) -> Result<&reqwest::Client, InstallError> {
        let https = !crate::http_client::is_plain_http(url) && !url.starts_with("file:");
        let cell = if https { &self.https } else { &self.plain };
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
            builder.build().map_err(|e| ClientUnbuilt {
                reason: crate::http_client::build_error(&e),
            })
        });
        built.as_ref().map_err(|e| InstallError::Client {
            reason: e.reason.clone(),
        })
    }
}

/// Why the ACP registry's entry for an agent cannot be installed here (the fallback is tried
/// next; the text becomes the note of `InstallError::NoSource`/`PinUnavailable`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Unusable {
    #[error("the registry has version {has}, not the requested {asked}")]
    OtherVersion { has: String, asked: String },
    #[error(
        "the registry distributes this agent only through uvx (Python), which is not supported"
    )]
    UvxOnly,
    #[error("the registry has no build of this agent for {platform}")]
    NoBuild { platform: String },
}

/// What one install needs of the daemon: its settings, the HTTP client and the PATH agents (and
/// npm) see.
pub struct Installer<'a> {
    pub config: &'a Config,
    pub client: &'a LazyClient,
    pub agent_path: OsString,
}

impl Installer<'_> {
    /// Chooses the source (registry, then fallback) and installs from it.
    pub async fn install_fresh(
        &self,
        def: &AgentDef,
        req: &InstallRequest,
        dir: &Path,
        progress: &dyn Progress,
    ) -> Result<Manifest, InstallError> {
        let pin = req.agent_process_version.as_deref();
        let mut registry_note = String::new();
        if let Some(rid) = &def.registry_id {
            progress.step(&format!(
                "reading the ACP registry {}",
                self.config.acp_registry_url
            ));
            let fetched = match self.client.get(&self.config.acp_registry_url) {
                Ok(client) => {
                    registry::fetch(
                        client,
                        &self.config.acp_registry_url,
                        self.config.registry_max_bytes,
                    )
                    .await
                }
                Err(e) => Err(registry::RegistryError::Client(e.to_string())),
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
                            registry_note = why.to_string();
                        }
                    },
                },
            }
        }
        let Some(fallback) = &def.fallback else {
            return Err(InstallError::NoSource {
                note: registry_note,
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
                if let Some(asked) = pin.filter(|p| p != version) {
                    return Err(InstallError::PinUnavailable {
                        asked: asked.to_string(),
                        provides: version.clone(),
                        note: registry_note,
                    });
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
    ) -> Result<Plan, Unusable> {
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
            return Err(Unusable::OtherVersion {
                has: entry_version,
                asked: pin.unwrap_or_default().to_string(),
            });
        }
        if dist.uvx.is_some() {
            return Err(Unusable::UvxOnly);
        }
        Err(Unusable::NoBuild { platform })
    }

    async fn run_plan(
        &self,
        def: &AgentDef,
        plan: Plan,
        req: &InstallRequest,
        dir: &Path,
        progress: &dyn Progress,
    ) -> Result<Manifest, InstallError> {
        let mut staging = Staging::new_async(dir)
            .await
            .map_err(|source| InstallError::Io {
                what: "cannot create a staging directory".into(),
                source,
            })?;
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
    ) -> Result<Manifest, InstallError> {
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
                        return Err(InstallError::Unverified { url });
                    }
                    tracing::warn!(agent = %def.id, %url, "installing a binary without a sha256 to check it against (unverified)");
                    progress.step(&format!(
                        "warning: {url} has no sha256; it is installed unverified"
                    ));
                }
                progress.step(&format!("downloading {url}"));
                let mut file = super::download(
                    self.client.get(&url)?,
                    &url,
                    sha256.as_deref(),
                    dir,
                    progress,
                )
                .await?;
                let program_in_staging = {
                    let staging_path = staging.path.clone();
                    let url = url.clone();
                    let cmd = cmd.clone();
                    tokio::task::spawn_blocking(move || {
                        super::unpack(&mut file.file, &url, &cmd, &staging_path)
                    })
                    .await??
                };
                let rel = program_in_staging
                    .strip_prefix(&staging.path)
                    .map_err(|_| InstallError::CommandOutside { cmd: cmd.clone() })?
                    .to_path_buf();
                staging
                    .commit_async(&final_dir)
                    .await
                    .map_err(|source| InstallError::Io {
                        what: "cannot move the install into place".into(),
                        source,
                    })?;
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
                    installed_at: super::now_secs(),
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
                super::npm_install(
                    &specs,
                    &staging.path,
                    &env_for_npm,
                    &self.agent_path,
                    progress,
                )
                .await?;
                let package = match package {
                    Some(p) => p,
                    None => super::npm_first_dependency(&staging.path)
                        .ok_or(InstallError::NpmNoPackage)?,
                };
                let program_in_staging = super::npm_bin(&staging.path, &package, bin.as_deref())?;
                let bin_name = program_in_staging
                    .file_name()
                    .map(|n| n.to_os_string())
                    .unwrap_or_default();
                let native_bin = match &native {
                    Some((n, _)) => {
                        Some(super::npm_bin(&staging.path, &n.package, n.bin.as_deref())?)
                    }
                    None => None,
                };
                let final_dir = dir.join(version_dir(&version));
                staging
                    .commit_async(&final_dir)
                    .await
                    .map_err(|source| InstallError::Io {
                        what: "cannot move the install into place".into(),
                        source,
                    })?;
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
                    installed_at: super::now_secs(),
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
