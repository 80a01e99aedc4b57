//! `/ui/`: the inspector, a single-page app whose built files (`ui/dist/`) are embedded in the
//! binary by `build.rs`. Invariant: only those embedded bytes are ever served — a path is looked
//! up in a static table, never on disk — and every answer carries the strict
//! Content-Security-Policy below. `/ui/` is not an API route: it needs no token (the page asks for
//! one and sends it on its own API calls) and it is left out of the OpenAPI document.

use axum::Router;
use axum::extract::Path;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::get;

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

pub fn routes() -> Router<AppState> {
    Router::new()
        // Relative links in the page resolve against `/ui/`, so the bare path must redirect.
        .route("/ui", get(|| async { Redirect::permanent("/ui/") }))
        .route("/ui/", get(index))
        .route("/ui/{*path}", get(asset))
}

async fn index(headers: HeaderMap) -> Response {
    serve("index.html", &headers)
}

async fn asset(Path(path): Path<String>, headers: HeaderMap) -> Response {
    serve(&path, &headers)
}

/// The embedded file at `path`, or 404 problem+json. Honours `If-None-Match`.
fn serve(path: &str, request: &HeaderMap) -> Response {
    let Some(asset) = ASSETS.iter().find(|a| a.path == path) else {
        let detail = if ASSETS.is_empty() {
            "this binary was built without the inspector (ui/dist/ was missing)".to_string()
        } else {
            format!("the inspector has no file {path:?}")
        };
        return Problem::not_found(detail).into_response();
    };
    let cache = if path == "index.html" {
        REVALIDATE
    } else {
        IMMUTABLE
    };
    let fresh = request
        .get(header::IF_NONE_MATCH)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| {
            v.split(',')
                .any(|t| t.trim() == asset.etag || t.trim() == "*")
        });
    let mut resp = if fresh {
        StatusCode::NOT_MODIFIED.into_response()
    } else {
        let mut r = asset.bytes.into_response();
        r.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static(content_type(path)),
        );
        r
    };
    let h = resp.headers_mut();
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static(cache));
    h.insert(header::ETAG, HeaderValue::from_static(asset.etag));
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
    use super::content_type;

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
