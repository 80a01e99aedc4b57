//! `/v1/fs/*`: translates HTTP (query, headers, streamed bodies, byte ranges) into calls on
//! [`FileService`](crate::files::FileService). Bodies of PUT and upload-batch are streamed, so the
//! JSON body limit is disabled on those routes and the upload limit is enforced by the service.

use std::io;

use axum::Json;
use axum::Router;
use axum::body::Body;
use axum::extract::rejection::JsonRejection;
use axum::extract::{DefaultBodyLimit, Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post};
use futures_util::TryStreamExt;
use serde::Deserialize;
use serde_json::json;

use super::{AppState, Problem};
use crate::files::{BodyStream, Compression, FileError, stream_range};

pub fn routes() -> Router<AppState> {
    Router::new()
        .route("/v1/fs/entries", get(list))
        .route(
            "/v1/fs/file",
            get(read_file)
                .put(write_file)
                .layer(DefaultBodyLimit::disable()),
        )
        .route("/v1/fs/entry", delete(delete_entry))
        .route("/v1/fs/mkdir", post(mkdir))
        .route("/v1/fs/move", post(move_entry))
        .route("/v1/fs/stat", get(stat))
        .route(
            "/v1/fs/upload-batch",
            post(upload_batch).layer(DefaultBodyLimit::disable()),
        )
}

#[derive(Deserialize)]
struct PathQuery {
    path: String,
}

#[derive(Deserialize)]
struct OptionalPathQuery {
    path: Option<String>,
}

#[derive(Deserialize)]
struct DeleteQuery {
    path: String,
    #[serde(default)]
    recursive: bool,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct MoveBody {
    from: String,
    to: String,
    #[serde(default)]
    overwrite: Option<bool>,
}

/// A JSON body that does not parse or has the wrong shape is 400 (the docs' promise; axum says
/// 422 for the shape); a missing or wrong content type stays 415.
pub(super) fn json_problem(e: JsonRejection) -> Problem {
    match e {
        JsonRejection::JsonDataError(_) | JsonRejection::JsonSyntaxError(_) => {
            Problem::bad_request(format!("invalid JSON body: {}", e.body_text()))
        }
        JsonRejection::MissingJsonContentType(_) => {
            Problem::new(StatusCode::UNSUPPORTED_MEDIA_TYPE, e.body_text())
        }
        _ => Problem::new(e.status(), e.body_text()),
    }
}

fn body_stream(body: Body) -> BodyStream {
    Box::pin(body.into_data_stream().map_err(io::Error::other))
}

fn declared_length(headers: &HeaderMap) -> Option<u64> {
    headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse().ok())
}

async fn list(
    State(s): State<AppState>,
    Query(q): Query<OptionalPathQuery>,
) -> Result<Response, Problem> {
    let entries = s.files.list(q.path.as_deref().unwrap_or(".")).await?;
    Ok(Json(entries).into_response())
}

async fn stat(State(s): State<AppState>, Query(q): Query<PathQuery>) -> Result<Response, Problem> {
    Ok(Json(s.files.stat(&q.path).await?).into_response())
}

async fn mkdir(State(s): State<AppState>, Query(q): Query<PathQuery>) -> Result<Response, Problem> {
    let path = s.files.mkdir(&q.path).await?;
    Ok(Json(json!({ "path": path })).into_response())
}

async fn delete_entry(
    State(s): State<AppState>,
    Query(q): Query<DeleteQuery>,
) -> Result<Response, Problem> {
    let path = s.files.delete(&q.path, q.recursive).await?;
    Ok(Json(json!({ "path": path })).into_response())
}

async fn move_entry(
    State(s): State<AppState>,
    body: Result<Json<MoveBody>, JsonRejection>,
) -> Result<Response, Problem> {
    let Json(b) = body.map_err(json_problem)?;
    let (from, to) = s
        .files
        .rename(&b.from, &b.to, b.overwrite.unwrap_or(false))
        .await?;
    Ok(Json(json!({ "from": from, "to": to })).into_response())
}

async fn write_file(
    State(s): State<AppState>,
    Query(q): Query<PathQuery>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, Problem> {
    let out = s
        .files
        .write_file(&q.path, body_stream(body), declared_length(&headers))
        .await?;
    Ok(Json(out).into_response())
}

async fn upload_batch(
    State(s): State<AppState>,
    Query(q): Query<OptionalPathQuery>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, Problem> {
    let compression = upload_compression(&headers)?;
    let out = s
        .files
        .upload_batch(
            q.path.as_deref().unwrap_or("."),
            body_stream(body),
            compression,
            declared_length(&headers),
        )
        .await?;
    Ok(Json(out).into_response())
}

/// The archive's compression from its Content-Type (and Content-Encoding). Only archive types
/// are accepted: a CORS-simple type (`text/plain`, forms) would let any web page post a tar.
fn upload_compression(headers: &HeaderMap) -> Result<Compression, FileError> {
    const EXPECTED: &str =
        "application/x-tar, application/gzip, application/x-gzip, application/octet-stream";
    let get = |name: header::HeaderName| {
        headers
            .get(name)
            .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
    };
    let raw = get(header::CONTENT_TYPE).unwrap_or_default();
    let essence = raw
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();
    let gzip_encoded = get(header::CONTENT_ENCODING)
        .is_some_and(|v| matches!(v.trim().to_ascii_lowercase().as_str(), "gzip" | "x-gzip"));
    match essence.as_str() {
        "application/gzip" | "application/x-gzip" => Ok(Compression::Gzip),
        "application/x-tar" | "application/octet-stream" if gzip_encoded => Ok(Compression::Gzip),
        "application/x-tar" | "application/octet-stream" => Ok(Compression::Sniff),
        _ => Err(FileError::UnsupportedMediaType {
            got: raw,
            expected: EXPECTED,
        }),
    }
}

/// A decimal position as RFC 9110 spells it: ASCII digits only (no sign, no space), which
/// `u64::from_str` alone would not enforce (it takes `+1`).
fn digits(s: &str) -> Option<u64> {
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse().ok()
}

/// A single satisfiable range `(start, len)`, or `None` to send the whole file. Syntactically
/// invalid or multi-range headers are ignored (RFC 9110 allows serving the full body).
pub(crate) fn parse_range(h: &str, size: u64) -> Result<Option<(u64, u64)>, FileError> {
    let Some(spec) = h.trim().strip_prefix("bytes=") else {
        return Ok(None);
    };
    if spec.contains(',') {
        return Ok(None);
    }
    let Some((a, b)) = spec.trim().split_once('-') else {
        return Ok(None);
    };
    let (a, b) = (a.trim(), b.trim());
    let unsatisfiable = FileError::RangeNotSatisfiable { size };
    if a.is_empty() {
        let Some(n) = digits(b) else {
            return Ok(None);
        };
        if n == 0 || size == 0 {
            return Err(unsatisfiable);
        }
        let n = n.min(size);
        return Ok(Some((size - n, n)));
    }
    let Some(start) = digits(a) else {
        return Ok(None);
    };
    let end = if b.is_empty() {
        u64::MAX
    } else {
        match digits(b) {
            Some(e) if e >= start => e,
            _ => return Ok(None),
        }
    };
    if start >= size {
        return Err(unsatisfiable);
    }
    let end = end.min(size - 1);
    Ok(Some((start, end - start + 1)))
}

async fn read_file(
    State(s): State<AppState>,
    Query(q): Query<PathQuery>,
    headers: HeaderMap,
) -> Result<Response, Problem> {
    let opened = s.files.open_file(&q.path).await?;
    let size = opened.size;
    let range = match headers.get(header::RANGE).and_then(|v| v.to_str().ok()) {
        Some(h) => parse_range(h, size)?,
        None => None,
    };
    let (status, start, len) = match range {
        Some((start, len)) => (StatusCode::PARTIAL_CONTENT, start, len),
        None => (StatusCode::OK, 0, size),
    };
    let idle = s.files.transfer_idle();
    let mut resp = Response::new(Body::from_stream(stream_range(
        opened.file,
        start,
        len,
        idle,
        opened.slot,
    )));
    *resp.status_mut() = status;
    let h = resp.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/octet-stream"),
    );
    h.insert(header::CONTENT_LENGTH, HeaderValue::from(len));
    h.insert(header::ACCEPT_RANGES, HeaderValue::from_static("bytes"));
    if status == StatusCode::PARTIAL_CONTENT {
        let v = format!("bytes {}-{}/{}", start, start + len - 1, size);
        if let Ok(v) = HeaderValue::from_str(&v) {
            h.insert(header::CONTENT_RANGE, v);
        }
    }
    if let Some(m) = opened
        .modified
        .and_then(|m| httpdate::fmt_http_date(m).parse::<HeaderValue>().ok())
    {
        h.insert(header::LAST_MODIFIED, m);
    }
    Ok(resp)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(h: &str, size: u64, expected: Result<Option<(u64, u64)>, ()>) {
        assert_eq!(
            parse_range(h, size).map_err(|_| ()),
            expected,
            "{h} of {size}"
        );
    }

    #[test]
    fn ranges_follow_rfc_9110() {
        check("bytes=0-9", 100, Ok(Some((0, 10))));
        check("bytes=90-", 100, Ok(Some((90, 10))));
        check("bytes=90-500", 100, Ok(Some((90, 10))));
        check("bytes=-10", 100, Ok(Some((90, 10))));
        check("bytes=-500", 100, Ok(Some((0, 100))));
        check("bytes=100-", 100, Err(()));
        check("bytes=-0", 100, Err(()));
        check("bytes=0-", 0, Err(()));
        check("bytes=5-1", 100, Ok(None));
        check("bytes=0-1,5-6", 100, Ok(None));
        check("items=0-1", 100, Ok(None));
        // A sign is not part of the grammar: the header is ignored, the whole file served.
        check("bytes=+1-2", 100, Ok(None));
        check("bytes=1-+2", 100, Ok(None));
        check("bytes=-+5", 100, Ok(None));
        check("bytes=--5", 100, Ok(None));
        check("bytes=0x1-2", 100, Ok(None));
    }

    /// Property (seeded generator; `RANGE_PROPTEST_CASES`, default 20,000): any header made of
    /// the grammar's pieces and hostile ones never panics, and an answered range lies inside the
    /// file and is never empty; a header with a sign is never honoured.
    #[test]
    fn property_ranges_stay_inside_the_file() {
        const PIECES: &[&str] = &[
            "bytes=",
            "0",
            "1",
            "9",
            "-",
            ",",
            "+",
            " ",
            "18446744073709551615",
            "99999999999999999999",
            "x",
            "=",
            "é",
            "00",
        ];
        let cases: u64 = std::env::var("RANGE_PROPTEST_CASES")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(20_000);
        let mut x: u64 = 0x2545_F491_4F6C_DD1D;
        let mut next = || {
            x ^= x >> 12;
            x ^= x << 25;
            x ^= x >> 27;
            x.wrapping_mul(0x9E37_79B9_7F4A_7C15)
        };
        for _ in 0..cases {
            let mut h = String::new();
            if next() % 4 != 0 {
                h.push_str("bytes=");
            }
            for _ in 0..next() % 6 {
                h.push_str(PIECES[(next() % PIECES.len() as u64) as usize]);
            }
            let size = match next() % 4 {
                0 => 0,
                1 => 1,
                2 => next() % 1000,
                _ => u64::MAX,
            };
            if let Ok(Some((start, len))) = parse_range(&h, size) {
                assert!(len >= 1, "{h:?} of {size}: empty");
                assert!(
                    start.checked_add(len).is_some_and(|end| end <= size),
                    "{h:?} of {size}: ({start}, {len})"
                );
                assert!(!h.contains('+'), "{h:?} honoured with a sign");
            }
        }
    }
}
