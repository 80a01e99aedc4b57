//! Bearer-token authentication for every `/v1/*` path. The comparison takes the same time
//! whatever the guess, and the token is never logged.
//!
//! The token comes in the `Authorization: Bearer` header. One exception: a WebSocket upgrade
//! (`GET` with `Upgrade: websocket`) of a route that serves WebSockets may carry it as
//! `?access_token=` instead, because a browser's `WebSocket` cannot set headers (the published npm
//! SDK sends it that way). A URL may end up in a proxy's or a browser's history, so the query
//! form is refused (401) on every other request, even one that also has a valid header; the
//! edge removes the parameter from the URI before routing, so no handler (and no error message)
//! ever sees it. Why: docs/security.md, "Tokens in URLs".

use axum::extract::Request;
use axum::http::uri::PathAndQuery;
use axum::http::{Method, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};

use super::{AppState, Problem};

/// The query parameter a WebSocket upgrade may carry the token in.
const QUERY_TOKEN: &str = "access_token";

/// Whether `path` is behind the token: every `/v1` path, and `/metrics` (scrapers send
/// `Authorization: Bearer …` as well).
pub fn needs_token(path: &str) -> bool {
    path == "/v1" || path.starts_with("/v1/") || path == "/metrics" || is_opencode(path)
}

/// The OpenCode bridge, whose clients send the token as an HTTP basic password (user `opencode`,
/// OpenCode's `OPENCODE_SERVER_PASSWORD`); a bearer token works there too.
fn is_opencode(path: &str) -> bool {
    path == "/opencode" || path.starts_with("/opencode/")
}

/// `None` when the request may go on, else the 401 answer. A plain function called by the one
/// edge middleware (`super::edge`), not a layer of its own: each `from_fn_with_state` layer
/// clones the state and its inner service on every request. An accepted query token is removed
/// from the request's URI.
pub fn check_token(state: &AppState, req: &mut Request) -> Option<Response> {
    let expected = state.config.token.as_deref()?;
    // Every /v1 path needs the token, routed or not, so that nothing about the surface is
    // visible without it; `/` stays open for probes.
    if !needs_token(req.uri().path()) {
        return None;
    }
    let header = req.headers().get(header::AUTHORIZATION).map(|v| {
        v.to_str().ok().and_then(|v| {
            bearer_credentials(v).map(str::to_string).or_else(|| {
                is_opencode(req.uri().path())
                    .then(|| basic_password(v))
                    .flatten()
            })
        })
    });
    let query = query_token(req.uri());
    if let QueryToken::Present(_) | QueryToken::Repeated = query
        && !is_websocket_upgrade(req)
    {
        return Some(unauthorized(
            "a token in the URL (`access_token`) is accepted only on WebSocket upgrades of the \
             routes that serve WebSockets; send `Authorization: Bearer <token>`",
        ));
    }
    // Every credential given must be valid, and there must be one.
    let header_ok = match header {
        None => None,
        Some(Some(given)) => Some(constant_time_eq(given.as_bytes(), expected.as_bytes())),
        Some(None) => Some(false),
    };
    let query_ok = match &query {
        QueryToken::Absent => None,
        QueryToken::Present(given) => Some(constant_time_eq(given.as_bytes(), expected.as_bytes())),
        QueryToken::Repeated => Some(false),
    };
    match (header_ok, query_ok) {
        (None, None) => Some(unauthorized(
            "this route needs `Authorization: Bearer <token>`",
        )),
        (Some(false), _) => Some(unauthorized("the bearer token is not valid")),
        (_, Some(false)) => Some(unauthorized("the access_token is not valid")),
        _ => {
            if query_ok.is_some() {
                strip_query_token(req);
            }
            None
        }
    }
}

/// The routes that serve WebSockets (OpenAPI path templates; `{…}` is one non-empty segment). The
/// OpenAPI document marks their GET as also taking the query token (`openapi.rs`).
pub const WEBSOCKET_ROUTES: [&str; 6] = [
    "/v1/acp/{serverId}",
    "/v1/desktop/stream/frames",
    "/v1/agents/{agent}/acp",
    "/v1/processes/{id}/terminal/ws",
    "/v1/fs/watch",
    "/v1/browser/cdp",
];

/// A `GET` asking for a WebSocket on one of [`WEBSOCKET_ROUTES`]. (Not the HTTP/2 form, an
/// extended CONNECT: browsers, the reason for the query token, speak HTTP/2 only over TLS, which
/// the daemon does not serve, so an h2c client sends its token in the header.)
fn is_websocket_upgrade(req: &Request) -> bool {
    req.method() == Method::GET
        && super::ws::wants_upgrade(req.method(), req.headers())
        && serves_websockets(req.uri().path())
}

fn serves_websockets(path: &str) -> bool {
    WEBSOCKET_ROUTES.iter().any(|template| {
        let mut given = path.split('/');
        let mut wanted = template.split('/');
        loop {
            match (given.next(), wanted.next()) {
                (None, None) => return true,
                (Some(g), Some(w)) if w.starts_with('{') => {
                    if g.is_empty() {
                        return false;
                    }
                }
                (Some(g), Some(w)) if g == w => {}
                _ => return false,
            }
        }
    })
}

enum QueryToken {
    Absent,
    Present(String),
    /// More than one `access_token`: refused rather than guessing which one counts.
    Repeated,
}

fn query_token(uri: &Uri) -> QueryToken {
    let Some(query) = uri.query() else {
        return QueryToken::Absent;
    };
    let mut found = QueryToken::Absent;
    for pair in query.split('&') {
        let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
        if decode_component(name).as_deref() != Some(QUERY_TOKEN.as_bytes()) {
            continue;
        }
        found = match found {
            QueryToken::Absent => match decode_component(value).map(String::from_utf8) {
                Some(Ok(v)) => QueryToken::Present(v),
                // Undecodable: cannot be the token; compare something that fails.
                _ => QueryToken::Repeated,
            },
            _ => QueryToken::Repeated,
        };
    }
    found
}

/// `application/x-www-form-urlencoded` decoding of one name or value (`+` is a space, `%XX` a
/// byte). `None` for a malformed escape.
fn decode_component(s: &str) -> Option<Vec<u8>> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'+' => out.push(b' '),
            b'%' => {
                let hex = b.get(i + 1..i + 3)?;
                let hex = std::str::from_utf8(hex).ok()?;
                out.push(u8::from_str_radix(hex, 16).ok()?);
                i += 2;
            }
            c => out.push(c),
        }
        i += 1;
    }
    Some(out)
}

/// Removes every `access_token` pair from the URI, keeping the other pairs byte for byte.
fn strip_query_token(req: &mut Request) {
    let uri = req.uri();
    let Some(query) = uri.query() else { return };
    let kept: Vec<&str> = query
        .split('&')
        .filter(|pair| {
            let name = pair.split_once('=').map_or(*pair, |(n, _)| n);
            decode_component(name).as_deref() != Some(QUERY_TOKEN.as_bytes())
        })
        .collect();
    let pq = if kept.is_empty() {
        uri.path().to_string()
    } else {
        format!("{}?{}", uri.path(), kept.join("&"))
    };
    let mut parts = uri.clone().into_parts();
    let rebuilt = PathAndQuery::try_from(pq).ok().and_then(|pq| {
        parts.path_and_query = Some(pq);
        Uri::from_parts(parts).ok()
    });
    // A subset of a valid path and query is valid, so the fallback is never taken; should it be,
    // the request is routed nowhere rather than with the token still in its URI.
    *req.uri_mut() = rebuilt.unwrap_or_else(|| Uri::from_static("/v1/invalid-uri"));
}

/// The credentials of an `Authorization: Bearer <token>` header. The scheme is matched without
/// regard to case (RFC 9110 §11.1); the token is taken as is, minus surrounding blanks.
fn bearer_credentials(value: &str) -> Option<&str> {
    let (scheme, rest) = value.trim_start().split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then(|| rest.trim())
}

/// The password of an `Authorization: Basic` header (any user name).
fn basic_password(value: &str) -> Option<String> {
    use base64::Engine as _;
    let (scheme, rest) = value.trim_start().split_once(' ')?;
    if !scheme.eq_ignore_ascii_case("basic") {
        return None;
    }
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(rest.trim())
        .ok()?;
    let text = String::from_utf8(decoded).ok()?;
    text.split_once(':').map(|(_, pass)| pass.to_string())
}

fn unauthorized(detail: &str) -> Response {
    Problem::new(StatusCode::UNAUTHORIZED, detail)
        .header(header::WWW_AUTHENTICATE, "Bearer")
        .into_response()
}

/// Compares without an early exit; only the length leaks, as with any such comparison.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    let mut diff: usize = a.len() ^ b.len();
    for i in 0..a.len().max(b.len()) {
        let x = a.get(i).copied().unwrap_or(0);
        let y = b.get(i).copied().unwrap_or(0xff);
        diff |= usize::from(x ^ y);
    }
    std::hint::black_box(diff) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scheme_is_case_insensitive() {
        for v in ["Bearer t", "bearer t", "BEARER t", "bEaReR   t "] {
            assert_eq!(bearer_credentials(v), Some("t"), "{v}");
        }
        for v in ["Basic t", "Bearert", "Bearer", ""] {
            assert_eq!(bearer_credentials(v), None, "{v}");
        }
    }

    #[test]
    fn compares_whole_strings() {
        assert!(constant_time_eq(b"secret", b"secret"));
        assert!(!constant_time_eq(b"secret", b"secreT"));
        assert!(!constant_time_eq(b"secret", b"secret2"));
        assert!(!constant_time_eq(b"", b"x"));
        assert!(constant_time_eq(b"", b""));
    }

    #[test]
    fn websocket_routes() {
        for ok in [
            "/v1/acp/s1",
            "/v1/agents/mock/acp",
            "/v1/processes/proc_1/terminal/ws",
        ] {
            assert!(serves_websockets(ok), "{ok}");
        }
        for bad in [
            "/v1/acp",
            "/v1/acp/",
            "/v1/acp/s1/x",
            "/v1/agents//acp",
            "/v1/agents/mock/install",
            "/v1/processes/proc_1/logs",
            "/v1/processes//terminal/ws",
            "/v1/processes/proc_1/terminal/ws/",
            "/v1/health",
            "/ui/acp/x",
        ] {
            assert!(!serves_websockets(bad), "{bad}");
        }
    }

    #[test]
    fn query_token_is_decoded_and_a_repeat_refused() {
        let t = |q: &str| match query_token(&q.parse::<Uri>().unwrap()) {
            QueryToken::Absent => "absent".to_string(),
            QueryToken::Present(v) => format!("={v}"),
            QueryToken::Repeated => "repeated".to_string(),
        };
        assert_eq!(t("/v1/acp/x"), "absent");
        assert_eq!(t("/v1/acp/x?agent=mock"), "absent");
        assert_eq!(t("/v1/acp/x?access_token=a%2Bb+c&agent=m"), "=a+b c");
        assert_eq!(t("/v1/acp/x?access%5Ftoken=z"), "=z");
        assert_eq!(t("/v1/acp/x?access_token"), "=");
        assert_eq!(t("/v1/acp/x?access_token=a&access_token=a"), "repeated");
        assert_eq!(t("/v1/acp/x?access_token=%zz"), "repeated");
        assert_eq!(t("/v1/acp/x?access_token=%ff"), "repeated");
    }

    #[test]
    fn stripping_keeps_the_other_pairs_byte_for_byte() {
        let strip = |u: &str| {
            let mut req = Request::builder()
                .uri(u)
                .body(axum::body::Body::empty())
                .unwrap();
            strip_query_token(&mut req);
            req.uri().to_string()
        };
        assert_eq!(
            strip("/v1/acp/x?agent=a%20b&access_token=s&lastEventId=3"),
            "/v1/acp/x?agent=a%20b&lastEventId=3"
        );
        assert_eq!(strip("/v1/acp/x?access_token=s"), "/v1/acp/x");
        assert_eq!(
            strip("http://127.0.0.1:1/v1/acp/x?access%5ftoken=s&a=1"),
            "http://127.0.0.1:1/v1/acp/x?a=1"
        );
    }
}
