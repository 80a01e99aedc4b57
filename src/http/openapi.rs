//! The OpenAPI 3.1 document of the HTTP API, generated from the route registrations themselves:
//! every route is registered through utoipa-axum's `OpenApiRouter` + `routes!` (see
//! [`super::api`]), so a handler without a `#[utoipa::path]` cannot be routed. This module adds
//! what is common to every operation (bearer auth, the edge's error answers, problem+json bodies)
//! and serves the result at `GET /v1/openapi.json`; `sandbox-agent openapi` prints the same bytes.
//! **Invariant:** the document is built once per process and is identical byte for byte on every
//! call, so `docs/openapi.json` can be compared with what the binary serves.

use std::sync::OnceLock;

use axum::body::Bytes;
use axum::http::{HeaderValue, header};
use axum::response::{IntoResponse, Response};
use utoipa::openapi::path::Operation;
use utoipa::openapi::response::{Response as ApiResponse, ResponseBuilder};
use utoipa::openapi::schema::{ObjectBuilder, Type};
use utoipa::openapi::security::{
    ApiKey, ApiKeyValue, HttpAuthScheme, HttpBuilder, SecurityRequirement, SecurityScheme,
};
use utoipa::openapi::{ContentBuilder, HeaderBuilder, OpenApi as Document, Ref, RefOr};
use utoipa::{OpenApi, ToSchema};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::AppState;
use super::error::PROBLEM_JSON;

/// The parts of the document that are not per route: info, tags, shared schemas.
#[derive(OpenApi)]
#[openapi(
    info(
        title = "Sandbox Agent",
        description = "HTTP API of the Sandbox Agent daemon: a transparent proxy to ACP coding \
agents (JSON-RPC over stdio, served as POST + SSE on `/v1/acp/{serverId}`), agent install, a \
filesystem API and per-directory MCP/skills configuration. With a token configured, every `/v1` \
route needs `Authorization: Bearer <token>`; `GET /` never does. Every 4xx and 5xx answer is an \
RFC 9457 `application/problem+json` body (`Problem`). Generated from the code: \
`sandbox-agent openapi` prints this document.",
        license(name = "Apache-2.0", identifier = "Apache-2.0")
    ),
    tags(
        (name = "meta", description = "Identity, health and this document"),
        (name = "acp", description = "The ACP proxy: one agent process per client-chosen serverId"),
        (name = "agents", description = "Known agents, their install and runtime status"),
        (name = "fs", description = "Files beneath the daemon's working root (and `--fs-root`)"),
        (name = "config", description = "Per-directory MCP and skills configuration"),
        (name = "processes", description = "Programs run next to the agents: runs, background processes, logs, terminals"),
    ),
    components(schemas(ProblemSchema, super::wire::watch::WatchChange))
)]
struct ApiDoc;

/// The routes this module owns.
pub fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(serve_document))
}

/// The document without the per-route parts; [`super::api`] starts from it.
pub fn base() -> Document {
    ApiDoc::openapi()
}

/// The whole document: every route of [`super::api`] plus what every operation shares.
pub fn document() -> Document {
    let mut doc = super::api().into_openapi();
    finish(&mut doc);
    doc
}

/// The served (and printed, and checked-in) bytes: pretty JSON and a final newline.
pub fn document_json() -> &'static [u8] {
    static DOC: OnceLock<Vec<u8>> = OnceLock::new();
    DOC.get_or_init(|| {
        // The document is built from our own static types; failing to serialise it is a bug
        // that every test run would show at once.
        let mut bytes = serde_json::to_vec_pretty(&document()).unwrap_or_default();
        bytes.push(b'\n');
        bytes
    })
}

/// The OpenAPI 3.1 document of this API (the same bytes as `docs/openapi.json`).
#[utoipa::path(
    get,
    path = "/v1/openapi.json",
    operation_id = "getOpenApi",
    tag = "meta",
    responses(
        (status = 200, description = "This document (OpenAPI 3.1)", body = Object,
            content_type = "application/json"),
    )
)]
async fn serve_document() -> Response {
    (
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        )],
        Bytes::from_static(document_json()),
    )
        .into_response()
}

/// An RFC 9457 problem: the body of every 4xx and 5xx answer (`Problem` in `src/http/error.rs`
/// builds it). Members beyond the first four appear where they help; others may be added.
#[derive(ToSchema)]
#[schema(as = Problem)]
#[allow(dead_code)] // only its schema is used; the body itself is built by `Problem::body`
pub(crate) struct ProblemSchema {
    /// `urn:sandbox-agent:problem:<title in kebab case>`.
    #[schema(example = "urn:sandbox-agent:problem:not-found")]
    r#type: String,
    #[schema(example = "Not Found")]
    title: String,
    /// The HTTP status, repeated.
    #[schema(example = 404, minimum = 400, maximum = 599)]
    status: u16,
    /// What went wrong, for a human.
    #[schema(example = "no agent instance with serverId `s1`")]
    detail: String,
    /// The agent instance concerned.
    #[schema(rename = "serverId", nullable = false)]
    server_id: Option<String>,
    /// The agent concerned (for 409 Agent Mismatch, the one the serverId is bound to).
    #[schema(nullable = false)]
    agent: Option<String>,
    /// 409 Agent Mismatch: the agent this request asked for.
    #[schema(rename = "requestedAgent", nullable = false)]
    requested_agent: Option<String>,
    /// 409 Agent Not Installed (`--require-preinstall`): the command that installs it.
    #[schema(rename = "installCommand", nullable = false)]
    install_command: Option<String>,
    /// 502 Agent Gone: the agent's exit code, when it exited by itself.
    #[schema(rename = "exitCode", nullable = false)]
    exit_code: Option<i32>,
    /// 502 Agent Gone: the signal that killed the agent.
    #[schema(nullable = false)]
    signal: Option<i32>,
    /// 502 Agent Gone: how the agent ended.
    #[schema(rename = "exitReason", nullable = false)]
    exit_reason: Option<super::wire::supervisor::ExitReason>,
    /// 502 Agent Gone: the last lines the agent wrote to stderr.
    #[schema(rename = "stderrTail", nullable = false)]
    stderr_tail: Option<String>,
    /// 413: the limit that was exceeded (bytes, or entries for an archive).
    #[schema(nullable = false)]
    limit: Option<u64>,
    /// 504 Agent Timeout: the request timeout in milliseconds.
    #[schema(rename = "timeoutMs", nullable = false)]
    timeout_ms: Option<u64>,
    /// 409 Duplicate Request Id: the JSON-RPC id still in flight (number or string).
    #[schema(value_type = Object, nullable = false, required = false)]
    id: Option<serde_json::Value>,
}

/// A status the edge (auth, Host/Origin guard, body limits, caps, shutdown) may answer on any
/// route, before or instead of its handler; each is added to every operation that does not
/// describe it itself, as a reference to a shared response named `name`.
struct EdgeResponse {
    status: &'static str,
    name: &'static str,
    description: &'static str,
    /// `(header, description)` pairs.
    headers: &'static [(&'static str, &'static str)],
}

const EDGE_RESPONSES: &[EdgeResponse] = &[
    EdgeResponse {
        status: "401",
        name: "Unauthorized",
        description: "A token is configured and the request has no valid \
                      `Authorization: Bearer` header.",
        headers: &[("WWW-Authenticate", "`Bearer`")],
    },
    EdgeResponse {
        status: "403",
        name: "Forbidden",
        description: "Refused by the edge guard (a `Host` or `Origin` that is not allowed), \
                      or by the filesystem policy.",
        headers: &[],
    },
    EdgeResponse {
        status: "413",
        name: "PayloadTooLarge",
        description: "The request (body, headers or URI) is larger than a configured limit; \
                      `limit` names it.",
        headers: &[],
    },
    EdgeResponse {
        status: "415",
        name: "UnsupportedMediaType",
        description: "The request's Content-Type is not one this route accepts \
                      (state-changing routes refuse the CORS-simple types).",
        headers: &[],
    },
    EdgeResponse {
        status: "429",
        name: "TooManyRequests",
        description: "A configured cap (connections, requests, instances, subscribers) is \
                      reached; retry later.",
        headers: &[("Retry-After", "Seconds to wait before retrying.")],
    },
    EdgeResponse {
        status: "503",
        name: "ServiceUnavailable",
        description: "The daemon is shutting down, or a capacity limit is reached; retry \
                      later (elsewhere).",
        headers: &[("Retry-After", "Seconds to wait before retrying.")],
    },
];

/// An SSE route and what one event of its stream is.
struct SseStream {
    path: &'static str,
    schema: &'static str,
    events: &'static [&'static str],
    about: &'static str,
}

/// OpenAPI 3.1 has no way to describe a stream as a whole; by the convention tools follow
/// (schemathesis validates each event of a finished stream against it), the `text/event-stream`
/// schema describes one event as an SSE parser yields it: its `event`, `id` and `data` fields.
const SSE_STREAMS: &[SseStream] = &[
    SseStream {
        path: "/v1/acp/{serverId}",
        schema: "AcpStreamEvent",
        events: &["message", "gap"],
        about: "One event of an ACP instance's stream: `message` (`id` the event's id in the \
                instance log, `data` one JSON-RPC object) or `gap` (no `id`; `data` \
                `{\"from\",\"to\"}`, the ids evicted before this reader got them).",
    },
    SseStream {
        path: "/v1/agents/{agent}/acp",
        schema: "RfdStreamEvent",
        events: &["message"],
        about: "One event of an RFD connection or session stream: `message`, `data` one \
                JSON-RPC object.",
    },
    SseStream {
        path: "/v1/fs/watch",
        schema: "FsWatchEvent",
        events: &["ready", "change", "overflow", "error"],
        about: "One event of a watch stream: `ready` (no `id`; `data` `{\"path\",\"recursive\"}`), \
                `change` (`id` the change's number in the stream, from 1; `data` a WatchChange), \
                `overflow` (no `id`; `data` `{\"reason\"}`: changes were lost, rescan) or `error` \
                (no `id`; `data` a problem; the stream ends).",
    },
    SseStream {
        path: "/opencode/event",
        schema: "OpencodeStreamEvent",
        events: &["message"],
        about: "One event of OpenCode's event stream: `data` one event `{type, properties}` \
                (`server.connected` first, then `server.heartbeat` and the sessions' events).",
    },
    SseStream {
        path: "/opencode/global/event",
        schema: "OpencodeGlobalStreamEvent",
        events: &["message"],
        about: "One event of OpenCode's global event stream: `data` `{directory, payload}`, the \
                payload one event `{type, properties}`.",
    },
    SseStream {
        path: "/v1/processes/{id}/logs",
        schema: "ProcessLogEvent",
        events: &["log", "gap"],
        about: "One event of a process's follow stream: `log` (`id` the entry's `sequence`, \
                `data` a ProcessLogEntry) or `gap` (no `id`; `data` `{\"from\",\"to\"}`, \
                the output dropped before this reader got it).",
    },
];

fn sse_event_schema(events: &[&str], about: &str) -> RefOr<utoipa::openapi::schema::Schema> {
    let string = || ObjectBuilder::new().schema_type(Type::String);
    ObjectBuilder::new()
        .description(Some(about))
        .property("event", string().enum_values(Some(events.iter().copied())))
        .property("id", string())
        .property("data", string().content_media_type("application/json"))
        .required("event")
        .required("data")
        .into()
}

/// Adds what every operation shares: the bearer security scheme (required everywhere but `GET /`),
/// the edge's answers, and a problem+json body on every error answer that describes none.
fn finish(doc: &mut Document) {
    // A catch-all segment is `{*name}` in the router and `{name}` in OpenAPI (order kept).
    doc.paths.paths = std::mem::take(&mut doc.paths.paths)
        .into_iter()
        .map(|(k, v)| (k.replace("{*", "{"), v))
        .collect();
    let components = doc.components.get_or_insert_with(Default::default);
    components.security_schemes.insert(
        "bearerAuth".to_string(),
        SecurityScheme::Http(
            HttpBuilder::new()
                .scheme(HttpAuthScheme::Bearer)
                .description(Some(
                    "The daemon's token (`--token`, `--token-file`); required on every `/v1` \
                     route when one is configured.",
                ))
                .build(),
        ),
    );
    components.security_schemes.insert(
        "accessTokenQuery".to_string(),
        SecurityScheme::ApiKey(ApiKey::Query(ApiKeyValue::with_description(
            "access_token",
            "The same token as `?access_token=`, accepted only on a WebSocket upgrade (`GET` \
             with `Upgrade: websocket`) of the routes that serve WebSockets, because a browser's \
             WebSocket cannot send headers; refused (401) on every other request.",
        ))),
    );
    for edge in EDGE_RESPONSES {
        let mut response = problem_response(edge.description);
        for (header, about) in edge.headers {
            response.headers.insert(
                header.to_string(),
                HeaderBuilder::new()
                    .schema(ObjectBuilder::new().schema_type(Type::String))
                    .description(Some(*about))
                    .build(),
            );
        }
        components
            .responses
            .insert(edge.name.to_string(), RefOr::T(response));
    }
    doc.security = Some(vec![SecurityRequirement::new(
        "bearerAuth",
        Vec::<String>::new(),
    )]);
    for s in SSE_STREAMS {
        components
            .schemas
            .insert(s.schema.to_string(), sse_event_schema(s.events, s.about));
    }
    for (path, item) in doc.paths.paths.iter_mut() {
        if let Some(stream) = SSE_STREAMS.iter().find(|s| s.path == path)
            && let Some(RefOr::T(ok)) = item
                .get
                .as_mut()
                .and_then(|g| g.responses.responses.get_mut("200"))
            && let Some(content) = ok.content.get_mut("text/event-stream")
        {
            content.schema = Some(Ref::from_schema_name(stream.schema).into());
        }
        let open = !super::auth::needs_token(path);
        let operations = [
            &mut item.get,
            &mut item.put,
            &mut item.post,
            &mut item.delete,
            &mut item.options,
            &mut item.head,
            &mut item.patch,
            &mut item.trace,
        ];
        for op in operations.into_iter().flatten() {
            finish_operation(op, open);
        }
        if super::auth::WEBSOCKET_ROUTES.contains(&path.as_str())
            && let Some(get) = item.get.as_mut()
        {
            // Either requirement satisfies: the header, or on an upgrade the query token.
            get.security = Some(vec![
                SecurityRequirement::new("bearerAuth", Vec::<String>::new()),
                SecurityRequirement::new("accessTokenQuery", Vec::<String>::new()),
            ]);
        }
    }
}

fn finish_operation(op: &mut Operation, open: bool) {
    if open {
        // An empty list overrides the document-wide requirement: no authentication.
        op.security = Some(Vec::new());
    }
    let responses = &mut op.responses.responses;
    for edge in EDGE_RESPONSES {
        if open && edge.status == "401" {
            continue;
        }
        if !responses.contains_key(edge.status) {
            responses.insert(
                edge.status.to_string(),
                RefOr::Ref(Ref::from_response_name(edge.name)),
            );
        }
    }
    for (status, response) in responses.iter_mut() {
        let is_error = status.starts_with('4') || status.starts_with('5');
        if let RefOr::T(r) = response
            && is_error
            && r.content.is_empty()
        {
            r.content
                .insert(PROBLEM_JSON.to_string(), problem_content());
        }
    }
}

fn problem_content() -> utoipa::openapi::Content {
    ContentBuilder::new()
        .schema(Some(Ref::from_schema_name("Problem")))
        .build()
}

fn problem_response(description: &str) -> ApiResponse {
    ResponseBuilder::new()
        .description(description)
        .content(PROBLEM_JSON, problem_content())
        .build()
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    /// Every route goes through `OpenApiRouter::routes(routes!(…))`, so it cannot be served
    /// without being documented. A plain axum registration in `src/http` would be such a route;
    /// one that must stay out of the document (a static page, say) carries an
    /// `openapi-exempt: <reason>` comment on its line or the line before.
    #[test]
    fn no_route_is_registered_outside_the_document() {
        // Spelled in pieces so that this test does not find itself.
        let forbidden = [
            [".", "route("].concat(),
            [".", "route_service("].concat(),
            [".", "nest("].concat(),
            [".", "nest_service("].concat(),
            ["axum::", "routing::"].concat(),
        ];
        let exempt = ["openapi", "-exempt:"].concat();
        let mut found = Vec::new();
        let mut stack = vec![Path::new(env!("CARGO_MANIFEST_DIR")).join("src/http")];
        while let Some(dir) = stack.pop() {
            for entry in std::fs::read_dir(&dir).unwrap().flatten() {
                let path = entry.path();
                if path.is_dir() {
                    stack.push(path);
                    continue;
                }
                if path.extension().is_none_or(|e| e != "rs") {
                    continue;
                }
                let text = std::fs::read_to_string(&path).unwrap();
                let lines: Vec<&str> = text.lines().collect();
                for (i, line) in lines.iter().enumerate() {
                    let exempted =
                        line.contains(&exempt) || (i > 0 && lines[i - 1].contains(&exempt));
                    if !exempted && forbidden.iter().any(|f| line.contains(f.as_str())) {
                        found.push(format!("{}:{}: {}", path.display(), i + 1, line.trim()));
                    }
                }
            }
        }
        assert!(
            found.is_empty(),
            "routes registered without an OpenAPI description (use `OpenApiRouter::routes(\
             routes!(handler))` with `#[utoipa::path]` on the handler; see docs/api.md):\n{}",
            found.join("\n")
        );
    }

    /// The routes whose upgrade takes the query token are documented with a GET that says so.
    #[test]
    fn websocket_routes_are_documented_with_the_query_token() {
        let doc = serde_json::to_value(super::document()).unwrap();
        for path in crate::http::auth::WEBSOCKET_ROUTES {
            let security = &doc["paths"][path]["get"]["security"];
            assert_eq!(
                security,
                &serde_json::json!([{"bearerAuth": []}, {"accessTokenQuery": []}]),
                "{path}"
            );
        }
        assert_eq!(
            doc["components"]["securitySchemes"]["accessTokenQuery"]["in"],
            "query"
        );
    }

    /// The document is the same bytes on every call (the checked-in file relies on it).
    #[test]
    fn document_is_deterministic() {
        let a = serde_json::to_vec_pretty(&super::document()).unwrap();
        let b = serde_json::to_vec_pretty(&super::document()).unwrap();
        assert_eq!(a, b);
    }
}
