//! cgroups for agents, written by hand (a few files per group). Every group lives beneath the
//! daemon's own cgroup, in `<own>/sandbox-agent/d<pid>-<nonce>/a<n>-<serverId>`, never at a
//! hierarchy root. The daemon holds an flock on its `d…` directory for its whole life, so a later
//! daemon can tell leftovers of a dead one (lock free) from a live neighbour's (lock held).

use std::collections::BTreeSet;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use nix::fcntl::{Flock, FlockArg};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

pub use super::limits::Applied;
use super::limits::Limits;
use crate::config::AgentCgroups as Mode;

/// Name of the subtree every daemon creates beneath its own cgroup.
pub const SUBTREE: &str = "sandbox-agent";

/// The controllers we set limits with.
pub(super) const WANTED: [&str; 3] = ["memory", "pids", "cpu"];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Version {
    V1,
    V2,
}

/// One mounted hierarchy, as `/proc/self/mountinfo` shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mount {
    pub point: PathBuf,
    /// The part of the hierarchy mounted there (`/` unless bind-mounted from a sub-group).
    pub root: String,
    pub version: Version,
    /// v1 only: the controllers of this hierarchy.
    pub options: Vec<String>,
}

/// Parses `/proc/self/mountinfo`, keeping cgroup mounts.
pub fn parse_mountinfo(text: &str) -> Vec<Mount> {
    let mut out = Vec::new();
    for line in text.lines() {
        let Some((left, right)) = line.split_once(" - ") else {
            continue;
        };
        let left: Vec<&str> = left.split(' ').collect();
        let right: Vec<&str> = right.split(' ').collect();
        if left.len() < 5 || right.len() < 3 {
            continue;
        }
        let version = match right[0] {
            "cgroup" => Version::V1,
            "cgroup2" => Version::V2,
            _ => continue,
        };
        out.push(Mount {
            point: PathBuf::from(unescape(left[4])),
            root: unescape(left[3]),
            version,
            options: right[2].split(',').map(str::to_owned).collect(),
        });
    }
    out
}

/// mountinfo escapes spaces and a few other bytes as `\ooo`.
fn unescape(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\'
            && i + 3 < b.len()
            && let Ok(v) = u8::from_str_radix(&String::from_utf8_lossy(&b[i + 1..i + 4]), 8)
        {
            out.push(v);
            i += 4;
            continue;
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Our cgroup path in a hierarchy, from `/proc/self/cgroup`: the v2 line (`0::`) or the v1 line
/// naming `controller`.
pub fn own_path(proc_self_cgroup: &str, version: Version, controller: &str) -> Option<String> {
    proc_self_cgroup.lines().find_map(|line| {
        let mut parts = line.splitn(3, ':');
        let (id, ctrls, path) = (parts.next()?, parts.next()?, parts.next()?);
        let hit = match version {
            Version::V2 => id == "0" && ctrls.is_empty(),
            Version::V1 => ctrls.split(',').any(|c| c == controller),
        };
        hit.then(|| path.to_string())
    })
}

/// The v1 hierarchies to use, each once, with its wanted controllers and our group's path in it.
/// One hierarchy may be mounted several times (a chroot or container that bind-mounts the host's
/// `/sys/fs/cgroup` shows up in our mountinfo too); a controller belongs to exactly one hierarchy,
/// so the controllers identify it. Of its mounts, the first that shows our own group is used
/// (mountinfo lists the original before later bind mounts), else its first mount.
fn distinct_v1<'m>(v1: &[&'m Mount], own: &str) -> Vec<(&'m Mount, Vec<&'static str>, String)> {
    let mut picked: Vec<(&'m Mount, Vec<&'static str>, String)> = Vec::new();
    for m in v1 {
        let controllers: Vec<&'static str> = WANTED
            .iter()
            .copied()
            .filter(|c| m.options.iter().any(|o| o == c))
            .collect();
        let Some(first) = controllers.first() else {
            continue;
        };
        let Some(path) = own_path(own, Version::V1, first) else {
            continue;
        };
        match picked.iter_mut().find(|(_, c, _)| *c == controllers) {
            Some(slot) => {
                if !reaches(slot.0, &slot.2) && reaches(m, &path) {
                    *slot = (m, controllers, path);
                }
            }
            None => picked.push((m, controllers, path)),
        }
    }
    picked
}

/// Whether the group `own` (a path from `/proc/self/cgroup`) lies inside what `mount` shows.
fn reaches(mount: &Mount, own: &str) -> bool {
    let root = mount.root.trim_end_matches('/');
    root.is_empty() || own == root || own.starts_with(&format!("{root}/"))
}

/// Where our own group of a hierarchy is on disk.
pub fn own_dir(mount: &Mount, own: &str) -> PathBuf {
    let rel = own
        .strip_prefix(mount.root.trim_end_matches('/'))
        .unwrap_or(own);
    mount.point.join(rel.trim_start_matches('/'))
}

/// One hierarchy the daemon uses, with its locked `d…` directory.
#[derive(Debug)]
struct Hierarchy {
    version: Version,
    /// The wanted controllers effective for groups we create here.
    controllers: Vec<&'static str>,
    dir: PathBuf,
    /// Holds the flock that marks `dir` as owned by a live daemon.
    _lock: Flock<File>,
}

/// The daemon's cgroup setup: zero hierarchies means "no cgroups, rlimits only".
#[derive(Debug)]
pub struct Cgroups {
    hierarchies: Vec<Hierarchy>,
    next: AtomicU64,
    /// `remove_own` ran: a second call (the supervisor's drop) has nothing to do and must not
    /// take the blocking flock again.
    removed: AtomicBool,
}

/// One agent's groups (one per hierarchy; the first is used to list its processes).
#[derive(Debug)]
pub struct AgentCgroup {
    dirs: Vec<(PathBuf, Version, Vec<&'static str>)>,
}

impl Cgroups {
    /// No cgroups at all.
    pub fn none() -> Self {
        Cgroups {
            hierarchies: Vec::new(),
            next: AtomicU64::new(1),
            removed: AtomicBool::new(false),
        }
    }

    pub fn enabled(&self) -> bool {
        !self.hierarchies.is_empty()
    }

    /// Finds the hierarchies, creates our subtree beneath our own cgroup, clears leftovers of
    /// daemons that died without stopping their agents, and logs what limits can be enforced.
    pub fn setup(mode: Mode) -> Self {
        if mode == Mode::Off {
            tracing::info!("cgroups disabled by configuration; agent limits use rlimits only");
            return Self::none();
        }
        let mounts = fs::read_to_string("/proc/self/mountinfo")
            .map(|t| parse_mountinfo(&t))
            .unwrap_or_default();
        let own = fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
        let v1: Vec<&Mount> = mounts
            .iter()
            .filter(|m| {
                m.version == Version::V1 && WANTED.iter().any(|c| m.options.iter().any(|o| o == c))
            })
            .collect();
        let v2 = mounts.iter().find(|m| m.version == Version::V2);
        let use_v1 = match mode {
            Mode::V1 => true,
            Mode::V2 => false,
            _ => !v1.is_empty(),
        };
        let nonce = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64 & 0xffff_ffff)
            .unwrap_or(0);
        let name = format!("d{}-{nonce:08x}", std::process::id());
        let mut hierarchies = Vec::new();
        let mut problems = Vec::new();
        if use_v1 {
            for (m, controllers, path) in distinct_v1(&v1, &own) {
                match claim(&own_dir(m, &path), &name, Version::V1, &[]) {
                    Ok(h) => hierarchies.push(Hierarchy { controllers, ..h }),
                    Err(e) => problems.push(format!("{}: {e}", m.point.display())),
                }
            }
        } else if let Some(m) = v2
            && let Some(path) = own_path(&own, Version::V2, "")
        {
            let own_dir = own_dir(m, &path);
            match setup_v2(&own_dir, &name) {
                Ok(h) => hierarchies.push(h),
                Err(e) => problems.push(format!("{}: {e}", m.point.display())),
            }
        }
        if hierarchies.is_empty() {
            let why = if problems.is_empty() {
                "no cgroup hierarchy found".to_string()
            } else {
                problems.join("; ")
            };
            tracing::warn!(
                reason = why,
                "cgroups are not writable; agents run without cgroups (memory capped per process with RLIMIT_DATA, no pids or cpu limit, setsid escapees cannot be tracked)"
            );
            return Self::none();
        }
        for p in &problems {
            tracing::warn!(problem = p, "a cgroup hierarchy is not usable");
        }
        let effective: BTreeSet<&str> = hierarchies
            .iter()
            .flat_map(|h| h.controllers.iter().copied())
            .collect();
        for c in WANTED {
            if !effective.contains(c) {
                tracing::warn!(
                    controller = c,
                    "cgroup controller not available to us; its limit is not enforced"
                );
            }
        }
        tracing::info!(
            version = if hierarchies[0].version == Version::V1 { "v1" } else { "v2" },
            dirs = ?hierarchies.iter().map(|h| h.dir.display().to_string()).collect::<Vec<_>>(),
            controllers = ?effective,
            "agent cgroups ready"
        );
        Cgroups {
            hierarchies,
            next: AtomicU64::new(1),
            removed: AtomicBool::new(false),
        }
    }

    /// Creates the agent's groups and writes its limits, reading each back.
    pub fn create(&self, server_id: &str, limits: &Limits) -> io::Result<(AgentCgroup, Applied)> {
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        let label: String = server_id
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                    c
                } else {
                    '_'
                }
            })
            .take(64)
            .collect();
        let name = format!("a{n}-{label}");
        let mut dirs = Vec::new();
        let mut applied = Applied::default();
        for h in &self.hierarchies {
            let dir = h.dir.join(&name);
            if let Err(e) = fs::create_dir(&dir) {
                let cg = AgentCgroup { dirs };
                cg.remove_dirs();
                return Err(io::Error::new(
                    e.kind(),
                    format!("create {}: {e}", dir.display()),
                ));
            }
            for c in &h.controllers {
                let ok = match *c {
                    "memory" => set_memory(&dir, h.version, limits.memory_max),
                    "pids" => set_pids(&dir, limits.pids_max),
                    "cpu" => set_cpu(&dir, h.version, limits.cpu_max),
                    _ => true,
                };
                match *c {
                    "memory" => applied.memory |= ok,
                    "pids" => applied.pids |= ok,
                    _ => applied.cpu |= ok,
                }
            }
            dirs.push((dir, h.version, h.controllers.clone()));
        }
        Ok((AgentCgroup { dirs }, applied))
    }

    /// Applies the budget of all agents together (`--agents-memory-max`, `--agents-pids-max`) to
    /// our `d…` directories, which every agent group is beneath, reading each limit back. Logs
    /// what holds and, clearly, what does not (not writable, controller missing, v1 memory
    /// without hierarchy); agents run either way.
    pub fn apply_budget(&self, memory: Option<u64>, pids: Option<u64>) {
        if memory.is_none() && pids.is_none() {
            return;
        }
        if self.hierarchies.is_empty() {
            tracing::warn!(
                memory_max = memory,
                pids_max = pids,
                "the budget of all agents together is NOT enforced: agents run without cgroups"
            );
            return;
        }
        let mut memory_ok = memory.is_none();
        let mut pids_ok = pids.is_none();
        for h in &self.hierarchies {
            if memory.is_some() && h.controllers.contains(&"memory") {
                if h.version == Version::V1 {
                    // Before any child exists; always 1 on kernels from 5.16 on.
                    let _ = write_file(&h.dir.join("memory.use_hierarchy"), "1");
                    let hier = read_u64(&h.dir.join("memory.use_hierarchy"));
                    if hier == Some(1) {
                        memory_ok |= set_memory(&h.dir, h.version, memory);
                    }
                } else {
                    memory_ok |= set_memory(&h.dir, h.version, memory);
                }
            }
            if pids.is_some() && h.controllers.contains(&"pids") {
                pids_ok |= set_pids(&h.dir, pids);
            }
        }
        let dirs: Vec<String> = self
            .hierarchies
            .iter()
            .map(|h| h.dir.display().to_string())
            .collect();
        if memory_ok && pids_ok {
            tracing::info!(
                memory_max = memory,
                pids_max = pids,
                ?dirs,
                "budget of all agents together enforced by their parent cgroup"
            );
        } else {
            tracing::warn!(
                memory_max = memory,
                pids_max = pids,
                memory_enforced = memory_ok,
                pids_enforced = pids_ok,
                ?dirs,
                "the budget of all agents together is NOT fully enforced (controller missing or not writable)"
            );
        }
    }

    /// Best-effort removal of our own `d…` directories (at shutdown, once every agent is gone).
    /// The shared `sandbox-agent` directory goes too when no other daemon uses it, so nothing
    /// of ours is left in a cgroup someone else may want to remove.
    pub fn remove_own(&self) {
        if self.removed.swap(true, Ordering::AcqRel) {
            return;
        }
        for h in &self.hierarchies {
            if let Err(e) = fs::remove_dir(&h.dir)
                && e.kind() != io::ErrorKind::NotFound
            {
                tracing::debug!(dir = %h.dir.display(), error = %e, "cgroup not removed");
                continue;
            }
            let Some(subtree) = h.dir.parent() else {
                continue;
            };
            if let Ok(f) = File::open(subtree)
                && let Ok(_guard) = Flock::lock(f, FlockArg::LockExclusive)
            {
                // Fails (busy) while another daemon's directory is in it; that is fine.
                let _ = fs::remove_dir(subtree);
            }
        }
    }

    /// The hand-off state of the daemon's own directories; `keep` receives a duplicate of each
    /// flock's descriptor, which holds the lock across the exec.
    pub fn handoff_state(
        &self,
        keep: &mut Vec<std::os::fd::OwnedFd>,
    ) -> io::Result<super::adopt::CgroupsState> {
        use std::os::fd::{AsFd, AsRawFd};
        let mut dirs = Vec::new();
        for h in &self.hierarchies {
            let dup = h._lock.as_fd().try_clone_to_owned()?;
            let n = dup.as_raw_fd();
            keep.push(dup);
            dirs.push(super::adopt::dir_state(
                &h.dir,
                h.version,
                &h.controllers,
                Some(n),
            ));
        }
        Ok(super::adopt::CgroupsState {
            dirs,
            next: self.next.load(Ordering::Relaxed),
        })
    }

    /// The previous image's directories, taken over with their flocks (`locks`, in the order of
    /// `state.dirs`); no leftovers are cleared (ours are locked, by us).
    pub fn adopt(
        state: &super::adopt::CgroupsState,
        locks: Vec<std::os::fd::OwnedFd>,
    ) -> io::Result<Self> {
        let mut hierarchies = Vec::new();
        for (d, fd) in state.dirs.iter().zip(locks) {
            let lock = Flock::lock(File::from(fd), FlockArg::LockExclusiveNonblock)
                .map_err(|(_, e)| io::Error::from(e))?;
            hierarchies.push(Hierarchy {
                version: if d.v2 { Version::V2 } else { Version::V1 },
                controllers: super::adopt::controllers_from(&d.controllers),
                dir: d.dir.clone(),
                _lock: lock,
            });
        }
        tracing::info!(
            dirs = ?hierarchies.iter().map(|h| h.dir.display().to_string()).collect::<Vec<_>>(),
            "agent cgroups taken over from the previous image"
        );
        Ok(Cgroups {
            hierarchies,
            next: AtomicU64::new(state.next.max(1)),
            removed: AtomicBool::new(false),
        })
    }

    /// The daemon's `d…` directories (for the emergency kill).
    pub fn own_dirs(&self) -> Vec<PathBuf> {
        self.hierarchies.iter().map(|h| h.dir.clone()).collect()
    }
}

/// Creates `<own>/sandbox-agent/<name>` and locks it; clears dead daemons' leftovers on the way.
/// The subtree's own flock serialises this between daemons starting side by side.
fn claim(
    own: &Path,
    name: &str,
    version: Version,
    enable: &[&'static str],
) -> io::Result<Hierarchy> {
    let subtree = own.join(SUBTREE);
    let guard = lock_subtree(&subtree, version, enable)?;
    // Killing a dead daemon's agents waits for them to die (sleeps between rounds): that is done
    // on a thread of its own, not on the caller's (the runtime thread at start-up). A leftover
    // directory is claimed by its flock, so a second daemon clearing at the same time skips it.
    // The sweep takes the subtree's lock too, so it never runs while a daemon is between
    // creating its directory and locking it (below, under the same lock).
    let leftovers = subtree.clone();
    let controllers = enable.to_vec();
    let _ = std::thread::Builder::new()
        .name("cgroup-leftovers".into())
        .spawn(move || {
            if let Ok(_guard) = lock_subtree(&leftovers, version, &controllers) {
                clear_leftovers(&leftovers);
            }
        });
    let dir = subtree.join(name);
    fs::create_dir(&dir)?;
    if version == Version::V2 {
        enable_controllers(&dir, enable);
    }
    let lock = Flock::lock(File::open(&dir)?, FlockArg::LockExclusiveNonblock)
        .map_err(|(_, e)| io::Error::from(e))?;
    drop(guard);
    Ok(Hierarchy {
        version,
        controllers: enable.to_vec(),
        dir,
        _lock: lock,
    })
}

/// Creates `subtree` if needed and takes its flock. A daemon that stops removes the subtree when
/// it is empty (under the same lock), so after the lock is ours the directory is checked to be the
/// one on disk; if it was removed meanwhile, start over.
fn lock_subtree(
    subtree: &Path,
    version: Version,
    enable: &[&'static str],
) -> io::Result<Flock<File>> {
    use std::os::unix::fs::MetadataExt;
    for _ in 0..20 {
        match fs::create_dir(subtree) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(e) => {
                return Err(io::Error::new(
                    e.kind(),
                    format!("create {}: {e}", subtree.display()),
                ));
            }
        }
        if version == Version::V2 {
            enable_controllers(subtree, enable);
        }
        let guard = match File::open(subtree) {
            Ok(f) => {
                Flock::lock(f, FlockArg::LockExclusive).map_err(|(_, e)| io::Error::from(e))?
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
            Err(e) => return Err(e),
        };
        let locked = guard.metadata()?.ino();
        if fs::metadata(subtree).is_ok_and(|m| m.ino() == locked) {
            return Ok(guard);
        }
    }
    Err(io::Error::other(format!(
        "{} keeps disappearing",
        subtree.display()
    )))
}

/// Kills and removes every `d…` directory whose daemon is gone (its flock can be taken).
fn clear_leftovers(subtree: &Path) {
    let Ok(entries) = fs::read_dir(subtree) else {
        return;
    };
    for entry in entries.flatten() {
        let dir = entry.path();
        if !dir.is_dir() || !entry.file_name().to_string_lossy().starts_with('d') {
            continue;
        }
        let Ok(file) = File::open(&dir) else { continue };
        let Ok(_lock) = Flock::lock(file, FlockArg::LockExclusiveNonblock) else {
            continue; // a live daemon owns it
        };
        // A daemon starting beside us creates its directory, then locks it: in between, the
        // lock is free. A directory that is that young and holds no process is such a daemon's,
        // not a leftover (a real leftover with nothing in it is cleared by a later start).
        let young = entry
            .metadata()
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| t.elapsed().ok())
            .is_none_or(|age| age < std::time::Duration::from_secs(10));
        if young && !holds_processes(&dir) {
            continue;
        }
        let mut killed = 0;
        let mut groups = 0;
        for sub in fs::read_dir(&dir).into_iter().flatten().flatten() {
            let p = sub.path();
            if !p.is_dir() {
                continue;
            }
            groups += 1;
            let cg = AgentCgroup {
                dirs: vec![(p.clone(), Version::V1, Vec::new())],
            };
            let mut killed_here = 0;
            for _ in 0..200 {
                let n = cg.kill_all();
                killed_here += n;
                if cg.is_empty() {
                    break;
                }
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
            killed += killed_here;
            // Right after a kill the kernel may still be releasing the group: retry briefly. A
            // group that was already empty and cannot be removed is pinned (an unreaped zombie
            // of it elsewhere): retrying only holds the subtree's lock, and every daemon
            // starting meanwhile waits for it. A later start tries again.
            cg.remove_dirs_within(if killed_here > 0 { 50 } else { 1 });
        }
        let removed = fs::remove_dir(&dir).is_ok();
        tracing::warn!(
            dir = %dir.display(),
            agent_cgroups = groups,
            processes_killed = killed,
            removed,
            "cleared leftovers of a previous daemon that did not stop its agents"
        );
    }
}

/// True when `dir` or one of its child groups lists a process.
fn holds_processes(dir: &Path) -> bool {
    let listed =
        |d: &Path| fs::read_to_string(d.join("cgroup.procs")).is_ok_and(|s| !s.trim().is_empty());
    listed(dir)
        || fs::read_dir(dir)
            .into_iter()
            .flatten()
            .flatten()
            .any(|e| e.path().is_dir() && listed(&e.path()))
}

/// v2: makes the wanted controllers available beneath `own`, respecting "no internal
/// processes": if our group holds only us (and our own init parent, when we run as PID 1's
/// child), those move into the leaf `<own>/sandbox-agent.daemon` first.
fn setup_v2(own: &Path, name: &str) -> io::Result<Hierarchy> {
    let available = read_words(&own.join("cgroup.controllers"));
    let wanted: Vec<&'static str> = WANTED
        .iter()
        .copied()
        .filter(|c| available.iter().any(|a| a == c))
        .collect();
    let missing = enable_controllers(own, &wanted);
    if !missing.is_empty()
        && let Some(ours) = only_ours(own)
    {
        let leaf = own.join(format!("{SUBTREE}.daemon"));
        match fs::create_dir(&leaf) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(e),
        }
        for pid in &ours {
            if let Err(e) = write_file(&leaf.join("cgroup.procs"), pid) {
                tracing::warn!(pid, leaf = %leaf.display(), error = %e, "cannot move into the leaf cgroup");
            }
        }
        tracing::info!(leaf = %leaf.display(), "moved the daemon into a leaf cgroup so agent groups can have controllers");
        enable_controllers(own, &wanted);
    }
    let enabled = read_words(&own.join("cgroup.subtree_control"));
    let effective: Vec<&'static str> = wanted
        .into_iter()
        .filter(|c| enabled.iter().any(|e| e == c))
        .collect();
    claim(own, name, Version::V2, &effective)
}

/// The processes of `dir` when every one is us or our parent running the same executable (our
/// own init); `None` when anyone else is there (they are not ours to move).
fn only_ours(dir: &Path) -> Option<Vec<String>> {
    let me = std::process::id().to_string();
    let parent = nix::unistd::getppid().to_string();
    let exe = |pid: &str| fs::read_link(format!("/proc/{pid}/exe")).ok();
    let procs = read_words(&dir.join("cgroup.procs"));
    let ours = procs
        .iter()
        .all(|p| *p == me || (*p == parent && exe(p).is_some() && exe(p) == exe(&me)));
    ours.then_some(procs)
}

/// Writes `+c` for each controller to `dir/cgroup.subtree_control`; returns those that failed.
fn enable_controllers(dir: &Path, controllers: &[&'static str]) -> Vec<&'static str> {
    let path = dir.join("cgroup.subtree_control");
    controllers
        .iter()
        .copied()
        .filter(|c| write_file(&path, &format!("+{c}")).is_err())
        .collect()
}

fn read_words(path: &Path) -> Vec<String> {
    fs::read_to_string(path)
        .map(|t| t.split_whitespace().map(str::to_owned).collect())
        .unwrap_or_default()
}

fn write_file(path: &Path, value: &str) -> io::Result<()> {
    let mut f = OpenOptions::new().write(true).open(path)?;
    f.write_all(value.as_bytes())
}

fn read_u64(path: &Path) -> Option<u64> {
    fs::read_to_string(path).ok()?.trim().parse().ok()
}

/// Warns once per limit kind when a limit did not take.
fn not_applied(what: &'static str, flag: &AtomicBool, path: &Path, detail: String) {
    if !flag.swap(true, Ordering::Relaxed) {
        tracing::warn!(limit = what, file = %path.display(), detail, "agent limit did not take effect (reported once)");
    } else {
        tracing::debug!(limit = what, file = %path.display(), detail, "agent limit did not take effect");
    }
}

static MEMORY_WARNED: AtomicBool = AtomicBool::new(false);
static PIDS_WARNED: AtomicBool = AtomicBool::new(false);
static CPU_WARNED: AtomicBool = AtomicBool::new(false);

fn set_memory(dir: &Path, version: Version, max: Option<u64>) -> bool {
    let Some(max) = max else { return true };
    let file = dir.join(match version {
        Version::V1 => "memory.limit_in_bytes",
        Version::V2 => "memory.max",
    });
    if let Err(e) = write_file(&file, &max.to_string()) {
        not_applied("memory", &MEMORY_WARNED, &file, e.to_string());
        return false;
    }
    // Without this the limit only pushes the agent into swap instead of stopping it.
    let _ = match version {
        Version::V1 => write_file(&dir.join("memory.memsw.limit_in_bytes"), &max.to_string()),
        Version::V2 => write_file(&dir.join("memory.swap.max"), "0"),
    };
    let page = crate::sys::page_size();
    match read_u64(&file) {
        // The kernel rounds the limit down to whole pages.
        Some(v) if v <= max && v + page > max => true,
        other => {
            not_applied(
                "memory",
                &MEMORY_WARNED,
                &file,
                format!("wrote {max}, read back {other:?}"),
            );
            false
        }
    }
}

fn set_pids(dir: &Path, max: Option<u64>) -> bool {
    let Some(max) = max else { return true };
    let file = dir.join("pids.max");
    if let Err(e) = write_file(&file, &max.to_string()) {
        not_applied("pids", &PIDS_WARNED, &file, e.to_string());
        return false;
    }
    match read_u64(&file) {
        Some(v) if v == max => true,
        other => {
            not_applied(
                "pids",
                &PIDS_WARNED,
                &file,
                format!("wrote {max}, read back {other:?}"),
            );
            false
        }
    }
}

/// CPU limit in cores, as a CFS quota over a 100 ms period.
fn set_cpu(dir: &Path, version: Version, cores: Option<f64>) -> bool {
    let Some(cores) = cores else { return true };
    const PERIOD: u64 = 100_000;
    let quota = ((cores * PERIOD as f64).round() as u64).max(1000);
    let (file, value) = match version {
        Version::V1 => {
            let _ = write_file(&dir.join("cpu.cfs_period_us"), &PERIOD.to_string());
            (dir.join("cpu.cfs_quota_us"), quota.to_string())
        }
        Version::V2 => (dir.join("cpu.max"), format!("{quota} {PERIOD}")),
    };
    if let Err(e) = write_file(&file, &value) {
        not_applied("cpu", &CPU_WARNED, &file, e.to_string());
        return false;
    }
    let back = fs::read_to_string(&file).unwrap_or_default();
    if back.split_whitespace().next() == Some(&quota.to_string()) {
        true
    } else {
        not_applied(
            "cpu",
            &CPU_WARNED,
            &file,
            format!("wrote {value}, read back {}", back.trim()),
        );
        false
    }
}

impl AgentCgroup {
    pub fn handoff_state(&self) -> Vec<super::adopt::CgroupDirState> {
        self.dirs
            .iter()
            .map(|(d, v, c)| super::adopt::dir_state(d, *v, c, None))
            .collect()
    }

    pub fn adopt(dirs: &[super::adopt::CgroupDirState]) -> Self {
        AgentCgroup {
            dirs: dirs
                .iter()
                .map(|d| {
                    (
                        d.dir.clone(),
                        if d.v2 { Version::V2 } else { Version::V1 },
                        super::adopt::controllers_from(&d.controllers),
                    )
                })
                .collect(),
        }
    }

    /// Opens every group's `cgroup.procs` for writing (close-on-exec), for the child to join.
    pub fn open_procs(&self) -> io::Result<Vec<File>> {
        self.dirs
            .iter()
            .map(|(d, _, _)| OpenOptions::new().write(true).open(d.join("cgroup.procs")))
            .collect()
    }

    /// The tracking group's directory.
    pub fn path(&self) -> Option<&Path> {
        self.dirs.first().map(|(d, _, _)| d.as_path())
    }

    /// Every process in any of the agent's groups.
    pub fn pids(&self) -> Vec<i32> {
        let mut all = BTreeSet::new();
        for (d, _, _) in &self.dirs {
            for w in read_words(&d.join("cgroup.procs")) {
                if let Ok(p) = w.parse::<i32>() {
                    all.insert(p);
                }
            }
        }
        all.into_iter().collect()
    }

    /// Processes of the tracking group only (cheaper, for figures).
    pub fn tracked_pids(&self) -> Vec<i32> {
        self.path()
            .map(|d| {
                read_words(&d.join("cgroup.procs"))
                    .iter()
                    .filter_map(|w| w.parse().ok())
                    .collect()
            })
            .unwrap_or_default()
    }

    pub fn is_empty(&self) -> bool {
        self.pids().is_empty()
    }

    /// SIGKILLs everything in the groups once; returns how many processes were signalled.
    /// Uses `cgroup.kill` on v2 where the kernel has it (atomic, fork bombs included).
    pub fn kill_all(&self) -> usize {
        for (d, v, _) in &self.dirs {
            if *v == Version::V2 {
                let _ = write_file(&d.join("cgroup.kill"), "1");
            }
        }
        let pids = self.pids();
        for p in &pids {
            let _ = kill(Pid::from_raw(*p), Signal::SIGKILL);
        }
        pids.len()
    }

    /// The CPU weight files of the groups under the cpu controller (v1 `cpu.shares`, v2
    /// `cpu.weight`), opened for writing, with what they hold now and their minimum value.
    /// A warm stub's child writes the minimum once it has joined (`ChildSetup::after_join`),
    /// so its start-up runs without taking CPU from running programs; `restore_cpu_weight`
    /// puts the value back when the stub is taken.
    pub fn cpu_weight_files(&self) -> Vec<(File, (PathBuf, String), &'static [u8])> {
        let mut out = Vec::new();
        for (d, v, ctrls) in &self.dirs {
            if !ctrls.contains(&"cpu") {
                continue;
            }
            let (file, low): (&str, &'static [u8]) = match v {
                Version::V1 => ("cpu.shares", b"2"),
                Version::V2 => ("cpu.weight", b"1"),
            };
            let path = d.join(file);
            if let Ok(now) = fs::read_to_string(&path)
                && let Ok(f) = OpenOptions::new().write(true).open(&path)
            {
                out.push((f, (path, now.trim().to_string()), low));
            }
        }
        out
    }

    /// Puts back the values `cpu_weight_files` read; false if a write failed.
    pub fn restore_cpu_weight(saved: &[(PathBuf, String)]) -> bool {
        saved.iter().all(|(p, v)| write_file(p, v).is_ok())
    }

    /// How many times the kernel's OOM killer struck in the memory group.
    pub fn oom_kills(&self) -> u64 {
        for (d, v, ctrls) in &self.dirs {
            if !ctrls.contains(&"memory") {
                continue;
            }
            let (file, key) = match v {
                Version::V1 => ("memory.oom_control", "oom_kill"),
                Version::V2 => ("memory.events", "oom_kill"),
            };
            let text = fs::read_to_string(d.join(file)).unwrap_or_default();
            return parse_keyed(&text, key).unwrap_or(0);
        }
        0
    }

    /// Removes the (empty) groups, retrying briefly: the kernel may still be releasing them.
    pub fn remove_dirs(&self) -> bool {
        self.remove_dirs_within(50)
    }

    /// `remove_dirs` with at most `attempts` tries per group, 10 ms apart.
    fn remove_dirs_within(&self, attempts: usize) -> bool {
        let mut all = true;
        for (d, _, _) in &self.dirs {
            let mut ok = false;
            for _ in 0..attempts.max(1) {
                match fs::remove_dir(d) {
                    Ok(()) => {
                        ok = true;
                        break;
                    }
                    Err(e) if e.kind() == io::ErrorKind::NotFound => {
                        ok = true;
                        break;
                    }
                    Err(_) => std::thread::sleep(std::time::Duration::from_millis(10)),
                }
            }
            if !ok {
                tracing::warn!(dir = %d.display(), "agent cgroup could not be removed");
            }
            all &= ok;
        }
        all
    }
}

/// Kills everything in every agent group beneath our `d…` directories (emergency exit).
pub fn kill_beneath(dirs: &[PathBuf]) {
    for d in dirs {
        for sub in fs::read_dir(d).into_iter().flatten().flatten() {
            let cg = AgentCgroup {
                dirs: vec![(sub.path(), Version::V1, Vec::new())],
            };
            let _ = write_file(&sub.path().join("cgroup.kill"), "1");
            cg.kill_all();
        }
    }
}

/// Reads `key N` out of a flat keyed file (`memory.events`, `memory.oom_control`).
pub fn parse_keyed(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|l| {
        let (k, v) = l.split_once(' ')?;
        (k == key).then(|| v.trim().parse().ok()).flatten()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const MOUNTINFO: &str = "\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu,cpuacct rw,relatime - cgroup cgroup rw,cpu,cpuacct
35 31 0:32 /docker/abc /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
39 31 0:36 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
50 23 0:40 / /mnt/with\\040space rw - ext4 /dev/sda rw
";

    #[test]
    fn a_hierarchy_mounted_twice_is_used_once_through_the_mount_that_shows_our_group() {
        let text = "\
32 31 0:29 / /sys/fs/cgroup/cpu,cpuacct rw - cgroup cgroup rw,cpu,cpuacct
35 31 0:32 /other /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory
39 31 0:36 / /sys/fs/cgroup/pids rw - cgroup cgroup rw,pids
90 80 0:29 / /var/tmp/room/sys/fs/cgroup/cpu,cpuacct rw - cgroup cgroup rw,cpu,cpuacct
91 80 0:32 / /var/tmp/room/sys/fs/cgroup/memory rw - cgroup cgroup rw,memory
92 80 0:36 / /var/tmp/room/sys/fs/cgroup/pids rw - cgroup cgroup rw,pids
";
        let mounts = parse_mountinfo(text);
        let v1: Vec<&Mount> = mounts.iter().collect();
        let own = "5:pids:/a\n4:memory:/a\n3:cpu,cpuacct:/a\n";
        let picked = distinct_v1(&v1, own);
        let points: Vec<String> = picked
            .iter()
            .map(|(m, _, _)| m.point.display().to_string())
            .collect();
        // cpu and pids: the first mount; memory: the first one mounts /other, which does not show
        // our group /a, so the bind mount of the whole hierarchy is used.
        assert_eq!(
            points,
            [
                "/sys/fs/cgroup/cpu,cpuacct",
                "/var/tmp/room/sys/fs/cgroup/memory",
                "/sys/fs/cgroup/pids"
            ]
        );
        assert!(picked.iter().all(|(_, _, p)| p == "/a"));
    }

    #[test]
    fn mountinfo_keeps_cgroup_mounts_with_their_controllers() {
        let m = parse_mountinfo(MOUNTINFO);
        assert_eq!(m.len(), 4);
        assert_eq!(m[0].point, PathBuf::from("/sys/fs/cgroup/cpu,cpuacct"));
        assert!(m[0].options.iter().any(|o| o == "cpuacct"));
        assert_eq!(m[1].root, "/docker/abc");
        assert_eq!(m[3].version, Version::V2);
    }

    #[test]
    fn mountinfo_unescapes_octal() {
        assert_eq!(unescape("/mnt/with\\040space"), "/mnt/with space");
        assert_eq!(unescape("/plain"), "/plain");
    }

    #[test]
    fn own_path_per_version_and_controller() {
        let text = "9:name=systemd:/\n8:pids:/user.slice\n2:cpu,cpuacct:/x\n4:memory:/process_api/07b9\n0::/system.slice/sa.service\n";
        assert_eq!(
            own_path(text, Version::V1, "memory").as_deref(),
            Some("/process_api/07b9")
        );
        assert_eq!(own_path(text, Version::V1, "cpu").as_deref(), Some("/x"));
        assert_eq!(
            own_path(text, Version::V1, "cpuacct").as_deref(),
            Some("/x")
        );
        assert_eq!(
            own_path(text, Version::V2, "").as_deref(),
            Some("/system.slice/sa.service")
        );
        assert_eq!(own_path("4:memory:/a\n", Version::V2, ""), None);
    }

    #[test]
    fn own_dir_strips_the_mount_root_of_a_bind_mounted_hierarchy() {
        let m = parse_mountinfo(MOUNTINFO);
        assert_eq!(
            own_dir(&m[1], "/docker/abc/inner"),
            PathBuf::from("/sys/fs/cgroup/memory/inner")
        );
        assert_eq!(own_dir(&m[2], "/"), PathBuf::from("/sys/fs/cgroup/pids"));
        assert_eq!(
            own_dir(&m[2], "/a/b"),
            PathBuf::from("/sys/fs/cgroup/pids/a/b")
        );
    }

    #[test]
    fn keyed_files() {
        let v1 = "oom_kill_disable 0\nunder_oom 0\noom_kill 3\n";
        assert_eq!(parse_keyed(v1, "oom_kill"), Some(3));
        let v2 = "low 0\nhigh 0\nmax 12\noom 2\noom_kill 1\noom_group_kill 0\n";
        assert_eq!(parse_keyed(v2, "oom_kill"), Some(1));
        assert_eq!(parse_keyed(v2, "absent"), None);
    }

    #[test]
    fn daemons_starting_and_stopping_side_by_side_never_trip_over_each_other() {
        if Cgroups::setup(Mode::Auto).hierarchies.is_empty() {
            eprintln!("SKIPPED: cgroups are not writable here");
            return;
        }
        let limits = Limits {
            memory_max: Some(64 << 20),
            pids_max: Some(10),
            cpu_max: None,
        };
        let workers: Vec<_> = (0..8)
            .map(|i| {
                std::thread::spawn(move || {
                    for round in 0..5 {
                        let cg = Cgroups::setup(Mode::Auto);
                        assert!(cg.enabled(), "worker {i} round {round}");
                        let (agent, applied) =
                            cg.create(&format!("w{i}"), &limits).expect("agent cgroup");
                        assert!(applied.pids);
                        assert!(agent.path().is_some_and(Path::exists));
                        assert!(agent.remove_dirs());
                        cg.remove_own();
                    }
                })
            })
            .collect();
        for w in workers {
            w.join().expect("worker");
        }
    }
}
