//! Bearer-token authentication for every `/v1/*` path. The comparison takes the same time
//! whatever the guess, and the token is never logged.

use axum::extract::Request;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};

use super::{AppState, Problem};

/// `None` when the request may go on, else the 401 answer. A plain function called by the one
/// edge middleware (`super::edge`), not a layer of its own: each `from_fn_with_state` layer
/// clones the state and its inner service on every request.
pub fn check_token(state: &AppState, req: &Request) -> Option<Response> {
    let expected = state.config.token.as_deref()?;
    // Every /v1 path needs the token, routed or not, so that nothing about the surface is
    // visible without it; `/` stays open for probes.
    let path = req.uri().path();
    if path != "/v1" && !path.starts_with("/v1/") {
        return None;
    }
    let given = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(bearer_credentials);
    match given {
        Some(given) if constant_time_eq(given.as_bytes(), expected.as_bytes()) => None,
        Some(_) => Some(unauthorized("the bearer token is not valid")),
        None => Some(unauthorized(
            "this route needs `Authorization: Bearer <token>`",
        )),
    }
}

/// The credentials of an `Authorization: Bearer <token>` header. The scheme is matched without
/// regard to case (RFC 9110 §11.1); the token is taken as is, minus surrounding blanks.
fn bearer_credentials(value: &str) -> Option<&str> {
    let (scheme, rest) = value.trim_start().split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then(|| rest.trim())
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
    use super::{bearer_credentials, constant_time_eq};

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
}
