//! `/v1/config/mcp` and `/v1/config/skills`: GET/PUT/DELETE of one named entry of a directory's
//! configuration, delegated to [`ConfigStore`](crate::config_store::ConfigStore).

use std::collections::HashMap;

use axum::Json;
use axum::body::Bytes;
use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::wire::config::{McpEntry, SkillsEntry};
use super::{AppState, Problem};
use crate::config_store::{ConfigError, ConfigKind};

pub fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(get_mcp, put_mcp, delete_mcp))
        .routes(routes!(get_skill, put_skill, delete_skill))
}

/// One handler per method and kind: each carries its own OpenAPI description.
macro_rules! config_routes {
    ($kind:expr, $path:literal, $name_param:literal, $entry:ty, $what:literal,
     $get:ident, $put:ident, $delete:ident) => {
        #[doc = concat!("Reads one ", $what, " entry of a directory.")]
        #[utoipa::path(
            get,
            path = $path,
            operation_id = stringify!($get),
            tag = "config",
            params(
                ("directory" = String, Query, description = "An existing directory; the entry is \
                    stored in `<directory>/.sandbox-agent/config/`", min_length = 1),
                ($name_param = String, Query, description = "The entry's name", min_length = 1),
            ),
            responses(
                (status = 200, description = "The entry as stored", body = $entry),
                (status = 400, description = "A missing parameter, or `directory` is not a directory"),
                (status = 404, description = "No such entry, or no such directory"),
                (status = 409, description = "The stored file is not a JSON object: fix or remove it"),
            )
        )]
        async fn $get(s: State<AppState>, q: Params) -> Result<Response, Problem> {
            read($kind, s, q).await
        }

        #[doc = concat!("Creates or replaces one ", $what, " entry of a directory.")]
        #[utoipa::path(
            put,
            path = $path,
            operation_id = stringify!($put),
            tag = "config",
            params(
                ("directory" = String, Query, description = "An existing directory; the entry is \
                    stored in `<directory>/.sandbox-agent/config/`", min_length = 1),
                ($name_param = String, Query, description = "The entry's name", min_length = 1),
            ),
            request_body(content = $entry, content_type = "application/json"),
            responses(
                (status = 204, description = "Stored"),
                (status = 400, description = "A missing parameter, an invalid entry (the reason \
                    names the field), or `directory` is not a directory"),
                (status = 404, description = "No such directory"),
                (status = 409, description = "The stored file is not a JSON object: fix or remove it"),
                (status = 507, description = "No space left on the device"),
            )
        )]
        async fn $put(s: State<AppState>, q: Params, b: Bytes) -> Result<Response, Problem> {
            write($kind, s, q, b).await
        }

        #[doc = concat!("Deletes one ", $what, " entry of a directory.")]
        #[utoipa::path(
            delete,
            path = $path,
            operation_id = stringify!($delete),
            tag = "config",
            params(
                ("directory" = String, Query, description = "An existing directory; the entry is \
                    stored in `<directory>/.sandbox-agent/config/`", min_length = 1),
                ($name_param = String, Query, description = "The entry's name", min_length = 1),
            ),
            responses(
                (status = 204, description = "Deleted"),
                (status = 400, description = "A missing parameter, or `directory` is not a directory"),
                (status = 404, description = "No such entry, or no such directory"),
                (status = 409, description = "The stored file is not a JSON object: fix or remove it"),
            )
        )]
        async fn $delete(s: State<AppState>, q: Params) -> Result<Response, Problem> {
            remove($kind, s, q).await
        }
    };
}

config_routes!(
    ConfigKind::Mcp,
    "/v1/config/mcp",
    "mcpName",
    McpEntry,
    "MCP server",
    get_mcp,
    put_mcp,
    delete_mcp
);
config_routes!(
    ConfigKind::Skills,
    "/v1/config/skills",
    "skillName",
    SkillsEntry,
    "skills",
    get_skill,
    put_skill,
    delete_skill
);

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
