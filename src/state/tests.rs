use super::*;
use std::os::unix::fs::PermissionsExt;

fn config(dir: &Path, events: usize, max_bytes: u64, total: u64) -> Config {
    let mut c = Config::defaults();
    c.state_dir = Some(dir.to_path_buf());
    c.data_dir = dir.parent().unwrap().join("data");
    std::fs::create_dir_all(&c.data_dir).unwrap();
    c.state_sync = StateSync::Every;
    c.event_buffer = events;
    c.state_max_bytes = max_bytes;
    c.state_total_bytes = total;
    c
}

fn open(c: &Config, dir: &Path) -> (Arc<StateStore>, Recovered) {
    StateStore::open(c, dir).unwrap()
}

/// Drops the store and waits for its writer to end (which releases the lock).
fn close(store: Arc<StateStore>) {
    let dir = store.dir().to_path_buf();
    drop(store);
    let deadline = Instant::now() + Duration::from_secs(10);
    while std::fs::File::open(dir.join(dir::LOCK)).is_ok_and(|f| {
        nix::fcntl::Flock::lock(f, nix::fcntl::FlockArg::LockExclusiveNonblock).is_err()
    }) {
        assert!(Instant::now() < deadline, "the writer did not end");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// A log is compacted to the retained window (the newest events) once it outgrows twice
/// that, and the start reads back only that window.
#[test]
fn compaction_keeps_the_newest_window() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("state");
    let c = config(&dir, 10, 1 << 20, 1 << 30);
    let (store, rec) = open(&c, &dir);
    assert!(rec.acp.is_empty());
    let d = store.entry("acp", "s1", true);
    d.meta(b"{\"agent\":\"mock\"}".to_vec());
    for id in 1..=105u64 {
        assert!(d.append(id, Bytes::from(format!("{{\"n\":{id}}}"))));
    }
    assert!(store.flush_blocking(Duration::from_secs(10)));
    let on_disk = log::read_and_repair(&dir.join("acp/s1/events.log"), log::Keep::ALL).unwrap();
    assert!(on_disk.records.len() <= 20, "{}", on_disk.records.len());
    assert_eq!(on_disk.records.last().unwrap().0, 105);
    drop(d);
    close(store);
    let (_store, rec) = open(&c, &dir);
    let r = &rec.acp[0];
    assert_eq!(r.name, "s1");
    assert_eq!(r.meta["agent"], "mock");
    assert_eq!(r.last_id, 105);
    assert!(r.records.len() <= 10);
    assert!(!r.incomplete);
}

/// Over `--state-total-bytes` the store turns memory-only, says why, and removes the
/// durable flag: the next start knows records were lost.
#[test]
fn the_total_cap_turns_the_store_memory_only() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("state");
    let c = config(&dir, 4096, 1 << 20, 4096);
    let (store, _) = open(&c, &dir);
    let d = store.entry("acp", "big", true);
    d.meta(b"{}".to_vec());
    let line = Bytes::from(vec![b'x'; 1000]);
    for id in 1..=10u64 {
        d.append(id, line.clone());
    }
    store.flush_blocking(Duration::from_secs(10));
    assert!(!store.is_durable());
    assert!(store.problem().unwrap().contains("--state-total-bytes"));
    let size = std::fs::metadata(dir.join("acp/big/events.log")).map_or(0, |m| m.len());
    assert!(size <= 4096, "{size}");
    assert!(!d.append(11, line));
    assert!(!dir.join(dir::DURABLE).exists());
    drop(d);
    close(store);
    let (_s, rec) = open(&c, &dir);
    assert!(rec.acp[0].incomplete);
}

/// After `forget` nothing of the entry reaches the disk, even what its handle sends later;
/// a fresh entry of the same name starts a new log.
#[test]
fn a_forgotten_entry_stays_gone() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("state");
    let c = config(&dir, 100, 1 << 20, 1 << 30);
    let (store, _) = open(&c, &dir);
    let d = store.entry("acp", "gone", true);
    d.meta(b"{}".to_vec());
    d.append(1, Bytes::from_static(b"{}"));
    store.flush_blocking(Duration::from_secs(10));
    assert!(dir.join("acp/gone/events.log").exists());
    d.forget();
    d.meta(b"{\"late\":true}".to_vec());
    d.append(2, Bytes::from_static(b"{}"));
    store.flush_blocking(Duration::from_secs(10));
    assert!(!dir.join("acp/gone").exists());
    let again = store.entry("acp", "gone", true);
    again.meta(b"{}".to_vec());
    again.append(1, Bytes::from_static(b"{\"new\":1}"));
    store.flush_blocking(Duration::from_secs(10));
    let r = log::read_and_repair(&dir.join("acp/gone/events.log"), log::Keep::ALL).unwrap();
    assert_eq!(r.records.len(), 1);
    assert_eq!(&r.records[0].1[..], b"{\"new\":1}");
}

/// A producer's wait returns once its records are written: the marks follow the writer.
#[test]
fn written_waits_for_the_writer() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("state");
    let c = config(&dir, 100_000, 1 << 30, 1 << 30);
    let (store, _) = open(&c, &dir);
    let d = store.entry("acp", "w", true);
    d.meta(b"{}".to_vec());
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    for id in 1..=20_000u64 {
        d.append(id, Bytes::from_static(b"{\"x\":1}"));
    }
    rt.block_on(d.written());
    assert_eq!(d.last_written(), 20_000);
    let r = log::read_and_repair(&dir.join("acp/w/events.log"), log::Keep::ALL).unwrap();
    assert_eq!(r.count, 20_000);
}

/// Files 0600, directories 0700 whatever the umask; unreadable entries and symlinks are
/// moved aside, never deleted or followed.
#[test]
fn permissions_quarantine_and_symlinks() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("state");
    let c = config(&dir, 100, 1 << 20, 1 << 30);
    let old = nix::sys::stat::umask(nix::sys::stat::Mode::empty());
    let (store, _) = open(&c, &dir);
    let d = store.entry("acp", "p", true);
    d.meta(b"{}".to_vec());
    d.append(1, Bytes::from_static(b"{}"));
    store.flush_blocking(Duration::from_secs(10));
    nix::sys::stat::umask(old);
    let mode = |p: &Path| std::fs::symlink_metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&dir), 0o700);
    assert_eq!(mode(&dir.join("acp")), 0o700);
    assert_eq!(mode(&dir.join("acp/p")), 0o700);
    assert_eq!(mode(&dir.join("acp/p/meta.json")), 0o600);
    assert_eq!(mode(&dir.join("acp/p/events.log")), 0o600);
    assert_eq!(mode(&dir.join(dir::LOCK)), 0o600);
    drop(d);
    close(store);
    // An unreadable entry and a symlink to a tree outside.
    std::fs::create_dir_all(dir.join("acp/bad")).unwrap();
    std::fs::write(dir.join("acp/bad/meta.json"), b"not json").unwrap();
    let outside = tmp.path().join("outside");
    std::fs::create_dir_all(&outside).unwrap();
    std::fs::write(outside.join("keep.txt"), b"mine").unwrap();
    std::os::unix::fs::symlink(&outside, dir.join("acp/link")).unwrap();
    let (_s, rec) = open(&c, &dir);
    assert_eq!(rec.acp.len(), 1);
    assert!(!dir.join("acp/bad").exists() && !dir.join("acp/link").exists());
    let moved: Vec<String> = std::fs::read_dir(dir.join(dir::QUARANTINE))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(moved.len(), 2, "{moved:?}");
    assert_eq!(std::fs::read(outside.join("keep.txt")).unwrap(), b"mine");
}

/// A second store on the same dir is refused while the first holds it; a dir that is not
/// a state dir is refused before anything is written into it.
#[test]
fn one_dir_one_daemon_and_only_our_own_dir() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("state");
    let c = config(&dir, 100, 1 << 20, 1 << 30);
    let (store, _) = open(&c, &dir);
    let second = StateStore::open(&c, &dir).err().expect("refused");
    assert!(matches!(second, StateError::Locked { .. }), "{second}");
    assert!(second.to_string().contains(&std::process::id().to_string()));
    close(store);
    assert!(StateStore::open(&c, &dir).is_ok());

    let project = tmp.path().join("project");
    std::fs::create_dir_all(project.join("processes/billing/src")).unwrap();
    std::fs::write(project.join("processes/billing/src/main.py"), b"print(1)").unwrap();
    let e = StateStore::open(&c, &project).err().expect("refused");
    assert!(matches!(e, StateError::NotOurs { .. }), "{e}");
    assert!(project.join("processes/billing/src/main.py").exists());
    assert!(!project.join(dir::LOCK).exists() && !project.join(dir::MARKER).exists());

    let linked = tmp.path().join("linked");
    std::fs::create_dir_all(&linked).unwrap();
    std::os::unix::fs::symlink(tmp.path().join("project"), linked.join("acp")).unwrap();
    let e = StateStore::open(&c, &linked).err().expect("refused");
    assert!(matches!(e, StateError::NotOurs { .. }), "{e}");
}
