//! The workspace API's HTTP faces: `/v1/git/*`, `/v1/fs/glob`, `/v1/fs/grep`, `/v1/ports*`
//! and the preview links at `/preview/<opaque>/…`, over [`crate::workspace`]. Wire types used by
//! one route only are declared here, beside their handler.
//!
//! One file per concern: `git.rs`, `search.rs`, `ports.rs` (ports, the proxy, preview links).

mod git;
mod ports;
mod search;

pub use ports::preview_routes;

use axum::Json;
use axum::extract::rejection::JsonRejection;
use axum::http::StatusCode;
use utoipa_axum::router::OpenApiRouter;

use super::files::json_problem;
use super::{AppState, Problem};
use crate::workspace::git as git_service;
use crate::workspace::proxy;

pub fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .merge(git::routes())
        .merge(search::routes())
        .merge(ports::routes())
}

impl From<git_service::GitError> for Problem {
    fn from(e: git_service::GitError) -> Self {
        use git_service::GitError as E;
        let detail = e.to_string();
        match e {
            E::Path(f) => f.into(),
            E::NotARepository { .. } | E::NotFound(_) => Problem::not_found(detail),
            E::RepositoryOutsideRoot { .. } => Problem::new(StatusCode::FORBIDDEN, detail),
            E::Invalid(_) | E::UnknownRevision { .. } => Problem::bad_request(detail),
            // 422, not 401: a 401 would read as the daemon refusing the client's token.
            E::Unauthorized(_) => Problem::new(StatusCode::UNPROCESSABLE_ENTITY, detail),
            E::Conflict(_) => Problem::new(StatusCode::CONFLICT, detail),
            E::Remote(_) => Problem::new(StatusCode::BAD_GATEWAY, detail),
            E::Timeout(_) => Problem::new(StatusCode::GATEWAY_TIMEOUT, detail),
            E::TooLarge { limit } => {
                Problem::new(StatusCode::INSUFFICIENT_STORAGE, detail).with("limit", limit as u64)
            }
            E::Failed(_) | E::Spawn(_) => Problem::new(StatusCode::INTERNAL_SERVER_ERROR, detail),
        }
    }
}

impl From<proxy::ProxyError> for Problem {
    fn from(e: proxy::ProxyError) -> Self {
        let detail = e.to_string();
        match e {
            proxy::ProxyError::NoListener { port } | proxy::ProxyError::Upstream { port, .. } => {
                Problem::new(StatusCode::BAD_GATEWAY, detail).with("port", port)
            }
            proxy::ProxyError::OwnPort { port } => Problem::bad_request(detail).with("port", port),
        }
    }
}

fn json<T>(body: Result<Json<T>, JsonRejection>) -> Result<T, Problem> {
    body.map(|Json(b)| b).map_err(json_problem)
}
