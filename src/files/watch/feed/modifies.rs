//! The coalescing of `modify` changes: writes to one file within `COALESCE` become one `modify`,
//! sent when its window closes; a waiting one follows its file through a rename and is dropped
//! with it; at most `MAX_PENDING_MODIFIES` wait at once.

use std::collections::{HashMap, HashSet, VecDeque};
use std::ffi::{OsStr, OsString};
use std::time::Instant;

use nix::sys::inotify::WatchDescriptor;

use super::COALESCE;

/// Files with a `modify` waiting at once; beyond, a modify is sent without waiting.
const MAX_PENDING_MODIFIES: usize = 4096;

/// Files with a `modify` waiting for its window to close, in the order the windows close.
#[derive(Default)]
pub(super) struct Modifies {
    order: VecDeque<(Instant, u64)>,
    by_seq: HashMap<u64, (WatchDescriptor, OsString, bool)>,
    live: HashMap<(WatchDescriptor, OsString), u64>,
    seq: u64,
}

impl Modifies {
    /// False when the file must be reported at once (too many waiting).
    pub(super) fn note(
        &mut self,
        wd: WatchDescriptor,
        name: &OsStr,
        is_dir: bool,
        now: Instant,
    ) -> bool {
        let key = (wd, name.to_os_string());
        if self.live.contains_key(&key) {
            return true;
        }
        if self.live.len() >= MAX_PENDING_MODIFIES {
            return false;
        }
        self.seq += 1;
        self.live.insert(key, self.seq);
        self.by_seq
            .insert(self.seq, (wd, name.to_os_string(), is_dir));
        self.order.push_back((now + COALESCE, self.seq));
        true
    }

    pub(super) fn cancel(&mut self, wd: WatchDescriptor, name: &OsStr) {
        if let Some(seq) = self.live.remove(&(wd, name.to_os_string())) {
            self.by_seq.remove(&seq);
        }
    }

    /// The file was renamed: its waiting `modify` follows it (and is sent under the new path).
    pub(super) fn rekey(&mut self, from: (WatchDescriptor, &OsStr), to: (WatchDescriptor, &OsStr)) {
        let Some(seq) = self.live.remove(&(from.0, from.1.to_os_string())) else {
            return;
        };
        let to_key = (to.0, to.1.to_os_string());
        if self.live.contains_key(&to_key) {
            self.by_seq.remove(&seq);
            return;
        }
        if let Some(entry) = self.by_seq.get_mut(&seq) {
            entry.0 = to.0;
            entry.1 = to.1.to_os_string();
        }
        self.live.insert(to_key, seq);
    }

    pub(super) fn forget_dirs(&mut self, gone: &HashSet<WatchDescriptor>) {
        if self.live.is_empty() {
            return;
        }
        self.live.retain(|(wd, _), _| !gone.contains(wd));
        self.by_seq.retain(|_, (wd, _, _)| !gone.contains(wd));
    }

    pub(super) fn next_due(&self) -> Option<Instant> {
        self.order.front().map(|(at, _)| *at)
    }

    pub(super) fn take_due(&mut self, now: Instant) -> Vec<(WatchDescriptor, OsString, bool)> {
        let mut out = Vec::new();
        while let Some(&(at, seq)) = self.order.front() {
            if at > now {
                break;
            }
            self.order.pop_front();
            if let Some(entry) = self.by_seq.remove(&seq) {
                self.live.remove(&(entry.0, entry.1.clone()));
                out.push(entry);
            }
        }
        out
    }
}
