//! The edge guard against browsers: what a web page in the user's browser could otherwise do to
//! a daemon on loopback. Three rules, checked before the token and before routing:
//! - **Host** (DNS rebinding): without a token, the `Host` (or HTTP/2 `:authority`) must be a
//!   loopback name or address, an IP literal of the address the connection arrived on (the
//!   configured `--host`, or the interface of a wildcard bind), or a name in `--allowed-hosts`.
//!   A rebinding page always sends its own DNS name, so an IP literal cannot be one.
//! - **Origin** (cross-site requests): a request carrying `Origin` must come from the daemon's
//!   own origin (the request's own host and port) or one in `--allowed-origins`; allowed foreign
//!   origins get CORS answers, including preflights.
//! - **Content-Type** (no-cors writes): a state-changing request (POST/PUT/PATCH/DELETE) with a
//!   CORS-simple type (`text/plain`, `application/x-www-form-urlencoded`,
//!   `multipart/form-data`), or with a body and no type at all, is refused 415: those are the
//!   only requests a page can send cross-site without a preflight.
//!
//! **Invariant:** pure functions of the request and the config; no I/O, no allocation beyond the
//! refusal itself.

use std::borrow::Cow;
use std::net::{IpAddr, SocketAddr};

use axum::body::{Body, HttpBody};
use axum::extract::Request;
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::response::{IntoResponse, Response};

use super::Problem;
use crate::config::Config;

/// The local address a connection arrived on; the accept loop puts it in every request's
/// extensions.
#[derive(Debug, Clone, Copy)]
pub struct LocalAddr(pub SocketAddr);

/// Both ends of the connection a request arrived on, for the port proxy only (its
/// `X-Forwarded-For`, and its refusal to proxy to the daemon's own port): the accept loop adds
/// it to the requests `needs_conn_addrs` names, so that no other request pays for it.
#[derive(Debug, Clone, Copy)]
pub struct ConnAddrs {
    pub peer: SocketAddr,
    pub local: SocketAddr,
}

/// Whether a request's path is one of the proxy's (`/v1/ports/{port}/proxy/…`, `/preview/…`).
pub fn needs_conn_addrs(path: &str) -> bool {
    path.starts_with("/v1/ports/") || path.starts_with("/preview/")
}

/// What the guard decided for a request that may go on.
pub enum Pass {
    /// No Origin, or the daemon's own: nothing to add to the answer.
    SameOrigin,
    /// An allowed foreign origin: the answer gets CORS headers for it.
    Cors(HeaderValue),
}

/// What the guard decided.
pub enum Decision {
    /// The request may go on.
    Go(Pass),
    /// The answer is already known: a refusal, or a preflight's 204.
    Answer(Response),
}

pub fn check(config: &Config, req: &Request) -> Decision {
    match decide(config, req) {
        Ok(pass) => Decision::Go(pass),
        Err(answer) => Decision::Answer(*answer),
    }
}

fn decide(config: &Config, req: &Request) -> Result<Pass, Box<Response>> {
    let host = request_host(req);
    if config.token.is_none()
        && let Some(host) = host.as_deref()
        && !host_allowed(config, host, req.extensions().get::<LocalAddr>())
    {
        return Err(Box::new(refuse(
            StatusCode::FORBIDDEN,
            "this Host is not served without a token; add it to --allowed-hosts",
        )));
    }
    // A request without any Host is not from a browser (every browser sends one).
    let pass = match req.headers().get(header::ORIGIN) {
        None => Pass::SameOrigin,
        Some(origin) => match origin_allowed(config, origin.as_bytes(), host.as_deref()) {
            OriginRule::Own => Pass::SameOrigin,
            OriginRule::Listed => Pass::Cors(origin.clone()),
            OriginRule::Refused => {
                return Err(Box::new(refuse(
                    StatusCode::FORBIDDEN,
                    "requests from this Origin are not allowed; add it to --allowed-origins",
                )));
            }
        },
    };
    if req.method() == Method::OPTIONS
        && let Pass::Cors(origin) = &pass
        && req
            .headers()
            .contains_key(header::ACCESS_CONTROL_REQUEST_METHOD)
    {
        return Err(Box::new(preflight(origin.clone())));
    }
    if let Some(refusal) = check_content_type(req) {
        return Err(Box::new(refusal));
    }
    Ok(pass)
}

/// Adds the CORS answer headers for an allowed foreign origin.
pub fn finish(pass: Pass, resp: &mut Response) {
    if let Pass::Cors(origin) = pass {
        let h = resp.headers_mut();
        h.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, origin);
        h.append(header::VARY, HeaderValue::from_static("origin"));
        h.insert(
            header::ACCESS_CONTROL_EXPOSE_HEADERS,
            HeaderValue::from_static(
                "retry-after, location, content-range, www-authenticate, sandbox-agent-last-event-id, \
                 sandbox-agent-next-cursor",
            ),
        );
    }
}

fn preflight(origin: HeaderValue) -> Response {
    let mut resp = StatusCode::NO_CONTENT.into_response();
    let h = resp.headers_mut();
    h.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, origin);
    h.insert(header::VARY, HeaderValue::from_static("origin"));
    h.insert(
        header::ACCESS_CONTROL_ALLOW_METHODS,
        HeaderValue::from_static("GET, HEAD, POST, PUT, PATCH, DELETE"),
    );
    h.insert(
        header::ACCESS_CONTROL_ALLOW_HEADERS,
        HeaderValue::from_static(
            "authorization, content-type, content-encoding, accept, last-event-id, range",
        ),
    );
    h.insert(
        header::ACCESS_CONTROL_MAX_AGE,
        HeaderValue::from_static("600"),
    );
    resp
}

fn refuse(status: StatusCode, detail: &str) -> Response {
    Problem::new(status, detail).into_response()
}

/// The host the client addressed, lower-cased: the HTTP/2 `:authority` (in the URI), else the
/// `Host` header. `None` when the request names none. Borrowed when already lower case (every
/// request of a well-behaved client: no allocation per request).
fn request_host(req: &Request) -> Option<Cow<'_, str>> {
    if let Some(authority) = req.uri().authority() {
        return Some(lower(authority.as_str().as_bytes()));
    }
    req.headers().get(header::HOST).map(|v| lower(v.as_bytes()))
}

/// `bytes` as lower-case text (invalid UTF-8 replaced), borrowed when nothing changes.
fn lower(bytes: &[u8]) -> Cow<'_, str> {
    match std::str::from_utf8(bytes) {
        Ok(s) if !s.bytes().any(|b| b.is_ascii_uppercase()) => Cow::Borrowed(s),
        _ => Cow::Owned(String::from_utf8_lossy(bytes).to_ascii_lowercase()),
    }
}

/// Splits `name[:port]` / `[v6][:port]` into the name (brackets removed) and the port text.
fn split_host(host: &str) -> (&str, Option<&str>) {
    if let Some(rest) = host.strip_prefix('[') {
        return match rest.split_once(']') {
            Some((ip, tail)) => (ip, tail.strip_prefix(':')),
            None => (host, None),
        };
    }
    match host.rsplit_once(':') {
        // More than one colon without brackets is not a valid Host; keep it whole.
        Some((name, port)) if !name.contains(':') => (name, Some(port)),
        _ => (host, None),
    }
}

fn host_allowed(config: &Config, host: &str, local: Option<&LocalAddr>) -> bool {
    let (name, _port) = split_host(host);
    let name = name.trim_end_matches('.');
    if name == "localhost" || name.ends_with(".localhost") {
        // RFC 6761: these names always resolve to loopback in browsers; no page can rebind them.
        return true;
    }
    if let Ok(ip) = name.parse::<IpAddr>()
        && (ip.is_loopback() || ip == config.host || local.is_some_and(|l| l.0.ip() == ip))
    {
        return true;
    }
    config.allowed_hosts.iter().any(|allowed| {
        allowed == "*" || allowed == host || {
            // An entry without a port matches the name on any port.
            !allowed.contains(':') && allowed == name
        }
    })
}

enum OriginRule {
    Own,
    Listed,
    Refused,
}

/// The daemon's own origin is `http(s)://<the request's Host>`: the page was served by us (the
/// inspector at /ui/) or by a proxy in front of us on the same host and port.
fn origin_allowed(config: &Config, origin: &[u8], host: Option<&str>) -> OriginRule {
    let origin = String::from_utf8_lossy(origin).to_ascii_lowercase();
    if let Some(host) = host {
        let own = origin
            .strip_prefix("http://")
            .or_else(|| origin.strip_prefix("https://"))
            .is_some_and(|rest| rest == host);
        if own {
            return OriginRule::Own;
        }
    }
    if config
        .allowed_origins
        .iter()
        .any(|o| o == "*" || *o == origin)
    {
        OriginRule::Listed
    } else {
        OriginRule::Refused
    }
}

/// The media types a page may send cross-site without a preflight (the Fetch standard's
/// CORS-safelisted `Content-Type` values).
fn is_cors_simple(essence: &str) -> bool {
    matches!(
        essence,
        "text/plain" | "application/x-www-form-urlencoded" | "multipart/form-data"
    )
}

/// The type to suggest in a 415: what the route takes (a file's raw bytes, a tar), else JSON.
fn expected_type(req: &Request) -> &'static str {
    match req.uri().path().trim_end_matches('/') {
        "/v1/fs/file" => "application/octet-stream",
        "/v1/fs/upload-batch" => "application/x-tar",
        _ => "application/json",
    }
}

fn check_content_type(req: &Request) -> Option<Response> {
    if !matches!(
        *req.method(),
        Method::POST | Method::PUT | Method::PATCH | Method::DELETE
    ) {
        return None;
    }
    match content_type_essence(req.headers()) {
        Some(essence) if is_cors_simple(&essence) => Some(refuse(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            &format!(
                "Content-Type {essence} is not accepted on {} (a web page could send it \
                 cross-site): send {}",
                req.method(),
                expected_type(req)
            ),
        )),
        Some(_) => None,
        None if has_body(req.body()) => Some(refuse(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            &format!(
                "a request body needs a Content-Type: send {}",
                expected_type(req)
            ),
        )),
        None => None,
    }
}

/// The type/subtype of `Content-Type`, lower case, parameters dropped.
fn content_type_essence(headers: &HeaderMap) -> Option<Cow<'_, str>> {
    let v = headers.get(header::CONTENT_TYPE)?.as_bytes();
    let essence = v.split(|b| *b == b';').next().unwrap_or(b"").trim_ascii();
    Some(lower(essence))
}

/// True unless the request is known to carry no body: HTTP/1 without Content-Length (or with
/// 0) and without Transfer-Encoding, or HTTP/2 with END_STREAM on its headers.
fn has_body(body: &Body) -> bool {
    !body.is_end_stream()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(hosts: &[&str], origins: &[&str]) -> Config {
        let mut c = Config::defaults();
        c.allowed_hosts = hosts.iter().map(|s| s.to_string()).collect();
        c.allowed_origins = origins.iter().map(|s| s.to_string()).collect();
        c
    }

    #[test]
    fn hosts() {
        let c = config(&["box.internal", "api.example:8443"], &[]);
        for ok in [
            "localhost",
            "localhost:2468",
            "LOCALHOST.",
            "app.localhost:1",
            "127.0.0.1:2468",
            "127.9.9.9",
            "[::1]:2468",
            "box.internal:1234",
            "api.example:8443",
        ] {
            assert!(host_allowed(&c, &ok.to_ascii_lowercase(), None), "{ok}");
        }
        for bad in [
            "evil.example",
            "evil.example:2468",
            "localhost.evil.example",
            "api.example:8444",
            "10.0.0.1",
            "[::2]:80",
            "",
        ] {
            assert!(!host_allowed(&c, bad, None), "{bad}");
        }
        let local = LocalAddr("10.0.0.1:2468".parse().unwrap());
        assert!(host_allowed(&c, "10.0.0.1:2468", Some(&local)));
        assert!(host_allowed(&config(&["*"], &[]), "anything", None));
    }

    #[test]
    fn origins() {
        let c = config(&[], &["https://app.example"]);
        let rule = |o: &str, h: Option<&str>| origin_allowed(&c, o.as_bytes(), h);
        assert!(matches!(
            rule("http://localhost:2468", Some("localhost:2468")),
            OriginRule::Own
        ));
        assert!(matches!(
            rule("http://localhost:2469", Some("localhost:2468")),
            OriginRule::Refused
        ));
        assert!(matches!(
            rule("https://app.example", Some("localhost:2468")),
            OriginRule::Listed
        ));
        assert!(matches!(rule("null", Some("x")), OriginRule::Refused));
        assert!(matches!(
            rule("http://evil.example", None),
            OriginRule::Refused
        ));
    }
}
