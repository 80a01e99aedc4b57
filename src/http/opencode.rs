//! `/opencode/*`: OpenCode's server API (docs/opencode.md), translated onto `crate::opencode`.
//! Bodies are OpenCode's shapes, free-form JSON in the document. Errors are OpenCode's own
//! shapes (`{name, data: {message}}` for 404, `{data, errors: [{message}], success: false}` for
//! 400), marked so that the edge's problem+json safety net leaves them as they are; the edge's
//! own answers (401, 413, 415, …) stay problem+json.

use std::convert::Infallible;

use axum::Json;
use axum::body::{Body, Bytes};
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use futures_util::StreamExt;
use serde::Deserialize;
use serde_json::{Value, json};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::AppState;
use crate::opencode::{AskKind, OcError};

/// Marks a response whose error body is OpenCode's own shape (see `super::problem_safety_net`).
#[derive(Clone, Copy)]
pub struct NativeError;

pub fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(event))
        .routes(routes!(global_event))
        .routes(routes!(session_list, session_create))
        .routes(routes!(session_status))
        .routes(routes!(session_get, session_update, session_delete))
        .routes(routes!(session_init))
        .routes(routes!(session_abort))
        .routes(routes!(message_list, message_send))
        .routes(routes!(prompt_async))
        .routes(routes!(message_get))
        .routes(routes!(session_permission))
        .routes(routes!(session_children))
        .routes(routes!(session_todo))
        .routes(routes!(permission_list))
        .routes(routes!(permission_reply))
        .routes(routes!(question_list))
        .routes(routes!(question_reply))
        .routes(routes!(question_reject))
        .routes(routes!(provider_list))
        .routes(routes!(config_providers))
        .routes(routes!(config_get))
        .routes(routes!(agent_list))
        .routes(routes!(path_get))
        .routes(routes!(project_current))
        .routes(routes!(project_list))
        .routes(routes!(empty_list))
        .routes(routes!(global_health))
}

fn error(e: OcError) -> Response {
    let (status, body) = match &e {
        OcError::NotFound(m) => (
            StatusCode::NOT_FOUND,
            json!({"name": "NotFoundError", "data": {"message": m}}),
        ),
        OcError::BadRequest(m) => (
            StatusCode::BAD_REQUEST,
            json!({"data": {"message": m}, "errors": [{"message": m}], "success": false}),
        ),
        OcError::Busy(m) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            json!({"name": "UnknownError", "data": {"message": m}}),
        ),
        OcError::Capacity(m) => (
            StatusCode::TOO_MANY_REQUESTS,
            json!({"name": "UnknownError", "data": {"message": m}}),
        ),
    };
    let mut resp = (status, Json(body)).into_response();
    resp.extensions_mut().insert(NativeError);
    resp
}

/// A request body as JSON: empty is `{}`; anything else must be a JSON object.
fn body_json(body: &Bytes) -> Result<Value, Box<Response>> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(json!({}));
    }
    match serde_json::from_slice::<Value>(body) {
        Ok(v @ Value::Object(_)) => Ok(v),
        Ok(_) => Err(Box::new(error(OcError::BadRequest(
            "the body must be a JSON object".into(),
        )))),
        Err(e) => Err(Box::new(error(OcError::BadRequest(format!(
            "the body is not JSON: {e}"
        ))))),
    }
}

fn ok<T: serde::Serialize>(v: T) -> Response {
    Json(v).into_response()
}

/// The query every OpenCode route may carry (the project directory; one project is served).
#[derive(Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub struct DirQuery {
    /// Ignored: the daemon serves one project, its working directory.
    #[allow(dead_code)]
    directory: Option<String>,
    /// The most messages to answer (the newest).
    limit: Option<usize>,
}

/// The event bus as SSE: `server.connected`, then every event; `global` wraps each in
/// `{directory, payload}`. A stream that falls behind skips what it missed. Each event handed
/// to the connection is marked delivered (`OpenCode::wait_delivered`).
fn event_stream(state: &AppState, global: bool) -> Response {
    let oc = state.opencode.clone();
    let stream = match oc.subscribe() {
        Ok(x) => x,
        Err(e) => return error(e),
    };
    let crate::opencode::Stream {
        permit,
        mut rx,
        delivered,
    } = stream;
    let dir = oc.directory().to_string();
    let wrap = move |ev: &str| -> Bytes {
        let data = if global {
            format!(
                r#"{{"directory":{},"payload":{ev}}}"#,
                Value::String(dir.clone())
            )
        } else {
            ev.to_string()
        };
        Bytes::from(format!("data: {data}\n\n"))
    };
    let first = wrap(&json!({"type": "server.connected", "properties": {}}).to_string());
    let shutdown = state.shutdown.clone();
    let (tx, items) = tokio::sync::mpsc::channel::<(u64, Bytes)>(16);
    tokio::spawn(async move {
        let _permit = permit;
        let mut heartbeat = tokio::time::interval(std::time::Duration::from_secs(10));
        heartbeat.tick().await;
        loop {
            let item = tokio::select! {
                _ = shutdown.cancelled() => break,
                _ = heartbeat.tick() => (0, wrap(&json!({"type": "server.heartbeat", "properties": {}}).to_string())),
                r = rx.recv() => match r {
                    Ok(ev) => (ev.seq, wrap(&ev.json)),
                    Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => continue,
                    Err(tokio::sync::broadcast::error::RecvError::Closed) => break,
                },
            };
            if tx.send(item).await.is_err() {
                break;
            }
        }
    });
    let body = futures_util::stream::once(async move { (0, first) })
        .chain(tokio_stream::wrappers::ReceiverStream::new(items))
        .map(move |(seq, bytes)| {
            if seq > 0 {
                oc.mark_delivered(&delivered, seq);
            }
            Ok::<_, Infallible>(bytes)
        });
    super::sse_response(Body::from_stream(body))
}

/// OpenCode's event stream (`server.connected`, then every event as `data: {type, properties}`).
#[utoipa::path(get, path = "/opencode/event", operation_id = "opencodeEvent", tag = "opencode",
    params(DirQuery),
    responses((status = 200, description = "The events, as SSE", content_type = "text/event-stream", body = String),
        (status = 429, description = "Too many event streams", body = Object, content_type = "application/json")))]
async fn event(State(state): State<AppState>) -> Response {
    event_stream(&state, false)
}

/// The same events, each wrapped as `{directory, payload}`.
#[utoipa::path(get, path = "/opencode/global/event", operation_id = "opencodeGlobalEvent", tag = "opencode",
    responses((status = 200, description = "The events, as SSE", content_type = "text/event-stream", body = String),
        (status = 429, description = "Too many event streams", body = Object, content_type = "application/json")))]
async fn global_event(State(state): State<AppState>) -> Response {
    event_stream(&state, true)
}

/// Every session, newest first.
#[utoipa::path(get, path = "/opencode/session", operation_id = "opencodeSessionList", tag = "opencode",
    params(DirQuery), responses((status = 200, description = "Sessions", body = Vec<Object>)))]
async fn session_list(State(state): State<AppState>) -> Response {
    ok(state.opencode.list_sessions())
}

/// Creates a session (`title`, `model`, `permission` rules, `permissionMode`).
#[utoipa::path(post, path = "/opencode/session", operation_id = "opencodeSessionCreate", tag = "opencode",
    params(DirQuery), request_body(content = Object, content_type = "application/json"),
    responses((status = 200, description = "The session", body = Object),
        (status = 400, description = "Bad body", body = Object, content_type = "application/json"),
        (status = 429, description = "Too many sessions", body = Object, content_type = "application/json")))]
async fn session_create(State(state): State<AppState>, body: Bytes) -> Response {
    match body_json(&body) {
        Ok(b) => state
            .opencode
            .create_session(&b, None)
            .map_or_else(error, ok),
        Err(r) => *r,
    }
}

/// Each session's status (`idle` or `busy`).
#[utoipa::path(get, path = "/opencode/session/status", operation_id = "opencodeSessionStatus", tag = "opencode",
    params(DirQuery), responses((status = 200, description = "Status per session id", body = Object)))]
async fn session_status(State(state): State<AppState>) -> Response {
    ok(state.opencode.status())
}

/// One session.
#[utoipa::path(get, path = "/opencode/session/{id}", operation_id = "opencodeSessionGet", tag = "opencode",
    params(("id" = String, Path, description = "Session id"), DirQuery),
    responses((status = 200, description = "The session", body = Object),
        (status = 404, description = "No such session", body = Object, content_type = "application/json")))]
async fn session_get(State(state): State<AppState>, Path(id): Path<String>) -> Response {
    state.opencode.get_session(&id).map_or_else(error, ok)
}

/// Changes a session's title (a model change is refused).
#[utoipa::path(patch, path = "/opencode/session/{id}", operation_id = "opencodeSessionUpdate", tag = "opencode",
    params(("id" = String, Path, description = "Session id"), DirQuery),
    request_body(content = Object, content_type = "application/json"),
    responses((status = 200, description = "The session", body = Object),
        (status = 400, description = "Bad body, or a model change", body = Object, content_type = "application/json"),
        (status = 404, description = "No such session", body = Object, content_type = "application/json")))]
async fn session_update(
    State(state): State<AppState>,
    Path(id): Path<String>,
    body: Bytes,
) -> Response {
    match body_json(&body) {
        Ok(b) => state
            .opencode
            .update_session(&id, &b)
            .map_or_else(error, ok),
        Err(r) => *r,
    }
}

/// Deletes a session and its agent instance.
#[utoipa::path(delete, path = "/opencode/session/{id}", operation_id = "opencodeSessionDelete", tag = "opencode",
    params(("id" = String, Path, description = "Session id"), DirQuery),
    responses((status = 200, description = "Deleted", body = bool, content_type = "application/json"),
        (status = 404, description = "No such session", body = Object, content_type = "application/json")))]
async fn session_delete(State(state): State<AppState>, Path(id): Path<String>) -> Response {
    state
        .opencode
        .delete_session(&id)
        .map_or_else(error, |()| ok(true))
}

/// Chooses the session's provider and model (creating a session of that id if none exists).
#[utoipa::path(post, path = "/opencode/session/{id}/init", operation_id = "opencodeSessionInit", tag = "opencode",
    params(("id" = String, Path, description = "Session id"), DirQuery),
    request_body(content = Object, content_type = "application/json"),
    responses((status = 200, description = "Done", body = bool, content_type = "application/json"),
        (status = 400, description = "Bad body, or a model change after the first prompt", body = Object, content_type = "application/json"),
        (status = 404, description = "No such session", body = Object, content_type = "application/json"),
        (status = 429, description = "Too many sessions", body = Object, content_type = "application/json")))]
async fn session_init(
    State(state): State<AppState>,
    Path(id): Path<String>,
    body: Bytes,
) -> Response {
    match body_json(&body) {
        Ok(b) => state
            .opencode
            .init_session(&id, &b)
            .map_or_else(error, |()| ok(true)),
        Err(r) => *r,
    }
}

/// Cancels the running turn (true also when none runs).
#[utoipa::path(post, path = "/opencode/session/{id}/abort", operation_id = "opencodeSessionAbort", tag = "opencode",
    params(("id" = String, Path, description = "Session id"), DirQuery),
    responses((status = 200, description = "Done", body = bool, content_type = "application/json"),
        (status = 404, description = "No such session", body = Object, content_type = "application/json")))]
async fn session_abort(State(state): State<AppState>, Path(id): Path<String>) -> Response {
    state.opencode.abort(&id).await.map_or_else(error, ok)
}

/// The session's messages, oldest first, each `{info, parts}`.
#[utoipa::path(get, path = "/opencode/session/{id}/message", operation_id = "opencodeMessageList", tag = "opencode",
    params(("id" = String, Path, description = "Session id"), DirQuery),
    responses((status = 200, description = "Messages", body = Vec<Object>),
        (status = 400, description = "A query parameter that is not of its type (`limit`)"),
        (status = 404, description = "No such session", body = Object, content_type = "application/json")))]
async fn message_list(
    State(state): State<AppState>,
    Path(id): Path<String>,
    Query(q): Query<DirQuery>,
) -> Response {
    state.opencode.messages(&id, q.limit).map_or_else(error, ok)
}

/// Sends a prompt and answers the assistant message once the turn ends.
#[utoipa::path(post, path = "/opencode/session/{id}/message", operation_id = "opencodeMessageSend", tag = "opencode",
    params(("id" = String, Path, description = "Session id"), DirQuery),
    request_body(content = Object, content_type = "application/json"),
    responses((status = 200, description = "The assistant message", body = Object),
        (status = 400, description = "Bad body, or a model change after the first prompt", body = Object, content_type = "application/json"),
        (status = 404, description = "No such session", body = Object, content_type = "application/json"),
        (status = 500, description = "The turn ended abnormally", body = Object, content_type = "application/json")))]
async fn message_send(
    State(state): State<AppState>,
    Path(id): Path<String>,
    body: Bytes,
) -> Response {
    match body_json(&body) {
        Ok(b) => state
            .opencode
            .prompt(&id, &b, true)
            .await
            .map_or_else(error, ok),
        Err(r) => *r,
    }
}

/// Sends a prompt and answers at once (204); the turn goes on, its events on `/event`.
#[utoipa::path(post, path = "/opencode/session/{id}/prompt_async", operation_id = "opencodePromptAsync", tag = "opencode",
    params(("id" = String, Path, description = "Session id"), DirQuery),
    request_body(content = Object, content_type = "application/json"),
    responses((status = 204, description = "Started"),
        (status = 400, description = "Bad body, or a model change after the first prompt", body = Object, content_type = "application/json"),
        (status = 404, description = "No such session", body = Object, content_type = "application/json")))]
async fn prompt_async(
    State(state): State<AppState>,
    Path(id): Path<String>,
    body: Bytes,
) -> Response {
    match body_json(&body) {
        Ok(b) => match state.opencode.prompt(&id, &b, false).await {
            Ok(_) => StatusCode::NO_CONTENT.into_response(),
            Err(e) => error(e),
        },
        Err(r) => *r,
    }
}

/// One message with its parts.
#[utoipa::path(get, path = "/opencode/session/{id}/message/{messageID}", operation_id = "opencodeMessageGet", tag = "opencode",
    params(("id" = String, Path, description = "Session id"), ("messageID" = String, Path, description = "Message id"), DirQuery),
    responses((status = 200, description = "The message", body = Object),
        (status = 404, description = "No such session or message", body = Object, content_type = "application/json")))]
async fn message_get(
    State(state): State<AppState>,
    Path((id, message)): Path<(String, String)>,
) -> Response {
    state.opencode.message(&id, &message).map_or_else(error, ok)
}

#[derive(Deserialize)]
struct ReplyBody {
    #[serde(alias = "reply")]
    response: Option<String>,
}

/// Answers a permission request (the older route: `response` once, always, reject).
#[utoipa::path(post, path = "/opencode/session/{id}/permissions/{permissionID}", operation_id = "opencodeSessionPermission", tag = "opencode",
    params(("id" = String, Path, description = "Session id"), ("permissionID" = String, Path, description = "Request id"), DirQuery),
    request_body(content = Object, content_type = "application/json"),
    responses((status = 200, description = "Answered", body = bool, content_type = "application/json"),
        (status = 400, description = "Bad body", body = Object, content_type = "application/json"),
        (status = 404, description = "No such session or request", body = Object, content_type = "application/json")))]
async fn session_permission(
    State(state): State<AppState>,
    Path((id, permission)): Path<(String, String)>,
    body: Bytes,
) -> Response {
    let reply = match body_json(&body).map(serde_json::from_value::<ReplyBody>) {
        Ok(Ok(ReplyBody { response: Some(r) })) => r,
        Ok(_) => {
            return error(OcError::BadRequest(
                "`response` must be once, always or reject".into(),
            ));
        }
        Err(r) => return *r,
    };
    state
        .opencode
        .reply_permission(&permission, &reply, Some(&id))
        .await
        .map_or_else(error, |()| ok(true))
}

/// A session's child sessions (none: sub-agents are the agent's own business).
#[utoipa::path(get, path = "/opencode/session/{id}/children", operation_id = "opencodeSessionChildren", tag = "opencode",
    params(("id" = String, Path, description = "Session id"), DirQuery),
    responses((status = 200, description = "Sessions", body = Vec<Object>),
        (status = 404, description = "No such session", body = Object, content_type = "application/json")))]
async fn session_children(State(state): State<AppState>, Path(id): Path<String>) -> Response {
    state
        .opencode
        .get_session(&id)
        .map_or_else(error, |_| ok(json!([])))
}

/// A session's to-do list (empty: ACP plans are not mapped).
#[utoipa::path(get, path = "/opencode/session/{id}/todo", operation_id = "opencodeSessionTodo", tag = "opencode",
    params(("id" = String, Path, description = "Session id"), DirQuery),
    responses((status = 200, description = "To-dos", body = Vec<Object>),
        (status = 404, description = "No such session", body = Object, content_type = "application/json")))]
async fn session_todo(State(state): State<AppState>, Path(id): Path<String>) -> Response {
    state
        .opencode
        .get_session(&id)
        .map_or_else(error, |_| ok(json!([])))
}

/// Permission requests waiting for an answer.
#[utoipa::path(get, path = "/opencode/permission", operation_id = "opencodePermissionList", tag = "opencode",
    params(DirQuery), responses((status = 200, description = "Requests", body = Vec<Object>)))]
async fn permission_list(State(state): State<AppState>) -> Response {
    ok(state.opencode.list_pending(AskKind::Permission))
}

/// Answers a permission request (`reply`: once, always, reject).
#[utoipa::path(post, path = "/opencode/permission/{requestID}/reply", operation_id = "opencodePermissionReply", tag = "opencode",
    params(("requestID" = String, Path, description = "Request id"), DirQuery),
    request_body(content = Object, content_type = "application/json"),
    responses((status = 200, description = "Answered", body = bool, content_type = "application/json"),
        (status = 400, description = "Bad body", body = Object, content_type = "application/json"),
        (status = 404, description = "No such request", body = Object, content_type = "application/json")))]
async fn permission_reply(
    State(state): State<AppState>,
    Path(request): Path<String>,
    body: Bytes,
) -> Response {
    let reply = match body_json(&body).map(serde_json::from_value::<ReplyBody>) {
        Ok(Ok(ReplyBody { response: Some(r) })) => r,
        Ok(_) => {
            return error(OcError::BadRequest(
                "`reply` must be once, always or reject".into(),
            ));
        }
        Err(r) => return *r,
    };
    state
        .opencode
        .reply_permission(&request, &reply, None)
        .await
        .map_or_else(error, |()| ok(true))
}

/// Questions waiting for an answer.
#[utoipa::path(get, path = "/opencode/question", operation_id = "opencodeQuestionList", tag = "opencode",
    params(DirQuery), responses((status = 200, description = "Requests", body = Vec<Object>)))]
async fn question_list(State(state): State<AppState>) -> Response {
    ok(state.opencode.list_pending(AskKind::Question))
}

/// Answers a question (`answers`: one list of labels per question).
#[utoipa::path(post, path = "/opencode/question/{requestID}/reply", operation_id = "opencodeQuestionReply", tag = "opencode",
    params(("requestID" = String, Path, description = "Request id"), DirQuery),
    request_body(content = Object, content_type = "application/json"),
    responses((status = 200, description = "Answered", body = bool, content_type = "application/json"),
        (status = 400, description = "Bad body", body = Object, content_type = "application/json"),
        (status = 404, description = "No such request", body = Object, content_type = "application/json")))]
async fn question_reply(
    State(state): State<AppState>,
    Path(request): Path<String>,
    body: Bytes,
) -> Response {
    let b = match body_json(&body) {
        Ok(b) => b,
        Err(r) => return *r,
    };
    let answers = match b.get("answers") {
        Some(a @ Value::Array(list)) if list.len() <= 64 && list.iter().all(Value::is_array) => {
            a.clone()
        }
        _ => {
            return error(OcError::BadRequest(
                "`answers` must be an array of arrays of labels".into(),
            ));
        }
    };
    state
        .opencode
        .reply_question(&request, answers)
        .await
        .map_or_else(error, |()| ok(true))
}

/// Rejects a question.
#[utoipa::path(post, path = "/opencode/question/{requestID}/reject", operation_id = "opencodeQuestionReject", tag = "opencode",
    params(("requestID" = String, Path, description = "Request id"), DirQuery),
    responses((status = 200, description = "Rejected", body = bool, content_type = "application/json"),
        (status = 404, description = "No such request", body = Object, content_type = "application/json")))]
async fn question_reject(State(state): State<AppState>, Path(request): Path<String>) -> Response {
    state
        .opencode
        .reject_question(&request)
        .await
        .map_or_else(error, |()| ok(true))
}

/// Every agent as a provider (`all`, `default` model per provider, `connected`: installed).
#[utoipa::path(get, path = "/opencode/provider", operation_id = "opencodeProviderList", tag = "opencode",
    params(DirQuery), responses((status = 200, description = "Providers", body = Object)))]
async fn provider_list(State(state): State<AppState>) -> Response {
    ok(state.opencode.providers().await)
}

/// The providers as the older `config.providers` shapes them (`providers`, `default`).
#[utoipa::path(get, path = "/opencode/config/providers", operation_id = "opencodeConfigProviders", tag = "opencode",
    params(DirQuery), responses((status = 200, description = "Providers", body = Object)))]
async fn config_providers(State(state): State<AppState>) -> Response {
    let p = state.opencode.providers().await;
    let connected: Vec<Value> = p["connected"].as_array().cloned().unwrap_or_default();
    let providers: Vec<Value> = p["all"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter(|x| connected.contains(&x["id"]))
                .cloned()
                .collect()
        })
        .unwrap_or_default();
    ok(json!({"providers": providers, "default": p["default"]}))
}

/// OpenCode's config: what the daemon has of it (the default model).
#[utoipa::path(get, path = "/opencode/config", operation_id = "opencodeConfigGet", tag = "opencode",
    params(DirQuery), responses((status = 200, description = "Config", body = Object)))]
async fn config_get(State(_state): State<AppState>) -> Response {
    ok(
        json!({"$schema": "https://opencode.ai/config.json", "model": "mock/mock",
        "agent": {}, "provider": {}, "mcp": {}, "permission": {}}),
    )
}

/// OpenCode's agents (modes): one, `build`; the ACP agents are the providers.
#[utoipa::path(get, path = "/opencode/agent", operation_id = "opencodeAgentList", tag = "opencode",
    params(DirQuery), responses((status = 200, description = "Agents", body = Vec<Object>)))]
async fn agent_list() -> Response {
    ok(
        json!([{"name": "build", "description": "The ACP agent behind the session's provider",
        "mode": "primary", "builtIn": true, "native": true, "permission": [], "options": {},
        "tools": {}}]),
    )
}

/// The paths OpenCode clients show.
#[utoipa::path(get, path = "/opencode/path", operation_id = "opencodePathGet", tag = "opencode",
    params(DirQuery), responses((status = 200, description = "Paths", body = Object)))]
async fn path_get(State(state): State<AppState>) -> Response {
    let dir = state.opencode.directory().to_string();
    let data = state.config.data_dir.to_string_lossy().into_owned();
    ok(
        json!({"home": std::env::var("HOME").unwrap_or_default(), "state": data, "config": data,
        "worktree": dir, "directory": dir}),
    )
}

fn project(state: &AppState) -> Value {
    let dir = state.opencode.directory().to_string();
    json!({"id": "global", "worktree": dir, "vcs": null, "time": {"created": 0, "initialized": 0},
        "sandboxes": []})
}

/// The one project: the daemon's working directory.
#[utoipa::path(get, path = "/opencode/project/current", operation_id = "opencodeProjectCurrent", tag = "opencode",
    params(DirQuery), responses((status = 200, description = "Project", body = Object)))]
async fn project_current(State(state): State<AppState>) -> Response {
    ok(project(&state))
}

/// Every project: the one.
#[utoipa::path(get, path = "/opencode/project", operation_id = "opencodeProjectList", tag = "opencode",
    params(DirQuery), responses((status = 200, description = "Projects", body = Vec<Object>)))]
async fn project_list(State(state): State<AppState>) -> Response {
    ok(json!([project(&state)]))
}

/// Lists OpenCode has and the daemon does not fill (commands, MCP, LSP, formatters): empty.
#[utoipa::path(get, path = "/opencode/{list}", operation_id = "opencodeEmptyList", tag = "opencode",
    params(("list" = String, Path, description = "command, lsp, formatter or mcp"), DirQuery),
    responses((status = 200, description = "Empty", body = Object),
        (status = 404, description = "Not served", body = Object, content_type = "application/json")))]
async fn empty_list(Path(list): Path<String>) -> Response {
    match list.as_str() {
        "command" | "lsp" | "formatter" => ok(json!([])),
        "mcp" | "vcs" => ok(json!({})),
        other => error(OcError::NotFound(format!(
            "/opencode/{} is not served",
            other.chars().take(100).collect::<String>()
        ))),
    }
}

/// OpenCode's health probe.
#[utoipa::path(get, path = "/opencode/global/health", operation_id = "opencodeGlobalHealth", tag = "opencode",
    responses((status = 200, description = "Healthy", body = Object)))]
async fn global_health() -> Response {
    ok(json!({"healthy": true, "version": env!("CARGO_PKG_VERSION")}))
}
