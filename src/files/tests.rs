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
