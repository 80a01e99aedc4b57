//! Unpacking a downloaded artifact by its kind (tar, tar.gz, tar.bz2, zip, or a raw binary) into the
//! staging directory, refusing any entry that would land outside it.

use std::io::Seek;
use std::path::{Component, Path, PathBuf};

use super::*;

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
pub(super) const MAX_ENTRIES: u64 = 1_000_000;

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
pub(super) fn safe_relative(p: &Path) -> Option<PathBuf> {
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
