//! Finding the cgroup hierarchies (`/proc/self/mountinfo`, v1 and v2) and our own group in each
//! (`/proc/self/cgroup`).

use super::*;

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
pub(super) fn unescape(s: &str) -> String {
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
pub(super) fn distinct_v1<'m>(
    v1: &[&'m Mount],
    own: &str,
) -> Vec<(&'m Mount, Vec<&'static str>, String)> {
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
pub(super) fn reaches(mount: &Mount, own: &str) -> bool {
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
