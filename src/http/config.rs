//! `/v1/config/mcp` and `/v1/config/skills`: GET/PUT/DELETE of one named entry of a directory's
//! configuration, delegated to [`ConfigStore`](crate::config_store::ConfigStore).

use std::collections::HashMap;

use axum::Json;
use axum::Router;
use axum::body::Bytes;
use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;

use super::{AppState, Problem};
use crate::config_store::{ConfigError, ConfigKind};

pub fn routes() -> Router<AppState> {
    Router::new()
        .route(
            "/v1/config/mcp",
            get(|s, q| read(ConfigKind::Mcp, s, q))
                .put(|s, q, b| write(ConfigKind::Mcp, s, q, b))
                .delete(|s, q| remove(ConfigKind::Mcp, s, q)),
        )
        .route(
            "/v1/config/skills",
            get(|s, q| read(ConfigKind::Skills, s, q))
                .put(|s, q, b| write(ConfigKind::Skills, s, q, b))
                .delete(|s, q| remove(ConfigKind::Skills, s, q)),
        )
}

type Params = Query<HashMap<String, String>>;

/// Both `directory` and the entry name are required and non-empty.
fn params(kind: ConfigKind, q: &HashMap<String, String>) -> Result<(String, String), ConfigError> {
    let get = |k: &'static str| {
        q.get(k)
            .filter(|v| !v.is_empty())
            .cloned()
            .ok_or(ConfigError::MissingParam(k))
    };
    Ok((get("directory")?, get(kind.name_param())?))
}

async fn read(
    kind: ConfigKind,
    State(s): State<AppState>,
    Query(q): Params,
) -> Result<Response, Problem> {
    let (dir, name) = params(kind, &q)?;
    Ok(Json(s.config_store.get(kind, &dir, &name).await?).into_response())
}

async fn write(
    kind: ConfigKind,
    State(s): State<AppState>,
    Query(q): Params,
    body: Bytes,
) -> Result<Response, Problem> {
    let (dir, name) = params(kind, &q)?;
    s.config_store.put(kind, &dir, &name, &body).await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

async fn remove(
    kind: ConfigKind,
    State(s): State<AppState>,
    Query(q): Params,
) -> Result<Response, Problem> {
    let (dir, name) = params(kind, &q)?;
    s.config_store.delete(kind, &dir, &name).await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}
