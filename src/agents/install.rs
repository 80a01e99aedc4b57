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
/// Largest total an archive may unpack to: a small download must not fill the disk
/// (a decompression bomb).
pub const MAX_UNPACKED: u64 = 8 << 30;
/// An npm install that takes longer than this is killed.
const NPM_TIMEOUT: Duration = Duration::from_secs(15 * 60);

/// Everything putting an agent on disk can fail with.
#[derive(Debug, thiserror::Error)]
pub enum InstallError {
    #[error("cannot download {url}: {reason}")]
    Download { url: String, reason: String },
    #[error("{url} is larger than {limit} bytes")]
    TooLarge { url: String, limit: u64 },
    #[error(
        "checksum mismatch for {url}: expected sha256 {want}, got {got}; nothing was installed"
    )]
    Checksum {
        url: String,
        want: String,
        got: String,
    },
    /// The archive is malformed, or broke a safety rule or a limit (then the message says
    /// "refused").
    #[error("{0}")]
    Archive(#[from] crate::archive::ArchiveError),
    #[error("the command path `{cmd}` is not a relative path inside the archive")]
    BadCommand { cmd: String },
    #[error("the archive has no `{cmd}`")]
    MissingCommand { cmd: String },
    #[error("`{cmd}` in the archive is not a file inside the archive")]
    CommandOutside { cmd: String },
    #[error(
        "`npm` was not found on PATH: this agent is distributed through npm; install Node.js \
         (20 or newer) and npm, or pre-install the agent"
    )]
    NpmMissing,
    #[error("`node` was not found on PATH: this agent needs Node.js 20 or newer")]
    NodeMissing,
    #[error("npm install {specs} failed ({status}): {tail}")]
    NpmFailed {
        specs: String,
        status: String,
        tail: String,
    },
    #[error("the npm package {package} has no single command to run")]
    NpmNoCommand { package: String },
    #[error("the npm package {package} did not install the command `{name}`")]
    NpmCommandMissing { package: String, name: String },
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
}

/// The agents service reports install failures as text (`AgentError::InstallFailed`).
impl From<InstallError> for String {
    fn from(e: InstallError) -> String {
        e.to_string()
    }
}

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
    /// For a downloaded binary: whether its sha256 was checked (`false`: the source gave none).
    /// Absent for npm installs (npm checks its own integrity) and older manifests.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub verified: Option<bool>,
}

#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Artifact {
    /// `agent_process` (the ACP program) or `native_agent` (the CLI it drives).
    pub kind: String,
    #[schema(value_type = String)]
    pub path: PathBuf,
    pub version: String,
    pub source: String,
    /// See [`Manifest::verified`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub verified: Option<bool>,
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

    /// [`Self::write`] on the blocking pool (it fsyncs).
    pub async fn write_async(&self, agent_dir: &Path) -> std::io::Result<()> {
        let (m, dir) = (self.clone(), agent_dir.to_path_buf());
        tokio::task::spawn_blocking(move || m.write(&dir))
            .await
            .map_err(std::io::Error::other)?
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

    /// [`Self::new`] on the blocking pool.
    pub async fn new_async(agent_dir: &Path) -> std::io::Result<Staging> {
        let dir = agent_dir.to_path_buf();
        tokio::task::spawn_blocking(move || Staging::new(&dir))
            .await
            .map_err(std::io::Error::other)?
    }

    /// [`Self::commit`] on the blocking pool (renames and the removal of an older tree).
    pub async fn commit_async(&mut self, final_dir: &Path) -> std::io::Result<()> {
        let (staged, final_dir) = (self.path.clone(), final_dir.to_path_buf());
        tokio::task::spawn_blocking(move || commit_tree(&staged, &final_dir))
            .await
            .map_err(std::io::Error::other)??;
        self.keep = true;
        Ok(())
    }

    /// Removes the staging directory now (on the blocking pool) and waits for it, so that a
    /// failed install has left nothing behind by the time it is reported.
    pub async fn discard(mut self) {
        if self.keep {
            return;
        }
        self.keep = true;
        let path = std::mem::take(&mut self.path);
        let _ = tokio::task::spawn_blocking(move || crate::files::remove_dir_all(&path)).await;
    }

    /// Moves the staging directory to `final_dir` (replacing an older install of the same
    /// version): after this returns, `final_dir` is complete or untouched.
    pub fn commit(mut self, final_dir: &Path) -> std::io::Result<()> {
        commit_tree(&self.path, final_dir)?;
        self.keep = true;
        Ok(())
    }
}

/// Renames `staged` to `final_dir`, replacing (then removing) an older tree there.
fn commit_tree(staged: &Path, final_dir: &Path) -> std::io::Result<()> {
    {
        let parent = final_dir.parent().unwrap_or(Path::new("/"));
        let old = parent.join(format!(".old-{}-{}", std::process::id(), nonce()));
        let had_old = match std::fs::rename(final_dir, &old) {
            Ok(()) => true,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => false,
            Err(e) => return Err(e),
        };
        if let Err(e) = std::fs::rename(staged, final_dir) {
            if had_old {
                let _ = std::fs::rename(&old, final_dir);
            }
            return Err(e);
        }
        if had_old {
            let _ = crate::files::remove_dir_all(&old);
        }
        Ok(())
    }
}

impl Drop for Staging {
    fn drop(&mut self) {
        if !self.keep {
            remove_tree_off_thread(std::mem::take(&mut self.path));
        }
    }
}

/// Removes a tree, on the blocking pool when called from inside a runtime (a `Drop` on the
/// runtime thread must not walk a directory tree), inline otherwise.
fn remove_tree_off_thread(path: PathBuf) {
    if path.as_os_str().is_empty() {
        return;
    }
    match tokio::runtime::Handle::try_current() {
        Ok(h) => {
            h.spawn_blocking(move || {
                let _ = crate::files::remove_dir_all(&path);
            });
        }
        Err(_) => {
            let _ = crate::files::remove_dir_all(&path);
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
) -> Result<tempfile_like::TempFile, InstallError> {
    let dir_owned = dir.to_path_buf();
    let file = tokio::task::spawn_blocking(move || tempfile_like::TempFile::new_in(&dir_owned))
        .await
        .map_err(join_error)?
        .map_err(|source| InstallError::Io {
            what: format!("cannot create a temporary file in {}", dir.display()),
            source,
        })?;
    let hasher = Sha256::new();
    let (file, hasher) = if let Some(path) = url.strip_prefix("file://") {
        // Reading, hashing and copying a local file is blocking work, and the daemon runs every
        // task on one thread: do it on the blocking pool so that requests go on meanwhile.
        let path = path.to_string();
        tokio::task::spawn_blocking(move || copy_local(&path, file, hasher))
            .await
            .map_err(join_error)??
    } else {
        download_http(client, url, file, hasher, progress).await?
    };
    let want = sha256.map(str::to_string);
    let url_owned = url.to_string();
    // Flushing and hashing the tail are blocking/CPU work; on failure the temporary file is
    // dropped (removed) there too.
    tokio::task::spawn_blocking(move || {
        let mut file = file;
        file.flush().map_err(write_error)?;
        if let Some(want) = want {
            let got = hex(&hasher.finalize());
            if !got.eq_ignore_ascii_case(want.trim()) {
                return Err(InstallError::Checksum {
                    url: url_owned,
                    want,
                    got,
                });
            }
        }
        Ok(file)
    })
    .await
    .map_err(join_error)?
}

/// A blocking step that did not finish: a panic goes on unwinding (the edge answers a plain 500);
/// a cancelled step is reported without internals.
fn join_error(e: tokio::task::JoinError) -> InstallError {
    if e.is_panic() {
        std::panic::resume_unwind(e.into_panic());
    }
    tracing::warn!(error = %e, "a blocking step of the install was cancelled");
    InstallError::Io {
        what: "a blocking step of the install failed".into(),
        source: std::io::Error::other("see the daemon's log"),
    }
}

fn write_error(source: std::io::Error) -> InstallError {
    InstallError::Io {
        what: "cannot write the download".into(),
        source,
    }
}

/// Received bytes are written (and hashed) in batches of this size, each by one blocking step.
const DOWNLOAD_BATCH: usize = 1 << 20;

/// The http(s) branch of [`download`]: the async side receives, the blocking pool hashes and
/// writes each batch; the runtime thread never makes a file syscall.
async fn download_http(
    client: &reqwest::Client,
    url: &str,
    file: tempfile_like::TempFile,
    hasher: Sha256,
    progress: &dyn Progress,
) -> Result<(tempfile_like::TempFile, Sha256), InstallError> {
    use futures_util::StreamExt;

    // Whoever holds the file on an early return drops it off the runtime thread.
    struct Held(Option<(tempfile_like::TempFile, Sha256)>);
    impl Drop for Held {
        fn drop(&mut self) {
            if let Some(v) = self.0.take() {
                tokio::task::spawn_blocking(move || drop(v));
            }
        }
    }
    let mut held = Held(Some((file, hasher)));
    let flush = |held: &mut Held, buf: Vec<u8>| {
        let taken = held.0.take();
        async move {
            let (mut file, mut hasher) = taken.ok_or_else(abandoned)?;
            tokio::task::spawn_blocking(move || {
                hasher.update(&buf);
                file.write_all(&buf).map_err(write_error)?;
                Ok::<_, InstallError>((file, hasher))
            })
            .await
            .map_err(join_error)?
        }
    };
    let mut done: u64 = 0;
    let resp = client
        .get(url)
        .send()
        .await
        .map_err(|e| InstallError::Download {
            url: url.to_string(),
            reason: error_chain(&e),
        })?;
    if !resp.status().is_success() {
        return Err(InstallError::Download {
            url: url.to_string(),
            reason: format!("the server answered {}", resp.status()),
        });
    }
    let too_large = || InstallError::TooLarge {
        url: url.to_string(),
        limit: MAX_DOWNLOAD,
    };
    let total = resp.content_length();
    if total.is_some_and(|t| t > MAX_DOWNLOAD) {
        return Err(too_large());
    }
    let mut stream = resp.bytes_stream();
    let mut buf: Vec<u8> = Vec::new();
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(|e| InstallError::Download {
            url: url.to_string(),
            reason: error_chain(&e),
        })?;
        done += chunk.len() as u64;
        if done > MAX_DOWNLOAD {
            return Err(too_large());
        }
        buf.extend_from_slice(&chunk);
        if buf.len() >= DOWNLOAD_BATCH {
            let batch = std::mem::take(&mut buf);
            held.0 = Some(flush(&mut held, batch).await?);
        }
        progress.download(done, total);
    }
    if !buf.is_empty() {
        held.0 = Some(flush(&mut held, buf).await?);
    }
    progress.download_done();
    held.0.take().ok_or_else(abandoned)
}

fn abandoned() -> InstallError {
    InstallError::Io {
        what: "the download was abandoned".into(),
        source: std::io::Error::other("no file"),
    }
}

/// The `file://` branch of `download`: copies `path` into `file`, hashing it, within the size cap.
fn copy_local(
    path: &str,
    mut file: tempfile_like::TempFile,
    mut hasher: Sha256,
) -> Result<(tempfile_like::TempFile, Sha256), InstallError> {
    let mut src = std::fs::File::open(path).map_err(|source| InstallError::Io {
        what: format!("cannot open {path}"),
        source,
    })?;
    let mut buf = vec![0u8; 64 * 1024];
    let mut done: u64 = 0;
    loop {
        let n = src.read(&mut buf).map_err(|source| InstallError::Io {
            what: format!("cannot read {path}"),
            source,
        })?;
        if n == 0 {
            return Ok((file, hasher));
        }
        done += n as u64;
        if done > MAX_DOWNLOAD {
            return Err(InstallError::TooLarge {
                url: format!("file://{path}"),
                limit: MAX_DOWNLOAD,
            });
        }
        hasher.update(&buf[..n]);
        file.write_all(&buf[..n]).map_err(write_error)?;
    }
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

/// Most entries an agent archive may hold.
const MAX_ENTRIES: u64 = 1_000_000;

/// Unpacks (or, for a raw binary, copies) `file` into `dest` (an empty staging directory) with
/// the rules of [`crate::archive`], then returns the path of `cmd` inside it, made executable.
/// The caller drops the staging directory on error.
pub fn unpack(
    file: &mut std::fs::File,
    url: &str,
    cmd: &str,
    dest: &Path,
) -> Result<PathBuf, InstallError> {
    use crate::archive::{self, Compression};
    let io = |what: &str| {
        let what = what.to_string();
        move |source: std::io::Error| InstallError::Io { what, source }
    };
    file.rewind().map_err(io("cannot read the download"))?;
    let rel_cmd = safe_relative(Path::new(cmd)).ok_or_else(|| InstallError::BadCommand {
        cmd: cmd.to_string(),
    })?;
    let root = nix::fcntl::open(
        dest,
        nix::fcntl::OFlag::O_RDONLY | nix::fcntl::OFlag::O_DIRECTORY | nix::fcntl::OFlag::O_CLOEXEC,
        nix::sys::stat::Mode::empty(),
    )
    .map_err(|e| InstallError::Io {
        what: format!("cannot open {}", dest.display()),
        source: e.into(),
    })?;
    let limits = archive::Limits {
        bytes: Some(MAX_UNPACKED),
        entries: MAX_ENTRIES,
        listed: 0,
    };
    match archive_kind(url) {
        ArchiveKind::TarGz => {
            archive::extract_tar(&mut *file, Compression::Gzip, &root, limits, None)?;
        }
        ArchiveKind::Tar => {
            archive::extract_tar(&mut *file, Compression::None, &root, limits, None)?;
        }
        ArchiveKind::TarBz2 => {
            archive::extract_tar(&mut *file, Compression::Bzip2, &root, limits, None)?;
        }
        ArchiveKind::Zip => {
            archive::extract_zip(&mut *file, &root, limits, None)?;
        }
        ArchiveKind::Raw => {
            let target = dest.join(&rel_cmd);
            if let Some(parent) = target.parent() {
                std::fs::create_dir_all(parent).map_err(io("cannot create the install"))?;
            }
            let mut out =
                std::fs::File::create(&target).map_err(io("cannot create the install"))?;
            std::io::copy(file, &mut out).map_err(io("cannot copy the download"))?;
        }
    }
    let program = dest.join(&rel_cmd);
    let missing = || InstallError::MissingCommand {
        cmd: cmd.to_string(),
    };
    let meta = std::fs::symlink_metadata(&program).map_err(|_| missing())?;
    // The command itself may be a symlink inside the archive; it must still point inside.
    let real = program.canonicalize().map_err(|_| missing())?;
    let real_dest = dest
        .canonicalize()
        .map_err(io("cannot resolve the install"))?;
    if !real.starts_with(&real_dest) || !real.is_file() {
        return Err(InstallError::CommandOutside {
            cmd: cmd.to_string(),
        });
    }
    if meta.is_file() {
        use std::os::unix::fs::PermissionsExt;
        let mut perm = meta.permissions();
        perm.set_mode(perm.mode() | 0o755);
        std::fs::set_permissions(&program, perm)
            .map_err(io("cannot make the command executable"))?;
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

    struct Quiet;
    impl Progress for Quiet {
        fn step(&self, _: &str) {}
    }

    #[tokio::test]
    async fn file_urls_are_copied_and_checked() {
        let dir = tempfile::tempdir().unwrap();
        let src = dir.path().join("agent.bin");
        std::fs::write(&src, b"hello agent").unwrap();
        let url = format!("file://{}", src.display());
        let dl = dir.path().join("dl");
        crate::install_crypto_provider();
        let client = reqwest::Client::new();
        let sha = hex(&Sha256::digest(b"hello agent"));
        let mut got = download(&client, &url, Some(&sha), &dl, &Quiet)
            .await
            .unwrap();
        let mut text = String::new();
        got.file.seek(std::io::SeekFrom::Start(0)).unwrap();
        got.file.read_to_string(&mut text).unwrap();
        assert_eq!(text, "hello agent");
        drop(got);
        let bad = download(&client, &url, Some(&"0".repeat(64)), &dl, &Quiet).await;
        assert!(matches!(bad, Err(InstallError::Checksum { .. })));
        let missing = format!("file://{}", dir.path().join("nope").display());
        let err = download(&client, &missing, None, &dl, &Quiet).await;
        assert!(err.err().unwrap().to_string().contains("cannot open"));
        // Neither a failure nor a dropped download leaves a temporary file behind.
        assert_eq!(std::fs::read_dir(&dl).unwrap().count(), 0);
    }

    #[test]
    fn command_paths_are_relative_and_stay_inside() {
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
        assert_eq!(archive_kind("https://h/a.tar.bz2"), ArchiveKind::TarBz2);
        assert_eq!(archive_kind("https://h/a.tbz2"), ArchiveKind::TarBz2);
        assert_eq!(archive_kind("https://h/a.tar"), ArchiveKind::Tar);
        assert_eq!(archive_kind("https://h/agent"), ArchiveKind::Raw);
    }

    enum Z<'a> {
        File(&'a str, &'a [u8], u32),
        Dir(&'a str),
        Link(&'a str, &'a str),
    }

    fn zip_bytes(items: &[Z]) -> Vec<u8> {
        use zip::write::SimpleFileOptions;
        let mut w = zip::ZipWriter::new(std::io::Cursor::new(Vec::new()));
        let opts =
            SimpleFileOptions::default().compression_method(zip::CompressionMethod::Deflated);
        for item in items {
            match item {
                Z::File(name, data, mode) => {
                    w.start_file(*name, opts.unix_permissions(*mode)).unwrap();
                    w.write_all(data).unwrap();
                }
                Z::Dir(name) => w.add_directory(*name, opts).unwrap(),
                Z::Link(name, target) => w.add_symlink(*name, *target, opts).unwrap(),
            }
        }
        w.finish().unwrap().into_inner()
    }

    /// Writes `bytes` to a file and unpacks it as `name` into a fresh directory.
    fn unpack_bytes(bytes: &[u8], name: &str) -> (tempfile::TempDir, Result<PathBuf, String>) {
        let tmp = tempfile::tempdir().unwrap();
        let archive = tmp.path().join(name);
        std::fs::write(&archive, bytes).unwrap();
        let dest = tmp.path().join("dest");
        std::fs::create_dir(&dest).unwrap();
        let mut f = std::fs::File::open(&archive).unwrap();
        let r = unpack(&mut f, &format!("https://h/{name}"), "pkg/bin/agent", &dest)
            .map_err(|e| e.to_string());
        (tmp, r)
    }

    #[test]
    fn tar_declaring_more_than_the_unpack_cap_is_refused_before_writing() {
        // A header that claims 9 GiB (the data need not follow: the check comes first).
        let mut header = tar::Header::new_gnu();
        header.set_path("pkg/bin/agent").unwrap();
        header.set_size(9 << 30);
        header.set_mode(0o755);
        header.set_entry_type(tar::EntryType::Regular);
        header.set_cksum();
        let mut bytes = header.as_bytes().to_vec();
        bytes.extend_from_slice(&[0u8; 1024]);
        let (tmp, r) = unpack_bytes(&bytes, "bomb.tar");
        let err = r.unwrap_err();
        assert!(err.contains("unpacks to more than"), "{err}");
        assert!(!tmp.path().join("dest/pkg/bin/agent").exists());
    }

    fn mode_of(p: &Path) -> u32 {
        use std::os::unix::fs::PermissionsExt;
        std::fs::symlink_metadata(p).unwrap().permissions().mode() & 0o7777
    }

    #[test]
    fn zip_unpacks_files_modes_dirs_and_inner_links() {
        let bytes = zip_bytes(&[
            Z::Dir("pkg/"),
            Z::File("pkg/bin/agent", b"#!/bin/sh\n", 0o755),
            Z::File("pkg/lib/helper", b"x", 0o750),
            Z::File("pkg/README", b"hello", 0o644),
            Z::Link("pkg/bin/alias", "agent"),
            Z::Link("pkg/docs", "../pkg/lib"),
        ]);
        let (tmp, r) = unpack_bytes(&bytes, "a.zip");
        let dest = tmp.path().join("dest");
        assert_eq!(r.unwrap(), dest.join("pkg/bin/agent"));
        assert_eq!(mode_of(&dest.join("pkg/bin/agent")), 0o755);
        assert_eq!(mode_of(&dest.join("pkg/lib/helper")), 0o750);
        assert_eq!(mode_of(&dest.join("pkg/README")), 0o644);
        assert_eq!(std::fs::read(dest.join("pkg/README")).unwrap(), b"hello");
        assert_eq!(
            std::fs::read_link(dest.join("pkg/bin/alias")).unwrap(),
            PathBuf::from("agent")
        );
        assert_eq!(std::fs::read(dest.join("pkg/docs/helper")).unwrap(), b"x");
    }

    #[test]
    fn hostile_zip_entries_are_refused() {
        let outside = tempfile::tempdir().unwrap();
        let abs = outside.path().join("abs");
        let abs = abs.to_str().unwrap();
        let script: &[u8] = b"#!/bin/sh\n";
        let cases: Vec<(&str, &str, Vec<u8>)> = vec![
            (
                "dotdot",
                "`..` components are refused",
                zip_bytes(&[
                    Z::File("pkg/bin/agent", script, 0o755),
                    Z::File("../x", b"x", 0o644),
                ]),
            ),
            (
                "absolute",
                "absolute paths are refused",
                zip_bytes(&[
                    Z::File("pkg/bin/agent", script, 0o755),
                    Z::File(abs, b"x", 0o644),
                ]),
            ),
            (
                "linkout",
                "absolute symlink targets are refused",
                zip_bytes(&[
                    Z::File("pkg/bin/agent", script, 0o755),
                    Z::Link("pkg/out", outside.path().to_str().unwrap()),
                ]),
            ),
            (
                "linkup",
                "its symlink target leaves the destination",
                zip_bytes(&[
                    Z::File("pkg/bin/agent", script, 0o755),
                    Z::Link("pkg/up", "../../etc"),
                ]),
            ),
            // Each link stays inside on its own; followed together they climb out.
            (
                "chain",
                "its symlink target leaves the destination",
                zip_bytes(&[
                    Z::File("pkg/bin/agent", script, 0o755),
                    Z::Link("pkg/a", ".."),
                    Z::Link("pkg/b", "a/../.."),
                ]),
            ),
            // A file written through an (inside) link is refused: links are never traversed.
            (
                "through",
                "its path crosses a symlink",
                zip_bytes(&[
                    Z::File("pkg/bin/agent", script, 0o755),
                    Z::Link("pkg/l", "bin"),
                    Z::File("pkg/l/x", b"x", 0o644),
                ]),
            ),
        ];
        for (name, why, bytes) in cases {
            let (tmp, r) = unpack_bytes(&bytes, "a.zip");
            let err = r.expect_err(name);
            assert!(
                err.contains("refused") && err.contains(why),
                "{name}: {err}"
            );
            assert!(!tmp.path().join("x").exists(), "{name}");
        }
        assert!(!Path::new(abs).exists());
    }

    #[test]
    fn zip_device_nodes_are_refused() {
        let mut bytes = zip_bytes(&[
            Z::File("pkg/bin/agent", b"#!/bin/sh\n", 0o755),
            Z::File("pkg/null", b"", 0o666),
        ]);
        // Mark the last central-directory entry a character device: the high 16 bits of its
        // external attributes (offset 38) hold the unix mode.
        let cd = bytes.windows(4).rposition(|w| w == b"PK\x01\x02").unwrap();
        bytes[cd + 38..cd + 42].copy_from_slice(&((0o020_666u32) << 16).to_le_bytes());
        let (_tmp, r) = unpack_bytes(&bytes, "a.zip");
        let err = r.unwrap_err();
        assert!(err.contains("refused") && err.contains("special"), "{err}");
    }

    #[test]
    fn zip_entries_in_other_compression_methods_fail_clearly() {
        use zip::write::SimpleFileOptions;
        let mut w = zip::ZipWriter::new(std::io::Cursor::new(Vec::new()));
        let opts = SimpleFileOptions::default()
            .compression_method(zip::CompressionMethod::Stored)
            .unix_permissions(0o755);
        w.start_file("pkg/bin/agent", opts).unwrap();
        w.write_all(b"#!/bin/sh\n").unwrap();
        let mut bytes = w.finish().unwrap().into_inner();
        // Claim bzip2 (method 12) in the local and central headers.
        let local = bytes.windows(4).position(|w| w == b"PK\x03\x04").unwrap();
        bytes[local + 8..local + 10].copy_from_slice(&12u16.to_le_bytes());
        let cd = bytes.windows(4).position(|w| w == b"PK\x01\x02").unwrap();
        bytes[cd + 10..cd + 12].copy_from_slice(&12u16.to_le_bytes());
        let (tmp, r) = unpack_bytes(&bytes, "a.zip");
        let err = r.unwrap_err();
        assert!(err.to_lowercase().contains("zip"), "{err}");
        assert!(!tmp.path().join("dest/pkg/bin/agent").exists());
    }

    #[test]
    fn tar_bz2_unpacks_with_modes() {
        let mut b = tar::Builder::new(bzip2::write::BzEncoder::new(
            Vec::new(),
            bzip2::Compression::fast(),
        ));
        let mut h = tar::Header::new_gnu();
        let data = b"#!/bin/sh\n";
        h.set_size(data.len() as u64);
        h.set_mode(0o755);
        b.append_data(&mut h, "pkg/bin/agent", &data[..]).unwrap();
        let bytes = b.into_inner().unwrap().finish().unwrap();
        for name in ["a.tar.bz2", "a.tbz2"] {
            let (tmp, r) = unpack_bytes(&bytes, name);
            let program = r.unwrap();
            assert_eq!(program, tmp.path().join("dest/pkg/bin/agent"));
            assert_eq!(std::fs::read(&program).unwrap(), data);
            assert_eq!(mode_of(&program) & 0o111, 0o111);
        }
        // Not bzip2 data under a bzip2 name: a clear error, not a panic.
        let (_tmp, r) = unpack_bytes(b"not bzip2", "a.tar.bz2");
        assert!(r.is_err());
    }
}
