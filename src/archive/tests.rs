//! Unit and property tests of the archive rules. The property tests use a small seeded generator
//! (no dependency): the seed count is `ARCHIVE_PROPTEST_CASES` (default 2,000, a fraction of a
//! second), raised by hand for longer runs (see docs/files.md, "Property tests").

use super::*;

fn check_entry(raw: &str, expected: Result<&str, &str>) {
    let got = entry_path(Path::new(raw), raw).map_err(|e| e.to_string());
    match (got, expected) {
        (Ok(p), Ok(e)) => assert_eq!(p, Path::new(e), "{raw}"),
        (Err(m), Err(e)) => assert!(m.contains(e), "{raw}: {m}"),
        (got, expected) => panic!("{raw}: got {got:?}, expected {expected:?}"),
    }
}

#[test]
fn entry_paths_keep_only_normal_components() {
    check_entry("a/b", Ok("a/b"));
    check_entry("./a/./b/", Ok("a/b"));
    check_entry("./", Ok(""));
    check_entry("/etc/passwd", Err("absolute"));
    check_entry("a/../../x", Err("`..`"));
    check_entry("..", Err("`..`"));
}

#[test]
fn symlink_targets_are_checked_from_the_link_directory() {
    let check = |parent: &str, target: &str, expected: bool| {
        assert_eq!(
            link_target_stays(Path::new(parent), Path::new(target)),
            expected,
            "{parent} -> {target}"
        );
    };
    check("", "a", true);
    check("", "../a", false);
    check("d", "../a", true);
    check("d", "../../a", false);
    check("d/e", "../../x/../y", true);
    check("d", "./../..", false);
    check("", "/etc", false);
}

/// One raw tar entry: name, type flag, link target, data.
type RawEntry<'a> = (&'a str, u8, &'a str, &'a [u8]);

/// A tar built by hand, so hostile names and links are possible.
fn tar(entries: &[RawEntry]) -> Vec<u8> {
    let mut out = Vec::new();
    for (name, kind, link, data) in entries {
        let mut h = tar::Header::new_gnu();
        h.as_mut_bytes()[..name.len()].copy_from_slice(name.as_bytes());
        h.as_mut_bytes()[157..157 + link.len()].copy_from_slice(link.as_bytes());
        h.set_entry_type(tar::EntryType::new(*kind));
        h.set_size(data.len() as u64);
        h.set_mode(0o644);
        h.set_cksum();
        out.extend_from_slice(h.as_bytes());
        out.extend_from_slice(data);
        out.resize(out.len().div_ceil(512) * 512, 0);
    }
    out.extend_from_slice(&[0u8; 1024]);
    out
}

fn extract_into(bytes: &[u8]) -> (tempfile::TempDir, Result<Extracted, ArchiveError>) {
    let tmp = tempfile::tempdir().unwrap();
    let root_path = tmp.path().join("root");
    std::fs::create_dir(&root_path).unwrap();
    let root = nix::fcntl::open(&root_path, DIR, Mode::empty()).unwrap();
    let limits = Limits {
        bytes: Some(1 << 20),
        entries: 100,
        listed: 10,
    };
    let r = extract_tar(bytes, Compression::Sniff, &root, limits, None);
    (tmp, r)
}

#[test]
fn chains_of_links_that_each_stay_inside_are_refused_on_disk() {
    let (_t, r) = extract_into(&tar(&[
        ("x/y/", b'5', "", b""),
        ("x/up", b'2', "..", b""),
        ("x/bad", b'2', "up/..", b""),
    ]));
    let e = r.unwrap_err().to_string();
    assert!(e.contains("refused") && e.contains("leaves"), "{e}");
    let (t, r) = extract_into(&tar(&[
        ("x/y/", b'5', "", b""),
        ("x/up", b'2', "..", b""),
        ("x/y/ok", b'2', "../up", b""),
        ("x/y/f", b'0', "", b"data"),
    ]));
    let got = r.unwrap();
    assert_eq!(got.symlinks.len(), 2);
    assert_eq!(std::fs::read(t.path().join("root/x/y/f")).unwrap(), b"data");
}

#[test]
fn hostile_entries_are_refused_and_nothing_escapes() {
    let cases: &[(&str, &[RawEntry], &str)] = &[
        ("dotdot", &[("../x", b'0', "", b"x")], "`..`"),
        ("absolute", &[("/tmp/x", b'0', "", b"x")], "absolute"),
        ("link-abs", &[("l", b'2', "/etc", b"")], "absolute symlink"),
        ("link-up", &[("d/l", b'2', "../../x", b"")], "leaves"),
        (
            "through",
            &[("l", b'2', ".", b""), ("l/x", b'0', "", b"x")],
            "crosses a symlink",
        ),
        ("fifo", &[("f", b'6', "", b"")], "fifos"),
        ("device", &[("c", b'3', "", b"")], "device"),
        (
            "hardlink-out",
            &[("h", b'1', "../../etc/passwd", b"")],
            "hard link",
        ),
        ("hardlink-missing", &[("h", b'1', "nope", b"")], "earlier"),
    ];
    for (name, entries, why) in cases {
        let (t, r) = extract_into(&tar(entries));
        let e = r.expect_err(name).to_string();
        assert!(e.contains("refused") && e.contains(why), "{name}: {e}");
        assert!(!t.path().join("x").exists(), "{name}");
    }
}

#[test]
fn a_huge_base256_mtime_is_ignored() {
    let mut t = tar(&[("f", b'0', "", b"x")]);
    t[136] = 0x80;
    t[137..148].fill(0xff);
    t[148..156].fill(b' ');
    let sum: u64 = t[..512].iter().map(|&b| b as u64).sum();
    t[148..156].copy_from_slice(format!("{sum:06o}\0 ").as_bytes());
    let (tmp, r) = extract_into(&t);
    r.unwrap();
    assert_eq!(std::fs::read(tmp.path().join("root/f")).unwrap(), b"x");
}

/// Files keep the archive's permission bits (setuid dropped) and mtime whether or not the umask
/// would filter them; a later entry replaces an earlier file or symlink of the same name; the
/// data of an entry nobody reads (a directory's) is skipped, and the entries after it still parse.
#[test]
fn entries_keep_their_bits_and_mtime_and_later_ones_replace_earlier_ones() {
    let mut b = tar::Builder::new(Vec::new());
    let mut add = |name: &str, kind: tar::EntryType, mode: u32, data: &[u8], link: &str| {
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(kind);
        h.set_mode(mode);
        h.set_mtime(1_000_000_000 + u64::from(mode));
        h.set_size(data.len() as u64);
        if !link.is_empty() {
            h.set_link_name(link).unwrap();
        }
        b.append_data(&mut h, name, data).unwrap();
    };
    let (file, dir, link) = (
        tar::EntryType::Regular,
        tar::EntryType::Directory,
        tar::EntryType::Symlink,
    );
    add("a", file, 0o666, b"first", "");
    add("b", file, 0o755, &[7; 513], "");
    add("c", file, 0o4755, b"c", "");
    add("d", file, 0o444, b"read only", "");
    add("e", link, 0o777, b"", "b");
    // A directory carrying data: skipped unread, the next header must still be found.
    add("sub", dir, 0o750, &[9; 1500], "");
    add("a", file, 0o600, b"second", "");
    add("e", file, 0o640, b"no longer a link", "");
    add("f", file, 0o666, b"group and others may write", "");
    let bytes = b.into_inner().unwrap();
    let (tmp, r) = extract_into(&bytes);
    r.unwrap();
    let root = tmp.path().join("root");
    let meta = |n: &str| std::fs::symlink_metadata(root.join(n)).unwrap();
    use std::os::unix::fs::MetadataExt;
    for (name, mode, content) in [
        ("a", 0o600, &b"second"[..]),
        ("b", 0o755, &[7; 513][..]),
        ("c", 0o755, b"c"),
        ("d", 0o444, b"read only"),
        ("e", 0o640, b"no longer a link"),
        ("f", 0o666, b"group and others may write"),
    ] {
        let m = meta(name);
        assert!(m.file_type().is_file(), "{name}");
        assert_eq!(m.mode() & 0o7777, mode, "{name}");
        let declared = if name == "c" { 0o4755 } else { mode };
        assert_eq!(m.mtime(), 1_000_000_000 + i64::from(declared), "{name}");
        assert_eq!(std::fs::read(root.join(name)).unwrap(), content, "{name}");
    }
    assert!(meta("sub").is_dir());
    assert_eq!(meta("sub").mode() & 0o777, 0o750);
    assert_eq!(std::fs::read_dir(root.join("sub")).unwrap().count(), 0);
}

#[test]
fn limits_stop_extraction() {
    let (_t, r) = extract_into(&tar(&[("big", b'0', "", &vec![0u8; (1 << 20) + 1])]));
    assert!(matches!(r, Err(ArchiveError::TooLarge { .. })), "{r:?}");
    let many: Vec<(String, u8, &str, &[u8])> = (0..101)
        .map(|i| (format!("f{i}"), b'0', "", &b""[..]))
        .collect();
    let refs: Vec<RawEntry> = many
        .iter()
        .map(|(n, k, l, d)| (n.as_str(), *k, *l, *d))
        .collect();
    let (_t, r) = extract_into(&tar(&refs));
    assert!(
        matches!(r, Err(ArchiveError::TooManyEntries { .. })),
        "{r:?}"
    );
}

/// xorshift64*: deterministic, seedable, good enough to spread cases.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

fn cases() -> u64 {
    std::env::var("ARCHIVE_PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2_000)
}

/// A random path from pieces that matter: `..`, `.`, empty, `/`, long, non-UTF-8-looking names.
fn random_path(rng: &mut Rng) -> String {
    const PIECES: &[&str] = &["a", "..", ".", "", "b", "é", "/", "c/..", "...", "x y"];
    let n = rng.below(6) + 1;
    let mut s = String::new();
    if rng.below(5) == 0 {
        s.push('/');
    }
    for i in 0..n {
        if i > 0 {
            s.push('/');
        }
        s.push_str(PIECES[rng.below(PIECES.len() as u64) as usize]);
    }
    s
}

/// Property: an accepted entry path is relative, has only normal components, and never climbs;
/// a path is refused exactly when it is absolute or has a `..` component.
#[test]
fn property_entry_paths_never_leave_the_root() {
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    for _ in 0..cases() {
        let raw = random_path(&mut rng);
        let p = Path::new(&raw);
        let bad = p.is_absolute() || p.components().any(|c| c == Component::ParentDir);
        match entry_path(p, &raw) {
            Ok(out) => {
                assert!(!bad, "{raw:?} accepted");
                assert!(
                    out.components().all(|c| matches!(c, Component::Normal(_))),
                    "{raw:?} -> {out:?}"
                );
            }
            Err(e) => {
                assert!(bad, "{raw:?} refused: {e}");
                assert!(e.to_string().contains("refused"));
            }
        }
    }
}

/// Property: `link_target_stays` agrees with a model that resolves the joined path lexically
/// and checks it never goes above the root.
#[test]
fn property_link_targets_agree_with_a_lexical_model() {
    let mut rng = Rng(0xD1B5_4A32_D192_ED03);
    for _ in 0..cases() {
        let parent = random_path(&mut rng).trim_start_matches('/').to_string();
        let Ok(parent) = entry_path(Path::new(&parent), "") else {
            continue;
        };
        let target = random_path(&mut rng);
        let mut depth: i64 = parent.components().count() as i64;
        let mut ok = !target.starts_with('/');
        for c in Path::new(&target).components() {
            match c {
                Component::ParentDir => {
                    depth -= 1;
                    ok &= depth >= 0;
                }
                Component::Normal(_) => depth += 1,
                _ => {}
            }
        }
        assert_eq!(
            link_target_stays(&parent, Path::new(&target)),
            ok,
            "{parent:?} -> {target:?}"
        );
    }
}

/// Property: random bytes after a valid tar header never panic the extractor and never write
/// outside the root.
#[test]
fn property_mangled_archives_fail_cleanly() {
    let mut rng = Rng(0xA076_1D64_78BD_642F);
    let base = tar(&[
        ("d/", b'5', "", b""),
        ("d/f", b'0', "", b"hello"),
        ("d/l", b'2', "f", b""),
    ]);
    for _ in 0..cases() / 4 {
        let mut t = base.clone();
        for _ in 0..rng.below(8) + 1 {
            let i = rng.below(t.len() as u64) as usize;
            t[i] = rng.next() as u8;
        }
        let (tmp, r) = extract_into(&t);
        let _ = r;
        let outside: Vec<_> = std::fs::read_dir(tmp.path())
            .unwrap()
            .flatten()
            .map(|e| e.file_name())
            .filter(|n| n != "root")
            .collect();
        assert!(outside.is_empty(), "{outside:?}");
    }
}

/// A tree as (path, what): a directory, a file's bytes, a symlink's target.
fn tree(root: &Path) -> Vec<(PathBuf, String)> {
    let mut out = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for e in std::fs::read_dir(&dir).unwrap().flatten() {
            let p = e.path();
            let rel = p.strip_prefix(root).unwrap().to_path_buf();
            let t = e.file_type().unwrap();
            let what = if t.is_symlink() {
                format!("-> {}", std::fs::read_link(&p).unwrap().display())
            } else if t.is_dir() {
                stack.push(p.clone());
                "dir".to_string()
            } else {
                format!("{:?}", std::fs::read(&p).unwrap())
            };
            out.push((rel, what));
        }
    }
    out.sort();
    out
}

/// Extracts `bytes` the way an upload does while its body arrives: cut at `cuts`, each piece
/// given to the scanner, the whole entries it finds extracted at once, the rest at the end.
fn extract_in_pieces(
    bytes: &[u8],
    cuts: &[usize],
    root: &OwnedFd,
    limits: Limits,
) -> Result<Extracted, ArchiveError> {
    let mut scan = TarScan::new();
    let mut stream: Option<TarStream> = None;
    let mut done = 0usize;
    let mut from = 0usize;
    for &cut in cuts.iter().chain([&bytes.len()]) {
        let cut = cut.clamp(from, bytes.len());
        scan.feed(&bytes[from..cut]);
        from = cut;
        let ready = scan.ready() as usize;
        assert!(
            ready <= cut && ready.is_multiple_of(512),
            "ready {ready} at {cut}"
        );
        if ready > done {
            let s = match &mut stream {
                Some(s) => s,
                None => stream.insert(TarStream::new(root, limits, None)?),
            };
            s.feed(&bytes[done..ready])?;
            done = ready;
        }
    }
    let mut s = match stream {
        Some(s) => s,
        None => TarStream::new(root, limits, None)?,
    };
    if done == 0 {
        s.feed(decompress(bytes, Compression::Sniff)?)?;
    } else {
        s.feed(&bytes[done..])?;
    }
    s.finish()
}

#[test]
fn the_scanner_marks_only_the_ends_of_whole_entries() {
    let long = "n".repeat(150);
    let mut b = tar::Builder::new(Vec::new());
    let mut h = tar::Header::new_gnu();
    h.set_size(10_000);
    h.set_mode(0o644);
    b.append_data(&mut h, &long, &[7u8; 10_000][..]).unwrap();
    let mut h = tar::Header::new_gnu();
    h.set_size(3);
    h.set_mode(0o644);
    b.append_data(&mut h, "small", &b"abc"[..]).unwrap();
    let bytes = b.into_inner().unwrap();
    // A GNU long-name record (header + one block), then the entry: 512 + 512 + 512 + 10,240.
    let first_end = 512 + 512 + 512 + 10_240;
    let mut scan = TarScan::new();
    scan.feed(&bytes[..first_end - 1]);
    assert_eq!(scan.ready(), 0, "the first entry's data is not all there");
    scan.feed(&bytes[first_end - 1..first_end]);
    assert_eq!(scan.ready(), first_end as u64);
    scan.feed(&bytes[first_end..first_end + 700]);
    assert_eq!(
        scan.ready(),
        first_end as u64,
        "a header and part of a block"
    );
    scan.feed(&bytes[first_end + 700..first_end + 1024]);
    assert_eq!(scan.ready(), first_end as u64 + 1024);
    // The end-of-archive blocks stop it; so does a compressed stream from the start.
    scan.feed(&bytes[first_end + 1024..]);
    assert_eq!(scan.ready(), first_end as u64 + 1024);
    let mut gz = TarScan::new();
    gz.feed(&[0x1f, 0x8b, 8, 0]);
    gz.feed(&[0u8; 2048]);
    assert_eq!(gz.ready(), 0);
}

/// Property: extracting in pieces as the bytes arrive, cut anywhere, gives exactly what one
/// pass gives — the same tree, or an error where one pass has one — for random archives with
/// long names, links and odd sizes, intact or mangled.
#[test]
fn property_extraction_in_pieces_matches_one_pass() {
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    let limits = Limits {
        bytes: Some(1 << 20),
        entries: 100,
        listed: 100,
    };
    for case in 0..cases() / 20 {
        let mut b = tar::Builder::new(Vec::new());
        for i in 0..rng.below(6) + 1 {
            let dir = if rng.below(2) == 0 { "d/" } else { "" };
            let name = match rng.below(3) {
                0 => format!("{dir}f{i}"),
                1 => format!("{dir}{}{i}", "long".repeat(30)),
                _ => format!("{dir}e{i}"),
            };
            let mut h = tar::Header::new_gnu();
            h.set_mode(0o644);
            match rng.below(4) {
                0 => {
                    h.set_entry_type(tar::EntryType::Symlink);
                    h.set_size(0);
                    b.append_link(&mut h, &name, "f0").unwrap();
                }
                _ => {
                    let data = vec![i as u8; rng.below(3000) as usize];
                    h.set_size(data.len() as u64);
                    b.append_data(&mut h, &name, &data[..]).unwrap();
                }
            }
        }
        let mut bytes = b.into_inner().unwrap();
        if case % 3 == 2 {
            for _ in 0..rng.below(4) + 1 {
                let i = rng.below(bytes.len() as u64) as usize;
                bytes[i] = rng.next() as u8;
            }
        }
        let mut cuts: Vec<usize> = (0..rng.below(8))
            .map(|_| rng.below(bytes.len() as u64 + 1) as usize)
            .collect();
        cuts.sort();
        let whole = tempfile::tempdir().unwrap();
        let pieces = tempfile::tempdir().unwrap();
        let open = |d: &tempfile::TempDir| nix::fcntl::open(d.path(), DIR, Mode::empty()).unwrap();
        let one = extract_tar(&bytes[..], Compression::Sniff, &open(&whole), limits, None);
        let cut = extract_in_pieces(&bytes, &cuts, &open(&pieces), limits);
        match (&one, &cut) {
            (Ok(a), Ok(b)) => {
                assert_eq!(a.paths, b.paths, "case {case}");
                assert_eq!(tree(whole.path()), tree(pieces.path()), "case {case}");
            }
            (Err(_), Err(_)) => {}
            _ => panic!("case {case} cuts {cuts:?}: one pass {one:?}, in pieces {cut:?}"),
        }
    }
}
