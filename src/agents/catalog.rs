//! The catalog of agents: the built-in `catalog.toml` plus the operator's agents file, parsed and
//! checked once at start-up. A bad agents file is a start-up error that names the problem.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Deserialize;

const BUILTIN: &str = include_str!("catalog.toml");

/// One agent the daemon can run.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AgentDef {
    pub id: String,
    #[serde(default)]
    pub name: Option<String>,
    /// The id in the ACP registry; `None` = only the fallback (or a user command).
    #[serde(default)]
    pub registry_id: Option<String>,
    #[serde(default)]
    pub native: Option<String>,
    /// Commands on PATH that count as an operator-installed copy (provenance `local`).
    #[serde(default)]
    pub local_bins: Vec<String>,
    #[serde(default)]
    pub local_args: Vec<String>,
    #[serde(default)]
    pub credentials_env: Vec<String>,
    /// Relative to HOME.
    #[serde(default)]
    pub credentials_files: Vec<String>,
    #[serde(default)]
    pub platforms: Vec<String>,
    #[serde(default)]
    pub fallback: Option<Fallback>,
    #[serde(default)]
    pub native_npm: Option<NpmPackage>,
    /// Variables set for every launch of a catalog agent, whatever its source.
    #[serde(default)]
    pub launch_env: BTreeMap<String, String>,
    /// A user agent: the command to run (absolute, or looked up on PATH).
    #[serde(default)]
    pub command: Option<String>,
    #[serde(default)]
    pub args: Vec<String>,
    #[serde(default)]
    pub env: BTreeMap<String, String>,
}

impl AgentDef {
    /// A user agent runs the operator's command as is and is never installed.
    pub fn is_user(&self) -> bool {
        self.command.is_some()
    }

    /// An agents-file entry that says nothing about what to run (no command, registry id or
    /// fallback): for a built-in id it adds environment to the built-in agent.
    fn is_overlay(&self) -> bool {
        self.command.is_none()
            && self.registry_id.is_none()
            && self.fallback.is_none()
            && self.native_npm.is_none()
            && self.args.is_empty()
    }
}

/// Why the catalog (the built-in one, or it overlaid with the operator's agents file) cannot be
/// used: the daemon refuses to start, naming the file and the agent.
#[derive(Debug, thiserror::Error)]
pub enum CatalogError {
    #[error("the built-in agent catalog is invalid: {0}")]
    Builtin(#[source] toml::de::Error),
    #[error("cannot read the agents file {}: {source}", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("agents file {}: {source}", path.display())]
    Parse {
        path: PathBuf,
        #[source]
        source: toml::de::Error,
    },
    /// An entry of the agents file adds more than the operator's environment to a built-in agent.
    #[error(
        "{origin}: agent `{agent}` is built in: only `env`, `credentials_env` and \
         `credentials_files` can be added to it (or give `command` for an agent of your own)"
    )]
    BuiltinOverlay { origin: String, agent: String },
    /// One entry breaks a rule; `origin` names the catalog or file it is in.
    #[error("{origin}: agent `{agent}`: {why}")]
    Entry {
        origin: String,
        agent: String,
        why: String,
    },
}

/// Environment names must be usable as such: not empty, no `=` and no NUL.
fn check_env_names(origin: &str, def: &AgentDef) -> Result<(), CatalogError> {
    let bad = |why: String| CatalogError::Entry {
        origin: origin.to_string(),
        agent: def.id.clone(),
        why,
    };
    for name in def.env.keys() {
        if name.is_empty() || name.contains('=') || name.contains('\0') {
            return Err(bad(format!(
                "`{name}` is not a valid environment variable name"
            )));
        }
    }
    if def.env.values().any(|v| v.contains('\0')) {
        return Err(bad("an environment value contains a NUL byte".into()));
    }
    Ok(())
}

/// The pinned source used when the registry cannot be used.
#[derive(Debug, Clone, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum Fallback {
    Npm {
        /// An npm package name, or a path / URL of a package tarball (then `version` is a label).
        package: String,
        version: String,
        /// The command in `node_modules/.bin`; default: the package's own bin.
        #[serde(default)]
        bin: Option<String>,
        #[serde(default)]
        args: Vec<String>,
        #[serde(default)]
        env: BTreeMap<String, String>,
    },
    Binary {
        /// `http(s)://` or `file://` URL of an archive or a raw executable.
        url: String,
        #[serde(default)]
        sha256: Option<String>,
        /// Path of the executable inside the unpacked archive.
        cmd: String,
        version: String,
        #[serde(default)]
        args: Vec<String>,
        #[serde(default)]
        env: BTreeMap<String, String>,
    },
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NpmPackage {
    pub package: String,
    pub version: String,
    #[serde(default)]
    pub bin: Option<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    #[serde(default)]
    agent: Vec<AgentDef>,
}

/// Every known agent, in catalog order (built-ins first, then the agents file).
#[derive(Debug, Clone)]
pub struct Catalog {
    pub agents: Vec<AgentDef>,
}

impl Catalog {
    /// The built-in catalog, overlaid with the agents file when one is configured. An entry of the
    /// file with a built-in id replaces the built-in entry.
    pub fn load(agents_file: Option<&Path>) -> Result<Catalog, CatalogError> {
        let builtin: File = toml::from_str(BUILTIN).map_err(CatalogError::Builtin)?;
        let mut agents = builtin.agents_checked("built-in catalog")?;
        if let Some(path) = agents_file {
            let text = std::fs::read_to_string(path).map_err(|source| CatalogError::Read {
                path: path.to_path_buf(),
                source,
            })?;
            let file: File = toml::from_str(&text).map_err(|source| CatalogError::Parse {
                path: path.to_path_buf(),
                source,
            })?;
            let origin = format!("agents file {}", path.display());
            // An entry that names a built-in agent and nothing to run only adds to it: the
            // operator's environment for that agent (model endpoint, keys, HOME) and, if given,
            // where its credentials are. Every other entry is a whole agent of its own.
            let (overlays, entries): (Vec<AgentDef>, Vec<AgentDef>) =
                file.agent.into_iter().partition(|d| {
                    d.is_overlay() && agents.iter().any(|a| a.id == d.id && a.id != "mock")
                });
            for overlay in overlays {
                check_env_names(&origin, &overlay)?;
                if overlay.name.is_some()
                    || overlay.native.is_some()
                    || !overlay.local_bins.is_empty()
                    || !overlay.local_args.is_empty()
                    || !overlay.platforms.is_empty()
                    || !overlay.launch_env.is_empty()
                {
                    return Err(CatalogError::BuiltinOverlay {
                        origin,
                        agent: overlay.id,
                    });
                }
                if let Some(existing) = agents.iter_mut().find(|a| a.id == overlay.id) {
                    existing.env.extend(overlay.env);
                    if !overlay.credentials_env.is_empty() {
                        existing.credentials_env = overlay.credentials_env;
                    }
                    if !overlay.credentials_files.is_empty() {
                        existing.credentials_files = overlay.credentials_files;
                    }
                }
            }
            let file = File { agent: entries };
            for def in file.agents_checked(&origin)? {
                match agents.iter_mut().find(|a| a.id == def.id) {
                    Some(existing) => *existing = def,
                    None => agents.push(def),
                }
            }
        }
        Ok(Catalog { agents })
    }

    pub fn get(&self, id: &str) -> Option<&AgentDef> {
        self.agents.iter().find(|a| a.id == id)
    }
}

impl File {
    fn agents_checked(self, origin: &str) -> Result<Vec<AgentDef>, CatalogError> {
        let mut seen = std::collections::HashSet::new();
        for def in &self.agent {
            let bad = |why: &str| CatalogError::Entry {
                origin: origin.to_string(),
                agent: def.id.clone(),
                why: why.to_string(),
            };
            if !valid_id(&def.id) {
                return Err(bad(
                    "the id must be 1-64 characters of a-z, 0-9, `-`, `_` or `.`, not starting with `.`",
                ));
            }
            if def.id == "mock" {
                return Err(bad(
                    "`mock` is the built-in mock agent and cannot be redefined",
                ));
            }
            if !seen.insert(def.id.clone()) {
                return Err(bad("defined twice"));
            }
            check_env_names(origin, def)?;
            match &def.command {
                Some(cmd) => {
                    if cmd.trim().is_empty() {
                        return Err(bad("`command` is empty"));
                    }
                    if def.registry_id.is_some() || def.fallback.is_some() {
                        return Err(bad(
                            "a user agent (`command`) cannot also have `registry_id` or `fallback`",
                        ));
                    }
                }
                None => {
                    if def.registry_id.is_none() && def.fallback.is_none() {
                        return Err(bad(
                            "nothing to run: give `command`, `registry_id` or a `fallback`",
                        ));
                    }
                    if !def.args.is_empty() {
                        return Err(bad("`args` belongs to user agents (with `command`)"));
                    }
                }
            }
            if let Some(Fallback::Binary {
                sha256: Some(h), ..
            }) = &def.fallback
                && (h.len() != 64 || !h.bytes().all(|b| b.is_ascii_hexdigit()))
            {
                return Err(bad("fallback sha256 must be 64 hex digits"));
            }
        }
        Ok(self.agent)
    }
}

/// Ids end up in paths (`<data-dir>/agents/<id>`), so they are kept to a safe alphabet.
pub fn valid_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= 64
        && !id.starts_with('.')
        && id
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"-_.".contains(&b))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builtin_catalog_has_every_contract_agent() {
        let c = Catalog::load(None).unwrap();
        for id in [
            "claude", "codex", "opencode", "gemini", "amp", "pi", "cursor",
        ] {
            let def = c.get(id).unwrap_or_else(|| panic!("{id} missing"));
            assert!(def.registry_id.is_some(), "{id} has no registry id");
        }
        for id in ["claude", "codex", "opencode", "gemini", "pi"] {
            assert!(matches!(
                c.get(id).unwrap().fallback,
                Some(Fallback::Npm { .. })
            ));
        }
    }

    #[test]
    fn agents_file_adds_and_rejects() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("agents.toml");
        std::fs::write(
            &p,
            "[[agent]]\nid = \"inhouse\"\ncommand = \"/bin/cat\"\nargs = [\"-u\"]\n",
        )
        .unwrap();
        let c = Catalog::load(Some(&p)).unwrap();
        assert!(c.get("inhouse").unwrap().is_user());

        std::fs::write(&p, "[[agent]]\nid = \"x\"\n").unwrap();
        let e = Catalog::load(Some(&p)).unwrap_err().to_string();
        assert!(e.contains("nothing to run"), "{e}");

        std::fs::write(&p, "[[agent]]\nid = \"../x\"\ncommand = \"a\"\n").unwrap();
        let e = Catalog::load(Some(&p)).unwrap_err().to_string();
        assert!(e.contains("the id must be"), "{e}");

        std::fs::write(&p, "[[agent]]\nid = \"y\"\ncommand = \"a\"\ncolor = 1\n").unwrap();
        let e = Catalog::load(Some(&p)).unwrap_err().to_string();
        assert!(e.contains("color"), "{e}");
    }

    #[test]
    fn agents_file_adds_environment_to_a_builtin_agent() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("agents.toml");
        std::fs::write(
            &p,
            "[[agent]]\nid = \"claude\"\nenv = { ANTHROPIC_BASE_URL = \"http://127.0.0.1:9\" }\n",
        )
        .unwrap();
        let c = Catalog::load(Some(&p)).unwrap();
        let claude = c.get("claude").unwrap();
        assert_eq!(claude.env["ANTHROPIC_BASE_URL"], "http://127.0.0.1:9");
        // Everything else of the built-in stays.
        assert_eq!(claude.registry_id.as_deref(), Some("claude-acp"));
        assert!(
            claude
                .credentials_env
                .contains(&"ANTHROPIC_API_KEY".to_string())
        );

        std::fs::write(&p, "[[agent]]\nid = \"claude\"\nname = \"x\"\n").unwrap();
        let e = Catalog::load(Some(&p)).unwrap_err().to_string();
        assert!(e.contains("is built in"), "{e}");

        std::fs::write(&p, "[[agent]]\nid = \"codex\"\nenv = { \"A=B\" = \"1\" }\n").unwrap();
        let e = Catalog::load(Some(&p)).unwrap_err().to_string();
        assert!(e.contains("not a valid environment variable name"), "{e}");
    }
}
