//! Where each agent keeps its own session files, as the agent lays them out (found by the
//! session id, never by guessing a whole path), and where an import puts them back.
//!
//! - `mock`: `<work dir>/.mock-agent-sessions/<sessionId>.json`.
//! - `claude` (the Claude Code ACP adapter): `~/.claude/projects/<cwd, every character but
//!   A-Z a-z 0-9 turned into `-`>/<sessionId>.jsonl`; the import puts it under the directory of
//!   the mapped cwd and rewrites the cwd paths inside.
//! - `codex`: `$CODEX_HOME/sessions/YYYY/MM/DD/rollout-<time>-<sessionId>.jsonl` (`CODEX_HOME`
//!   defaults to `~/.codex`); the import rewrites the cwd paths inside.
//! - `gemini` (Gemini CLI): `~/.gemini/tmp/<project name>/chats/session-<time>-<first 8 of the
//!   sessionId>.jsonl` (the first line names the whole id); the project name is what
//!   `~/.gemini/projects.json` maps the cwd to. The import puts the file under the mapped cwd's
//!   project name (registering it the way Gemini CLI would when it has none) and rewrites the
//!   cwd paths and the cwd's sha256 (`projectHash`) inside.
//! - any other agent: no files are carried; its restore reports each session it cannot load.

use std::path::{Path, PathBuf};

use super::{BundleError, CwdMap};

/// Where one agent's files are: its HOME, its working directory and, for Codex, `CODEX_HOME`
/// (default `~/.codex`; its files are carried as `files/home/.codex/…` either way).
#[derive(Debug, Clone)]
pub struct Places {
    pub home: Option<PathBuf>,
    pub work_dir: PathBuf,
    pub codex_home: Option<PathBuf>,
}

impl Places {
    fn codex(&self) -> Option<PathBuf> {
        self.codex_home
            .clone()
            .or_else(|| self.home.as_ref().map(|h| h.join(".codex")))
    }
}

pub const HOME_PREFIX: &str = "files/home/";
pub const WORKDIR_PREFIX: &str = "files/workdir/";

/// Most directory entries looked at while finding one session's files.
const SCAN_MAX: usize = 20_000;

/// A session id that can be part of a file name.
fn plain(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= 128
        && !id.starts_with('.')
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

/// The files of session `sid`: (path in the bundle, path on disk). Blocking.
pub fn find(agent: &str, at: &Places, sid: &str) -> Vec<(String, PathBuf)> {
    if !plain(sid) {
        return Vec::new();
    }
    let mut out = Vec::new();
    match agent {
        "mock" => {
            let rel = format!(".mock-agent-sessions/{sid}.json");
            let p = at.work_dir.join(&rel);
            if is_file(&p) {
                out.push((format!("{WORKDIR_PREFIX}{rel}"), p));
            }
        }
        "claude" => {
            let Some(home) = &at.home else { return out };
            let name = format!("{sid}.jsonl");
            for dir in subdirs(&home.join(".claude/projects")) {
                let p = dir.join(&name);
                if is_file(&p)
                    && let Some(d) = dir.file_name().and_then(|d| d.to_str())
                {
                    out.push((format!("{HOME_PREFIX}.claude/projects/{d}/{name}"), p));
                }
            }
        }
        "codex" => {
            let Some(codex) = at.codex() else { return out };
            let root = codex.join("sessions");
            let tail = format!("-{sid}.jsonl");
            let mut seen = 0;
            for y in subdirs(&root) {
                for m in subdirs(&y) {
                    for d in subdirs(&m) {
                        let Ok(rd) = std::fs::read_dir(&d) else {
                            continue;
                        };
                        for e in rd.flatten() {
                            seen += 1;
                            if seen > SCAN_MAX {
                                return out;
                            }
                            let name = e.file_name();
                            let Some(name) = name.to_str() else { continue };
                            if name.starts_with("rollout-") && name.ends_with(&tail) {
                                let p = e.path();
                                if let Ok(rel) = p.strip_prefix(&codex)
                                    && let Some(rel) = rel.to_str()
                                    && is_file(&p)
                                {
                                    out.push((format!("{HOME_PREFIX}.codex/{rel}"), p));
                                }
                            }
                        }
                    }
                }
            }
        }
        "gemini" => {
            let Some(home) = &at.home else { return out };
            let tail = format!("-{}.jsonl", sid.get(..8).unwrap_or(sid));
            let needle = format!("\"sessionId\":\"{sid}\"");
            for project in subdirs(&home.join(".gemini/tmp")) {
                let Some(name) = project.file_name().and_then(|n| n.to_str()) else {
                    continue;
                };
                let Ok(rd) = std::fs::read_dir(project.join("chats")) else {
                    continue;
                };
                for e in rd.flatten().take(SCAN_MAX) {
                    let f = e.file_name();
                    let Some(f) = f.to_str() else { continue };
                    let p = e.path();
                    if f.starts_with("session-")
                        && f.ends_with(&tail)
                        && is_file(&p)
                        && first_line_has(&p, &needle)
                    {
                        out.push((format!("{HOME_PREFIX}.gemini/tmp/{name}/chats/{f}"), p));
                    }
                }
            }
        }
        _ => {}
    }
    out
}

/// Whether the file's first line (at most 64 KiB of it) holds `needle`.
fn first_line_has(p: &Path, needle: &str) -> bool {
    use std::io::Read;
    let mut buf = vec![0u8; 64 * 1024];
    let n = std::fs::File::open(p)
        .and_then(|mut f| f.read(&mut buf))
        .unwrap_or(0);
    let line = buf[..n].split(|b| *b == b'\n').next().unwrap_or(&[]);
    memchr::memmem::find(line, needle.as_bytes()).is_some()
}

/// Gemini CLI's project name for `cwd` on this machine: the one its `~/.gemini/projects.json`
/// gives, else the one it would give a new project (the directory's name, lower case, every
/// character but a-z 0-9 as `-`). `None` when that name is another project's.
pub fn gemini_project(home: &Path, cwd: &str) -> Result<(String, bool), BundleError> {
    let map: serde_json::Value = std::fs::read(home.join(".gemini/projects.json"))
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or_default();
    let projects = map.get("projects").and_then(|p| p.as_object());
    if let Some(name) = projects.and_then(|p| p.get(cwd)).and_then(|n| n.as_str()) {
        return Ok((name.to_string(), true));
    }
    let base = Path::new(cwd)
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or("root");
    let name: String = base
        .chars()
        .map(|c| {
            let c = c.to_ascii_lowercase();
            if c.is_ascii_alphanumeric() { c } else { '-' }
        })
        .collect();
    let taken = projects.is_some_and(|p| p.values().any(|v| v.as_str() == Some(&name)));
    if taken || home.join(".gemini/tmp").join(&name).exists() {
        return Err(BundleError::TargetExists {
            path: home.join(".gemini/tmp").join(&name).display().to_string(),
        });
    }
    Ok((name, false))
}

/// Gemini CLI's `session/load` first starts a new record of the session in
/// `chats/session-<the current minute, UTC>-<first 8 of the id>.jsonl`, whose opening
/// `$set: {messages}` empties the conversation when that is the session's own file (a load in
/// the minute the file's name gives); then it finds nothing to resume. So an imported file is
/// named for a minute before the import's (the name's time is Gemini CLI's only use of it).
pub fn gemini_file_before(file: &str, now_ms: u64) -> String {
    let Some(rest) = file.strip_prefix("chats/session-") else {
        return file.to_string();
    };
    let (Some(stamp), Some(tail)) = (rest.get(..STAMP), rest.get(STAMP..)) else {
        return file.to_string();
    };
    if stamp < minute(now_ms).as_str() {
        return file.to_string();
    }
    format!(
        "chats/session-{}{tail}",
        minute(now_ms.saturating_sub(60_000))
    )
}

/// The length of the minute in a Gemini session file's name (`2026-11-28T23-38`).
const STAMP: usize = "2026-11-28T23-38".len();

/// Most earlier minutes tried for a Gemini file renamed before a restore.
const MINUTES_BACK: u64 = 60;

/// The minute of `ms` as Gemini CLI writes it in a session file's name (UTC).
fn minute(ms: u64) -> String {
    let t = std::time::UNIX_EPOCH + std::time::Duration::from_millis(ms);
    let s = humantime::format_rfc3339_seconds(t).to_string();
    s.get(..STAMP).unwrap_or_default().replace(':', "-")
}

/// Before the restore of Gemini session `sid` after a restart (the same Gemini CLI behaviour as
/// [`gemini_file_before`], met by a restart within the minute the session began): each of the
/// session's files under `home` named for the current minute, or later, is renamed for the
/// latest earlier minute no file of that name holds (never replacing a file). Returns how many
/// were renamed. Blocking.
pub fn gemini_ready_for_load(home: &Path, sid: &str, now_ms: u64) -> std::io::Result<usize> {
    let at = Places {
        home: Some(home.to_path_buf()),
        work_dir: PathBuf::new(),
        codex_home: None,
    };
    let now = minute(now_ms);
    let mut renamed = 0;
    for (_, path) in find("gemini", &at, sid) {
        let Some(name) = path.file_name().and_then(|n| n.to_str()) else {
            continue;
        };
        let Some(rest) = name.strip_prefix("session-") else {
            continue;
        };
        let (Some(stamp), Some(tail)) = (rest.get(..STAMP), rest.get(STAMP..)) else {
            continue;
        };
        if stamp < now.as_str() {
            continue;
        }
        for back in 1..=MINUTES_BACK {
            let earlier = minute(now_ms.saturating_sub(back * 60_000));
            let to = path.with_file_name(format!("session-{earlier}{tail}"));
            // A link then an unlink: a name already taken is refused, not replaced.
            match std::fs::hard_link(&path, &to) {
                Ok(()) => {
                    std::fs::remove_file(&path)?;
                    renamed += 1;
                    break;
                }
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
                Err(e) => return Err(e),
            }
        }
    }
    Ok(renamed)
}

/// Registers a Gemini project (`projects.json` entry and its `.project_root` markers), as Gemini
/// CLI would at its first start there. Blocking.
pub fn register_gemini_project(home: &Path, cwd: &str, name: &str) -> std::io::Result<()> {
    let path = home.join(".gemini/projects.json");
    let mut map: serde_json::Value = std::fs::read(&path)
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or_else(|| serde_json::json!({"projects": {}}));
    if !map.get("projects").is_some_and(|p| p.is_object()) {
        map["projects"] = serde_json::json!({});
    }
    map["projects"][cwd] = serde_json::Value::String(name.to_string());
    std::fs::create_dir_all(home.join(".gemini"))?;
    let tmp = path.with_extension(format!("json.{}.tmp", crate::sys::random_hex::<4>()));
    std::fs::write(&tmp, serde_json::to_vec_pretty(&map).unwrap_or_default())?;
    std::fs::rename(&tmp, &path)?;
    for d in ["tmp", "history"] {
        let dir = home.join(".gemini").join(d).join(name);
        std::fs::create_dir_all(&dir)?;
        std::fs::write(dir.join(".project_root"), cwd)?;
    }
    Ok(())
}

fn is_file(p: &Path) -> bool {
    std::fs::symlink_metadata(p).is_ok_and(|m| m.file_type().is_file())
}

/// The subdirectories of `dir` (not following symlinks), bounded.
fn subdirs(dir: &Path) -> Vec<PathBuf> {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    rd.flatten()
        .take(SCAN_MAX)
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .map(|e| e.path())
        .collect()
}

/// Claude Code's directory name for a project at `cwd`.
pub fn claude_project_dir(cwd: &str) -> String {
    cwd.chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
        .collect()
}

/// Where an agent file of the bundle goes on this machine, given its session's cwd here.
pub fn target(
    agent: &str,
    at: &Places,
    bundle_path: &str,
    new_cwd: Option<&str>,
) -> Result<PathBuf, BundleError> {
    if let Some(rel) = bundle_path.strip_prefix(WORKDIR_PREFIX) {
        return Ok(at.work_dir.join(rel));
    }
    let rel = bundle_path
        .strip_prefix(HOME_PREFIX)
        .ok_or_else(|| BundleError::invalid(format!("`{bundle_path}` is not an agent file")))?;
    if agent == "gemini"
        && let (Some(rest), Some(cwd), Some(home)) =
            (rel.strip_prefix(".gemini/tmp/"), new_cwd, at.home.as_ref())
        && let Some((_, file)) = rest.split_once('/')
    {
        let (name, _) = gemini_project(home, cwd)?;
        let file = gemini_file_before(file, crate::acp::inventory::now_ms());
        return Ok(home.join(".gemini/tmp").join(name).join(file));
    }
    if agent == "codex"
        && let Some(rest) = rel.strip_prefix(".codex/")
        && let Some(codex) = at.codex()
    {
        return Ok(codex.join(rest));
    }
    let home = at.home.as_ref().ok_or_else(|| BundleError::NoHome {
        path: bundle_path.to_string(),
    })?;
    if agent == "claude"
        && let (Some(rest), Some(cwd)) = (rel.strip_prefix(".claude/projects/"), new_cwd)
        && let Some((_, file)) = rest.split_once('/')
    {
        return Ok(home
            .join(".claude/projects")
            .join(claude_project_dir(cwd))
            .join(file));
    }
    Ok(home.join(rel))
}

/// Whether the agent's files name their cwd inside (and so are rewritten by a cwd mapping).
pub fn names_cwd(agent: &str) -> bool {
    matches!(agent, "claude" | "codex" | "gemini")
}

/// One line with every JSON string naming a mapped directory (or a path beneath it) rewritten,
/// and the sha256 of a mapped directory (Gemini's `projectHash`) replaced by the new one's.
pub fn rewrite_line(line: &[u8], maps: &[CwdMap]) -> Vec<u8> {
    let mut cur = line.to_vec();
    for m in maps {
        use sha2::Digest;
        let (old_h, new_h) = (
            crate::sys::hex(&sha2::Sha256::digest(m.old.as_bytes())),
            crate::sys::hex(&sha2::Sha256::digest(m.new.as_bytes())),
        );
        if memchr::memmem::find(&cur, old_h.as_bytes()).is_some() {
            let mut out = Vec::with_capacity(cur.len());
            let mut rest = &cur[..];
            while let Some(i) = memchr::memmem::find(rest, old_h.as_bytes()) {
                out.extend_from_slice(&rest[..i]);
                out.extend_from_slice(new_h.as_bytes());
                rest = &rest[i + old_h.len()..];
            }
            out.extend_from_slice(rest);
            cur = out;
        }
        let enc = |s: &str| serde_json::to_string(s).unwrap_or_default();
        let (old, new) = (enc(&m.old), enc(&m.new));
        // `"OLD"` exactly, and `"OLD/…` (a path beneath it).
        let old_exact = old.as_bytes();
        let old_open = &old.as_bytes()[..old.len() - 1];
        let new_open = &new.as_bytes()[..new.len() - 1];
        let mut out = Vec::with_capacity(cur.len());
        let mut i = 0;
        while i < cur.len() {
            let rest = &cur[i..];
            if rest.starts_with(old_exact) {
                out.extend_from_slice(new.as_bytes());
                i += old_exact.len();
            } else if rest.starts_with(old_open) && rest.get(old_open.len()) == Some(&b'/') {
                out.extend_from_slice(new_open);
                i += old_open.len();
            } else {
                out.push(cur[i]);
                i += 1;
            }
        }
        cur = out;
    }
    cur
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_gemini_file_is_named_for_a_minute_before_the_import() {
        // 2026-11-28T23:38:13Z
        let now = 1_795_909_093_000;
        let f = "chats/session-2026-11-28T23-38-de68494f.jsonl";
        assert_eq!(
            super::gemini_file_before(f, now),
            "chats/session-2026-11-28T23-37-de68494f.jsonl"
        );
        let old = "chats/session-2026-11-28T22-10-de68494f.jsonl";
        assert_eq!(super::gemini_file_before(old, now), old);
        assert_eq!(
            super::gemini_file_before("chats/x.jsonl", now),
            "chats/x.jsonl"
        );
    }

    /// Before a restart's restore: the session's file of the current minute goes to the latest
    /// earlier minute that is free (one is held by another file of the session); older files
    /// and other sessions' files stay as they are.
    #[test]
    fn a_gemini_file_of_the_current_minute_is_renamed_before_a_restore() {
        let tmp = tempfile::tempdir().unwrap();
        let chats = tmp.path().join(".gemini/tmp/proj/chats");
        std::fs::create_dir_all(&chats).unwrap();
        let sid = "de68494f-1111-2222-3333-444455556666";
        let other = "de68494f-9999-2222-3333-444455556666";
        let line = |id: &str| format!("{{\"sessionId\":\"{id}\"}}\n");
        // 2026-11-28T23:38:13Z
        let now = 1_795_909_093_000;
        let put = |name: &str, id: &str| std::fs::write(chats.join(name), line(id)).unwrap();
        put("session-2026-11-28T23-38-de68494f.jsonl", sid);
        put("session-2026-11-28T23-37-de68494f.jsonl", sid);
        put("session-2026-11-28T22-10-de68494f.jsonl", sid);
        std::fs::create_dir_all(tmp.path().join(".gemini/tmp/else/chats")).unwrap();
        let foreign = tmp
            .path()
            .join(".gemini/tmp/else/chats/session-2026-11-28T23-38-de68494f.jsonl");
        std::fs::write(&foreign, line(other)).unwrap();
        assert_eq!(
            super::gemini_ready_for_load(tmp.path(), sid, now).unwrap(),
            1
        );
        let mut names: Vec<String> = std::fs::read_dir(&chats)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        names.sort();
        assert_eq!(
            names,
            [
                "session-2026-11-28T22-10-de68494f.jsonl",
                "session-2026-11-28T23-36-de68494f.jsonl",
                "session-2026-11-28T23-37-de68494f.jsonl",
            ]
        );
        assert_eq!(
            std::fs::read_to_string(chats.join("session-2026-11-28T23-36-de68494f.jsonl")).unwrap(),
            line(sid)
        );
        assert!(foreign.exists());
        // Nothing left to rename.
        assert_eq!(
            super::gemini_ready_for_load(tmp.path(), sid, now).unwrap(),
            0
        );
    }

    #[test]
    fn cwd_strings_are_rewritten_whole_or_as_a_prefix() {
        let maps = [CwdMap::parse("/work/a=/srv/b").unwrap()];
        let got = rewrite_line(
            br#"{"cwd":"/work/a","f":"/work/a/x.rs","g":"/work/ab","h":"x /work/a"}"#,
            &maps,
        );
        assert_eq!(
            String::from_utf8(got).unwrap(),
            r#"{"cwd":"/srv/b","f":"/srv/b/x.rs","g":"/work/ab","h":"x /work/a"}"#
        );
        assert_eq!(claude_project_dir("/tmp/x.y/z"), "-tmp-x-y-z");
        // Gemini's projectHash: the sha256 of the cwd.
        use sha2::Digest;
        let h = |s: &str| crate::sys::hex(&sha2::Sha256::digest(s.as_bytes()));
        let line = format!(r#"{{"projectHash":"{}"}}"#, h("/work/a"));
        let got = String::from_utf8(rewrite_line(line.as_bytes(), &maps)).unwrap();
        assert_eq!(got, format!(r#"{{"projectHash":"{}"}}"#, h("/srv/b")));
    }
}
