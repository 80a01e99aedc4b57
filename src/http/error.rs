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
            let server_id = self.extra.get("serverId").and_then(|v| v.as_str());
            tracing::warn!(
                status = self.status.as_u16(),
                detail = %self.detail,
                server_id,
                "request failed"
            );
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

impl From<crate::acp::AcpError> for Problem {
    fn from(e: crate::acp::AcpError) -> Self {
        use crate::acp::AcpError as E;
        let detail = e.to_string();
        match e {
            E::InvalidServerId { server_id } => {
                Problem::bad_request(detail).with("serverId", server_id)
            }
            E::MissingAgent { server_id } => {
                Problem::bad_request(detail).with("serverId", server_id)
            }
            E::UnknownAgent { agent } => Problem::bad_request(detail)
                .title("Unknown Agent")
                .with("agent", agent),
            E::AgentMismatch {
                server_id,
                bound,
                requested,
            } => Problem::new(StatusCode::CONFLICT, detail)
                .title("Agent Mismatch")
                .with("serverId", server_id)
                .with("agent", bound)
                .with("requestedAgent", requested),
            E::NotFound { server_id } => Problem::not_found(detail).with("serverId", server_id),
            E::DuplicateId { server_id, id } => Problem::new(StatusCode::CONFLICT, detail)
                .title("Duplicate Request Id")
                .with("serverId", server_id)
                .with(
                    "id",
                    serde_json::from_str::<Value>(&id).unwrap_or(Value::String(id)),
                ),
            E::AgentGone {
                server_id,
                agent,
                ended,
            } => {
                let exit = ended.exit.clone();
                Problem::new(StatusCode::BAD_GATEWAY, detail)
                    .title("Agent Gone")
                    .with("serverId", server_id)
                    .with("agent", agent)
                    .with("exitCode", exit.as_ref().and_then(|x| x.code))
                    .with("signal", exit.as_ref().and_then(|x| x.signal))
                    .with(
                        "exitReason",
                        exit.as_ref()
                            .map(|x| serde_json::to_value(x.reason).unwrap_or(Value::Null)),
                    )
                    .with("stderrTail", ended.stderr_tail.as_str())
            }
            E::Timeout { server_id, timeout } => {
                crate::metrics::refused(crate::metrics::Limit::RequestTimeout);
                Problem::new(StatusCode::GATEWAY_TIMEOUT, detail)
                    .title("Agent Timeout")
                    .with("serverId", server_id)
                    .with("timeoutMs", timeout.as_millis() as u64)
            }
            // The agents service's own mapping (409 with `installCommand` for
            // --require-preinstall, 502 for a failed install), plus the serverId.
            E::Launch {
                server_id, source, ..
            } => agent_problem(&source).with("serverId", server_id),
            E::Spawn {
                server_id, agent, ..
            } => Problem::new(StatusCode::BAD_GATEWAY, detail)
                .title("Agent Start Failed")
                .with("serverId", server_id)
                .with("agent", agent),
            E::Gone { server_id } => Problem::new(StatusCode::GONE, detail)
                .title("Agent Exited")
                .with("serverId", server_id),
            E::ShuttingDown => Problem::new(StatusCode::SERVICE_UNAVAILABLE, detail),
            E::SessionNotRestored {
                server_id,
                session_id,
                missing_capability,
                ..
            } => Problem::new(StatusCode::CONFLICT, detail)
                .title("Session Not Restored")
                .with("serverId", server_id)
                .with("sessionId", session_id)
                .with("missingCapability", missing_capability),
            E::Envelope(_) => Problem::bad_request(detail).title("Invalid JSON-RPC Envelope"),
            // harden-runtime: Last-Event-ID beyond the log, and the global caps (503 + Retry-After).
            E::EventIdAhead {
                server_id,
                last_event_id,
                last_id,
            } => Problem::bad_request(detail)
                .title("Unknown Last-Event-ID")
                .with("serverId", server_id)
                .with("lastEventId", last_event_id)
                .with("currentLastEventId", last_id),
            E::Importing { server_id } => Problem::new(StatusCode::CONFLICT, detail)
                .title("ServerId Being Imported")
                .with("serverId", server_id),
            E::Capacity {
                what,
                limit,
                server_id,
            } => {
                count_capacity(what);
                Problem::new(StatusCode::SERVICE_UNAVAILABLE, detail)
                    .title("Capacity Reached")
                    .with("limit", limit)
                    .with("capacity", what)
                    .with("serverId", server_id)
                    .header(header::RETRY_AFTER, "1")
            }
        }
    }
}

/// Counts a capacity refusal under its limit (`sandbox_agent_refusals_total`). The stdin queues
/// count where they refuse (`acp::instance`), since WebSocket batches refuse there too.
fn count_capacity(what: &str) {
    use crate::metrics::{Limit, refused};
    match what {
        "agent instances" => refused(Limit::MaxAgents),
        "SSE subscribers of all serverIds" => refused(Limit::MaxSubscribersTotal),
        "SSE subscribers of this serverId" => refused(Limit::MaxSubscribers),
        "ACP request body bytes being received" => refused(Limit::AcpInflightBytes),
        _ => {}
    }
}

impl From<crate::acp::bundle::BundleError> for Problem {
    fn from(e: crate::acp::bundle::BundleError) -> Self {
        use crate::acp::bundle::BundleError;
        let detail = e.to_string();
        match e {
            BundleError::NotFound { server_id } => {
                Problem::not_found(detail).with("serverId", server_id)
            }
            BundleError::NoStateDir | BundleError::NoHome { .. } => {
                Problem::new(StatusCode::CONFLICT, detail)
            }
            BundleError::Busy { server_id, pending } => Problem::new(StatusCode::CONFLICT, detail)
                .title("Turn In Progress")
                .with("serverId", server_id)
                .with("pendingRequests", pending),
            BundleError::Exists { server_id } => Problem::new(StatusCode::CONFLICT, detail)
                .title("ServerId Exists")
                .with("serverId", server_id),
            BundleError::UnknownAgent { agent } => Problem::new(StatusCode::CONFLICT, detail)
                .title("Unknown Agent")
                .with("agent", agent),
            BundleError::TargetExists { path } => {
                Problem::new(StatusCode::CONFLICT, detail).with("path", path)
            }
            BundleError::Invalid { .. } => Problem::bad_request(detail).title("Invalid Bundle"),
            BundleError::BadMapping { .. } => Problem::bad_request(detail),
            BundleError::TooLarge { limit } => Problem::payload_too_large(limit),
            BundleError::Io { .. } => {
                tracing::warn!(error = %detail, "a session bundle failed");
                Problem::new(StatusCode::INTERNAL_SERVER_ERROR, detail)
            }
        }
    }
}

impl From<crate::acp::ConnectionError> for Problem {
    fn from(e: crate::acp::ConnectionError) -> Self {
        use crate::acp::ConnectionError as E;
        let detail = e.to_string();
        match e {
            E::UnknownAgent { agent } => Problem::not_found(detail)
                .title("Unknown Agent")
                .with("agent", agent),
            E::MissingConnectionId | E::NotInitialize | E::InvalidSessionId => {
                Problem::bad_request(detail)
            }
            E::UnknownConnection { connection_id } => {
                Problem::not_found(detail).with("connectionId", connection_id)
            }
            E::AgentMismatch {
                connection_id,
                bound,
                requested,
            } => Problem::new(StatusCode::CONFLICT, detail)
                .title("Agent Mismatch")
                .with("connectionId", connection_id)
                .with("agent", bound)
                .with("requestedAgent", requested),
            E::StreamBusy { connection_id, .. } => Problem::new(StatusCode::CONFLICT, detail)
                .title("Stream Busy")
                .with("connectionId", connection_id),
            E::TooManySessions {
                connection_id,
                limit,
            } => {
                crate::metrics::refused(crate::metrics::Limit::RfdSessions);
                Problem::new(StatusCode::TOO_MANY_REQUESTS, detail)
                    .with("connectionId", connection_id)
                    .with("limit", limit)
            }
            E::Acp(e) => Problem::from(e),
        }
    }
}

impl From<crate::agents::AgentError> for Problem {
    fn from(e: crate::agents::AgentError) -> Self {
        agent_problem(&e)
    }
}

/// Agent errors: unknown → 400; not installed under `--require-preinstall` → 409 naming the
/// install command (the request is valid but conflicts with the operator's policy); a failed
/// install → 502 with the reason; an unusable pin → 400.
fn agent_problem(e: &crate::agents::AgentError) -> Problem {
    use crate::agents::AgentError;
    let detail = e.to_string();
    match e {
        AgentError::Unknown { agent } => Problem::bad_request(detail)
            .title("Unknown Agent")
            .with("agent", agent.as_str()),
        AgentError::PreinstallRequired { agent, command } => {
            Problem::new(StatusCode::CONFLICT, detail)
                .title("Agent Not Installed")
                .with("agent", agent.as_str())
                .with("installCommand", command.as_str())
        }
        AgentError::InstallFailed { agent, .. } => Problem::new(StatusCode::BAD_GATEWAY, detail)
            .title("Agent Install Failed")
            .with("agent", agent.as_str()),
        AgentError::InvalidRequest { agent, .. } => {
            Problem::bad_request(detail).with("agent", agent.as_str())
        }
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
            E::TooLarge { limit } => {
                crate::metrics::refused(crate::metrics::Limit::UploadLimit);
                Problem::payload_too_large(limit)
            }
            E::TooManyEntries { limit } => {
                crate::metrics::refused(crate::metrics::Limit::UploadMaxEntries);
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
            // harden-files: transfer limits and content types.
            E::Stalled { .. } => {
                crate::metrics::refused(crate::metrics::Limit::TransferTimeout);
                Problem::new(StatusCode::REQUEST_TIMEOUT, detail)
                    .header(header::CONNECTION, "close")
            }
            E::TooSlow { min_rate } => {
                crate::metrics::refused(crate::metrics::Limit::BodyMinRate);
                Problem::new(StatusCode::REQUEST_TIMEOUT, detail)
                    .with("minRate", min_rate)
                    .header(header::CONNECTION, "close")
            }
            E::UnsupportedMediaType { .. } => {
                Problem::new(StatusCode::UNSUPPORTED_MEDIA_TYPE, detail)
            }
        }
    }
}

impl From<crate::files::watch::WatchError> for Problem {
    fn from(e: crate::files::watch::WatchError) -> Self {
        use crate::files::watch::WatchError;
        let detail = e.to_string();
        match e {
            WatchError::File(f) => Problem::from(f),
            WatchError::Busy { limit } => {
                crate::metrics::refused(crate::metrics::Limit::MaxWatches);
                Problem::new(StatusCode::SERVICE_UNAVAILABLE, detail)
                    .with("limit", limit)
                    .header(header::RETRY_AFTER, "1")
            }
            WatchError::Limit { setting, limit, .. } => {
                crate::metrics::refused(crate::metrics::Limit::WatchMaxDirs);
                Problem::new(StatusCode::SERVICE_UNAVAILABLE, detail)
                    .title("Watch Limit Reached")
                    .with("setting", setting)
                    .with("limit", limit)
            }
            WatchError::Internal(_) => Problem::new(StatusCode::INTERNAL_SERVER_ERROR, detail),
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
            // The stored file is the client's (or an agent's) data, not a fault of the daemon:
            // the state of the resource refuses the request until the file is fixed or removed.
            E::Corrupt { .. } => Problem::new(StatusCode::CONFLICT, detail),
            E::TooLarge { limit, .. } => {
                crate::metrics::refused(crate::metrics::Limit::ConfigEntryBytes);
                Problem::new(StatusCode::PAYLOAD_TOO_LARGE, detail).with("limit", limit)
            }
            E::File(f) => Problem::from(f),
        }
    }
}

/// A JSON body axum could not take: an invalid body is 400 (axum's own answer would be 422,
/// which the contract does not use), a missing JSON content type 415, a body over the limit 413.
impl From<axum::extract::rejection::JsonRejection> for Problem {
    fn from(e: axum::extract::rejection::JsonRejection) -> Self {
        use axum::extract::rejection::JsonRejection as R;
        match e {
            R::MissingJsonContentType(_) => Problem::new(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "send the body with Content-Type: application/json",
            ),
            R::JsonDataError(_) | R::JsonSyntaxError(_) => {
                Problem::bad_request(format!("invalid request body: {}", e.body_text()))
            }
            other => Problem::new(other.status(), other.body_text()),
        }
    }
}

impl From<crate::processes::ProcessError> for Problem {
    fn from(e: crate::processes::ProcessError) -> Self {
        use crate::processes::ProcessError as E;
        let detail = e.to_string();
        let bad_command = e.is_bad_command();
        match e {
            E::Invalid(_) => Problem::bad_request(detail),
            E::NotFound { id } => Problem::not_found(detail).with("processId", id),
            E::Conflict { id, .. } => {
                Problem::new(StatusCode::CONFLICT, detail).with("processId", id)
            }
            E::TooManyProcesses { limit } => {
                crate::metrics::refused(crate::metrics::Limit::ProcessMaxConcurrent);
                Problem::new(StatusCode::TOO_MANY_REQUESTS, detail)
                    .with("limit", limit)
                    .header(header::RETRY_AFTER, "1")
            }
            E::TooManyReaders { id, limit } => {
                crate::metrics::refused(crate::metrics::Limit::ProcessReaders);
                Problem::new(StatusCode::TOO_MANY_REQUESTS, detail)
                    .with("processId", id)
                    .with("limit", limit)
                    .header(header::RETRY_AFTER, "1")
            }
            E::LogBudget { total } => {
                crate::metrics::refused(crate::metrics::Limit::ProcessMaxTotalLogBytes);
                Problem::new(StatusCode::SERVICE_UNAVAILABLE, detail)
                    .title("Log Budget Exhausted")
                    .with("limit", total)
                    .header(header::RETRY_AFTER, "5")
            }
            E::InputTooLarge { limit } => {
                crate::metrics::refused(crate::metrics::Limit::ProcessMaxInputBytes);
                Problem::new(StatusCode::PAYLOAD_TOO_LARGE, detail).with("limit", limit)
            }
            E::InputTimeout { id } => {
                Problem::new(StatusCode::GATEWAY_TIMEOUT, detail).with("processId", id)
            }
            E::Spawn { command, .. } if bad_command => Problem::bad_request(detail)
                .title("Process Start Failed")
                .with("command", command),
            E::Spawn { command, .. } => Problem::new(StatusCode::BAD_GATEWAY, detail)
                .title("Process Start Failed")
                .with("command", command),
            E::Io(_) => Problem::new(StatusCode::INTERNAL_SERVER_ERROR, detail),
            E::ShuttingDown => Problem::new(StatusCode::SERVICE_UNAVAILABLE, detail),
            E::CutByReload { command } => Problem::new(StatusCode::SERVICE_UNAVAILABLE, detail)
                .title("Cut By Reload")
                .with("command", command),
        }
    }
}
