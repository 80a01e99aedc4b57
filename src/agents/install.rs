//! Putting one agent on disk: streamed, size-capped, sha256-checked downloads; archive unpacking
//! that refuses anything escaping the target; npm installs into the agent's own prefix. Every
//! install is built in a staging directory and renamed into `<data-dir>/agents/<id>/<version>`,
//! so a failed or refused install leaves nothing behind and a reader never sees half an install.

use std::collections::BTreeMap;
use std::io::{Read, Seek, Write};
use std::path::{Component, Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::registry::error_chain;

/// Downloads larger than this are refused (the biggest agent archives are a few hundred MB).
pub const MAX_DOWNLOAD: u64 = 2 << 30;
/// An npm install that takes longer than this is killed.
const NPM_TIMEOUT: Duration = Duration::from_secs(15 * 60);

/// Where progress goes: a bar on a terminal, log lines in the daemon.
pub trait Progress: Send + Sync {
    fn step(&self, message: &str);
    fn download(&self, _done: u64, _total: Option<u64>) {}
    fn download_done(&self) {}
}

/// Logs steps through tracing (the daemon's lazy installs).
pub struct LogProgress;

impl Progress for LogProgress {
    fn step(&self, message: &str) {
        tracing::info!("{message}");
    }
}

/// What is installed for one agent, persisted as `<data-dir>/agents/<id>/manifest.json`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Manifest {
    pub agent: String,
    /// `registry` or `fallback`.
    pub source: String,
    /// Version of the ACP agent process.
    pub version: String,
    /// Version of the separately installed native CLI, if any.
    #[serde(default)]
    pub native_version: Option<String>,
    pub dir: PathBuf,
    pub program: PathBuf,
    #[serde(default)]
    pub args: Vec<String>,
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Directories prepended to PATH at launch (npm's `node_modules/.bin`).
    #[serde(default)]
    pub path_prepend: Vec<PathBuf>,
    pub artifacts: Vec<Artifact>,
    /// Seconds since the epoch.
    pub installed_at: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Artifact {
    /// `agent_process` (the ACP program) or `native_agent` (the CLI it drives).
    pub kind: String,
    pub path: PathBuf,
    pub version: String,
    pub source: String,
}

impl Manifest {
    pub fn path(agent_dir: &Path) -> PathBuf {
        agent_dir.join("manifest.json")
    }

    /// The manifest, when it exists and its program is still there.
    pub fn read(agent_dir: &Path) -> Option<Manifest> {
        let text = std::fs::read(Self::path(agent_dir)).ok()?;
        let m: Manifest = serde_json::from_slice(&text).ok()?;
        m.program.is_file().then_some(m)
    }

    pub fn write(&self, agent_dir: &Path) -> std::io::Result<()> {
        let tmp = agent_dir.join(format!(".manifest.{}.tmp", std::process::id()));
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(&serde_json::to_vec_pretty(self).unwrap_or_default())?;
        f.sync_all()?;
        std::fs::rename(&tmp, Self::path(agent_dir))
    }
}

/// A fresh directory inside `agent_dir` that is removed on drop unless `keep` was called.
pub struct Staging {
    pub path: PathBuf,
    keep: bool,
}

impl Staging {
    pub fn new(agent_dir: &Path) -> std::io::Result<Staging> {
        std::fs::create_dir_all(agent_dir)?;
        let path = agent_dir.join(format!(".staging-{}-{}", std::process::id(), nonce()));
        std::fs::create_dir(&path)?;
        Ok(Staging { path, keep: false })
    }

    /// Moves the staging directory to `final_dir` (replacing an older install of the same
    /// version): after this returns, `final_dir` is complete or untouched.
    pub fn commit(mut self, final_dir: &Path) -> std::io::Result<()> {
        let parent = final_dir.parent().unwrap_or(Path::new("/"));
        let old = parent.join(format!(".old-{}-{}", std::process::id(), nonce()));
        let had_old = match std::fs::rename(final_dir, &old) {
            Ok(()) => true,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => false,
            Err(e) => return Err(e),
        };
        if let Err(e) = std::fs::rename(&self.path, final_dir) {
            if had_old {
                let _ = std::fs::rename(&old, final_dir);
            }
            return Err(e);
        }
        self.keep = true;
        if had_old {
            let _ = std::fs::remove_dir_all(&old);
        }
        Ok(())
    }
}

impl Drop for Staging {
    fn drop(&mut self) {
        if !self.keep {
            let _ = std::fs::remove_dir_all(&self.path);
        }
    }
}

fn nonce() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos() as u64)
        .unwrap_or(0);
    t ^ (N.fetch_add(1, Ordering::Relaxed) << 32)
}

pub fn now_secs() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// Downloads `url` into a temporary file inside `dir`, checking the size cap and, when given, the
/// sha256. On any error the temporary file is gone.
pub async fn download(
    client: &reqwest::Client,
    url: &str,
    sha256: Option<&str>,
    dir: &Path,
    progress: &dyn Progress,
) -> Result<tempfile_like::TempFile, String> {
    use futures_util::StreamExt;

    let mut file = tempfile_like::TempFile::new_in(dir)
        .map_err(|e| format!("cannot create a temporary file in {}: {e}", dir.display()))?;
    let mut hasher = Sha256::new();
    let mut done: u64 = 0;
    if let Some(path) = url.strip_prefix("file://") {
        let mut src = std::fs::File::open(path).map_err(|e| format!("cannot open {path}: {e}"))?;
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            let n = src
                .read(&mut buf)
                .map_err(|e| format!("cannot read {path}: {e}"))?;
            if n == 0 {
                break;
            }
            done += n as u64;
            if done > MAX_DOWNLOAD {
                return Err(format!("{url} is larger than {MAX_DOWNLOAD} bytes"));
            }
            hasher.update(&buf[..n]);
            file.write_all(&buf[..n])
                .map_err(|e| format!("cannot write the download: {e}"))?;
        }
    } else {
        let resp = client
            .get(url)
            .send()
            .await
            .map_err(|e| format!("cannot download {url}: {}", error_chain(&e)))?;
        if !resp.status().is_success() {
            return Err(format!(
                "cannot download {url}: the server answered {}",
                resp.status()
            ));
        }
        let total = resp.content_length();
        if total.is_some_and(|t| t > MAX_DOWNLOAD) {
            return Err(format!("{url} is larger than {MAX_DOWNLOAD} bytes"));
        }
        let mut stream = resp.bytes_stream();
        while let Some(chunk) = stream.next().await {
            let chunk =
                chunk.map_err(|e| format!("download of {url} failed: {}", error_chain(&e)))?;
            done += chunk.len() as u64;
            if done > MAX_DOWNLOAD {
                return Err(format!("{url} is larger than {MAX_DOWNLOAD} bytes"));
            }
            hasher.update(&chunk);
            file.write_all(&chunk)
                .map_err(|e| format!("cannot write the download: {e}"))?;
            progress.download(done, total);
        }
        progress.download_done();
    }
    file.flush()
        .map_err(|e| format!("cannot write the download: {e}"))?;
    if let Some(want) = sha256 {
        let got = hex(&hasher.finalize());
        if !got.eq_ignore_ascii_case(want.trim()) {
            return Err(format!(
                "checksum mismatch for {url}: expected sha256 {want}, got {got}; nothing was installed"
            ));
        }
    }
    Ok(file)
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The kind of a downloaded artifact, from the URL's file name.
#[derive(Debug, PartialEq, Eq)]
pub enum ArchiveKind {
    TarGz,
    Tar,
    Zip,
    TarBz2,
    Raw,
}

pub fn archive_kind(url: &str) -> ArchiveKind {
    let name = url
        .split(['?', '#'])
        .next()
        .unwrap_or(url)
        .rsplit('/')
        .next()
        .unwrap_or("")
        .to_ascii_lowercase();
    if name.ends_with(".tar.gz") || name.ends_with(".tgz") {
        ArchiveKind::TarGz
    } else if name.ends_with(".tar") {
        ArchiveKind::Tar
    } else if name.ends_with(".zip") {
        ArchiveKind::Zip
    } else if name.ends_with(".tar.bz2") || name.ends_with(".tbz2") {
        ArchiveKind::TarBz2
    } else {
        ArchiveKind::Raw
    }
}

/// Refuses the archive formats the installer does not unpack (kept lean: no zip or bzip2 code).
pub fn check_supported(url: &str) -> Result<(), String> {
    match archive_kind(url) {
        ArchiveKind::Zip | ArchiveKind::TarBz2 => Err(format!(
            "{url}: this archive format is not supported; only .tar.gz, .tgz, .tar and raw \
             binaries are"
        )),
        _ => Ok(()),
    }
}

/// Unpacks (or, for a raw binary, copies) `file` into `dest`, then returns the path of `cmd`
/// inside it, made executable. Refuses absolute paths, `..`, links leaving `dest` and device
/// nodes; the caller drops the staging directory on error.
pub fn unpack(
    file: &mut std::fs::File,
    url: &str,
    cmd: &str,
    dest: &Path,
) -> Result<PathBuf, String> {
    file.rewind().map_err(|e| e.to_string())?;
    let rel_cmd = safe_relative(Path::new(cmd)).ok_or_else(|| {
        format!("the command path `{cmd}` is not a relative path inside the archive")
    })?;
    match archive_kind(url) {
        ArchiveKind::TarGz => unpack_tar(flate2::read::GzDecoder::new(file), dest)?,
        ArchiveKind::Tar => unpack_tar(file, dest)?,
        ArchiveKind::Zip | ArchiveKind::TarBz2 => check_supported(url)?,
        ArchiveKind::Raw => {
            let target = dest.join(&rel_cmd);
            if let Some(parent) = target.parent() {
                std::fs::create_dir_all(parent).map_err(|e| e.to_string())?;
            }
            let mut out = std::fs::File::create(&target).map_err(|e| e.to_string())?;
            std::io::copy(file, &mut out).map_err(|e| e.to_string())?;
        }
    }
    let program = dest.join(&rel_cmd);
    let meta =
        std::fs::symlink_metadata(&program).map_err(|_| format!("the archive has no `{cmd}`"))?;
    // The command itself may be a symlink inside the archive; it must still point inside.
    let real = program
        .canonicalize()
        .map_err(|e| format!("`{cmd}`: {e}"))?;
    let real_dest = dest.canonicalize().map_err(|e| e.to_string())?;
    if !real.starts_with(&real_dest) || !real.is_file() {
        return Err(format!(
            "`{cmd}` in the archive is not a file inside the archive"
        ));
    }
    if meta.is_file() {
        use std::os::unix::fs::PermissionsExt;
        let mut perm = meta.permissions();
        perm.set_mode(perm.mode() | 0o755);
        std::fs::set_permissions(&program, perm).map_err(|e| e.to_string())?;
    }
    Ok(program)
}

/// `p` without `.` components when it is relative and never climbs out; else `None`.
fn safe_relative(p: &Path) -> Option<PathBuf> {
    let mut out = PathBuf::new();
    for c in p.components() {
        match c {
            Component::Normal(s) => out.push(s),
            Component::CurDir => {}
            _ => return None,
        }
    }
    (!out.as_os_str().is_empty()).then_some(out)
}

fn unpack_tar(reader: impl Read, dest: &Path) -> Result<(), String> {
    use tar::EntryType;

    let mut archive = tar::Archive::new(reader);
    archive.set_preserve_permissions(false);
    archive.set_unpack_xattrs(false);
    archive.set_overwrite(true);
    let entries = archive
        .entries()
        .map_err(|e| format!("cannot read the archive: {e}"))?;
    for entry in entries {
        let mut entry = entry.map_err(|e| format!("cannot read the archive: {e}"))?;
        let raw_path = entry
            .path()
            .map_err(|e| format!("bad path in the archive: {e}"))?
            .into_owned();
        let shown = raw_path.display().to_string();
        let Some(rel) = safe_relative(&raw_path) else {
            // A lone `./` entry is harmless; anything else absolute or with `..` is refused.
            if raw_path.components().all(|c| c == Component::CurDir) {
                continue;
            }
            return Err(format!(
                "refused: the archive entry `{shown}` is an absolute path or climbs out with `..`"
            ));
        };
        let kind = entry.header().entry_type();
        match kind {
            EntryType::Regular | EntryType::Continuous | EntryType::Directory => {}
            EntryType::Symlink | EntryType::Link => {
                let target = entry
                    .link_name()
                    .map_err(|e| format!("bad link in the archive: {e}"))?
                    .ok_or_else(|| format!("refused: the link `{shown}` has no target"))?;
                // Symlink targets are relative to the link's directory; hard links to the root.
                let base = if kind == EntryType::Symlink {
                    rel.parent().map(Path::to_path_buf).unwrap_or_default()
                } else {
                    PathBuf::new()
                };
                if !stays_inside(&base, &target) {
                    return Err(format!(
                        "refused: the link `{shown}` points outside the archive (`{}`)",
                        target.display()
                    ));
                }
            }
            EntryType::XGlobalHeader
            | EntryType::XHeader
            | EntryType::GNULongName
            | EntryType::GNULongLink => continue,
            other => {
                return Err(format!(
                    "refused: the archive entry `{shown}` is a {other:?} (device nodes, fifos and \
                     other special files are not installed)"
                ));
            }
        }
        // `unpack_in` also refuses to write through a symlink that leads outside `dest`.
        match entry.unpack_in(dest) {
            Ok(true) => {}
            Ok(false) => {
                return Err(format!(
                    "refused: the archive entry `{shown}` leaves the target"
                ));
            }
            Err(e) => return Err(format!("cannot unpack `{shown}`: {e}")),
        }
    }
    Ok(())
}

/// Whether `base/target` (lexically resolved) stays inside the root; absolute targets never do.
fn stays_inside(base: &Path, target: &Path) -> bool {
    let mut depth: Vec<&std::ffi::OsStr> = Vec::new();
    for c in base.components().chain(target.components()) {
        match c {
            Component::Normal(s) => depth.push(s),
            Component::CurDir => {}
            Component::ParentDir => {
                if depth.pop().is_none() {
                    return false;
                }
            }
            Component::RootDir | Component::Prefix(_) => return false,
        }
    }
    true
}

/// `npm install --prefix <dest> <specs…>`; `npm` and `node` must be on `path`.
pub async fn npm_install(
    specs: &[String],
    dest: &Path,
    env: &[(std::ffi::OsString, std::ffi::OsString)],
    path: &std::ffi::OsStr,
    progress: &dyn Progress,
) -> Result<(), String> {
    let npm = find_on_path("npm", path).ok_or(
        "`npm` was not found on PATH: this agent is distributed through npm; install Node.js \
         (20 or newer) and npm, or pre-install the agent",
    )?;
    if find_on_path("node", path).is_none() {
        return Err("`node` was not found on PATH: this agent needs Node.js 20 or newer".into());
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
        .args(specs)
        .env_clear()
        .envs(env.iter().map(|(k, v)| (k, v)))
        .env("PATH", path)
        .current_dir(dest);
    let out = crate::supervisor::run_to_completion(cmd, NPM_TIMEOUT)
        .await
        .map_err(|e| e.to_string())?;
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        let tail: Vec<&str> = err.lines().rev().take(12).collect();
        let tail: Vec<&str> = tail.into_iter().rev().collect();
        return Err(format!(
            "npm install {} failed ({}): {}",
            specs.join(" "),
            out.status,
            tail.join("\n")
        ));
    }
    Ok(())
}

/// The bin an npm package installed under `prefix` provides: `bin` when named, else the
/// package's only bin (or the one named like the package).
pub fn npm_bin(prefix: &Path, package: &str, bin: Option<&str>) -> Result<PathBuf, String> {
    let bin_dir = prefix.join("node_modules/.bin");
    let name = match bin {
        Some(b) => b.to_string(),
        None => {
            let pkg_json = prefix
                .join("node_modules")
                .join(package)
                .join("package.json");
            let text = std::fs::read(&pkg_json)
                .map_err(|e| format!("cannot read {}: {e}", pkg_json.display()))?;
            let v: serde_json::Value = serde_json::from_slice(&text)
                .map_err(|e| format!("{}: {e}", pkg_json.display()))?;
            let base = package.rsplit('/').next().unwrap_or(package).to_string();
            match &v["bin"] {
                serde_json::Value::String(_) => base,
                serde_json::Value::Object(m) if m.len() == 1 => {
                    m.keys().next().cloned().unwrap_or(base)
                }
                serde_json::Value::Object(m) if m.contains_key(&base) => base,
                _ => {
                    return Err(format!(
                        "the npm package {package} has no single command to run"
                    ));
                }
            }
        }
    };
    let p = bin_dir.join(&name);
    if p.exists() {
        Ok(p)
    } else {
        Err(format!(
            "the npm package {package} did not install the command `{name}`"
        ))
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

/// A named temporary file removed on drop (the download buffer). Hand-made to keep `tempfile`
/// a dev-dependency.
pub mod tempfile_like {
    use std::io::Write;
    use std::path::{Path, PathBuf};

    pub struct TempFile {
        pub path: PathBuf,
        pub file: std::fs::File,
    }

    impl TempFile {
        pub fn new_in(dir: &Path) -> std::io::Result<TempFile> {
            std::fs::create_dir_all(dir)?;
            let path = dir.join(format!(
                ".download-{}-{}",
                std::process::id(),
                super::nonce()
            ));
            let file = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .create_new(true)
                .open(&path)?;
            Ok(TempFile { path, file })
        }
    }

    impl Write for TempFile {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.file.write(buf)
        }
        fn flush(&mut self) -> std::io::Result<()> {
            self.file.flush()
        }
    }

    impl Drop for TempFile {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn link_targets_are_resolved_lexically() {
        assert!(stays_inside(Path::new("a/b"), Path::new("../c")));
        assert!(!stays_inside(Path::new("a"), Path::new("../../etc/passwd")));
        assert!(!stays_inside(Path::new(""), Path::new("/etc/passwd")));
        assert!(safe_relative(Path::new("../x")).is_none());
        assert!(safe_relative(Path::new("/x")).is_none());
        assert_eq!(
            safe_relative(Path::new("./a/b")),
            Some(PathBuf::from("a/b"))
        );
    }

    #[test]
    fn archive_kinds_come_from_the_file_name() {
        assert_eq!(archive_kind("https://h/a.tar.gz?x=1"), ArchiveKind::TarGz);
        assert_eq!(archive_kind("https://h/a.tgz"), ArchiveKind::TarGz);
        assert_eq!(archive_kind("https://h/a.zip"), ArchiveKind::Zip);
        assert_eq!(archive_kind("https://h/a.tbz2"), ArchiveKind::TarBz2);
        assert_eq!(archive_kind("https://h/agent"), ArchiveKind::Raw);
    }
}
