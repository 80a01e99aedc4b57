//! What an agent may use: the configured limits, the rlimits that stand in for a memory cgroup
//! that is missing, and the user an agent runs as. RLIMIT_AS and RLIMIT_NPROC are never used: the
//! first breaks Node (it reserves large address ranges), the second counts the whole user.

use std::path::PathBuf;

use nix::sys::resource::Resource;
use nix::unistd::{Gid, Uid, User};

use crate::config::Config;

/// Which limits took effect in an agent's cgroup (what `cgroup/` read back); the rest fall
/// back to rlimits. Declared here, beside the limits, so that `cgroup/` depends on this module
/// and not the other way round.
#[derive(Debug, Default, Clone, Copy)]
pub struct Applied {
    pub memory: bool,
    pub pids: bool,
    pub cpu: bool,
}

/// The per-agent limits from the config (`None`: unlimited).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Limits {
    pub memory_max: Option<u64>,
    pub pids_max: Option<u64>,
    /// In cores (1.5 = one and a half CPUs).
    pub cpu_max: Option<f64>,
}

impl Limits {
    pub fn from_config(config: &Config) -> Self {
        Limits {
            memory_max: config.agent_memory_max,
            pids_max: config.agent_pids_max,
            cpu_max: config.agent_cpu_max,
        }
    }

    /// rlimits for what the cgroup did not enforce. Only memory has a per-process stand-in
    /// (RLIMIT_DATA: heap and private writable mappings, not address space reservations).
    pub fn fallback_rlimits(&self, applied: Applied) -> Vec<(Resource, u64)> {
        let mut out = Vec::new();
        if let Some(max) = self.memory_max
            && !applied.memory
        {
            out.push((Resource::RLIMIT_DATA, max));
        }
        out
    }
}

/// The user agents run as: uid, gid and supplementary groups.
pub type AgentUser = (Uid, Gid, Vec<Gid>);

/// Why `--agent-user` names no usable user.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AgentUserError {
    #[error("cannot look up agent user `{spec}`: {errno}")]
    Lookup { spec: String, errno: nix::Error },
    #[error("agent user `{0}` does not exist")]
    Missing(String),
    #[error("agent user `{0}` has an invalid name")]
    BadName(String),
}

/// Resolves `--agent-user` (a name or a numeric uid). Only meaningful when we are root; otherwise
/// the setting is ignored with a warning (an unprivileged process cannot switch users).
pub fn resolve_user(spec: Option<&str>) -> Result<Option<AgentUser>, AgentUserError> {
    let Some(spec) = spec.filter(|s| !s.is_empty()) else {
        return Ok(None);
    };
    if !Uid::effective().is_root() {
        tracing::warn!(
            user = spec,
            "--agent-user is ignored: the daemon does not run as root"
        );
        return Ok(None);
    }
    let user = match spec.parse::<u32>() {
        Ok(uid) => User::from_uid(Uid::from_raw(uid)),
        Err(_) => User::from_name(spec),
    }
    .map_err(|errno| AgentUserError::Lookup {
        spec: spec.to_string(),
        errno,
    })?
    .ok_or_else(|| AgentUserError::Missing(spec.to_string()))?;
    let name = std::ffi::CString::new(user.name.clone())
        .map_err(|_| AgentUserError::BadName(spec.to_string()))?;
    let groups = nix::unistd::getgrouplist(&name, user.gid).unwrap_or_else(|_| vec![user.gid]);
    Ok(Some((user.uid, user.gid, groups)))
}

/// The HOME an agent user gets. A root daemon's own HOME (`/root`) is not the agent's: its
/// home directory from the user database when that is a directory the user owns, else
/// `<data-dir>/home/<uid>`, made for it (mode 0700, owned by it).
pub fn agent_home(user: &AgentUser, data_dir: &std::path::Path) -> std::io::Result<PathBuf> {
    use std::os::unix::fs::{DirBuilderExt, MetadataExt};
    let (uid, gid, _) = user;
    if let Ok(Some(entry)) = User::from_uid(*uid)
        && std::fs::metadata(&entry.dir).is_ok_and(|m| m.is_dir() && m.uid() == uid.as_raw())
    {
        return Ok(entry.dir);
    }
    let homes = data_dir.join("home");
    std::fs::create_dir_all(&homes)?;
    let home = homes.join(uid.as_raw().to_string());
    match std::fs::DirBuilder::new().mode(0o700).create(&home) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(e),
    }
    // Only a real directory (never a link planted there) is handed over.
    let meta = std::fs::symlink_metadata(&home)?;
    if !meta.is_dir() {
        return Err(std::io::Error::other(format!(
            "{} is not a directory",
            home.display()
        )));
    }
    if meta.uid() != uid.as_raw() || meta.gid() != gid.as_raw() {
        nix::unistd::chown(&home, Some(*uid), Some(*gid)).map_err(std::io::Error::from)?;
    }
    Ok(home)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memory_falls_back_to_rlimit_data_only_when_the_cgroup_did_not_take_it() {
        let l = Limits {
            memory_max: Some(64 << 20),
            pids_max: Some(20),
            cpu_max: Some(1.0),
        };
        let none = Applied::default();
        assert_eq!(
            l.fallback_rlimits(none),
            vec![(Resource::RLIMIT_DATA, 64 << 20)]
        );
        let all = Applied {
            memory: true,
            pids: true,
            cpu: true,
        };
        assert!(l.fallback_rlimits(all).is_empty());
        let unlimited = Limits {
            memory_max: None,
            ..l
        };
        assert!(unlimited.fallback_rlimits(none).is_empty());
    }

    #[test]
    fn unknown_agent_user_is_an_error_as_root() {
        if !Uid::effective().is_root() {
            return;
        }
        assert!(resolve_user(Some("no-such-user-sandbox-agent")).is_err());
        let root = resolve_user(Some("0"))
            .expect("uid 0 exists")
            .expect("some");
        assert!(root.0.is_root());
        assert_eq!(resolve_user(None), Ok(None));
    }
}
