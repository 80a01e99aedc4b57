//! Putting one agent on disk: streamed, size-capped, sha256-checked downloads; archive unpacking
//! that refuses anything escaping the target; npm installs into the agent's own prefix. Every
//! install is built in a staging directory and renamed into `<data-dir>/agents/<id>/<version>`,
//! so a failed or refused install leaves nothing behind and a reader never sees half an install.

use std::collections::BTreeMap;
use std::io::{Read, Seek, Write};
use std::os::unix::ffi::OsStringExt;
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
    if let Some(path) = url.strip_prefix("file://") {
        // Reading, hashing and copying a local file is blocking work, and the daemon runs every
        // task on one thread: do it on the blocking pool so that requests go on meanwhile.
        let path = path.to_string();
        (file, hasher) = tokio::task::spawn_blocking(move || copy_local(&path, file, hasher))
            .await
            .unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic()))?;
    } else {
        let mut done: u64 = 0;
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

/// The `file://` branch of `download`: copies `path` into `file`, hashing it, within the size cap.
fn copy_local(
    path: &str,
    mut file: tempfile_like::TempFile,
    mut hasher: Sha256,
) -> Result<(tempfile_like::TempFile, Sha256), String> {
    let mut src = std::fs::File::open(path).map_err(|e| format!("cannot open {path}: {e}"))?;
    let mut buf = vec![0u8; 64 * 1024];
    let mut done: u64 = 0;
    loop {
        let n = src
            .read(&mut buf)
            .map_err(|e| format!("cannot read {path}: {e}"))?;
        if n == 0 {
            return Ok((file, hasher));
        }
        done += n as u64;
        if done > MAX_DOWNLOAD {
            return Err(format!("file://{path} is larger than {MAX_DOWNLOAD} bytes"));
        }
        hasher.update(&buf[..n]);
        file.write_all(&buf[..n])
            .map_err(|e| format!("cannot write the download: {e}"))?;
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

/// Unpacks (or, for a raw binary, copies) `file` into `dest`, then returns the path of `cmd`
/// inside it, made executable. Refuses absolute paths, `..`, links leaving `dest` (checked per
/// entry, then again on the unpacked tree so chains of links cannot escape either) and device
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
        ArchiveKind::TarBz2 => unpack_tar(bzip2::read::MultiBzDecoder::new(file), dest)?,
        ArchiveKind::Zip => unpack_zip(file, dest)?,
        ArchiveKind::Raw => {
            let target = dest.join(&rel_cmd);
            if let Some(parent) = target.parent() {
                std::fs::create_dir_all(parent).map_err(|e| e.to_string())?;
            }
            let mut out = std::fs::File::create(&target).map_err(|e| e.to_string())?;
            std::io::copy(file, &mut out).map_err(|e| e.to_string())?;
        }
    }
    check_links(dest, dest)?;
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
    let mut unpacked: u64 = 0;
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
        // The header's size is what tar reads for this entry, so the sum is the unpacked total.
        unpacked = unpacked.saturating_add(entry.header().size().unwrap_or(0));
        if unpacked > MAX_UNPACKED {
            return Err(format!(
                "refused: the archive unpacks to more than {MAX_UNPACKED} bytes"
            ));
        }
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

/// The file-type bits of a unix mode (`S_IFMT`) and the types a zip entry may carry.
const S_IFMT: u32 = 0o170_000;
const S_IFREG: u32 = 0o100_000;
const S_IFDIR: u32 = 0o040_000;
const S_IFLNK: u32 = 0o120_000;
/// Zip symlinks store their target as the entry's data; longer targets are refused.
const MAX_LINK_TARGET: u64 = 4096;

/// Unpacks a zip archive. The zip format keeps its index at the end, so this reads the (seekable)
/// downloaded file in place rather than a stream; entry data is still copied in chunks.
fn unpack_zip(file: &mut std::fs::File, dest: &Path) -> Result<(), String> {
    let mut archive = zip::ZipArchive::new(std::io::BufReader::new(file))
        .map_err(|e| format!("cannot read the zip archive: {e}"))?;
    let mut unpacked: u64 = 0;
    for i in 0..archive.len() {
        let mut entry = archive
            .by_index(i)
            .map_err(|e| format!("cannot read the zip archive: {e}"))?;
        let name = entry.name().to_string();
        let raw_path = Path::new(&name);
        let Some(rel) = safe_relative(raw_path) else {
            if raw_path.components().all(|c| c == Component::CurDir) {
                continue;
            }
            return Err(format!(
                "refused: the archive entry `{name}` is an absolute path or climbs out with `..`"
            ));
        };
        let mode = entry.unix_mode();
        let kind = match mode.map(|m| m & S_IFMT) {
            Some(S_IFLNK) => S_IFLNK,
            Some(S_IFDIR) => S_IFDIR,
            // Archives made without unix attributes carry no type: the trailing `/` decides.
            None | Some(0) | Some(S_IFREG) if entry.is_dir() => S_IFDIR,
            None | Some(0) | Some(S_IFREG) => S_IFREG,
            Some(other) => {
                return Err(format!(
                    "refused: the archive entry `{name}` has file type {other:o} (device nodes, \
                     fifos and other special files are not installed)"
                ));
            }
        };
        make_dirs_inside(dest, rel.parent().unwrap_or(Path::new("")), &name)?;
        let target = dest.join(&rel);
        match kind {
            S_IFDIR => make_dirs_inside(dest, &rel, &name)?,
            S_IFLNK => {
                let mut link = Vec::new();
                (&mut entry)
                    .take(MAX_LINK_TARGET + 1)
                    .read_to_end(&mut link)
                    .map_err(|e| format!("cannot unpack `{name}`: {e}"))?;
                if link.is_empty() || link.len() as u64 > MAX_LINK_TARGET {
                    return Err(format!(
                        "refused: the link `{name}` has an empty or oversized target"
                    ));
                }
                let link = PathBuf::from(std::ffi::OsString::from_vec(link));
                if !stays_inside(rel.parent().unwrap_or(Path::new("")), &link) {
                    return Err(format!(
                        "refused: the link `{name}` points outside the archive (`{}`)",
                        link.display()
                    ));
                }
                remove_non_dir(&target, &name)?;
                std::os::unix::fs::symlink(&link, &target)
                    .map_err(|e| format!("cannot unpack `{name}`: {e}"))?;
            }
            _ => {
                use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
                // Only the permission bits: no setuid/setgid/sticky from an archive.
                let perm = mode.map(|m| m & 0o777).filter(|m| *m != 0).unwrap_or(0o644);
                remove_non_dir(&target, &name)?;
                let mut out = std::fs::OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .mode(perm)
                    .open(&target)
                    .map_err(|e| format!("cannot unpack `{name}`: {e}"))?;
                // Count what really comes out, not what the entry declares.
                let budget = MAX_UNPACKED - unpacked;
                let written = std::io::copy(&mut (&mut entry).take(budget + 1), &mut out)
                    .map_err(|e| format!("cannot unpack `{name}`: {e}"))?;
                unpacked += written;
                if written > budget {
                    return Err(format!(
                        "refused: the archive unpacks to more than {MAX_UNPACKED} bytes"
                    ));
                }
                // `mode` above is filtered by the umask; the archive's bits are wanted as-is.
                std::fs::set_permissions(&target, std::fs::Permissions::from_mode(perm))
                    .map_err(|e| format!("cannot unpack `{name}`: {e}"))?;
            }
        }
    }
    Ok(())
}

/// Creates `dest/rel` directory by directory, refusing to pass through anything that is not a
/// real directory: an entry is never written through a link, so no link can carry it outside.
fn make_dirs_inside(dest: &Path, rel: &Path, shown: &str) -> Result<(), String> {
    let mut at = dest.to_path_buf();
    for c in rel.components() {
        at.push(c);
        match std::fs::symlink_metadata(&at) {
            Ok(m) if m.is_dir() => {}
            Ok(_) => {
                return Err(format!(
                    "refused: the archive entry `{shown}` would be written through a link or \
                     file"
                ));
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                std::fs::create_dir(&at).map_err(|e| format!("cannot unpack `{shown}`: {e}"))?
            }
            Err(e) => return Err(format!("cannot unpack `{shown}`: {e}")),
        }
    }
    Ok(())
}

/// A later entry replaces an earlier file or link of the same name (as with tar); never a
/// directory.
fn remove_non_dir(path: &Path, shown: &str) -> Result<(), String> {
    match std::fs::symlink_metadata(path) {
        Ok(m) if m.is_dir() => Err(format!(
            "refused: the archive entry `{shown}` would replace a directory"
        )),
        Ok(_) => std::fs::remove_file(path).map_err(|e| format!("cannot unpack `{shown}`: {e}")),
        Err(_) => Ok(()),
    }
}

/// Checks every symlink below `dir` (a subtree of `root`) once everything is unpacked: each
/// link is followed through the links it meets, so a chain such as `a -> ..`,
/// `b -> a/..` that passes the per-entry check is refused too.
fn check_links(root: &Path, dir: &Path) -> Result<(), String> {
    let entries = std::fs::read_dir(dir).map_err(|e| format!("cannot check the install: {e}"))?;
    for e in entries {
        let e = e.map_err(|e| format!("cannot check the install: {e}"))?;
        let ft = e
            .file_type()
            .map_err(|e| format!("cannot check the install: {e}"))?;
        let path = e.path();
        if ft.is_dir() {
            check_links(root, &path)?;
        } else if ft.is_symlink() {
            let rel = path.strip_prefix(root).unwrap_or(&path);
            if !resolves_inside(root, rel) {
                return Err(format!(
                    "refused: the link `{}` leads outside the archive",
                    rel.display()
                ));
            }
        }
    }
    Ok(())
}

/// Whether `root/rel`, following every symlink on the way (at most 40), stays inside `root`.
/// Missing components are taken lexically, as the kernel would once they exist.
fn resolves_inside(root: &Path, rel: &Path) -> bool {
    use std::ffi::OsString;
    // Pending components, last one first; `..` cannot be a normal name, so it marks a parent.
    fn push_rev(todo: &mut Vec<OsString>, p: &Path) -> bool {
        for c in p.components().rev() {
            match c {
                Component::Normal(s) => todo.push(s.to_owned()),
                Component::ParentDir => todo.push("..".into()),
                Component::CurDir => {}
                Component::RootDir | Component::Prefix(_) => return false,
            }
        }
        true
    }
    let mut todo = Vec::new();
    if !push_rev(&mut todo, rel) {
        return false;
    }
    let mut at: Vec<OsString> = Vec::new();
    let mut hops = 0;
    while let Some(c) = todo.pop() {
        if c == ".." {
            if at.pop().is_none() {
                return false;
            }
            continue;
        }
        at.push(c);
        let path: PathBuf = std::iter::once(root.as_os_str())
            .chain(at.iter().map(|s| s.as_os_str()))
            .collect();
        if std::fs::symlink_metadata(&path).is_ok_and(|m| m.file_type().is_symlink()) {
            hops += 1;
            let Ok(target) = std::fs::read_link(&path) else {
                return false;
            };
            at.pop();
            if hops > 40 || !push_rev(&mut todo, &target) {
                return false;
            }
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
        assert!(bad.err().unwrap().contains("checksum mismatch"));
        let missing = format!("file://{}", dir.path().join("nope").display());
        let err = download(&client, &missing, None, &dl, &Quiet).await;
        assert!(err.err().unwrap().contains("cannot open"));
        // Neither a failure nor a dropped download leaves a temporary file behind.
        assert_eq!(std::fs::read_dir(&dl).unwrap().count(), 0);
    }

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
        let r = unpack(&mut f, &format!("https://h/{name}"), "pkg/bin/agent", &dest);
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
                "climbs out",
                zip_bytes(&[
                    Z::File("pkg/bin/agent", script, 0o755),
                    Z::File("../x", b"x", 0o644),
                ]),
            ),
            (
                "absolute",
                "absolute path",
                zip_bytes(&[
                    Z::File("pkg/bin/agent", script, 0o755),
                    Z::File(abs, b"x", 0o644),
                ]),
            ),
            (
                "linkout",
                "points outside",
                zip_bytes(&[
                    Z::File("pkg/bin/agent", script, 0o755),
                    Z::Link("pkg/out", outside.path().to_str().unwrap()),
                ]),
            ),
            (
                "linkup",
                "points outside",
                zip_bytes(&[
                    Z::File("pkg/bin/agent", script, 0o755),
                    Z::Link("pkg/up", "../../etc"),
                ]),
            ),
            // Each link stays inside on its own; followed together they climb out.
            (
                "chain",
                "leads outside",
                zip_bytes(&[
                    Z::File("pkg/bin/agent", script, 0o755),
                    Z::Link("pkg/a", ".."),
                    Z::Link("pkg/b", "a/../.."),
                ]),
            ),
            // A file written through an (inside) link is refused: links are never traversed.
            (
                "through",
                "written through",
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
        assert!(err.contains("zip"), "{err}");
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

    #[test]
    fn link_chains_are_followed_when_checking() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path();
        std::fs::create_dir_all(root.join("x/y")).unwrap();
        std::os::unix::fs::symlink("..", root.join("x/up")).unwrap();
        std::os::unix::fs::symlink("up/..", root.join("x/bad")).unwrap();
        std::os::unix::fs::symlink("../up", root.join("x/y/ok")).unwrap();
        std::os::unix::fs::symlink("loop", root.join("loop")).unwrap();
        assert!(resolves_inside(root, Path::new("x/up")));
        assert!(resolves_inside(root, Path::new("x/y/ok")));
        assert!(resolves_inside(root, Path::new("x/y/ok/x/y")));
        assert!(!resolves_inside(root, Path::new("x/up/..")));
        assert!(!resolves_inside(root, Path::new("x/bad")));
        assert!(
            check_links(root, root)
                .unwrap_err()
                .contains("leads outside")
        );
        assert!(!resolves_inside(root, Path::new("loop")));
        assert!(resolves_inside(root, Path::new("missing/../x")));
    }
}
