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

pub fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(list, create))
        .routes(routes!(get_config, set_config))
        .routes(routes!(run))
        .routes(routes!(get_one, delete))
        .routes(routes!(input))
        .routes(routes!(stop))
        .routes(routes!(kill))
        .routes(routes!(logs))
        .routes(routes!(resize))
        .routes(routes!(terminal_ws))
}

type Params = Query<HashMap<String, String>>;

/// `GET /v1/processes`.
#[derive(serde::Serialize, utoipa::ToSchema)]
struct ProcessListResponse {
    processes: Vec<ProcessInfo>,
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

/// One chunk of output (`ProcessLogEntry`).
#[derive(serde::Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
struct LogEntry {
    /// Byte offset just after the chunk in the process's combined output.
    sequence: u64,
    stream: wire::LogStream,
    timestamp_ms: u64,
    /// The bytes: base64, or with `encoding=utf8` the text (invalid UTF-8 replaced by U+FFFD).
    data: String,
    /// `base64` (the default), or `utf8` when asked for.
    #[schema(value_type = String, example = "base64")]
    encoding: &'static str,
}

/// Output that was asked for but is no longer held: bytes `[from, to)`.
#[derive(serde::Serialize, utoipa::ToSchema)]
struct Gap {
    from: u64,
    to: u64,
}

/// `GET /v1/processes/{id}/logs` without `follow`.
#[derive(serde::Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
struct ProcessLogsResponse {
    process_id: String,
    stream: wire::StreamFilter,
    entries: Vec<LogEntry>,
    /// Bytes of output written so far.
    end: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    gap: Option<Gap>,
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
    ),
    responses(
        (status = 200, description = "The records", body = ProcessListResponse),
        (status = 400, description = "An unknown owner"),
    )
)]
async fn list(State(st): State<AppState>, Query(q): Params) -> Result<Response, Problem> {
    let processes = match q.get("owner").map(String::as_str) {
        None | Some("") | Some("user") => st.processes.list().await,
        // Processes started through this API are all the user's.
        Some("desktop") | Some("system") => Vec::new(),
        Some(other) => {
            return Err(Problem::bad_request(format!(
                "owner must be one of user, desktop, system, not `{other}`"
            )));
        }
    };
    let processes = processes.into_iter().map(ProcessInfo::from).collect();
    Ok(axum::Json(ProcessListResponse { processes }).into_response())
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

/// One log entry on the wire (`ProcessLogEntry`): `sequence` is the byte offset just after the
/// chunk, so `since=<sequence>` resumes right after it. Written by hand rather than through a
/// `Value`: the follow stream's throughput is bound by this copy, and base64 and the stream names
/// never need JSON escaping.
fn entry_json(c: &Chunk, out: &mut String, utf8: bool) {
    use std::fmt::Write;
    let stream = match c.stream {
        LogStream::Stdout => "stdout",
        LogStream::Stderr => "stderr",
        LogStream::Pty => "pty",
    };
    let _ = write!(
        out,
        r#"{{"sequence":{},"stream":"{stream}","timestampMs":{},"data":""#,
        c.end(),
        c.at_ms
    );
    if utf8 {
        // The JSON string literal without its quotes (the opening one is already written).
        let text = serde_json::to_string(&String::from_utf8_lossy(&c.data)).unwrap_or_default();
        out.push_str(&text[1..]);
        out.push_str(r#","encoding":"utf8"}"#);
    } else {
        B64.encode_string(&c.data, out);
        out.push_str(r#"","encoding":"base64"}"#);
    }
}

/// The same entry as a value, for the JSON answer.
fn entry(c: &Chunk, utf8: bool) -> LogEntry {
    LogEntry {
        sequence: c.end(),
        stream: c.stream.into(),
        timestamp_ms: c.at_ms,
        data: if utf8 {
            String::from_utf8_lossy(&c.data).into_owned()
        } else {
            B64.encode(&c.data)
        },
        encoding: if utf8 { "utf8" } else { "base64" },
    }
}

/// `encoding=utf8` (or `text`): entries carry their bytes as text, lossily; `base64` (the
/// default) keeps every byte.
fn wants_utf8(q: &std::collections::HashMap<String, String>) -> Result<bool, Problem> {
    match q.get("encoding").map(String::as_str) {
        None | Some("") | Some("base64") => Ok(false),
        Some("utf8" | "utf-8" | "text") => Ok(true),
        Some(other) => Err(Problem::bad_request(format!(
            "encoding must be base64 or utf8, not `{other}`"
        ))),
    }
}

fn gap_json((from, to): (u64, u64)) -> String {
    format!(r#"{{"from":{from},"to":{to}}}"#)
}

/// The process's output: a JSON page, or with `follow=true` an SSE stream.
#[utoipa::path(
    get,
    path = "/v1/processes/{id}/logs",
    operation_id = "getProcessLogs",
    tag = "processes",
    params(
        ("id" = String, Path, description = "Process id", example = "proc_1"),
        ("since" = Option<u64>, Query, description = "Only entries after this byte offset \
            (an entry's `sequence` is the offset just after it)"),
        ("tail" = Option<u64>, Query, description = "Only the last N entries"),
        ("stream" = Option<wire::StreamFilter>, Query, description = "Which stream; default `pty` for \
            a terminal process, else `combined`"),
        ("follow" = Option<bool>, Query, description = "Answer with an SSE stream that replays, \
            then follows, and ends when the process has exited and all output was sent",
            example = true),
        ("encoding" = Option<String>, Query, description = "`base64` (the default: every byte \
            kept) or `utf8`: each entry's `data` as text, invalid UTF-8 (a character cut between \
            two entries included) replaced by U+FFFD — for people reading along, not for \
            exact bytes", example = "utf8"),
        ("Last-Event-ID" = Option<String>, Header, description = "With `follow`: resume after \
            this offset (overrides `since`)", pattern = "^\\s*[0-9]{1,19}\\s*$"),
    ),
    responses(
        (status = 200, description = "The entries (JSON), or with `follow=true` a \
            `text/event-stream` of `event: log` / `id: <sequence>` / `data: <entry>` frames; \
            output that was dropped before the reader got it is announced as `event: gap` with \
            `data: {\"from\":F,\"to\":T}` (bytes [F, T) lost) and no id.",
            content(
                (ProcessLogsResponse = "application/json"),
                (String = "text/event-stream"),
            )),
        (status = 400, description = "An invalid parameter or `Last-Event-ID`"),
        (status = 404, description = "No such process"),
        (status = 429, description = "16 readers follow this process already (`Retry-After`)"),
    )
)]
async fn logs(
    State(st): State<AppState>,
    Path(id): Path<String>,
    Query(q): Params,
    headers: HeaderMap,
) -> Result<Response, Problem> {
    let stream: Option<StreamFilter> = match q.get("stream").map(String::as_str) {
        None | Some("") => None,
        Some(s) => Some(
            serde_json::from_value::<wire::StreamFilter>(Value::String(s.to_string()))
                .map_err(|_| {
                    Problem::bad_request(format!(
                        "stream must be one of stdout, stderr, combined, pty, not `{s}`"
                    ))
                })?
                .into(),
        ),
    };
    let mut since: Option<u64> = param(&q, "since")?;
    let tail: Option<usize> = param(&q, "tail")?;
    let follow = param::<bool>(&q, "follow")?.unwrap_or(false);
    let utf8 = wants_utf8(&q)?;
    if !follow {
        let logs = st.processes.logs(&id, since, tail, stream)?;
        let body = ProcessLogsResponse {
            process_id: id,
            stream: logs.stream.into(),
            entries: logs.chunks.iter().map(|c| entry(c, utf8)).collect(),
            end: logs.end,
            gap: logs.gap.map(|(from, to)| Gap { from, to }),
        };
        return Ok(axum::Json(body).into_response());
    }
    // A reconnecting EventSource resumes after the last id it saw.
    if let Some(v) = headers.get("last-event-id") {
        match v.to_str().ok().and_then(|s| s.trim().parse::<u64>().ok()) {
            Some(n) => since = Some(n),
            None => {
                return Err(Problem::bad_request(
                    "Last-Event-ID must be a non-negative integer (a log offset)",
                ));
            }
        }
    }
    let slot = st.processes.reader(&id)?;
    let filter = stream.unwrap_or(default_filter(&slot.process));
    let start = match (since, tail) {
        (Some(s), _) => s,
        // `tail` without `since`: replay the last n entries, then follow.
        (None, Some(n)) => slot
            .process
            .log
            .tail(0, filter, n)
            .first()
            .map_or(slot.process.log.end(), |c| c.start),
        (None, None) => 0,
    };
    let body = Body::from_stream(sse_frames(
        slot,
        filter,
        start,
        utf8,
        st.config.keepalive,
        st.shutdown.clone(),
    ));
    Ok(super::sse_response(body))
}

/// The follow stream: `event: log` frames with `id: <offset>`, an `event: gap` frame (no id) when
/// output the reader asked for was dropped, keepalive comments, ending once the process has ended
/// and everything was sent (or at shutdown).
fn sse_frames(
    slot: ReaderSlot,
    filter: StreamFilter,
    start: u64,
    utf8: bool,
    keepalive: Duration,
    shutdown: tokio_util::sync::CancellationToken,
) -> impl futures_util::Stream<Item = Result<Bytes, Infallible>> + Send {
    let keepalive = keepalive.max(Duration::from_millis(10));
    let rx = slot.process.log.subscribe();
    futures_util::stream::unfold(Some((slot, rx, start)), move |state| {
        let shutdown = shutdown.clone();
        async move {
            let (slot, mut rx, mut cursor) = state?;
            loop {
                rx.borrow_and_update();
                let read = slot.process.log.read_after(cursor, filter, BATCH_BYTES);
                let mut out = String::new();
                if let Some(gap) = read.gap {
                    out.push_str(&format!("event: gap\ndata: {}\n\n", gap_json(gap)));
                }
                for c in &read.chunks {
                    out.push_str("event: log\nid: ");
                    out.push_str(&c.end().to_string());
                    out.push_str("\ndata: ");
                    entry_json(c, &mut out, utf8);
                    out.push_str("\n\n");
                }
                cursor = read.cursor;
                if !out.is_empty() {
                    let next = (!read.finished).then_some((slot, rx, cursor));
                    return Some((Ok(Bytes::from(out)), next));
                }
                if read.finished {
                    return None;
                }
                tokio::select! {
                    biased;
                    _ = shutdown.cancelled() => return None,
                    changed = rx.changed() => if changed.is_err() { return None },
                    _ = tokio::time::sleep(keepalive) => {
                        return Some((Ok(Bytes::from_static(b": keepalive\n\n")), Some((slot, rx, cursor))));
                    }
                }
            }
        }
    })
}

/// The terminal as a WebSocket: binary frames are terminal output (server to client) or raw
/// input; text frames are JSON control frames (`ready`, `exit`, `error` from the server;
/// `input`, `resize`, `close` from the client).
#[utoipa::path(
    get,
    path = "/v1/processes/{id}/terminal/ws",
    operation_id = "connectProcessTerminal",
    tag = "processes",
    params(
        ("id" = String, Path, description = "Process id", example = "proc_1"),
    ),
    responses(
        (status = 101, description = "Switched to the WebSocket protocol"),
        (status = 400, description = "Not a WebSocket upgrade request"),
        (status = 404, description = "No such process"),
        (status = 409, description = "The process has no terminal"),
        (status = 429, description = "16 readers follow this process already (`Retry-After`)"),
    )
)]
async fn terminal_ws(
    State(st): State<AppState>,
    Path(id): Path<String>,
    ws: Result<WebSocketUpgrade, axum::extract::ws::rejection::WebSocketUpgradeRejection>,
) -> Result<Response, Problem> {
    let slot = st.processes.reader(&id)?;
    if !slot.process.tty {
        return Err(ProcessError::Conflict {
            id,
            reason: "the process has no terminal (not started with `tty`)",
        }
        .into());
    }
    let ws = ws.map_err(|e| Problem::bad_request(format!("not a WebSocket upgrade: {e}")))?;
    // A control frame holds at most one input request (base64 is 4/3 larger) plus its framing.
    let max = (st.processes.max_input_bytes() as usize).saturating_mul(2) + 4096;
    let shutdown = st.shutdown.clone();
    let limit = st.processes.max_input_bytes();
    // The socket's task is held in the daemon's drain (see `AppState::tasks`).
    let drain = st.tasks.token();
    Ok(ws
        .max_message_size(max)
        .max_frame_size(max)
        .on_upgrade(move |socket| async move {
            let _drain = drain;
            let _open = crate::metrics::WebSocketOpen::new();
            terminal_session(socket, slot, limit, shutdown).await
        }))
}

#[derive(serde::Deserialize)]
#[serde(tag = "type", rename_all = "lowercase")]
enum ClientFrame {
    Input {
        data: String,
        #[serde(default)]
        encoding: Option<String>,
    },
    Resize {
        cols: u32,
        rows: u32,
    },
    Close,
}

/// One terminal socket: `ready`, then the terminal's output (retained output first) as binary
/// frames, `exit` once the process has ended and all output was sent; input and resize frames
/// the other way. Bad frames are answered with an `error` frame and do not end the session.
async fn terminal_session(
    mut socket: WebSocket,
    slot: ReaderSlot,
    input_limit: u64,
    shutdown: tokio_util::sync::CancellationToken,
) {
    let p = slot.process.clone();
    let ready = json!({ "type": "ready", "processId": p.id }).to_string();
    if socket.send(Message::Text(ready.into())).await.is_err() {
        return;
    }
    let mut rx = p.log.subscribe();
    let mut cursor = 0u64;
    loop {
        rx.borrow_and_update();
        let read = p.log.read_after(cursor, StreamFilter::Pty, BATCH_BYTES);
        cursor = read.cursor;
        for c in read.chunks {
            if socket.send(Message::Binary(c.data)).await.is_err() {
                return;
            }
        }
        if read.finished {
            let exit = p.ended().map(|(e, _)| e);
            let frame = json!({
                "type": "exit",
                "exitCode": exit.as_ref().and_then(|e| e.code),
                "signal": exit.as_ref().and_then(|e| e.signal),
            });
            let _ = socket.send(Message::Text(frame.to_string().into())).await;
            let _ = socket.send(Message::Close(None)).await;
            return;
        }
        if read.more {
            continue;
        }
        tokio::select! {
            _ = shutdown.cancelled() => {
                let _ = socket.send(Message::Close(None)).await;
                return;
            }
            changed = rx.changed() => if changed.is_err() { return },
            msg = socket.recv() => {
                let text = match msg {
                    None | Some(Err(_)) | Some(Ok(Message::Close(_))) => return,
                    Some(Ok(Message::Text(t))) => t,
                    Some(Ok(Message::Binary(b))) => {
                        // Raw bytes are input as they are.
                        if let Err(e) = crate::processes::write_input(&p, &b, input_limit).await {
                            let _ = send_error(&mut socket, &e.to_string()).await;
                        }
                        continue;
                    }
                    Some(Ok(_)) => continue,
                };
                let frame: ClientFrame = match serde_json::from_str(text.as_str()) {
                    Ok(f) => f,
                    Err(e) => {
                        if send_error(&mut socket, &format!("invalid frame: {e}")).await.is_err() {
                            return;
                        }
                        continue;
                    }
                };
                let result = match frame {
                    ClientFrame::Close => {
                        let _ = socket.send(Message::Close(None)).await;
                        return;
                    }
                    // The SDK sends text without an encoding and bytes as base64.
                    ClientFrame::Input { data, encoding } => {
                        match decode_input(&data, encoding.as_deref(), false) {
                            Ok(bytes) => crate::processes::write_input(&p, &bytes, input_limit)
                                .await
                                .map(|_| ())
                                .map_err(|e| e.to_string()),
                            Err(problem) => Err(problem.detail),
                        }
                    }
                    ClientFrame::Resize { cols, rows } => {
                        crate::processes::resize(&p, cols, rows).map_err(|e| e.to_string())
                    }
                };
                if let Err(message) = result
                    && send_error(&mut socket, &message).await.is_err()
                {
                    return;
                }
            }
        }
    }
}

async fn send_error(socket: &mut WebSocket, message: &str) -> Result<(), axum::Error> {
    let frame = json!({ "type": "error", "message": message }).to_string();
    socket.send(Message::Text(frame.into())).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_hand_written_sse_entry_is_the_json_entry() {
        for (stream, data) in [
            (LogStream::Stdout, &b"hello\n"[..]),
            (LogStream::Stderr, &b"\xff\x00\"\\"[..]),
            (LogStream::Pty, &b""[..]),
        ] {
            let c = Chunk {
                start: 7,
                stream,
                at_ms: 1234,
                data: Bytes::copy_from_slice(data),
            };
            for utf8 in [false, true] {
                let mut s = String::new();
                entry_json(&c, &mut s, utf8);
                let by_hand: Value = serde_json::from_str(&s).expect("valid JSON");
                assert_eq!(by_hand, serde_json::to_value(entry(&c, utf8)).unwrap());
                assert_eq!(by_hand["sequence"], 7 + data.len() as u64);
            }
        }
    }

    #[test]
    fn input_is_base64_unless_it_says_otherwise() {
        assert_eq!(decode_input("aGk=", None, true).unwrap(), b"hi");
        assert_eq!(decode_input("hi", Some("utf8"), true).unwrap(), b"hi");
        assert_eq!(decode_input("hi", None, false).unwrap(), b"hi");
        assert!(decode_input("hi!", None, true).is_err());
        assert!(decode_input("hi", Some("latin1"), true).is_err());
    }
}
