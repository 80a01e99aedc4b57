//! `/v1/acp/{serverId}/bundle`: a serverId's sessions exported as a bundle (tar + gzip,
//! streamed) and imported into another daemon (docs/acp.md, "Session bundles"). The work is
//! `acp::bundle`'s.

use axum::body::Body;
use axum::extract::{Path, RawQuery, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::json;
use tokio_stream::StreamExt;
use tokio_stream::wrappers::ReceiverStream;
use utoipa_axum::router::{OpenApiRouter, UtoipaMethodRouterExt};
use utoipa_axum::routes;

use super::{AppState, Problem};
use crate::acp::bundle::{self, CwdMap, agent_files::Places};

pub fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(
        routes!(export_bundle, import_bundle).layer(axum::extract::DefaultBodyLimit::disable()),
    )
}

fn places(st: &AppState, agent: &str) -> Places {
    Places {
        home: st.agents.home_of(agent),
        work_dir: st.config.work_dir.clone(),
        codex_home: st
            .agents
            .agent_var(agent, "CODEX_HOME")
            .map(std::path::PathBuf::from),
    }
}

fn check_id(server_id: &str) -> Result<(), Problem> {
    crate::acp::validate_server_id(server_id).map_err(Problem::from)
}

/// Export a serverId's sessions as a bundle.
#[utoipa::path(
    get,
    path = "/v1/acp/{serverId}/bundle",
    operation_id = "exportAcpBundle",
    tag = "acp",
    params(("serverId" = String, Path, description = "The instance to export",
        pattern = "^[A-Za-z0-9._-]{1,128}$", min_length = 1, max_length = 128, example = "s1")),
    responses(
        (status = 200, description = "The bundle (tar + gzip, layout version 1: `events.log`, \
            the agent's session files under `files/`, `manifest.json` last), streamed",
            content_type = "application/gzip", body = super::files::Binary),
        (status = 400, description = "An invalid serverId"),
        (status = 404, description = "No such serverId"),
        (status = 409, description = "A request to the agent is in progress (export between \
            turns), or the daemon has no --state-dir"),
    ),
)]
async fn export_bundle(
    State(st): State<AppState>,
    Path(server_id): Path<String>,
) -> Result<Response, Problem> {
    check_id(&server_id)?;
    let snap = bundle::export::snapshot(&st.acp, &|a| places(&st, a), &server_id).await?;
    let body = Body::from_stream(ReceiverStream::new(bundle::export::stream(snap)));
    let name = format!("attachment; filename=\"{server_id}.tgz\"");
    Ok((
        [
            (header::CONTENT_TYPE, "application/gzip".to_string()),
            (header::CONTENT_DISPOSITION, name),
            (header::CACHE_CONTROL, "no-store".to_string()),
        ],
        body,
    )
        .into_response())
}

/// Import a bundle as a new serverId, restored by its first POST.
#[utoipa::path(
    post,
    path = "/v1/acp/{serverId}/bundle",
    operation_id = "importAcpBundle",
    tag = "acp",
    params(
        ("serverId" = String, Path, description = "The serverId to import as (must not exist)",
            pattern = "^[A-Za-z0-9._-]{1,128}$", min_length = 1, max_length = 128, example = "s1"),
        ("cwd" = Option<Vec<String>>, Query, description = "`OLD=NEW`, both absolute: a \
            session whose cwd is OLD (or beneath it) gets NEW instead, and the agent's files \
            that name it are rewritten. Repeatable; the first that applies wins.",
            example = "/work/a=/work/b"),
    ),
    request_body(content(
        (super::files::Binary = "application/gzip"),
        (super::files::Binary = "application/octet-stream"),
    ), description = "A bundle as `GET /v1/acp/{serverId}/bundle` wrote it (gzip; \
        `application/x-gzip` and `application/octet-stream` are taken as the same)"),
    responses(
        (status = 201, description = "Imported: listed as `exited`, restored by its next POST",
            body = Object),
        (status = 400, description = "A tampered, truncated or hostile bundle, or a bad `cwd` \
            mapping: nothing was written"),
        (status = 409, description = "The serverId exists, a file the bundle would install \
            exists, its agent is unknown here, or the daemon has no --state-dir"),
        (status = 413, description = "Larger than --bundle-max-bytes (sent or unpacked)"),
        (status = 415, description = "Not sent as application/gzip"),
    ),
)]
async fn import_bundle(
    State(st): State<AppState>,
    Path(server_id): Path<String>,
    RawQuery(query): RawQuery,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, Problem> {
    check_id(&server_id)?;
    let ct = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let essence = ct
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();
    if !matches!(
        essence.as_str(),
        "application/gzip" | "application/x-gzip" | "application/octet-stream"
    ) {
        return Err(Problem::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            format!("a bundle is sent as application/gzip, not `{ct}`"),
        ));
    }
    let mut maps = Vec::new();
    for (k, v) in form_urlencoded::parse(query.unwrap_or_default().as_bytes()) {
        if k == "cwd" {
            maps.push(CwdMap::parse(&v)?);
        }
    }
    let limit = st.config.bundle_max_bytes;
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
    let stream = body
        .into_data_stream()
        .map(|r| r.map_err(|e| e.to_string()));
    let done = bundle::import::import(
        &st.acp,
        &|a| places(&st, a),
        &server_id,
        maps,
        Box::pin(stream),
        (limit, declared, st.config.idle_timeout),
    )
    .await?;
    let files: Vec<String> = done.files.iter().map(|p| p.display().to_string()).collect();
    Ok((
        StatusCode::CREATED,
        axum::Json(json!({
            "serverId": server_id,
            "agent": done.agent,
            "sessions": done.sessions,
            "events": done.events,
            "files": files,
        })),
    )
        .into_response())
}
