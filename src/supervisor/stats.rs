//! Process figures from procfs (rss, cpu time, process count, open fds), summed over an agent's
//! processes: those of its cgroup, or of its process group when there is no cgroup. Read on
//! demand only (for the listing), a few small files per process.

use std::collections::HashMap;
use std::fs;

use super::ProcessStats;

/// The fields of `/proc/<pid>/stat` we use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stat {
    pub ppid: i32,
    pub pgrp: i32,
    /// State `Z`: exited, not yet reaped by its parent.
    pub zombie: bool,
    /// State `T` or `t`: stopped by a signal, or by a tracer.
    pub stopped: bool,
    /// utime + stime, in clock ticks.
    pub cpu_ticks: u64,
    pub rss_pages: u64,
}

/// Parses `/proc/<pid>/stat`. The command name may hold spaces and parentheses, so fields are
/// counted from the last `)`.
pub fn parse_stat(text: &str) -> Option<Stat> {
    let rest = &text[text.rfind(')')? + 1..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // After the name: state(3) ppid(4) pgrp(5) … utime(14) stime(15) … rss(24), 1-based overall.
    let at = |n: usize| f.get(n - 3).and_then(|v| v.parse::<i64>().ok());
    Some(Stat {
        ppid: at(4)? as i32,
        pgrp: at(5)? as i32,
        zombie: *f.first()? == "Z",
        stopped: matches!(*f.first()?, "T" | "t"),
        cpu_ticks: (at(14)?.max(0) + at(15)?.max(0)) as u64,
        rss_pages: at(24)?.max(0) as u64,
    })
}

pub fn read_stat(pid: i32) -> Option<Stat> {
    parse_stat(&fs::read_to_string(format!("/proc/{pid}/stat")).ok()?)
}

/// Members of process group `pgid` (a scan of /proc; used only without a cgroup).
pub fn group_members(pgid: i32) -> Vec<i32> {
    every_pid()
        .filter(|pid| read_stat(*pid).is_some_and(|s| s.pgrp == pgid))
        .collect()
}

fn every_pid() -> impl Iterator<Item = i32> {
    fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
}

/// The process groups of the whole machine from one `/proc` scan, made on the first question: a
/// listing of many agents without cgroups scans once, not once per agent.
#[derive(Default)]
pub struct GroupScan {
    groups: Option<HashMap<i32, Vec<i32>>>,
}

impl GroupScan {
    /// Members of process group `pgid` as the scan found them.
    pub fn members(&mut self, pgid: i32) -> Vec<i32> {
        let groups = self.groups.get_or_insert_with(|| every_group(true));
        groups.get(&pgid).cloned().unwrap_or_default()
    }
}

/// Every process group of the machine with its members, from one `/proc` scan; its zombies too
/// when `zombies`.
pub(super) fn every_group(zombies: bool) -> HashMap<i32, Vec<i32>> {
    let mut groups: HashMap<i32, Vec<i32>> = HashMap::new();
    for pid in every_pid() {
        if let Some(st) = read_stat(pid).filter(|s| zombies || !s.zombie) {
            groups.entry(st.pgrp).or_default().push(pid);
        }
    }
    groups
}

/// Sums the figures over `pids` (processes that vanished meanwhile are skipped).
pub fn collect(pids: &[i32]) -> ProcessStats {
    let ticks = crate::sys::clock_ticks().max(1);
    let page = crate::sys::page_size();
    let mut out = ProcessStats::default();
    for pid in pids {
        let Some(st) = read_stat(*pid) else { continue };
        out.processes += 1;
        out.cpu_ms += st.cpu_ticks * 1000 / ticks;
        out.rss_bytes += st.rss_pages * page;
        if let Ok(fds) = fs::read_dir(format!("/proc/{pid}/fd")) {
            out.open_fds += fds.count() as u64;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_stat_with_a_hostile_command_name() {
        let text = "1234 (a) b (c) S 1 1234 1234 0 -1 4194560 100 0 0 0 250 50 0 0 20 0 3 0 12345 1000000 777 18446744073709551615 0 0 0 0 0 0 0 0 0 0 0 0 17 0 0 0 0 0 0\n";
        let st = parse_stat(text).expect("parses");
        assert_eq!(st.pgrp, 1234);
        assert_eq!(st.cpu_ticks, 300);
        assert_eq!(st.rss_pages, 777);
        assert_eq!(parse_stat("garbage"), None);
    }

    #[test]
    fn own_process_figures_are_plausible() {
        let me = std::process::id() as i32;
        let s = collect(&[me, i32::MAX]);
        assert_eq!(s.processes, 1);
        assert!(s.rss_bytes > 0);
        assert!(s.open_fds >= 3);
        let pgrp = read_stat(me).expect("own stat").pgrp;
        assert!(group_members(pgrp).contains(&me));
        let mut scan = GroupScan::default();
        assert!(scan.members(pgrp).contains(&me));
        assert!(scan.members(-1).is_empty());
    }
}
