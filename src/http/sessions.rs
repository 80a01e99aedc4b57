//! `GET /v1/sessions`: the session inventory (`acp::inventory`) across every serverId, paged
//! by an opaque cursor, with each session's state from the registry (in memory, no procfs) and
//! its `gitBase` from the workspace's record.
//!
//! **Boundary:** parsing and encoding only; the inventory decides what is listed.

use std::collections::HashMap;

use axum::extract::{Query, State};
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use utoipa::ToSchema;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::{AppState, Problem};
use crate::acp::inventory::{decode_cursor, encode_cursor};

/// Sessions per page when `limit` is not given, and the most a page holds.
pub const DEFAULT_LIMIT: usize = 100;
pub const MAX_LIMIT: usize = 1000;

pub fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(list))
}

/// One session the daemon knows.
#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct SessionItem {
    #[schema(example = "s1")]
    server_id: String,
    #[schema(example = "mock-1")]
    session_id: String,
    #[schema(example = "mock")]
    agent: String,
    /// The working directory the session was created or loaded with.
    #[schema(nullable = false)]
    #[serde(skip_serializing_if = "Option::is_none")]
    cwd: Option<String>,
    /// The title the agent gave it (`session_info_update`), when it gave one.
    #[schema(nullable = false)]
    #[serde(skip_serializing_if = "Option::is_none")]
    title: Option<String>,
    /// When the daemon first saw the session (ms since the epoch).
    created_at_ms: u64,
    /// The last prompt or update of the session (ms since the epoch); after a restart, until
    /// new activity, the time it was recorded.
    last_activity_at_ms: u64,
    /// `live` (its agent is starting or running), `exited` (the agent ended; a POST starts it
    /// again), `restored` (recovered from the state dir after a restart; the next POST restores
    /// it), `closed` (the agent answered `session/close`).
    #[schema(example = "live")]
    state: &'static str,
    /// The HEAD of the repository `cwd` was in when the session was created or loaded.
    #[schema(nullable = false)]
    #[serde(skip_serializing_if = "Option::is_none")]
    git_base: Option<String>,
}

#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct SessionPage {
    /// Ordered by serverId, then sessionId.
    sessions: Vec<SessionItem>,
    /// Pass as `cursor` for the next page; absent on the last page.
    #[schema(nullable = false)]
    #[serde(skip_serializing_if = "Option::is_none")]
    next_cursor: Option<String>,
}

/// Every ACP session the daemon knows, across all serverIds: live, exited and restored after a
/// restart. Paged: `limit` (1–1000, default 100) and the opaque `cursor` of the previous page.
#[utoipa::path(
    get,
    path = "/v1/sessions",
    operation_id = "listSessions",
    tag = "acp",
    params(
        ("limit" = Option<u32>, Query, description = "Sessions per page (1-1000, default 100)",
            minimum = 1, maximum = 1000),
        ("cursor" = Option<String>, Query, description = "The `nextCursor` of the previous \
            page (opaque; a cursor stays valid while sessions come and go)"),
        ("serverId" = Option<String>, Query, description = "Only this serverId's sessions"),
    ),
    responses(
        (status = 200, description = "One page of sessions", body = SessionPage),
        (status = 400, description = "A `limit` out of range, a `cursor` this daemon did not \
            make, or an unknown parameter", content_type = "application/problem+json"),
    ),
)]
async fn list(State(st): State<AppState>, Query(q): Query<HashMap<String, String>>) -> Response {
    if let Some(k) = q
        .keys()
        .find(|k| !matches!(k.as_str(), "limit" | "cursor" | "serverId"))
    {
        return Problem::bad_request(format!("unknown query parameter `{k}`")).into_response();
    }
    let limit = match q.get("limit") {
        None => DEFAULT_LIMIT,
        Some(v) => match v.parse::<usize>() {
            Ok(n) if (1..=MAX_LIMIT).contains(&n) => n,
            _ => {
                return Problem::bad_request(format!(
                    "`limit` must be a whole number from 1 to {MAX_LIMIT}"
                ))
                .with("limit", MAX_LIMIT as u64)
                .into_response();
            }
        },
    };
    let after = match q.get("cursor") {
        None => None,
        Some(c) => match decode_cursor(c) {
            Some(k) => Some(k),
            None => {
                return Problem::bad_request("`cursor` is not one this daemon gave")
                    .into_response();
            }
        },
    };
    let server = q.get("serverId").map(String::as_str);
    let inventory = st.acp.inventory();
    let (page, more) = inventory.page(after.as_ref(), limit, server);
    let states = st.acp.session_states();
    let ids = st.acp.server_ids();
    let bases = st
        .workspace
        .sessions
        .of_listed(ids.iter().map(String::as_str));
    let next_cursor = match (more, page.last()) {
        (true, Some(e)) => Some(encode_cursor(&e.server_id, &e.session_id)),
        _ => None,
    };
    let sessions = page
        .into_iter()
        .map(|e| {
            let state = if e.closed {
                "closed"
            } else {
                states.get(&e.server_id).copied().unwrap_or("exited")
            };
            let git_base = bases.get(&e.server_id).and_then(|list| {
                list.iter()
                    .rev()
                    .find(|b| b.session_id == e.session_id)
                    .map(|b| b.git_base.clone())
            });
            SessionItem {
                server_id: e.server_id,
                session_id: e.session_id,
                agent: e.agent,
                cwd: e.cwd,
                title: e.title,
                created_at_ms: e.created_at_ms,
                last_activity_at_ms: e.last_activity_ms,
                state,
                git_base,
            }
        })
        .collect();
    axum::Json(SessionPage {
        sessions,
        next_cursor,
    })
    .into_response()
}
