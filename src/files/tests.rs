//! `FileService` in process on a temporary root: the entry operations as a client of the
//! filesystem API observes them, and the confinement beneath `--fs-root`.

use super::{FileError, FileService};
use crate::config::Config;

fn service(root: &std::path::Path) -> FileService {
    let mut config = Config::defaults();
    config.data_dir = root.join(".data");
    config.work_dir = root.to_path_buf();
    config.fs_root = Some(root.to_path_buf());
    FileService::new(&config).unwrap()
}

#[tokio::test]
async fn entries_are_made_moved_listed_and_removed() {
    let dir = tempfile::tempdir().unwrap();
    let fs = service(dir.path());
    fs.mkdir("a/b").await.unwrap();
    std::fs::write(dir.path().join("a/b/f.txt"), "hello").unwrap();
    fs.rename("a/b/f.txt", "c/g.txt", false).await.unwrap();
    assert_eq!(
        std::fs::read_to_string(dir.path().join("c/g.txt")).unwrap(),
        "hello"
    );
    let names: Vec<String> = fs
        .list("c")
        .await
        .unwrap()
        .into_iter()
        .map(|e| e.name)
        .collect();
    assert_eq!(names, ["g.txt"]);
    let kept = fs.delete("a", false).await.err();
    assert!(matches!(kept, Some(FileError::NotEmpty { .. })), "{kept:?}");
    fs.delete("a", true).await.unwrap();
    assert!(!dir.path().join("a").exists());
}

/// A symbolic link that leads out of the root is never followed, however it is reached.
#[tokio::test]
async fn a_link_out_of_the_root_is_refused() {
    let outside = tempfile::tempdir().unwrap();
    std::fs::write(outside.path().join("secret"), "no").unwrap();
    let dir = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink(outside.path(), dir.path().join("out")).unwrap();
    let fs = service(dir.path());
    for path in ["out/secret", "out", "../", "/../etc"] {
        let r = fs.stat(path).await;
        assert!(
            matches!(
                r,
                Err(FileError::OutsideRoot { .. }) | Err(FileError::NotFound { .. })
            ),
            "{path}: {r:?}"
        );
    }
    let moved = fs.rename("out/secret", "here", false).await.err();
    assert!(moved.is_some(), "a file outside the root was moved in");
    assert!(outside.path().join("secret").exists());
}

/// An archive built with the tar crate: `n` small files in directories, a file of 3 MiB that
/// spans several batches, long names (GNU records), a symlink; with `pax`, a pax record half-way
/// (the scanner stops there and the rest is extracted at the end).
fn sample_tar(n: usize, pax: bool) -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    let add = |b: &mut tar::Builder<Vec<u8>>, name: &str, data: &[u8]| {
        let mut h = tar::Header::new_gnu();
        h.set_size(data.len() as u64);
        h.set_mode(0o644);
        b.append_data(&mut h, name, data).unwrap();
    };
    for i in 0..n {
        let data: Vec<u8> = (0..(i * 37) % 5000).map(|j| (i + j) as u8).collect();
        add(&mut b, &format!("d{}/f{i}", i % 7), &data);
        if i == n / 2 {
            let big: Vec<u8> = (0..3 << 20).map(|j: usize| (j % 251) as u8).collect();
            add(&mut b, "big/blob", &big);
            add(&mut b, &format!("{}/long", "x".repeat(120)), b"long");
            if pax {
                b.append_pax_extensions([("comment", &b"mid-way"[..])])
                    .unwrap();
                add(&mut b, "after-pax", b"p");
            }
        }
    }
    let mut h = tar::Header::new_gnu();
    h.set_entry_type(tar::EntryType::Symlink);
    h.set_size(0);
    b.append_link(&mut h, "d0/link", "f0").unwrap();
    b.into_inner().unwrap()
}

/// The body as frames of the given sizes (cycled), all at once: the reader batches them.
fn frames(bytes: &[u8], sizes: &[usize]) -> super::BodyStream {
    let mut out = Vec::new();
    let mut at = 0;
    for size in sizes.iter().cycle() {
        if at >= bytes.len() {
            break;
        }
        let end = (at + size).min(bytes.len());
        out.push(Ok(bytes::Bytes::copy_from_slice(&bytes[at..end])));
        at = end;
    }
    Box::pin(futures_util::stream::iter(out))
}

/// The tree beneath `dir` as sorted (path, content or link target).
fn tree_of(dir: &std::path::Path) -> Vec<(String, Vec<u8>)> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            let p = e.path();
            let rel = p.strip_prefix(dir).unwrap().to_string_lossy().into_owned();
            let t = e.file_type().unwrap();
            if t.is_symlink() {
                let l = std::fs::read_link(&p).unwrap();
                out.push((rel, l.to_string_lossy().as_bytes().to_vec()));
            } else if t.is_dir() {
                stack.push(p);
                out.push((rel, b"/".to_vec()));
            } else {
                out.push((rel, std::fs::read(&p).unwrap()));
            }
        }
    }
    out.sort();
    out
}

/// upload-batch extracts a plain tar as its entries arrive: whatever the frames, the batches
/// and the archive's kind of records (GNU long names, a pax record that stops the scan, gzip),
/// the tree is exactly the archive's, nothing else is left, and the permit comes back.
#[tokio::test]
async fn upload_batch_gives_the_archives_tree_however_the_body_arrives() {
    use super::upload::Compression;
    let dir = tempfile::tempdir().unwrap();
    let fs = service(dir.path());
    let permits = || {
        fs.live_extractions
            .free
            .load(std::sync::atomic::Ordering::Acquire)
    };
    let free = permits();
    let reference = tempfile::tempdir().unwrap();
    // The last case's destination has more missing parents than a live extraction may hold
    // open: it is spooled whole, then extracted.
    for (case, (pax, gzip, sizes)) in [
        (false, false, &[65_536usize][..]),
        (false, false, &[1, 511, 513, 4096, 100_003][..]),
        (true, false, &[7_777][..]),
        (false, true, &[65_536][..]),
        (false, false, &[65_536][..]),
    ]
    .into_iter()
    .enumerate()
    {
        let plain = sample_tar(300, pax);
        let expected = {
            let out = reference.path().join(format!("r{case}"));
            std::fs::create_dir(&out).unwrap();
            tar::Archive::new(&plain[..]).unpack(&out).unwrap();
            tree_of(&out)
        };
        let body = if gzip {
            let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
            std::io::Write::write_all(&mut e, &plain).unwrap();
            e.finish().unwrap()
        } else {
            plain
        };
        let dest = if case == 4 {
            format!("out{case}/a/b/c/d/e/f/g/h/i/dest")
        } else {
            format!("out{case}/dest")
        };
        let outcome = fs
            .upload_batch(&dest, frames(&body, sizes), Compression::Sniff, None)
            .await
            .unwrap_or_else(|e| panic!("case {case}: {e:?}"));
        assert!(outcome.paths.len() > 300, "case {case}");
        assert_eq!(tree_of(&dir.path().join(&dest)), expected, "case {case}");
        assert_eq!(permits(), free, "case {case}: the permit came back");
    }
}

/// A hostile entry after megabytes of good ones, in a merge and in a new destination: refused,
/// and the destination is as before (the entries extracted meanwhile, the staging directory and
/// the parents the upload made are gone).
#[tokio::test]
async fn upload_batch_refused_half_way_leaves_the_destination_as_it_was() {
    use super::upload::Compression;
    let dir = tempfile::tempdir().unwrap();
    let fs = service(dir.path());
    let mut t = sample_tar(300, false);
    t.truncate(t.len() - 1024); // the end-of-archive blocks
    let mut h = tar::Header::new_gnu();
    h.set_size(1);
    h.set_mode(0o644);
    h.as_mut_bytes()[..12].copy_from_slice(b"../escape.tx");
    h.set_cksum();
    t.extend_from_slice(h.as_bytes());
    t.extend_from_slice(&[b'x'; 512]);
    t.extend_from_slice(&[0; 1024]);
    std::fs::create_dir_all(dir.path().join("merge")).unwrap();
    std::fs::write(dir.path().join("merge/keep"), "old").unwrap();
    let before = tree_of(dir.path());
    for dest in ["merge", "new/deeper/dest"] {
        let r = fs
            .upload_batch(dest, frames(&t, &[65_536]), Compression::Sniff, None)
            .await;
        assert!(
            matches!(r, Err(FileError::UnsafeEntry { .. })),
            "{dest}: {r:?}"
        );
        let after: Vec<_> = tree_of(dir.path())
            .into_iter()
            .filter(|(p, _)| !p.starts_with(".data"))
            .collect();
        let before: Vec<_> = before
            .iter()
            .filter(|(p, _)| !p.starts_with(".data"))
            .cloned()
            .collect();
        assert_eq!(after, before, "{dest}");
    }
}
