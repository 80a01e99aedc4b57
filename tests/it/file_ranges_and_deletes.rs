//! The fs API's range reads and recursive deletes through the in-process tier
//! (`support::app`): 206 with the exact bytes, 416 with `bytes */len`, and a recursive delete
//! that removes a symlink, never what it points to.

use axum::body::Body;
use axum::http::{Method, Request, StatusCode, header};

use crate::files::pattern;
use crate::support::app::App;

#[tokio::test]
async fn range_reads_answer_206_and_unsatisfiable_ones_416() {
    let app = App::start::<_, &str>([]).await;
    let data = pattern(1000, 3);
    let r = app.put_bytes("/v1/fs/file?path=r.bin", data.clone()).await;
    assert_eq!(r.status, 200);
    let ranged = |range: &'static str| {
        Request::builder()
            .method(Method::GET)
            .uri("/v1/fs/file?path=r.bin")
            .header(header::HOST, "127.0.0.1")
            .header(header::RANGE, range)
            .body(Body::empty())
            .unwrap()
    };
    for (range, start, end) in [
        ("bytes=0-0", 0usize, 0usize),
        ("bytes=10-19", 10, 19),
        ("bytes=990-", 990, 999),
        ("bytes=-5", 995, 999),
        ("bytes=500-5000", 500, 999),
    ] {
        let r = app.send(ranged(range)).await;
        assert_eq!(r.status, 206, "{range}");
        assert_eq!(
            r.headers[header::CONTENT_RANGE],
            format!("bytes {start}-{end}/1000").as_str()
        );
        assert_eq!(
            r.headers[header::CONTENT_LENGTH],
            (end - start + 1).to_string().as_str()
        );
        assert_eq!(&r.body[..], &data[start..=end], "{range}");
    }
    let r = app.send(ranged("bytes=1000-")).await;
    r.problem(StatusCode::RANGE_NOT_SATISFIABLE);
    assert_eq!(r.headers[header::CONTENT_RANGE], "bytes */1000");
}

#[tokio::test]
async fn delete_recursive_removes_symlinks_not_their_targets() {
    let app = App::start::<_, &str>([]).await;
    let outside = tempfile::tempdir().unwrap();
    std::fs::write(outside.path().join("precious"), "x").unwrap();
    std::fs::create_dir_all(app.path("t")).unwrap();
    std::os::unix::fs::symlink(outside.path(), app.path("t/link")).unwrap();
    let r = app.delete("/v1/fs/entry?path=t&recursive=true").await;
    assert_eq!(r.status, 200);
    assert!(!app.path("t").exists());
    assert!(outside.path().join("precious").exists());
}
