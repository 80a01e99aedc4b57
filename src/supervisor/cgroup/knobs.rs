//! The limit files of a group (memory, pids, cpu; v1 and v2 spellings), each written and read
//! back, with a warning once per kind when a limit did not take.

use super::*;

pub(super) fn read_words(path: &Path) -> Vec<String> {
    fs::read_to_string(path)
        .map(|t| t.split_whitespace().map(str::to_owned).collect())
        .unwrap_or_default()
}

pub(super) fn write_file(path: &Path, value: &str) -> io::Result<()> {
    let mut f = OpenOptions::new().write(true).open(path)?;
    f.write_all(value.as_bytes())
}

pub(super) fn read_u64(path: &Path) -> Option<u64> {
    fs::read_to_string(path).ok()?.trim().parse().ok()
}

/// Warns once per limit kind when a limit did not take.
pub(super) fn not_applied(what: &'static str, flag: &AtomicBool, path: &Path, detail: String) {
    if !flag.swap(true, Ordering::Relaxed) {
        tracing::warn!(limit = what, file = %path.display(), detail, "agent limit did not take effect (reported once)");
    } else {
        tracing::debug!(limit = what, file = %path.display(), detail, "agent limit did not take effect");
    }
}

pub(super) static MEMORY_WARNED: AtomicBool = AtomicBool::new(false);
pub(super) static PIDS_WARNED: AtomicBool = AtomicBool::new(false);
pub(super) static CPU_WARNED: AtomicBool = AtomicBool::new(false);

pub(super) fn set_memory(dir: &Path, version: Version, max: Option<u64>) -> bool {
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

pub(super) fn set_pids(dir: &Path, max: Option<u64>) -> bool {
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
pub(super) fn set_cpu(dir: &Path, version: Version, cores: Option<f64>) -> bool {
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
