//! One agent's groups (`AgentCgroup`): listing, killing and removing what they hold, the OOM
//! count, and their part of a reload's hand-off.

use super::*;

/// One agent's groups (one per hierarchy; the first is used to list its processes).
#[derive(Debug)]
pub struct AgentCgroup {
    pub(super) dirs: Vec<(PathBuf, Version, Vec<&'static str>)>,
}

impl AgentCgroup {
    pub fn handoff_state(&self) -> Vec<super::handoff::CgroupDirState> {
        self.dirs
            .iter()
            .map(|(d, v, c)| super::handoff::dir_state(d, *v, c, None))
            .collect()
    }

    pub fn adopt(dirs: &[super::handoff::CgroupDirState]) -> Self {
        AgentCgroup {
            dirs: dirs
                .iter()
                .map(|d| {
                    (
                        d.dir.clone(),
                        if d.v2 { Version::V2 } else { Version::V1 },
                        super::handoff::controllers_from(&d.controllers),
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
    pub(super) fn remove_dirs_within(&self, attempts: usize) -> bool {
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
