//! Whether a reload's hand-off fits in the memory the daemon may use: the daemon's memory cgroup
//! and each of its ancestors (cgroup v1 `memory.limit_in_bytes`, v2 `memory.max`), less what each
//! uses now (its usage less the page cache the kernel can drop, `inactive_file`). Checked before
//! the point of no return, so a reload that could be OOM-killed is refused and the daemon serves
//! on (docs/operations.md, "What a reload needs in memory").

use std::path::{Path, PathBuf};

/// Room kept beyond the hand-off itself: the writer's and the reader's buffers, the new image's
/// start (its binary's pages, a runtime, its first allocations).
pub const MARGIN: u64 = 48 << 20;

/// A reload that does not fit.
#[derive(Debug, thiserror::Error)]
#[error(
    "not enough memory for the hand-off: it needs about {need} MiB and the memory cgroup {cgroup} \
     has {room} MiB left of its {limit} MiB limit (raise the limit, or shrink --event-buffer and \
     the process logs)"
)]
pub struct NoRoom {
    pub need: u64,
    pub room: u64,
    pub limit: u64,
    pub cgroup: String,
}

/// Ok when `payload` bytes (plus [`MARGIN`]) fit under every memory limit above the daemon.
pub fn check(payload: u64) -> Result<(), NoRoom> {
    let need = payload + MARGIN;
    for g in limited_groups() {
        let room = g.limit.saturating_sub(g.working_set);
        if need > room {
            return Err(NoRoom {
                need: need >> 20,
                room: room >> 20,
                limit: g.limit >> 20,
                cgroup: g.name,
            });
        }
    }
    Ok(())
}

struct Group {
    name: String,
    limit: u64,
    working_set: u64,
}

/// The daemon's memory cgroup and its ancestors that have a limit.
fn limited_groups() -> Vec<Group> {
    let Ok(text) = std::fs::read_to_string("/proc/self/cgroup") else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for line in text.lines() {
        let mut parts = line.splitn(3, ':');
        let (Some(_), Some(controllers), Some(path)) = (parts.next(), parts.next(), parts.next())
        else {
            continue;
        };
        let v1 = controllers.split(',').any(|c| c == "memory");
        let v2 = controllers.is_empty();
        let (root, files) = if v1 {
            (
                PathBuf::from("/sys/fs/cgroup/memory"),
                (
                    "memory.limit_in_bytes",
                    "memory.usage_in_bytes",
                    "total_inactive_file",
                ),
            )
        } else if v2 {
            let root = ["/sys/fs/cgroup", "/sys/fs/cgroup/unified"]
                .iter()
                .map(PathBuf::from)
                .find(|r| r.join("cgroup.controllers").exists());
            let Some(root) = root else { continue };
            (root, ("memory.max", "memory.current", "inactive_file"))
        } else {
            continue;
        };
        let mut dir = root.join(path.trim_start_matches('/'));
        loop {
            if let Some(g) = read_group(&dir, &root, files) {
                out.push(g);
            }
            if dir == root || !dir.pop() || !dir.starts_with(&root) {
                break;
            }
        }
    }
    out
}

fn read_group(
    dir: &Path,
    root: &Path,
    (limit, usage, inactive): (&str, &str, &str),
) -> Option<Group> {
    let read = |f: &str| std::fs::read_to_string(dir.join(f)).ok();
    let limit: u64 = read(limit)?.trim().parse().ok()?;
    // v1 writes "unlimited" as a huge page-rounded number.
    if limit >= 1 << 62 {
        return None;
    }
    let usage: u64 = read(usage)?.trim().parse().ok()?;
    let cache = read("memory.stat")
        .and_then(|s| {
            s.lines().find_map(|l| {
                let (k, v) = l.split_once(' ')?;
                (k == inactive)
                    .then(|| v.trim().parse::<u64>().ok())
                    .flatten()
            })
        })
        .unwrap_or(0);
    let rel = dir.strip_prefix(root).unwrap_or(dir);
    Some(Group {
        name: format!("/{}", rel.display()),
        limit,
        working_set: usage.saturating_sub(cache),
    })
}
