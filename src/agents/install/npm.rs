//! npm installs into the agent's own prefix, and finding the installed binary.

use std::path::{Path, PathBuf};

use super::*;

/// `npm install --prefix <dest> -- <specs…>`; `npm` and `node` must be on `path`. The `--` ends
/// npm's options: a spec from a registry document that starts with a dash (`--global`,
/// `--prefix=/`) is a package name to npm, never an option.
pub async fn npm_install(
    specs: &[String],
    dest: &Path,
    env: &[(std::ffi::OsString, std::ffi::OsString)],
    path: &std::ffi::OsStr,
    progress: &dyn Progress,
) -> Result<(), InstallError> {
    let npm = find_on_path("npm", path).ok_or(InstallError::NpmMissing)?;
    if find_on_path("node", path).is_none() {
        return Err(InstallError::NodeMissing);
    }
    progress.step(&format!("npm install {}", specs.join(" ")));
    let mut cmd = tokio::process::Command::new(npm);
    cmd.arg("install")
        .arg("--prefix")
        .arg(dest)
        .args([
            "--no-audit",
            "--no-fund",
            "--loglevel=error",
            "--no-update-notifier",
        ])
        .arg("--")
        .args(specs)
        .env_clear()
        .envs(env.iter().map(|(k, v)| (k, v)))
        .env("PATH", path)
        .current_dir(dest);
    let out = crate::supervisor::run_to_completion(cmd, NPM_TIMEOUT)
        .await
        .map_err(|e| InstallError::Io {
            what: "cannot run npm".into(),
            source: std::io::Error::other(e.to_string()),
        })?;
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        let tail: Vec<&str> = err.lines().rev().take(12).collect();
        let tail: Vec<&str> = tail.into_iter().rev().collect();
        return Err(InstallError::NpmFailed {
            specs: specs.join(" "),
            status: out.status.to_string(),
            tail: tail.join("\n"),
        });
    }
    Ok(())
}

/// The bin an npm package installed under `prefix` provides: `bin` when named, else the
/// package's only bin (or the one named like the package).
pub fn npm_bin(prefix: &Path, package: &str, bin: Option<&str>) -> Result<PathBuf, InstallError> {
    let bin_dir = prefix.join("node_modules/.bin");
    let name = match bin {
        Some(b) => b.to_string(),
        None => {
            let pkg_json = prefix
                .join("node_modules")
                .join(package)
                .join("package.json");
            let text = std::fs::read(&pkg_json).map_err(|source| InstallError::Io {
                what: format!("cannot read {}", pkg_json.display()),
                source,
            })?;
            let v: serde_json::Value =
                serde_json::from_slice(&text).map_err(|e| InstallError::Io {
                    what: pkg_json.display().to_string(),
                    source: e.into(),
                })?;
            let base = package.rsplit('/').next().unwrap_or(package).to_string();
            match &v["bin"] {
                serde_json::Value::String(_) => base,
                serde_json::Value::Object(m) if m.len() == 1 => {
                    m.keys().next().cloned().unwrap_or(base)
                }
                serde_json::Value::Object(m) if m.contains_key(&base) => base,
                _ => {
                    return Err(InstallError::NpmNoCommand {
                        package: package.to_string(),
                    });
                }
            }
        }
    };
    let p = bin_dir.join(&name);
    if p.exists() {
        Ok(p)
    } else {
        Err(InstallError::NpmCommandMissing {
            package: package.to_string(),
            name,
        })
    }
}

/// The package name of a local tarball spec: read from the installed `package.json` deps.
pub fn npm_first_dependency(prefix: &Path) -> Option<String> {
    let text = std::fs::read(prefix.join("package.json")).ok()?;
    let v: serde_json::Value = serde_json::from_slice(&text).ok()?;
    v["dependencies"].as_object()?.keys().next().cloned()
}

pub fn find_on_path(name: &str, path: &std::ffi::OsStr) -> Option<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    if name.contains('/') {
        let p = PathBuf::from(name);
        return p.is_file().then_some(p);
    }
    std::env::split_paths(path).map(|d| d.join(name)).find(|p| {
        std::fs::metadata(p)
            .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
            .unwrap_or(false)
    })
}
