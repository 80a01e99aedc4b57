//! Reading a bundle: the body is unpacked as it arrives (through a bounded channel to the
//! blocking pool) into a staging directory beneath the state dir, every file checked against
//! the manifest (size, sha256), the manifest's version and every path checked, and only then
//! anything put in place: the agent's files beside their targets and renamed (all or none),
//! the serverId registered as restorable with its event log (the original ids).

use std::collections::{HashMap, VecDeque};
use std::io::{BufRead, Read, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use bytes::Bytes;
use sha2::{Digest, Sha256};
use tokio::sync::mpsc;
use tokio_stream::{Stream, StreamExt};

use super::agent_files::{self, Places};
use super::{
    BundleError, CwdMap, EVENTS, FORMAT, MANIFEST, MAX_DEPTH, MAX_FILES, MAX_MANIFEST, Manifest,
};
use crate::acp::AcpService;
use crate::acp::durable::{AcpMeta, SessionRecord};
use crate::acp::registry::ImportReservation;

/// Events appended to the state dir between waits for the writer.
const EVENT_BATCH: usize = 4096;
/// Bytes of the body a refused import still reads (and drops) before it answers.
const DRAIN_MAX: usize = 64 << 20;

/// What an import did.
#[derive(Debug)]
pub struct Imported {
    pub agent: String,
    pub sessions: Vec<String>,
    pub events: u64,
    pub files: Vec<PathBuf>,
}

/// Imports the bundle `body` as `server_id`. `limit`: bytes of the body, and of what it unpacks
/// to (each); `declared`: the body's Content-Length, if any.
pub async fn import<S, E>(
    acp: &AcpService,
    places: &(dyn Fn(&str) -> Places + Sync),
    server_id: &str,
    maps: Vec<CwdMap>,
    mut body: S,
    (limit, declared, idle): (u64, Option<u64>, std::time::Duration),
) -> Result<Imported, BundleError>
where
    S: Stream<Item = Result<Bytes, E>> + Unpin,
    E: std::fmt::Display,
{
    let res = import_body(
        acp,
        places,
        server_id,
        maps,
        &mut body,
        (limit, declared, idle),
    )
    .await;
    if res.is_err() {
        // A refusal reads on (a bounded amount) so that the client, still sending, gets the
        // answer rather than a broken pipe.
        let mut n = 0usize;
        while n < DRAIN_MAX {
            match tokio::time::timeout(idle, body.next()).await {
                Ok(Some(Ok(b))) => n += b.len(),
                _ => break,
            }
        }
    }
    res
}

async fn import_body<S, E>(
    acp: &AcpService,
    places: &(dyn Fn(&str) -> Places + Sync),
    server_id: &str,
    maps: Vec<CwdMap>,
    body: &mut S,
    (limit, declared, idle): (u64, Option<u64>, std::time::Duration),
) -> Result<Imported, BundleError>
where
    S: Stream<Item = Result<Bytes, E>> + Unpin,
    E: std::fmt::Display,
{
    let store = acp.state_store().ok_or(BundleError::NoStateDir)?;
    if declared.is_some_and(|n| n > limit) {
        return Err(BundleError::TooLarge { limit });
    }
    // Held until the import ends: no POST creates it, no second import takes it meanwhile.
    let held = acp
        .reserve_import(server_id)
        .ok_or_else(|| BundleError::Exists {
            server_id: server_id.to_string(),
        })?;
    let staging = store
        .dir()
        .join(crate::state::dir::IMPORTS)
        .join(crate::sys::random_hex::<8>());
    let dir = staging.clone();
    crate::sys::blocking(move || {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&dir)
    })
    .await
    .map_err(BundleError::io(format!("creating {}", staging.display())))?;
    let res = import_staged(
        acp,
        &held,
        places,
        server_id,
        maps,
        body,
        (limit, idle),
        &staging,
    )
    .await;
    let s = staging.clone();
    crate::sys::blocking(move || std::fs::remove_dir_all(s))
        .await
        .ok();
    res
}

#[allow(clippy::too_many_arguments)]
async fn import_staged<S, E>(
    acp: &AcpService,
    held: &ImportReservation<'_>,
    places: &(dyn Fn(&str) -> Places + Sync),
    server_id: &str,
    maps: Vec<CwdMap>,
    body: &mut S,
    (limit, idle): (u64, std::time::Duration),
    staging: &Path,
) -> Result<Imported, BundleError>
where
    S: Stream<Item = Result<Bytes, E>> + Unpin,
    E: std::fmt::Display,
{
    // The body, through a bounded channel, into the unpacking on the blocking pool.
    let (tx, rx) = mpsc::channel::<Bytes>(4);
    let dir = staging.to_path_buf();
    let unpack = tokio::task::spawn_blocking(move || {
        unpack(
            ChanReader {
                rx,
                cur: Bytes::new(),
            },
            &dir,
            limit,
        )
    });
    let mut received: u64 = 0;
    let mut body_err = None;
    loop {
        // A body that stalls for the idle timeout ends the import (the unpacking waits for it).
        let Ok(next) = tokio::time::timeout(idle, body.next()).await else {
            body_err = Some(BundleError::invalid(format!(
                "the body stalled for {} s",
                idle.as_secs()
            )));
            break;
        };
        let Some(chunk) = next else { break };
        match chunk {
            Ok(b) => {
                received += b.len() as u64;
                if received > limit {
                    body_err = Some(BundleError::TooLarge { limit });
                    break;
                }
                if tx.send(b).await.is_err() {
                    break; // the unpacking ended (refused the bundle)
                }
            }
            Err(e) => {
                body_err = Some(BundleError::invalid(format!("the body ended early: {e}")));
                break;
            }
        }
    }
    drop(tx);
    let staged = unpack
        .await
        .unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic()));
    if let Some(e) = body_err {
        return Err(e);
    }
    let mut staged = staged?;
    let m = &mut staged.manifest;
    if !acp.knows_agent(&m.agent) {
        return Err(BundleError::UnknownAgent {
            agent: m.agent.clone(),
        });
    }
    for s in m.sessions.iter_mut() {
        if let Some(cwd) = s.cwd.as_str() {
            s.cwd = serde_json::Value::String(super::map_cwd(&maps, cwd));
        }
    }
    // Where the agent's files go, none of which may exist.
    let cwd_of: HashMap<String, Option<String>> = m
        .sessions
        .iter()
        .map(|s| (s.session_id.clone(), s.cwd.as_str().map(str::to_string)))
        .collect();
    let places = places(&m.agent);
    let mut place = Vec::new();
    for f in m.files.iter().filter(|f| f.path != EVENTS) {
        let cwd = f
            .session_id
            .as_ref()
            .and_then(|s| cwd_of.get(s).cloned().flatten());
        let to = agent_files::target(&m.agent, &places, &f.path, cwd.as_deref())?;
        let from = staged.files.get(&f.path).cloned().unwrap_or_default();
        place.push((from, to));
    }
    // Gemini CLI finds a session under its project's name: one the mapped cwd does not have yet
    // is registered as Gemini CLI would at its first start there.
    let mut projects: Vec<(PathBuf, String, String)> = Vec::new();
    if m.agent == "gemini"
        && let Some(home) = places.home.clone()
    {
        for f in m.files.iter().filter(|f| f.path != EVENTS) {
            let cwd = f
                .session_id
                .as_ref()
                .and_then(|s| cwd_of.get(s).cloned().flatten());
            if let Some(cwd) = cwd
                && !projects.iter().any(|p| p.1 == cwd)
                && let (name, false) = agent_files::gemini_project(&home, &cwd)?
            {
                projects.push((home.clone(), cwd, name));
            }
        }
    }
    let agent = m.agent.clone();
    let rewrite = agent_files::names_cwd(&agent) && !maps.is_empty();
    let placed = crate::sys::blocking(move || {
        let placed = place_all(place, rewrite.then_some(maps))?;
        for (home, cwd, name) in projects {
            agent_files::register_gemini_project(&home, &cwd, &name)
                .map_err(BundleError::io("registering the Gemini project"))?;
        }
        Ok::<_, BundleError>(placed)
    })
    .await?;
    match register(acp, held, server_id, &staged).await {
        Ok(events) => Ok(Imported {
            agent,
            sessions: staged
                .manifest
                .sessions
                .iter()
                .map(|s| s.session_id.clone())
                .collect(),
            events,
            files: placed,
        }),
        Err(e) => {
            crate::sys::blocking(move || {
                for p in placed {
                    let _ = std::fs::remove_file(p);
                }
            })
            .await;
            Err(e)
        }
    }
}

/// The serverId made restorable: its durable state written (meta, then every event with its
/// id, waiting for the writer every few thousand), then the instance listed as `exited`.
async fn register(
    acp: &AcpService,
    held: &ImportReservation<'_>,
    server_id: &str,
    staged: &Staged,
) -> Result<u64, BundleError> {
    let store = acp.state_store().ok_or(BundleError::NoStateDir)?;
    let m = &staged.manifest;
    let meta = AcpMeta {
        agent: m.agent.clone(),
        created_at_ms: m.created_at_ms,
        id_floor: m.events.last_id,
        initialize: m.initialize.clone(),
        load_session: m.load_session,
        resume_session: m.resume_session,
        list_sessions: m.list_sessions,
        sessions: m
            .sessions
            .iter()
            .map(|s| SessionRecord {
                session_id: s.session_id.clone(),
                cwd: s.cwd.clone(),
                mcp_servers: s.mcp_servers.clone(),
                sealed: None,
                secrets: 0,
                created_at_ms: s.created_at_ms,
                title: s
                    .title
                    .as_deref()
                    .map(|t| crate::acp::inventory::clip(t.to_string())),
            })
            .collect(),
        promised: Vec::new(),
    };
    let t = crate::acp::durable::Tracked::imported(&store, server_id, meta);
    let keep = acp.log_limits().max_events;
    let path = staged.events.clone();
    let t2 = t.clone();
    let rt = tokio::runtime::Handle::current();
    let (count, tail) = crate::sys::blocking(move || -> Result<_, BundleError> {
        let f = std::fs::File::open(&path).map_err(BundleError::io("reading the staged log"))?;
        let mut tail: VecDeque<(u64, Bytes)> = VecDeque::new();
        let mut n = 0u64;
        for line in std::io::BufReader::new(f).split(b'\n') {
            let line = line.map_err(BundleError::io("reading the staged log"))?;
            let (id, json) = split_event(&line)?;
            let json = Bytes::copy_from_slice(json);
            t2.append_imported(id, json.clone());
            tail.push_back((id, json));
            if tail.len() > keep {
                tail.pop_front();
            }
            n += 1;
            if n.is_multiple_of(EVENT_BATCH as u64) {
                rt.block_on(t2.written());
            }
        }
        rt.block_on(t2.written());
        Ok((n, tail))
    })
    .await?;
    let next_id = m.events.last_id + crate::state::RESTART_ID_SKIP + 1;
    if !acp.insert_imported(held, server_id, m, tail.into(), next_id, t.clone()) {
        t.forget();
        return Err(BundleError::Exists {
            server_id: server_id.to_string(),
        });
    }
    Ok(count)
}

/// Copies each staged file beside its target (rewriting cwd paths when asked), then renames
/// them all; any failure removes what was put. Refuses before writing when a target exists.
fn place_all(
    place: Vec<(PathBuf, PathBuf)>,
    maps: Option<Vec<CwdMap>>,
) -> Result<Vec<PathBuf>, BundleError> {
    for (_, to) in &place {
        if std::fs::symlink_metadata(to).is_ok() {
            return Err(BundleError::TargetExists {
                path: to.display().to_string(),
            });
        }
    }
    let mut temps = Vec::new();
    let mut done = Vec::new();
    let res = (|| {
        for (from, to) in &place {
            let parent = to.parent().unwrap_or(Path::new("/"));
            std::fs::create_dir_all(parent)
                .map_err(BundleError::io(format!("creating {}", parent.display())))?;
            let tmp = parent.join(format!(".bundle-{}.tmp", crate::sys::random_hex::<6>()));
            let what = format!("writing {}", tmp.display());
            let mut out = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .custom_flags(nix::libc::O_NOFOLLOW)
                .open(&tmp)
                .map_err(BundleError::io(what.clone()))?;
            temps.push(tmp.clone());
            let inp = std::fs::File::open(from).map_err(BundleError::io(what.clone()))?;
            match &maps {
                Some(maps) => {
                    for line in std::io::BufReader::new(inp).split(b'\n') {
                        let line = line.map_err(BundleError::io(what.clone()))?;
                        out.write_all(&agent_files::rewrite_line(&line, maps))
                            .and_then(|()| out.write_all(b"\n"))
                            .map_err(BundleError::io(what.clone()))?;
                    }
                }
                None => {
                    std::io::copy(&mut std::io::BufReader::new(inp), &mut out)
                        .map_err(BundleError::io(what.clone()))?;
                }
            }
            out.sync_all().map_err(BundleError::io(what))?;
        }
        for ((_, to), tmp) in place.iter().zip(&temps) {
            std::fs::rename(tmp, to)
                .map_err(BundleError::io(format!("renaming to {}", to.display())))?;
            done.push(to.clone());
        }
        Ok(())
    })();
    if let Err(e) = res {
        for p in temps.iter().chain(&done) {
            let _ = std::fs::remove_file(p);
        }
        return Err(e);
    }
    Ok(done)
}

/// The bundle, unpacked and checked.
pub struct Staged {
    pub manifest: Manifest,
    /// Path in the bundle → staged file.
    pub files: HashMap<String, PathBuf>,
    pub events: PathBuf,
}

fn split_event(line: &[u8]) -> Result<(u64, &[u8]), BundleError> {
    let bad = || BundleError::invalid("events.log has a line that is not `<id> <json>`");
    let sp = memchr::memchr(b' ', line).ok_or_else(bad)?;
    let id = std::str::from_utf8(&line[..sp])
        .ok()
        .filter(|s| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()))
        .and_then(|s| s.parse::<u64>().ok())
        .ok_or_else(bad)?;
    Ok((id, &line[sp + 1..]))
}

/// Unpacks the bundle into `dir` (flat, one file per entry) and checks it whole. Blocking.
pub fn unpack(input: impl Read, dir: &Path, limit: u64) -> Result<Staged, BundleError> {
    let over = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let gz = flate2::read::GzDecoder::new(input);
    let ar = tar::Archive::new(Capped {
        inner: gz,
        left: limit,
        limit,
        over: over.clone(),
    });
    let res = unpack_into(ar, dir);
    if over.load(std::sync::atomic::Ordering::Acquire) {
        return Err(BundleError::TooLarge { limit });
    }
    let files = res?;
    check(files)
}

type StagedFiles = (HashMap<String, (PathBuf, u64, String)>, Option<Vec<u8>>);

fn unpack_into<R: Read>(mut ar: tar::Archive<R>, dir: &Path) -> Result<StagedFiles, BundleError> {
    let inv = |what: &str| {
        let what = what.to_string();
        move |e: std::io::Error| BundleError::invalid(format!("{what}: {e}"))
    };
    let mut files: HashMap<String, (PathBuf, u64, String)> = HashMap::new();
    let mut manifest: Option<Vec<u8>> = None;
    for (n, entry) in ar.entries().map_err(inv("reading the tar"))?.enumerate() {
        let mut e = entry.map_err(inv("reading the tar"))?;
        let raw = e.path().map_err(inv("an entry's path"))?.into_owned();
        let shown = raw.to_string_lossy().into_owned();
        let kind = e.header().entry_type();
        if kind.is_dir() {
            continue;
        }
        if !kind.is_file() {
            return Err(BundleError::invalid(format!(
                "`{shown}` is not a regular file (links, devices and fifos are refused)"
            )));
        }
        let path = crate::archive::entry_path(&raw, &shown)
            .map_err(|e| BundleError::invalid(e.to_string()))?;
        let path = path
            .to_str()
            .ok_or_else(|| BundleError::invalid(format!("`{shown}` is not UTF-8")))?
            .to_string();
        let known = path == EVENTS
            || path == MANIFEST
            || path.starts_with(agent_files::HOME_PREFIX)
            || path.starts_with(agent_files::WORKDIR_PREFIX);
        if !known || path.split('/').count() > MAX_DEPTH {
            return Err(BundleError::invalid(format!(
                "`{shown}` is not a path a bundle holds"
            )));
        }
        if files.contains_key(&path) || (path == MANIFEST && manifest.is_some()) {
            return Err(BundleError::invalid(format!("`{shown}` appears twice")));
        }
        if files.len() > MAX_FILES {
            return Err(BundleError::invalid(format!("more than {MAX_FILES} files")));
        }
        if path == MANIFEST {
            let mut m = Vec::new();
            (&mut e)
                .take(MAX_MANIFEST + 1)
                .read_to_end(&mut m)
                .map_err(inv("reading the manifest"))?;
            if m.len() as u64 > MAX_MANIFEST {
                return Err(BundleError::invalid("the manifest is too large"));
            }
            manifest = Some(m);
            continue;
        }
        let staged = dir.join(format!("{n}"));
        let mut out = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(nix::libc::O_NOFOLLOW)
            .open(&staged)
            .map_err(BundleError::io(format!("staging {}", staged.display())))?;
        let mut hash = Sha256::new();
        let mut size = 0u64;
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            let k = e
                .read(&mut buf)
                .map_err(inv(&format!("reading `{shown}`")))?;
            if k == 0 {
                break;
            }
            hash.update(&buf[..k]);
            size += k as u64;
            out.write_all(&buf[..k])
                .map_err(BundleError::io(format!("staging {}", staged.display())))?;
        }
        files.insert(path, (staged, size, crate::sys::hex(&hash.finalize())));
    }
    // The rest of the stream: the gzip trailer (its CRC and length) is checked here.
    std::io::copy(&mut ar.into_inner(), &mut std::io::sink())
        .map_err(inv("reading the end of the gzip stream"))?;
    Ok((files, manifest))
}

/// The staged files against the manifest.
fn check((files, manifest): StagedFiles) -> Result<Staged, BundleError> {
    let manifest = manifest.ok_or_else(|| BundleError::invalid("no manifest.json"))?;
    let manifest: Manifest = serde_json::from_slice(&manifest)
        .map_err(|e| BundleError::invalid(format!("manifest.json: {e}")))?;
    if manifest.format != FORMAT || manifest.version != super::VERSION {
        return Err(BundleError::invalid(format!(
            "format `{}` version {}: this daemon reads `{FORMAT}` version {}",
            manifest.format,
            manifest.version,
            super::VERSION
        )));
    }
    if manifest.files.len() != files.len() {
        return Err(BundleError::invalid(
            "the manifest and the bundle's files differ",
        ));
    }
    for f in &manifest.files {
        let Some((_, size, sha)) = files.get(&f.path) else {
            return Err(BundleError::invalid(format!(
                "`{}` is in the manifest, not in the bundle",
                f.path
            )));
        };
        if *size != f.size || !sha.eq_ignore_ascii_case(&f.sha256) {
            return Err(BundleError::invalid(format!(
                "`{}` does not match the manifest (size or sha256)",
                f.path
            )));
        }
    }
    let events = files
        .get(EVENTS)
        .map(|f| f.0.clone())
        .ok_or_else(|| BundleError::invalid("no events.log"))?;
    check_events(&events, &manifest)?;
    for s in &manifest.sessions {
        if s.session_id.is_empty() || s.session_id.len() > 1024 {
            return Err(BundleError::invalid("a session without a usable id"));
        }
    }
    Ok(Staged {
        manifest,
        files: files.into_iter().map(|(k, v)| (k, v.0)).collect(),
        events,
    })
}

/// Every event line `<id> <json object>`, ids increasing, as many as the manifest says.
fn check_events(path: &Path, m: &Manifest) -> Result<(), BundleError> {
    let f = std::fs::File::open(path).map_err(BundleError::io("reading the staged log"))?;
    let (mut n, mut last) = (0u64, 0u64);
    for line in std::io::BufReader::new(f).split(b'\n') {
        let line = line.map_err(BundleError::io("reading the staged log"))?;
        let (id, json) = split_event(&line)?;
        if id <= last {
            return Err(BundleError::invalid("events.log: ids are not increasing"));
        }
        if !json.starts_with(b"{") || serde_json::from_slice::<serde::de::IgnoredAny>(json).is_err()
        {
            return Err(BundleError::invalid(format!(
                "events.log: event {id} is not a JSON object"
            )));
        }
        last = id;
        n += 1;
    }
    if n != m.events.count || last != m.events.last_id {
        return Err(BundleError::invalid(
            "events.log does not match the manifest's count and last id",
        ));
    }
    Ok(())
}

/// The unpacked stream, bounded (`over` says that is why it failed).
struct Capped<R> {
    inner: R,
    left: u64,
    limit: u64,
    over: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl<R: Read> Read for Capped<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.left = self.left.checked_sub(n as u64).ok_or_else(|| {
            self.over.store(true, std::sync::atomic::Ordering::Release);
            std::io::Error::other(format!(
                "it unpacks to more than --bundle-max-bytes ({} bytes)",
                self.limit
            ))
        })?;
        Ok(n)
    }
}

/// The body's chunks as a `Read`, on the blocking pool.
struct ChanReader {
    rx: mpsc::Receiver<Bytes>,
    cur: Bytes,
}

impl Read for ChanReader {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        while self.cur.is_empty() {
            match self.rx.blocking_recv() {
                Some(b) => self.cur = b,
                None => return Ok(0),
            }
        }
        let n = buf.len().min(self.cur.len());
        buf[..n].copy_from_slice(&self.cur[..n]);
        let _ = self.cur.split_to(n);
        Ok(n)
    }
}
