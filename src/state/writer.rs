//! The store's one writer thread: it appends records and replaces `meta.json` files, group
//! commits every record that arrived during the previous batch, compacts, syncs, and turns the
//! store memory-only at the first write error (the invariants in `mod.rs`).

use super::*;

/// The writer's view of one entry.
pub(super) struct KeyState {
    /// The generation whose ops are applied (0: recovered, not yet taken by a service).
    pub(super) generation: u64,
    pub(super) mark: Option<Arc<Mark>>,
    pub(super) file: Option<File>,
    /// The log holds only stale records (a fresh entry of an old name): cut it at first use.
    pub(super) truncate: bool,
    pub(super) bytes: u64,
    pub(super) records: u64,
    pub(super) dirty: bool,
    pub(super) pending: Vec<u8>,
    pub(super) pending_n: u64,
    pub(super) pending_last: u64,
    /// Written since the marks were last told.
    pub(super) unannounced: Option<u64>,
}

impl KeyState {
    pub(super) fn on_disk(bytes: u64, records: u64) -> Self {
        KeyState {
            generation: 0,
            mark: None,
            file: None,
            truncate: false,
            bytes,
            records,
            dirty: false,
            pending: Vec::new(),
            pending_n: 0,
            pending_last: 0,
            unannounced: None,
        }
    }
}

pub(super) struct Writer {
    pub(super) dir: PathBuf,
    pub(super) keys: HashMap<Arc<str>, KeyState>,
    /// Bytes of every log on disk.
    pub(super) total: u64,
    /// Bytes gathered but not yet written.
    pub(super) pending_total: u64,
    pub(super) total_cap: u64,
    pub(super) retention: Retention,
    pub(super) sync: StateSync,
    pub(super) shared: Arc<Shared>,
    pub(super) dirty_since: Option<Instant>,
    /// Held for the writer's life: released once the last record is written.
    pub(super) _lock: dir::Lock,
}

impl Writer {
    pub(super) fn run(mut self, rx: Receiver<Op>) {
        let mut batch = Vec::with_capacity(4096);
        loop {
            let wait = match (self.sync, self.dirty_since) {
                (StateSync::Batch(d), Some(t)) => d.saturating_sub(t.elapsed()),
                _ => Duration::from_secs(3600),
            };
            match rx.recv_timeout(wait) {
                Ok(op) => batch.push(op),
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => {
                    self.flush_pending();
                    self.sync_all();
                    self.announce();
                    return;
                }
            }
            // Group commit: everything that arrived meanwhile goes out together.
            while batch.len() < 65536 {
                match rx.try_recv() {
                    Ok(op) => batch.push(op),
                    Err(_) => break,
                }
            }
            let mut barriers = Vec::new();
            for op in batch.drain(..) {
                match op {
                    Op::Barrier(tx) => barriers.push(tx),
                    op if self.shared.durable.load(Ordering::Acquire) => {
                        if let Err(e) = self.apply(op) {
                            self.fail(&e);
                        }
                    }
                    _ => {}
                }
            }
            self.flush_pending();
            let due = match self.sync {
                StateSync::Every => true,
                StateSync::Batch(d) => self.dirty_since.is_some_and(|t| t.elapsed() >= d),
                StateSync::Os => false,
            };
            if due || !barriers.is_empty() {
                self.sync_all();
            }
            self.announce();
            for b in barriers {
                let _ = b.send(());
            }
        }
    }

    fn fail(&mut self, e: &StateError) {
        self.shared.degrade(&self.dir, e);
        for k in self.keys.values_mut() {
            k.pending.clear();
            k.pending_n = 0;
            if let Some(m) = &k.mark {
                m.notify.notify_waiters();
            }
        }
        self.pending_total = 0;
    }

    /// Tells every waiting producer how far its entry is written.
    fn announce(&mut self) {
        for k in self.keys.values_mut() {
            if let (Some(upto), Some(m)) = (k.unannounced.take(), &k.mark) {
                m.written.fetch_max(upto, Ordering::AcqRel);
                m.notify.notify_waiters();
            }
        }
    }

    fn flush_pending(&mut self) {
        let pending: Vec<Arc<str>> = self
            .keys
            .iter()
            .filter(|(_, k)| !k.pending.is_empty())
            .map(|(key, _)| key.clone())
            .collect();
        for key in pending {
            if !self.shared.durable.load(Ordering::Acquire) {
                return;
            }
            if let Err(e) = self.flush_key(&key) {
                self.fail(&e);
            }
        }
    }

    /// Writes `key`'s gathered records in one `write`, then compacts the log if it outgrew its
    /// window.
    fn flush_key(&mut self, key: &Arc<str>) -> Result<(), StateError> {
        let dir = self.dir.join(&**key);
        let Some(k) = self.keys.get_mut(key) else {
            return Ok(());
        };
        if k.pending.is_empty() {
            return Ok(());
        }
        let path = dir.join(LOG);
        if k.file.is_none() {
            dir::make_dir(&dir)?;
            if std::mem::take(&mut k.truncate) {
                dir::create_file(&path)?;
                self.total = self.total.saturating_sub(k.bytes);
                k.bytes = 0;
                k.records = 0;
            }
            k.file = Some(dir::open_append(&path)?);
        }
        let f = k.file.as_mut().expect("opened above");
        let len = k.pending.len() as u64;
        self.pending_total = self.pending_total.saturating_sub(len);
        if let Err(e) = f.write_all(&k.pending) {
            // Leave no half record behind for the next start to cut.
            let _ = f.set_len(k.bytes);
            k.pending.clear();
            return Err(io_err(&path)(e));
        }
        k.pending.clear();
        k.bytes += len;
        k.records += std::mem::take(&mut k.pending_n);
        k.dirty = true;
        k.unannounced = Some(k.pending_last);
        self.total += len;
        self.dirty_since.get_or_insert_with(Instant::now);
        let r = self.retention;
        if k.bytes > r.max_file || k.records > 2 * r.events as u64 {
            self.compact(key)?;
        }
        Ok(())
    }

    fn apply(&mut self, op: Op) -> Result<(), StateError> {
        match op {
            Op::Open {
                key,
                generation,
                mark,
                fresh,
            } => {
                let k = self
                    .keys
                    .entry(key)
                    .or_insert_with(|| KeyState::on_disk(0, 0));
                k.generation = generation;
                // A handle this one supersedes is written no more: its waiter must not hang.
                if let Some(old) = k.mark.replace(mark) {
                    release(&old);
                }
                k.file = None;
                k.pending.clear();
                k.pending_n = 0;
                // A fresh entry replaces whatever a forgotten one of the same name left.
                k.truncate = fresh;
            }
            Op::Meta {
                key,
                generation,
                json,
            } => {
                if self
                    .keys
                    .get(&key)
                    .is_none_or(|k| k.generation != generation)
                {
                    return Ok(());
                }
                let dir = self.dir.join(&*key);
                dir::make_dir(&dir)?;
                let tmp = dir.join("meta.json.tmp");
                let mut f = dir::create_file(&tmp)?;
                f.write_all(&json).map_err(io_err(&tmp))?;
                if self.sync != StateSync::Os {
                    f.sync_data().map_err(io_err(&tmp))?;
                }
                std::fs::rename(&tmp, dir.join(META)).map_err(io_err(&tmp))?;
            }
            Op::Append {
                key,
                generation,
                id,
                payload,
            } => {
                let need = (log::HEADER + payload.len()) as u64;
                if self.total + self.pending_total + need > self.total_cap {
                    return Err(StateError::TotalCap {
                        cap: self.total_cap,
                    });
                }
                let Some(k) = self
                    .keys
                    .get_mut(&key)
                    .filter(|k| k.generation == generation)
                else {
                    return Ok(());
                };
                log::encode(&mut k.pending, id, &payload);
                k.pending_n += 1;
                k.pending_last = id;
                self.pending_total += need;
                if k.pending.len() >= WRITE_CHUNK {
                    self.flush_key(&key)?;
                }
            }
            Op::Remove { key, generation } => {
                if self
                    .keys
                    .get(&key)
                    .is_none_or(|k| k.generation != generation)
                {
                    return Ok(());
                }
                if let Some(k) = self.keys.remove(&key) {
                    self.total = self.total.saturating_sub(k.bytes);
                    self.pending_total = self.pending_total.saturating_sub(k.pending.len() as u64);
                    k.mark.iter().for_each(release);
                }
                let dir = self.dir.join(&*key);
                match std::fs::remove_dir_all(&dir) {
                    Ok(()) => {}
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                    Err(e) => return Err(io_err(&dir)(e)),
                }
            }
            Op::Quarantine { key } => {
                if let Some(k) = self.keys.remove(&key) {
                    self.total = self.total.saturating_sub(k.bytes);
                    k.mark.iter().for_each(release);
                }
                set_aside(&self.dir, &key, "its service could not read it");
            }
            Op::Barrier(_) => {}
        }
        Ok(())
    }

    /// Rewrites `key`'s log with the newest records within the retention (the newest always).
    fn compact(&mut self, key: &Arc<str>) -> Result<(), StateError> {
        let path = self.dir.join(&**key).join(LOG);
        let Some(k) = self.keys.get_mut(key) else {
            return Ok(());
        };
        k.file = None;
        let read = log::read_and_repair(&path, self.retention.keep()).map_err(io_err(&path))?;
        let new_len = log::rewrite(&path, &read.records).map_err(io_err(&path))?;
        self.total = self.total.saturating_sub(k.bytes) + new_len;
        k.bytes = new_len;
        k.records = read.records.len() as u64;
        k.dirty = false;
        Ok(())
    }

    fn sync_all(&mut self) {
        let mut failed = None;
        for (key, k) in self.keys.iter_mut() {
            if k.dirty {
                k.dirty = false;
                if let Some(f) = &k.file
                    && let Err(e) = f.sync_data()
                {
                    failed = Some(io_err(&self.dir.join(&**key))(e));
                }
            }
        }
        self.dirty_since = None;
        if let Some(f) = failed {
            self.fail(&f);
        }
    }
}

impl Drop for Writer {
    /// Even a writer that panicked leaves no producer waiting.
    fn drop(&mut self) {
        self.shared.durable.store(false, Ordering::Release);
        for k in self.keys.values() {
            if let Some(m) = &k.mark {
                m.notify.notify_waiters();
            }
        }
    }
}
