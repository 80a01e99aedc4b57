//! `/v1/processes`: HTTP and WebSocket faces of the process service (`crate::processes`), in the
//! wire shapes of the published `sandbox-agent` npm SDK (0.4.2). Log chunks carry their byte
//! offset as `sequence` and SSE `id`; the terminal socket carries raw terminal bytes as binary
//! frames and JSON control frames as text.
//!
//! **Boundary:** parsing, encoding and framing only; every decision is the service's.

use std::collections::HashMap;
use std::convert::Infallible;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::ws::{Message, WebSocket, WebSocketUpgrade};
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use base64::Engine;
use base64::engine::general_purpose::STANDARD as B64;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::wire::processes::{
    self as wire, CreateRequest, ProcessConfig, ProcessInfo, RunRequest, RunResponse,
};
use super::{AppState, Problem};
use crate::processes::{Chunk, LogStream, ProcessError, ReaderSlot, StreamFilter, default_filter};

/// Output per SSE batch or WebSocket frame run, so one reader holds little at a time.
const BATCH_BYTES: usize = 256 * 1024;

mod logs;
mod terminal;

pub fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(list, create))
        .routes(routes!(get_config, set_config))
        .routes(routes!(run))
        .routes(routes!(get_one, delete))
        .routes(routes!(input))
        .routes(routes!(stop))
        .routes(routes!(kill))
        .routes(routes!(logs::logs))
        .routes(routes!(resize))
        .routes(routes!(terminal::terminal_ws))
}

type Params = Query<HashMap<String, String>>;

/// `GET /v1/processes`.
#[derive(serde::Serialize, utoipa::ToSchema)]
struct ProcessListResponse {
    processes: Vec<ProcessInfo>,
    /// Present when `limit` was given and the page is full: pass it as `cursor` for the next.
    #[serde(rename = "nextCursor", skip_serializing_if = "Option::is_none")]
    next_cursor: Option<String>,
}

/// `POST /v1/processes/{id}/input`.
#[derive(serde::Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
struct InputResponse {
    bytes_written: usize,
}

/// `POST /v1/processes/{id}/terminal/resize`, both ways.
#[derive(serde::Serialize, serde::Deserialize, utoipa::ToSchema)]
struct TerminalSize {
    cols: u32,
    rows: u32,
}

fn parse_body<T: DeserializeOwned>(body: &[u8]) -> Result<T, Problem> {
    let de = &mut serde_json::Deserializer::from_slice(body);
    serde_path_to_error::deserialize(de).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        if path == "." {
            Problem::bad_request(format!("invalid JSON body: {inner}"))
        } else {
            Problem::bad_request(format!("invalid JSON body at `{path}`: {inner}"))
        }
    })
}

fn param<T: std::str::FromStr>(
    q: &HashMap<String, String>,
    name: &str,
) -> Result<Option<T>, Problem> {
    match q.get(name) {
        None => Ok(None),
        Some(v) if v.is_empty() => Ok(None),
        Some(v) => v.parse::<T>().map(Some).map_err(|_| {
            Problem::bad_request(format!("query parameter `{name}` is not valid: `{v}`"))
        }),
    }
}

fn wait_param(q: &HashMap<String, String>) -> Result<Duration, Problem> {
    Ok(Duration::from_millis(
        param::<u64>(q, "waitMs")?.unwrap_or(0),
    ))
}

/// Every process record (running and exited), oldest first.
#[utoipa::path(
    get,
    path = "/v1/processes",
    operation_id = "listProcesses",
    tag = "processes",
    params(
        ("owner" = Option<String>, Query, description = "`user` (every process of this API), \
            `desktop` or `system` (none)", example = "user"),
        ("limit" = Option<u32>, Query, description = "At most this many records (1..=1000); \
            without it, every record", minimum = 1, maximum = 1000),
        ("cursor" = Option<String>, Query, description = "The `nextCursor` of the page before, \
            unchanged"),
    ),
    responses(
        (status = 200, description = "The records (or one page), oldest first", body = ProcessListResponse),
        (status = 400, description = "An unknown owner, a bad `limit` or `cursor`"),
    )
)]
async fn list(State(st): State<AppState>, Query(q): Params) -> Result<Response, Problem> {
    let page = crate::http::paging::Page::from_query(&q)?;
    let after = match page.after.as_deref() {
        None => None,
        Some(id) => Some(
            id.strip_prefix("proc_")
                .and_then(|n| n.parse::<u64>().ok())
                .ok_or_else(|| Problem::bad_request("cursor is not one this daemon gave out"))?,
        ),
    };
    let processes = match q.get("owner").map(String::as_str) {
        None | Some("") | Some("user") => st.processes.page(after, page.take()).await,
        // Processes started through this API are all the user's.
        Some("desktop") | Some("system") => Vec::new(),
        Some(other) => {
            return Err(Problem::bad_request(format!(
                "owner must be one of user, desktop, system, not `{other}`"
            )));
        }
    };
    let next_cursor = page.next(processes.len(), processes.last().map(|p| p.id.as_str()));
    let processes = processes.into_iter().map(ProcessInfo::from).collect();
    Ok(axum::Json(ProcessListResponse {
        processes,
        next_cursor,
    })
    .into_response())
}

/// Starts a process in the background (pipes, or a terminal with `tty`).
#[utoipa::path(
    post,
    path = "/v1/processes",
    operation_id = "createProcess",
    tag = "processes",
    request_body(content = CreateRequest, content_type = "application/json"),
    responses(
        (status = 200, description = "Started", body = ProcessInfo),
        (status = 400, description = "An invalid request, or the program or directory it names cannot be used (missing, not executable, not a program, a name too long)"),
        (status = 429, description = "`maxConcurrentProcesses` processes are running (`Retry-After`)"),
        (status = 500, description = "No terminal could be opened"),
        (status = 502, description = "The program could not be started for a reason of the machine's (no processes or memory left)"),
        (status = 503, description = "The total output budget is used up, or the daemon is shutting down (`Retry-After`)"),
    )
)]
async fn create(State(st): State<AppState>, body: Bytes) -> Result<Response, Problem> {
    let req: CreateRequest = parse_body(&body)?;
    let process = st.processes.create(req.into()).await?;
    Ok(axum::Json(ProcessInfo::from(process.info().await)).into_response())
}

/// Runs a program to completion (or its timeout) and returns its output.
#[utoipa::path(
    post,
    path = "/v1/processes/run",
    operation_id = "runProcess",
    tag = "processes",
    request_body(content = RunRequest, content_type = "application/json"),
    responses(
        (status = 200, description = "The run's result (also when it timed out)", body = RunResponse),
        (status = 400, description = "An invalid request, or the program or directory it names cannot be used (missing, not executable, not a program, a name too long)"),
        (status = 429, description = "`maxConcurrentProcesses` processes are running (`Retry-After`)"),
        (status = 502, description = "The program could not be started for a reason of the machine's (no processes or memory left)"),
        (status = 503, description = "The total output budget cannot hold the capture, or the daemon is shutting down (`Retry-After`)"),
    )
)]
async fn run(State(st): State<AppState>, body: Bytes) -> Result<Response, Problem> {
    let req: RunRequest = parse_body(&body)?;
    let ran = st.processes.run(req.into()).await?;
    Ok(axum::Json(RunResponse::from(ran)).into_response())
}

/// The process API's runtime limits.
#[utoipa::path(
    get,
    path = "/v1/processes/config",
    operation_id = "getProcessConfig",
    tag = "processes",
    responses((status = 200, description = "The limits", body = ProcessConfig))
)]
async fn get_config(State(st): State<AppState>) -> Response {
    axum::Json(ProcessConfig::from(st.processes.config())).into_response()
}

/// Replaces the runtime limits (every value positive and within its hard ceiling).
#[utoipa::path(
    post,
    path = "/v1/processes/config",
    operation_id = "setProcessConfig",
    tag = "processes",
    request_body(content = ProcessConfig, content_type = "application/json"),
    responses(
        (status = 200, description = "The limits now in force", body = ProcessConfig),
        (status = 400, description = "A value is 0, above its ceiling, or unknown"),
    )
)]
async fn set_config(State(st): State<AppState>, body: Bytes) -> Result<Response, Problem> {
    let req: ProcessConfig = parse_body(&body)?;
    let now = st.processes.set_config(req.into())?;
    Ok(axum::Json(ProcessConfig::from(now)).into_response())
}

/// One process record.
#[utoipa::path(
    get,
    path = "/v1/processes/{id}",
    operation_id = "getProcess",
    tag = "processes",
    params(
        ("id" = String, Path, description = "Process id", example = "proc_1"),
    ),
    responses(
        (status = 200, description = "The record", body = ProcessInfo),
        (status = 404, description = "No such process"),
    )
)]
async fn get_one(State(st): State<AppState>, Path(id): Path<String>) -> Result<Response, Problem> {
    let process = st.processes.get(&id)?;
    Ok(axum::Json(ProcessInfo::from(process.info().await)).into_response())
}

/// Forgets an exited process and its output log.
#[utoipa::path(
    delete,
    path = "/v1/processes/{id}",
    operation_id = "deleteProcess",
    tag = "processes",
    params(
        ("id" = String, Path, description = "Process id", example = "proc_1"),
    ),
    responses(
        (status = 204, description = "Forgotten"),
        (status = 404, description = "No such process"),
        (status = 409, description = "Still running: stop or kill it first"),
    )
)]
async fn delete(State(st): State<AppState>, Path(id): Path<String>) -> Result<Response, Problem> {
    st.processes.delete(&id)?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

/// SIGTERM to the process group, the grace period, then SIGKILL to the group and its cgroup.
#[utoipa::path(
    post,
    path = "/v1/processes/{id}/stop",
    operation_id = "stopProcess",
    tag = "processes",
    params(
        ("id" = String, Path, description = "Process id", example = "proc_1"),
        ("waitMs" = Option<u64>, Query, description = "Wait up to this long (at most 60 s) for \
            the end before answering"),
    ),
    responses(
        (status = 200, description = "The record after the wait", body = ProcessInfo),
        (status = 400, description = "An invalid `waitMs`"),
        (status = 404, description = "No such process"),
    )
)]
async fn stop(
    State(st): State<AppState>,
    Path(id): Path<String>,
    Query(q): Params,
) -> Result<Response, Problem> {
    let wait = wait_param(&q)?;
    let info = st.processes.stop(&id, wait).await?;
    Ok(axum::Json(ProcessInfo::from(info)).into_response())
}

/// SIGKILL to the process group and everything in its cgroup at once.
#[utoipa::path(
    post,
    path = "/v1/processes/{id}/kill",
    operation_id = "killProcess",
    tag = "processes",
    params(
        ("id" = String, Path, description = "Process id", example = "proc_1"),
        ("waitMs" = Option<u64>, Query, description = "Wait up to this long (at most 60 s) for \
            the end before answering"),
    ),
    responses(
        (status = 200, description = "The record after the wait", body = ProcessInfo),
        (status = 400, description = "An invalid `waitMs`"),
        (status = 404, description = "No such process"),
    )
)]
async fn kill(
    State(st): State<AppState>,
    Path(id): Path<String>,
    Query(q): Params,
) -> Result<Response, Problem> {
    let wait = wait_param(&q)?;
    let info = st.processes.kill(&id, wait).await?;
    Ok(axum::Json(ProcessInfo::from(info)).into_response())
}

#[derive(serde::Deserialize, utoipa::ToSchema)]
struct InputRequest {
    data: String,
    #[serde(default)]
    encoding: Option<String>,
}

/// Input is base64 unless `encoding` says `utf8`/`text` (as the reference implementation does).
fn decode_input(data: &str, encoding: Option<&str>, default_b64: bool) -> Result<Vec<u8>, Problem> {
    match encoding {
        Some("base64") => {}
        None if default_b64 => {}
        None | Some("utf8") | Some("utf-8") | Some("text") => return Ok(data.as_bytes().to_vec()),
        Some(other) => {
            return Err(Problem::bad_request(format!(
                "encoding must be base64, utf8 or text, not `{other}`"
            )));
        }
    }
    B64.decode(data.as_bytes())
        .map_err(|e| Problem::bad_request(format!("data is not valid base64: {e}")))
}

/// Writes to the process's stdin, or to its terminal.
#[utoipa::path(
    post,
    path = "/v1/processes/{id}/input",
    operation_id = "sendProcessInput",
    tag = "processes",
    params(
        ("id" = String, Path, description = "Process id", example = "proc_1"),
    ),
    request_body(content = InputRequest, content_type = "application/json"),
    responses(
        (status = 200, description = "Written", body = InputResponse),
        (status = 400, description = "Invalid base64 or an unknown encoding"),
        (status = 404, description = "No such process"),
        (status = 409, description = "The process has exited, or has no stdin (not `interactive`)"),
        (status = 413, description = "More than `maxInputBytesPerRequest` bytes"),
        (status = 504, description = "The program did not take the input within 10 s"),
    )
)]
async fn input(
    State(st): State<AppState>,
    Path(id): Path<String>,
    body: Bytes,
) -> Result<Response, Problem> {
    let req: InputRequest = parse_body(&body)?;
    // Checked before decoding too, so a huge body is not decoded first (base64 is 4/3 larger).
    let limit = st.processes.max_input_bytes();
    if req.data.len() as u64 > limit.saturating_mul(4) / 3 + 4 {
        return Err(ProcessError::InputTooLarge { limit }.into());
    }
    let data = decode_input(&req.data, req.encoding.as_deref(), true)?;
    let n = st.processes.input(&id, &data).await?;
    Ok(axum::Json(InputResponse { bytes_written: n }).into_response())
}

/// Sets the terminal's size (TIOCSWINSZ) and signals SIGWINCH to the process group.
#[utoipa::path(
    post,
    path = "/v1/processes/{id}/terminal/resize",
    operation_id = "resizeProcessTerminal",
    tag = "processes",
    params(
        ("id" = String, Path, description = "Process id", example = "proc_1"),
    ),
    request_body(content = TerminalSize, content_type = "application/json"),
    responses(
        (status = 200, description = "The new size", body = TerminalSize),
        (status = 400, description = "A size outside 1..65535"),
        (status = 404, description = "No such process"),
        (status = 409, description = "The process has no terminal"),
        (status = 500, description = "The terminal refused the size"),
    )
)]
async fn resize(
    State(st): State<AppState>,
    Path(id): Path<String>,
    body: Bytes,
) -> Result<Response, Problem> {
    let req: TerminalSize = parse_body(&body)?;
    let (cols, rows) = st.processes.resize(&id, req.cols, req.rows)?;
    Ok(axum::Json(TerminalSize {
        cols: cols.into(),
        rows: rows.into(),
    })
    .into_response())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn input_is_base64_unless_it_says_otherwise() {
        assert_eq!(decode_input("aGk=", None, true).unwrap(), b"hi");
        assert_eq!(decode_input("hi", Some("utf8"), true).unwrap(), b"hi");
        assert_eq!(decode_input("hi", None, false).unwrap(), b"hi");
        assert!(decode_input("hi!", None, true).is_err());
        assert!(decode_input("hi", Some("latin1"), true).is_err());
    }
}
