//! `/ui/`: the inspector, a single-page app whose built files (`ui/dist/`) are embedded in the
//! binary by `build.rs`. Invariant: only those embedded bytes are ever served — a path is looked
//! up in a static table, never on disk — and every answer carries the strict
//! Content-Security-Policy below. `/ui/` is not an API route: it needs no token (the page asks for
//! one and sends it on its own API calls) and it is left out of the OpenAPI document.

use std::sync::OnceLock;

use axum::Router;
use axum::extract::Path;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Redirect, Response};
// openapi-exempt: the inspector's static files are not API routes (docs/inspector.md).
use axum::routing::get;
use bytes::Bytes;
use tokio::sync::OnceCell;

use super::{AppState, Problem};

/// One built file of the inspector.
pub struct EmbeddedAsset {
    /// Relative to `ui/dist/`, `/`-separated.
    pub path: &'static str,
    pub bytes: &'static [u8],
    /// A quoted content fingerprint, computed by `build.rs`.
    pub etag: &'static str,
}

include!(concat!(env!("OUT_DIR"), "/ui_assets.rs"));

/// Scripts, styles, images and fetches only from the daemon's own origin; nothing inline (the
/// bundle has no inline script or style, and `style=""` attributes are refused too), no plugins,
/// no framing, no form posts, no `<base>`.
pub const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; script-src 'self'; \
style-src 'self'; img-src 'self'; connect-src 'self'; base-uri 'none'; form-action 'none'; \
frame-ancestors 'none'";

/// Every file but `index.html` is named by a hash of its content (the UI build does that), so a
/// browser may keep it for good; `index.html` names the current ones and is revalidated each time.
const IMMUTABLE: &str = "public, max-age=31536000, immutable";
const REVALIDATE: &str = "no-cache";

/// The templates of the routes below, for the request metrics.
pub const TEMPLATES: &[&str] = &["/ui", "/ui/", "/ui/{*path}"];

/// The inspector's routes: plain axum routes, outside the OpenAPI document on purpose (each line
/// carries the `openapi-exempt` marker the document's completeness test looks for).
pub fn routes() -> Router<AppState> {
    Router::new()
        // Relative links in the page resolve against `/ui/`, so the bare path must redirect.
        // openapi-exempt: the inspector, not an API route
        .route("/ui", get(|| async { Redirect::permanent("/ui/") }))
        // openapi-exempt: the inspector, not an API route
        .route("/ui/", get(index))
        // openapi-exempt: the inspector, not an API route
        .route("/ui/{*path}", get(asset))
}

async fn index(headers: HeaderMap) -> Response {
    serve("index.html", &headers).await
}

async fn asset(Path(path): Path<String>, headers: HeaderMap) -> Response {
    serve(&path, &headers).await
}

/// The embedded file at `path`, or 404 problem+json. Text files go gzip-compressed to a client
/// that accepts it (the bundle is mostly script: about a quarter of the bytes); each encoding has
/// its own ETag, and `If-None-Match` is honoured.
async fn serve(path: &str, request: &HeaderMap) -> Response {
    let Some(index) = ASSETS.iter().position(|a| a.path == path) else {
        let detail = if ASSETS.is_empty() {
            "this binary was built without the inspector (ui/dist/ was missing)".to_string()
        } else {
            format!("the inspector has no file {path:?}")
        };
        return Problem::not_found(detail).into_response();
    };
    let asset = &ASSETS[index];
    let cache = if path == "index.html" {
        REVALIDATE
    } else {
        IMMUTABLE
    };
    let compressible = is_compressible(path, asset.bytes.len());
    let gzip = if compressible && accepts_gzip(request) {
        gzipped(index).await
    } else {
        None
    };
    let etag = match gzip {
        // A strong ETag names one representation: the compressed one needs its own.
        Some(_) => HeaderValue::from_str(&format!("{}-gz\"", asset.etag.trim_end_matches('"')))
            .expect("an ETag from build.rs is a valid header value"),
        None => HeaderValue::from_static(asset.etag),
    };
    let fresh = request
        .get(header::IF_NONE_MATCH)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| {
            v.split(',')
                .any(|t| t.trim().as_bytes() == etag.as_bytes() || t.trim() == "*")
        });
    let mut resp = if fresh {
        StatusCode::NOT_MODIFIED.into_response()
    } else {
        let mut r = match &gzip {
            Some(bytes) => bytes.clone().into_response(),
            None => asset.bytes.into_response(),
        };
        r.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static(content_type(path)),
        );
        if gzip.is_some() {
            r.headers_mut()
                .insert(header::CONTENT_ENCODING, HeaderValue::from_static("gzip"));
        }
        r
    };
    let h = resp.headers_mut();
    if compressible {
        h.insert(header::VARY, HeaderValue::from_static("accept-encoding"));
    }
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static(cache));
    h.insert(header::ETAG, etag);
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CONTENT_SECURITY_POLICY),
    );
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    resp
}

/// Text worth compressing: small files gain nothing but a header.
fn is_compressible(path: &str, len: usize) -> bool {
    len >= 1024 && (content_type(path).starts_with("text/") || path.ends_with(".svg"))
}

/// True when `Accept-Encoding` lists `gzip` (or `*`) without `q=0`.
fn accepts_gzip(request: &HeaderMap) -> bool {
    request
        .get_all(header::ACCEPT_ENCODING)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|item| {
            let mut parts = item.split(';').map(str::trim);
            let coding = parts.next().unwrap_or("");
            let refused = parts.any(|p| {
                p.strip_prefix("q=")
                    .and_then(|q| q.trim().parse::<f32>().ok())
                    .is_some_and(|q| q == 0.0)
            });
            (coding.eq_ignore_ascii_case("gzip") || coding == "*") && !refused
        })
}

/// The gzip of `ASSETS[index]`, compressed once per process on the blocking pool (the runtime
/// thread must not spend milliseconds deflating) and kept; `None` if compression failed.
async fn gzipped(index: usize) -> Option<Bytes> {
    static CELLS: OnceLock<Vec<OnceCell<Option<Bytes>>>> = OnceLock::new();
    let cells = CELLS.get_or_init(|| ASSETS.iter().map(|_| OnceCell::new()).collect());
    cells[index]
        .get_or_init(|| async move {
            let bytes = ASSETS[index].bytes;
            tokio::task::spawn_blocking(move || {
                use std::io::Write;
                let mut enc = flate2::write::GzEncoder::new(
                    Vec::with_capacity(bytes.len() / 3),
                    flate2::Compression::best(),
                );
                enc.write_all(bytes).ok()?;
                enc.finish().ok().map(Bytes::from)
            })
            .await
            .ok()
            .flatten()
        })
        .await
        .clone()
}

/// The media type for a built file, by extension. `nosniff` is set, so this must be right for
/// the browser to run a script or apply a style at all.
fn content_type(path: &str) -> &'static str {
    match path.rsplit_once('.').map(|(_, ext)| ext) {
        Some("html") => "text/html; charset=utf-8",
        Some("js" | "mjs") => "text/javascript; charset=utf-8",
        Some("css") => "text/css; charset=utf-8",
        Some("svg") => "image/svg+xml",
        Some("json" | "map") => "application/json",
        Some("png") => "image/png",
        Some("ico") => "image/x-icon",
        Some("txt") => "text/plain; charset=utf-8",
        _ => "application/octet-stream",
    }
}

#[cfg(test)]
mod tests {
    use super::{accepts_gzip, content_type};
    use axum::http::{HeaderMap, HeaderValue, header};

    fn check_gzip(accept: &str, expected: bool) {
        let mut h = HeaderMap::new();
        h.insert(
            header::ACCEPT_ENCODING,
            HeaderValue::from_str(accept).unwrap(),
        );
        assert_eq!(accepts_gzip(&h), expected, "{accept:?}");
    }

    #[test]
    fn gzip_when_accepted() {
        check_gzip("gzip, deflate, br, zstd", true);
        check_gzip("br;q=1.0, gzip;q=0.8", true);
        check_gzip("GZIP", true);
        check_gzip("*", true);
        check_gzip("gzip;q=0", false);
        check_gzip("gzip; q=0.0, br", false);
        check_gzip("identity", false);
        check_gzip("", false);
        assert!(!accepts_gzip(&HeaderMap::new()));
    }

    fn check(path: &str, expected: &str) {
        assert_eq!(content_type(path), expected, "{path}");
    }

    #[test]
    fn content_types_by_extension() {
        check("index.html", "text/html; charset=utf-8");
        check("app-0123abcd.js", "text/javascript; charset=utf-8");
        check("app-0123abcd.css", "text/css; charset=utf-8");
        check("icon-0123abcd.svg", "image/svg+xml");
        check("noextension", "application/octet-stream");
        check("weird.", "application/octet-stream");
    }
}
