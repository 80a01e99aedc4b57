//! The one place where errors become HTTP answers: every 4xx/5xx the daemon produces is an
//! RFC 9457 `application/problem+json` body `{type,title,status,detail,…}`. Services return their
//! own error enums; the `From` impls that map them to a `Problem` live here and nowhere else.

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Map, Value, json};

pub const PROBLEM_JSON: &str = "application/problem+json";

/// An RFC 9457 problem. `extra` carries members such as `serverId`, `exitCode`, `limit`.
#[derive(Debug, Clone)]
pub struct Problem {
    pub status: StatusCode,
    pub title: String,
    pub detail: String,
    pub extra: Map<String, Value>,
    /// Extra response headers (e.g. `WWW-Authenticate`).
    pub headers: Vec<(header::HeaderName, HeaderValue)>,
}

impl Problem {
    pub fn new(status: StatusCode, detail: impl Into<String>) -> Self {
        Problem {
            status,
            title: status.canonical_reason().unwrap_or("Error").to_string(),
            detail: detail.into(),
            extra: Map::new(),
            headers: Vec::new(),
        }
    }

    pub fn bad_request(detail: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, detail)
    }

    pub fn not_found(detail: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, detail)
    }

    pub fn title(mut self, title: impl Into<String>) -> Self {
        self.title = title.into();
        self
    }

    /// Adds a member to the body; `null` values are left out.
    pub fn with(mut self, key: &str, value: impl Into<Value>) -> Self {
        let value = value.into();
        if !value.is_null() {
            self.extra.insert(key.to_string(), value);
        }
        self
    }

    pub fn header(mut self, name: header::HeaderName, value: &'static str) -> Self {
        self.headers.push((name, HeaderValue::from_static(value)));
        self
    }

    /// A too-large body; `limit` is in bytes.
    pub fn payload_too_large(limit: u64) -> Self {
        Self::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("the request body is larger than the limit of {limit} bytes"),
        )
        .with("limit", limit)
    }

    /// The body as a JSON object (also used as JSON-RPC error `data`).
    pub fn body(&self) -> Value {
        let type_uri = format!(
            "urn:sandbox-agent:problem:{}",
            self.title.to_ascii_lowercase().replace([' ', '\''], "-")
        );
        let mut body = json!({
            "type": type_uri,
            "title": self.title,
            "status": self.status.as_u16(),
            "detail": self.detail,
        });
        if let Value::Object(map) = &mut body {
            for (k, v) in &self.extra {
                map.insert(k.clone(), v.clone());
            }
        }
        body
    }
}

impl IntoResponse for Problem {
    fn into_response(self) -> Response {
        if self.status.is_server_error() {
            tracing::warn!(status = self.status.as_u16(), detail = %self.detail, "request failed");
        }
        let body = serde_json::to_vec(&self.body()).unwrap_or_default();
        let mut resp = (self.status, body).into_response();
        resp.headers_mut()
            .insert(header::CONTENT_TYPE, HeaderValue::from_static(PROBLEM_JSON));
        for (name, value) in self.headers {
            resp.headers_mut().insert(name, value);
        }
        resp
    }
}

impl From<crate::files::FileError> for Problem {
    fn from(e: crate::files::FileError) -> Self {
        use crate::files::FileError as E;
        let detail = e.to_string();
        match e {
            E::NotFound { .. } => Problem::not_found(detail),
            E::OutsideRoot { .. } | E::PermissionDenied { .. } => {
                Problem::new(StatusCode::FORBIDDEN, detail)
            }
            E::WrongKind { .. } | E::Invalid { .. } | E::UnsafeEntry { .. } | E::BadArchive(_) => {
                Problem::bad_request(detail)
            }
            E::Body(_) => Problem::bad_request(detail),
            E::AlreadyExists { .. } | E::NotEmpty { .. } | E::EntryConflict { .. } => {
                Problem::new(StatusCode::CONFLICT, detail)
            }
            E::TooLarge { limit } => Problem::payload_too_large(limit),
            E::TooManyEntries { limit } => {
                Problem::new(StatusCode::PAYLOAD_TOO_LARGE, detail).with("limit", limit)
            }
            E::NoSpace { .. } => Problem::new(StatusCode::INSUFFICIENT_STORAGE, detail),
            E::RangeNotSatisfiable { size } => {
                let mut p = Problem::new(StatusCode::RANGE_NOT_SATISFIABLE, detail);
                if let Ok(v) = HeaderValue::from_str(&format!("bytes */{size}")) {
                    p.headers.push((header::CONTENT_RANGE, v));
                }
                p
            }
            E::Io { .. } => Problem::new(StatusCode::INTERNAL_SERVER_ERROR, detail),
        }
    }
}

impl From<crate::config_store::ConfigError> for Problem {
    fn from(e: crate::config_store::ConfigError) -> Self {
        use crate::config_store::ConfigError as E;
        let detail = e.to_string();
        match e {
            E::MissingParam(_) | E::InvalidEntry { .. } | E::NotADirectory { .. } => {
                Problem::bad_request(detail)
            }
            E::NotFound { .. } => Problem::not_found(detail),
            E::Corrupt { .. } => Problem::new(StatusCode::INTERNAL_SERVER_ERROR, detail),
            E::File(f) => Problem::from(f),
        }
    }
}
