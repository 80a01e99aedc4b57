//! One watch stream's thread: installs the kernel watches (the watched directory, and with
//! `recursive` every directory beneath it that is not ignored), then turns inotify events into
//! changes until the reader goes away. Every directory is opened beneath the watched directory
//! without following any symlink (`RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS`) and watched through
//! that descriptor (`/proc/self/fd/N`), so a symlink or a rename race can never put a watch
//! outside the tree. Walks are iterative; nothing here recurses on the tree's depth.
//!
//! Exactly-once for new directories: a directory that appears is watched first, then listed;
//! what the listing reports is remembered until the kernel queue has been read to its end twice
//! (by then every event queued before the listing finished has been seen), so a file reported by
//! the listing is not reported again by its own creation event.

use std::collections::{HashMap, HashSet};
use std::ffi::{OsStr, OsString};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::fcntl::{OFlag, OpenHow, ResolveFlag, openat2};
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sys::inotify::{AddWatchFlags as F, InitFlags, Inotify, InotifyEvent, WatchDescriptor};
use tokio::sync::OwnedSemaphorePermit;
use tokio::sync::oneshot;

use super::{
    ChangeKind, DirBudget, IgnoreSet, OverflowReason, Shared, WatchChange, WatchError, WatchItem,
};

mod modifies;

use crate::files::{EntryType, FileError, PathPolicy, SandboxPath};
use modifies::Modifies;

/// Writes to one file within this window are reported as one `modify`, sent when the window
/// closes (so the last write is always followed by a `modify` within this time).
pub const COALESCE: Duration = Duration::from_millis(50);
/// How long a `MOVED_FROM` waits for its `MOVED_TO` (the kernel queues both within one rename).
const MOVE_PAIRING: Duration = Duration::from_millis(20);
/// Entries of recent listings remembered for de-duplication; beyond, an overflow is reported.
const MAX_SCANNED: usize = 16 * 1024;
/// Reads of the inotify descriptor (4 KiB each) between two looks at the clock and the stop pipe.
const READS_PER_ROUND: usize = 64;

fn mask() -> F {
    F::IN_CREATE
        | F::IN_DELETE
        | F::IN_MOVED_FROM
        | F::IN_MOVED_TO
        | F::IN_MODIFY
        | F::IN_ATTRIB
        | F::IN_DELETE_SELF
        | F::IN_MOVE_SELF
        | F::IN_ONLYDIR
}

pub(super) struct Plan {
    pub policy: Arc<PathPolicy>,
    pub root: SandboxPath,
    pub recursive: bool,
    pub ignore: IgnoreSet,
    pub shared: Arc<Shared>,
    pub stop: OwnedFd,
    pub budget: Arc<DirBudget>,
}

/// Why the feed stops.
enum Stop {
    /// The reader went away or was cut off.
    Reader,
    /// The watched directory itself was removed or moved away (its `remove` was reported).
    RootGone,
    Failed(WatchError),
}

impl From<WatchError> for Stop {
    fn from(e: WatchError) -> Self {
        Stop::Failed(e)
    }
}

impl From<FileError> for Stop {
    fn from(e: FileError) -> Self {
        Stop::Failed(e.into())
    }
}

type Step = Result<(), Stop>;

struct Dir {
    parent: Option<WatchDescriptor>,
    name: OsString,
    children: HashMap<OsString, WatchDescriptor>,
}

struct MovedFrom {
    wd: WatchDescriptor,
    name: OsString,
    cookie: u32,
    is_dir: bool,
    at: Instant,
}

struct Feed {
    plan: Plan,
    inotify: Inotify,
    root_wd: Option<WatchDescriptor>,
    dirs: HashMap<WatchDescriptor, Dir>,
    /// Directories counted against the daemon-wide budget.
    held: usize,
    /// Entries reported by listings, this round and the one before.
    scanned: [HashSet<(WatchDescriptor, OsString)>; 2],
    moved_from: Option<MovedFrom>,
    modifies: Modifies,
}

impl Drop for Feed {
    fn drop(&mut self) {
        self.plan.budget.release(self.held);
    }
}

/// The thread's body: install, say ready (through `setup`), follow until told to stop.
pub(super) fn run(
    plan: Plan,
    setup: oneshot::Sender<Result<(), WatchError>>,
    permit: OwnedSemaphorePermit,
) {
    // Held until the inotify instance is closed (the end of this function).
    let _permit = permit;
    let shared = plan.shared.clone();
    let mut feed = match Feed::install(plan) {
        Ok(f) => f,
        Err(e) => {
            let _ = setup.send(Err(e));
            return;
        }
    };
    if setup.send(Ok(())).is_err() {
        return;
    }
    match feed.follow() {
        Stop::Reader => {
            if shared.lock().cut_off {
                tracing::info!(path = %feed.plan.root.abs.display(),
                    "a watch stream's reader took nothing while its queue was full; cut off");
            }
        }
        Stop::RootGone => {}
        Stop::Failed(e) => {
            tracing::warn!(path = %feed.plan.root.abs.display(), error = %e, "a watch stream failed");
            shared.push(WatchItem::Failed(e));
        }
    }
    shared.end();
    drop(feed);
}

fn internal(e: Errno) -> WatchError {
    WatchError::Internal(std::io::Error::from(e))
}

fn kernel_limit(setting_file: &str) -> u64 {
    std::fs::read_to_string(setting_file)
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(0)
}

impl Feed {
    fn install(plan: Plan) -> Result<Feed, WatchError> {
        let inotify =
            Inotify::init(InitFlags::IN_CLOEXEC | InitFlags::IN_NONBLOCK).map_err(|e| match e {
                Errno::EMFILE => WatchError::Limit {
                    what: "the kernel's limit on inotify instances",
                    setting: "fs.inotify.max_user_instances",
                    limit: kernel_limit("/proc/sys/fs/inotify/max_user_instances"),
                    path: plan.root.abs.clone(),
                },
                e => internal(e),
            })?;
        // Checked here for the answer's sake (404, 400 for a file, 403); not kept open, or the
        // kernel would not report the directory's removal while the feed holds it.
        drop(
            plan.policy
                .open(&plan.root, OFlag::O_RDONLY | OFlag::O_DIRECTORY)?,
        );
        let mut feed = Feed {
            plan,
            inotify,
            root_wd: None,
            dirs: HashMap::new(),
            held: 0,
            scanned: Default::default(),
            moved_from: None,
            modifies: Modifies::default(),
        };
        match feed.add_tree(None, OsString::new(), false) {
            Ok(()) => {}
            Err(Stop::Failed(e)) => return Err(e),
            Err(_) => {
                return Err(WatchError::Internal(std::io::Error::other(
                    "the watch was closed while it was being installed",
                )));
            }
        }
        if feed.root_wd.is_none() {
            return Err(FileError::NotFound {
                path: feed.plan.root.abs.clone(),
            }
            .into());
        }
        feed.plan.shared.push(WatchItem::Ready);
        Ok(feed)
    }

    fn push(&self, item: WatchItem) -> Step {
        if self.plan.shared.push(item) {
            Ok(())
        } else {
            Err(Stop::Reader)
        }
    }

    fn emit(&self, kind: ChangeKind, rel: &Path, is_dir: bool, old: Option<&Path>) -> Step {
        let abs = |r: &Path| {
            if r.as_os_str().is_empty() {
                self.plan.root.abs.to_string_lossy().into_owned()
            } else {
                self.plan.root.abs.join(r).to_string_lossy().into_owned()
            }
        };
        self.push(WatchItem::Change(WatchChange {
            kind,
            path: abs(rel),
            entry_type: if is_dir {
                EntryType::Directory
            } else {
                EntryType::File
            },
            old_path: old.map(abs),
        }))
    }

    /// The path of a watched directory relative to the watched root (`None` when unknown).
    fn rel_of(&self, wd: WatchDescriptor) -> Option<PathBuf> {
        let mut names: Vec<&OsStr> = Vec::new();
        let mut cur = wd;
        // Bounded by the number of directories, whatever the map holds.
        for _ in 0..=self.dirs.len() {
            let d = self.dirs.get(&cur)?;
            match d.parent {
                None => {
                    let mut p = PathBuf::new();
                    for n in names.iter().rev() {
                        p.push(n);
                    }
                    return Some(p);
                }
                Some(parent) => {
                    names.push(&d.name);
                    cur = parent;
                }
            }
        }
        None
    }

    /// Opens the watched directory beneath the policy's root (for one walk).
    fn open_root(&self) -> Result<OwnedFd, FileError> {
        self.plan
            .policy
            .open(&self.plan.root, OFlag::O_PATH | OFlag::O_DIRECTORY)
    }

    /// Opens a directory of the tree, following no symlink and never leaving the tree.
    fn open_in_tree(root: &OwnedFd, rel: &Path) -> nix::Result<OwnedFd> {
        let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
        let how = OpenHow::new()
            .flags(flags)
            .resolve(ResolveFlag::RESOLVE_BENEATH | ResolveFlag::RESOLVE_NO_SYMLINKS);
        let rel = if rel.as_os_str().is_empty() {
            Path::new(".")
        } else {
            rel
        };
        openat2(root.as_fd(), rel, how)
    }

    fn limit_reached(&self, rel: &Path) -> WatchError {
        WatchError::Limit {
            what: "the kernel's limit on inotify watches",
            setting: "fs.inotify.max_user_watches",
            limit: kernel_limit("/proc/sys/fs/inotify/max_user_watches"),
            path: self.plan.root.abs.join(rel),
        }
    }

    /// Watches `parent/name` (the root when `parent` is `None`) and, with `recursive`, every
    /// directory beneath it; with `report`, every entry found beneath it is reported as created.
    fn add_tree(&mut self, parent: Option<WatchDescriptor>, name: OsString, report: bool) -> Step {
        let root = match self.open_root() {
            Ok(fd) => fd,
            // The watched directory went: its own events end the feed.
            Err(FileError::NotFound { .. } | FileError::WrongKind { .. }) if parent.is_some() => {
                return Ok(());
            }
            Err(e) => return Err(e.into()),
        };
        let mut todo: Vec<(Option<WatchDescriptor>, OsString)> = vec![(parent, name)];
        while let Some((parent, name)) = todo.pop() {
            if self.plan.shared.is_closed() {
                return Err(Stop::Reader);
            }
            let rel = match parent {
                None => PathBuf::new(),
                Some(p) => match self.rel_of(p) {
                    Some(r) => r.join(&name),
                    None => continue,
                },
            };
            let shown = self.plan.root.abs.join(&rel);
            let fd = match Self::open_in_tree(&root, &rel) {
                Ok(fd) => fd,
                // Gone, replaced by something that is not a directory, or a symlink meanwhile:
                // its own events say what became of it.
                Err(Errno::ENOENT | Errno::ENOTDIR | Errno::ELOOP | Errno::EXDEV)
                    if parent.is_some() =>
                {
                    continue;
                }
                Err(e) => return Err(FileError::from_errno("watch", &shown, e).into()),
            };
            let proc_path = format!("/proc/self/fd/{}", fd.as_raw_fd());
            let wd = match self.inotify.add_watch(proc_path.as_str(), mask()) {
                Ok(wd) => wd,
                Err(Errno::ENOSPC) => return Err(self.limit_reached(&rel).into()),
                Err(Errno::ENOENT | Errno::ENOTDIR) if parent.is_some() => continue,
                Err(e) => return Err(FileError::from_errno("watch", &shown, e).into()),
            };
            if self.dirs.contains_key(&wd) {
                // The same directory reached twice (e.g. during a rebuild): already done.
                continue;
            }
            if !self.plan.budget.reserve() {
                let _ = self.inotify.rm_watch(wd);
                return Err(WatchError::Limit {
                    what: "the daemon's budget of watched directories",
                    setting: "--watch-max-dirs",
                    limit: self.plan.budget.limit as u64,
                    path: shown,
                }
                .into());
            }
            self.held += 1;
            if let Some(p) = parent
                && let Some(pd) = self.dirs.get_mut(&p)
            {
                pd.children.insert(name.clone(), wd);
            }
            if parent.is_none() {
                self.root_wd = Some(wd);
            }
            self.dirs.insert(
                wd,
                Dir {
                    parent,
                    name,
                    children: HashMap::new(),
                },
            );
            if !report && !self.plan.recursive {
                continue;
            }
            // A second descriptor for `fstatat` while the listing borrows the first.
            let stat_fd = match fd.try_clone() {
                Ok(f) => f,
                Err(e) => return Err(WatchError::Internal(e).into()),
            };
            let mut listing = match nix::dir::Dir::from_fd(fd) {
                Ok(d) => d,
                Err(e) => return Err(FileError::from_errno("list", &shown, e).into()),
            };
            for entry in listing.iter() {
                let entry = match entry {
                    Ok(e) => e,
                    Err(Errno::ENOENT) => break,
                    Err(e) => return Err(FileError::from_errno("list", &shown, e).into()),
                };
                let bytes = entry.file_name().to_bytes();
                if bytes == b"." || bytes == b".." {
                    continue;
                }
                let child = OsStr::from_bytes(bytes).to_os_string();
                let child_rel = rel.join(&child);
                if self.plan.ignore.matches(&child_rel) {
                    continue;
                }
                let is_dir = match entry.file_type() {
                    Some(t) => t == nix::dir::Type::Directory,
                    None => nix::sys::stat::fstatat(
                        stat_fd.as_fd(),
                        child.as_os_str(),
                        nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW,
                    )
                    .is_ok_and(|st| st.st_mode & libc::S_IFMT == libc::S_IFDIR),
                };
                if report {
                    self.note_scanned(wd, &child)?;
                    self.emit(ChangeKind::Create, &child_rel, is_dir, None)?;
                }
                if is_dir && self.plan.recursive {
                    todo.push((Some(wd), child));
                }
            }
        }
        Ok(())
    }

    fn note_scanned(&mut self, wd: WatchDescriptor, name: &OsStr) -> Step {
        if self.scanned[0].len() + self.scanned[1].len() >= MAX_SCANNED {
            // Duplicates may follow; the reader is told to rescan instead.
            self.scanned = Default::default();
            self.push(WatchItem::Overflow(OverflowReason::Scan))?;
        }
        self.scanned[0].insert((wd, name.to_os_string()));
        Ok(())
    }

    /// True (and forgotten) when a listing already reported this entry.
    fn was_scanned(&mut self, wd: WatchDescriptor, name: &OsStr) -> bool {
        if self.scanned[0].is_empty() && self.scanned[1].is_empty() {
            return false;
        }
        let key = (wd, name.to_os_string());
        self.scanned[0].remove(&key) | self.scanned[1].remove(&key)
    }

    /// Removes a directory and everything beneath it from the bookkeeping, and their watches
    /// from the kernel (a directory moved out of the tree keeps its watches otherwise).
    fn drop_subtree(&mut self, parent: WatchDescriptor, name: &OsStr) {
        let Some(child) = self
            .dirs
            .get_mut(&parent)
            .and_then(|d| d.children.remove(name))
        else {
            return;
        };
        let mut gone = HashSet::new();
        let mut todo = vec![child];
        while let Some(wd) = todo.pop() {
            if let Some(d) = self.dirs.remove(&wd) {
                self.held -= 1;
                self.plan.budget.release(1);
                let _ = self.inotify.rm_watch(wd);
                todo.extend(d.children.into_values());
                gone.insert(wd);
            }
        }
        self.modifies.forget_dirs(&gone);
    }

    /// The kernel dropped a watch (its directory was deleted or unmounted, or we removed it).
    fn forget_dir(&mut self, wd: WatchDescriptor) {
        if let Some(d) = self.dirs.remove(&wd) {
            self.held -= 1;
            self.plan.budget.release(1);
            if let Some(p) = d.parent
                && let Some(pd) = self.dirs.get_mut(&p)
                && pd.children.get(&d.name) == Some(&wd)
            {
                pd.children.remove(&d.name);
            }
            self.modifies.forget_dirs(&HashSet::from([wd]));
        }
    }

    fn created(&mut self, wd: WatchDescriptor, name: OsString, is_dir: bool) -> Step {
        if self.was_scanned(wd, &name) {
            return Ok(());
        }
        let Some(rel) = self.rel_of(wd).map(|r| r.join(&name)) else {
            return Ok(());
        };
        if self.plan.ignore.matches(&rel) {
            return Ok(());
        }
        self.emit(ChangeKind::Create, &rel, is_dir, None)?;
        if is_dir && self.plan.recursive {
            self.add_tree(Some(wd), name, true)?;
        }
        Ok(())
    }

    fn removed(&mut self, wd: WatchDescriptor, name: OsString, is_dir: bool) -> Step {
        // The file is gone: its pending `modify` would only precede its `remove`.
        self.modifies.cancel(wd, &name);
        self.was_scanned(wd, &name);
        if is_dir {
            self.drop_subtree(wd, &name);
        }
        let Some(rel) = self.rel_of(wd).map(|r| r.join(&name)) else {
            return Ok(());
        };
        if self.plan.ignore.matches(&rel) {
            return Ok(());
        }
        self.emit(ChangeKind::Remove, &rel, is_dir, None)
    }

    fn renamed(
        &mut self,
        from: MovedFrom,
        wd: WatchDescriptor,
        name: OsString,
        is_dir: bool,
    ) -> Step {
        self.was_scanned(from.wd, &from.name);
        let from_rel = self
            .rel_of(from.wd)
            .map(|r| r.join(&from.name))
            .filter(|r| !self.plan.ignore.matches(r));
        let to_rel = self
            .rel_of(wd)
            .map(|r| r.join(&name))
            .filter(|r| !self.plan.ignore.matches(r));
        match (from_rel, to_rel) {
            (None, None) => {
                self.modifies.cancel(from.wd, &from.name);
                if is_dir {
                    self.drop_subtree(from.wd, &from.name);
                }
                Ok(())
            }
            (Some(_), None) => self.removed(from.wd, from.name, is_dir),
            (None, Some(_)) => {
                if is_dir {
                    self.drop_subtree(from.wd, &from.name);
                }
                self.created(wd, name, is_dir)
            }
            (Some(old), Some(new)) => {
                self.was_scanned(wd, &name);
                self.modifies.rekey((from.wd, &from.name), (wd, &name));
                if is_dir {
                    let moved = self
                        .dirs
                        .get_mut(&from.wd)
                        .and_then(|d| d.children.remove(&from.name));
                    match moved {
                        Some(child) => {
                            if let Some(c) = self.dirs.get_mut(&child) {
                                c.parent = Some(wd);
                                c.name = name.clone();
                            }
                            if let Some(p) = self.dirs.get_mut(&wd) {
                                p.children.insert(name.clone(), child);
                            }
                        }
                        None if self.plan.recursive => {
                            self.emit(ChangeKind::Rename, &new, is_dir, Some(&old))?;
                            return self.add_tree(Some(wd), name, true);
                        }
                        None => {}
                    }
                }
                self.emit(ChangeKind::Rename, &new, is_dir, Some(&old))
            }
        }
    }

    fn modified(&mut self, wd: WatchDescriptor, name: OsString, is_dir: bool) -> Step {
        let Some(rel) = self.rel_of(wd).map(|r| r.join(&name)) else {
            return Ok(());
        };
        if self.plan.ignore.matches(&rel) {
            return Ok(());
        }
        if !self.modifies.note(wd, &name, is_dir, Instant::now()) {
            self.emit(ChangeKind::Modify, &rel, is_dir, None)?;
        }
        Ok(())
    }

    /// The kernel lost events: say so, then rebuild the set of watches from the tree as it is
    /// now (directories made meanwhile are watched, vanished ones dropped), without reporting.
    fn overflowed(&mut self) -> Step {
        self.push(WatchItem::Overflow(OverflowReason::Kernel))?;
        self.moved_from = None;
        self.scanned = Default::default();
        if !self.plan.recursive {
            return Ok(());
        }
        let old: Vec<WatchDescriptor> = self.dirs.keys().copied().collect();
        self.plan.budget.release(self.held);
        self.held = 0;
        self.dirs.clear();
        self.root_wd = None;
        self.add_tree(None, OsString::new(), false)?;
        for wd in old {
            if !self.dirs.contains_key(&wd) {
                let _ = self.inotify.rm_watch(wd);
            }
        }
        if self.root_wd.is_none() {
            self.emit(ChangeKind::Remove, Path::new(""), true, None)?;
            return Err(Stop::RootGone);
        }
        Ok(())
    }

    fn handle(&mut self, ev: InotifyEvent) -> Step {
        let mask = ev.mask;
        if mask.contains(F::IN_Q_OVERFLOW) {
            return self.overflowed();
        }
        if !self.dirs.contains_key(&ev.wd) {
            return Ok(());
        }
        let is_root = Some(ev.wd) == self.root_wd;
        if mask.contains(F::IN_IGNORED) {
            self.forget_dir(ev.wd);
            if is_root {
                self.emit(ChangeKind::Remove, Path::new(""), true, None)?;
                return Err(Stop::RootGone);
            }
            return Ok(());
        }
        let Some(name) = ev.name else {
            if is_root && mask.intersects(F::IN_DELETE_SELF | F::IN_MOVE_SELF | F::IN_UNMOUNT) {
                self.settle_move()?;
                self.emit(ChangeKind::Remove, Path::new(""), true, None)?;
                return Err(Stop::RootGone);
            }
            return Ok(());
        };
        let is_dir = mask.contains(F::IN_ISDIR);
        if let Some(from) = self.moved_from.take() {
            if mask.contains(F::IN_MOVED_TO) && ev.cookie == from.cookie {
                return self.renamed(from, ev.wd, name, is_dir);
            }
            self.removed(from.wd, from.name, from.is_dir)?;
        }
        if mask.contains(F::IN_MOVED_FROM) {
            self.moved_from = Some(MovedFrom {
                wd: ev.wd,
                name,
                cookie: ev.cookie,
                is_dir,
                at: Instant::now(),
            });
            Ok(())
        } else if mask.intersects(F::IN_MOVED_TO | F::IN_CREATE) {
            self.created(ev.wd, name, is_dir)
        } else if mask.contains(F::IN_DELETE) {
            self.removed(ev.wd, name, is_dir)
        } else if mask.intersects(F::IN_MODIFY | F::IN_ATTRIB) {
            self.modified(ev.wd, name, is_dir)
        } else {
            Ok(())
        }
    }

    /// A `MOVED_FROM` still alone: the entry left the tree.
    fn settle_move(&mut self) -> Step {
        match self.moved_from.take() {
            Some(from) => self.removed(from.wd, from.name, from.is_dir),
            None => Ok(()),
        }
    }

    /// Reads what the kernel queued (a bounded number of reads per round).
    fn drain(&mut self) -> Step {
        for _ in 0..READS_PER_ROUND {
            match self.inotify.read_events() {
                Ok(events) => {
                    for ev in events {
                        self.handle(ev)?;
                    }
                }
                Err(Errno::EAGAIN) => {
                    // Read to the end: no event queued before a listing of the previous round
                    // can still come, so its entries need no remembering any more.
                    let current = std::mem::take(&mut self.scanned[0]);
                    self.scanned[1] = current;
                    return Ok(());
                }
                Err(Errno::EINTR) => {}
                Err(e) => return Err(internal(e).into()),
            }
        }
        Ok(())
    }

    fn due(&mut self, now: Instant) -> Step {
        for (wd, name, is_dir) in self.modifies.take_due(now) {
            if let Some(rel) = self.rel_of(wd) {
                self.emit(ChangeKind::Modify, &rel.join(name), is_dir, None)?;
            }
        }
        if self
            .moved_from
            .as_ref()
            .is_some_and(|m| m.at + MOVE_PAIRING <= now)
        {
            self.settle_move()?;
        }
        Ok(())
    }

    fn next_wakeup(&self) -> Option<Instant> {
        let moved = self.moved_from.as_ref().map(|m| m.at + MOVE_PAIRING);
        match (self.modifies.next_due(), moved) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    fn follow(&mut self) -> Stop {
        loop {
            let timeout = match self.next_wakeup() {
                None => PollTimeout::NONE,
                Some(at) => {
                    let left = at.saturating_duration_since(Instant::now());
                    // Rounded up so that a wake-up never comes before its deadline.
                    let ms = left.as_millis().saturating_add(1).min(60_000) as u16;
                    PollTimeout::from(ms)
                }
            };
            let mut fds = [
                PollFd::new(self.inotify.as_fd(), PollFlags::POLLIN),
                PollFd::new(self.plan.stop.as_fd(), PollFlags::POLLIN),
            ];
            match poll(&mut fds, timeout) {
                Ok(_) | Err(Errno::EINTR) => {}
                Err(e) => return Stop::Failed(internal(e)),
            }
            let stop = fds[1].revents().is_some_and(|r| !r.is_empty());
            if stop || self.plan.shared.is_closed() {
                return Stop::Reader;
            }
            if let Err(s) = self.drain() {
                return s;
            }
            if let Err(s) = self.due(Instant::now()) {
                return s;
            }
        }
    }
}
