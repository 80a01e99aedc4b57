//! Putting one agent on disk: streamed, size-capped, sha256-checked downloads; archive unpacking
//! that refuses anything escaping the target; npm installs into the agent's own prefix. Every
//! install is built in a staging directory and renamed into `<data-dir>/agents/<id>/<version>`,
//! so a failed or refused install leaves nothing behind and a reader never sees half an install.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::registry::error_chain;

mod download;
mod npm;
mod plan;
mod staging;
mod unpack;

pub use download::*;
pub use npm::*;
pub use plan::{Installer, LazyClient};
pub use staging::*;
pub use unpack::*;

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
    /// The HTTP client could not be built (`reason` names the cause: for `https://`, typically
    /// that no CA certificates were found, and where they were looked for).
    #[error("cannot set up the HTTP client: {reason}")]
    Client { reason: String },
    /// Neither the registry nor a pinned fallback can provide the agent; `note` says why the
    /// registry could not (empty when the agent has no registry entry).
    #[error("{}", if note.is_empty() { "no source to install from".to_string() } else { format!("{note}, and the agent has no pinned fallback") })]
    NoSource { note: String },
    #[error("version {asked} was asked for but the pinned fallback provides {provides}{}", if note.is_empty() { String::new() } else { format!(" ({note})") })]
    PinUnavailable {
        asked: String,
        provides: String,
        note: String,
    },
    #[error("refused: {url} comes without a sha256 and --require-checksums is set")]
    Unverified { url: String },
    #[error("npm installed no package")]
    NpmNoPackage,
    #[error("the command `{command}` of this user agent was not found")]
    UserCommandMissing { command: String },
    #[error(
        "user agents are not installed by sandbox-agent; the command `{command}` was not found"
    )]
    UserAgentNotInstalled { command: String },
    #[error("the install finished but its program is missing")]
    ProgramMissing,
    #[error("unpacking failed: {0}")]
    Task(#[from] tokio::task::JoinError),
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

/// One installed program, as the manifest keeps it (`http::wire::agents::Artifact` on the wire).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Artifact {
    /// `agent_process` (the ACP program) or `native_agent` (the CLI it drives).
    pub kind: String,
    pub path: PathBuf,
    pub version: String,
    pub source: String,
    /// For a downloaded binary: whether its sha256 was checked (`false`: the source gave none).
    /// Absent for npm installs (npm checks its own integrity).
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
    use sha2::{Digest, Sha256};
    use std::io::{Read, Seek};

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
    fn unpack_bytes(
        bytes: &[u8],
        name: &str,
    ) -> (tempfile::TempDir, Result<PathBuf, InstallError>) {
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
        let err = r.unwrap_err().to_string();
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
            let err = r.expect_err(name).to_string();
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
        let err = r.unwrap_err().to_string();
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
        let err = r.unwrap_err().to_string();
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
