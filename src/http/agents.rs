//! `/v1/agents`: the known agents with install and runtime status, and explicit installs. An
//! install request waits for the install (there is one per agent at a time) and answers with the
//! artifacts and where they came from.

use axum::Json;
use axum::body::Bytes;
use axum::extract::{Path, State};
use serde::{Deserialize, Serialize};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::wire::agents::{AgentStatus, InstallOutcome};
use super::{AppState, Problem};
use crate::agents::{AgentError, InstallRequest};

pub fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(list))
        .routes(routes!(one))
        .routes(routes!(install))
}

/// One agent: its install status and how many of its processes the proxy runs.
#[derive(Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct AgentInfo {
    #[serde(flatten)]
    status: AgentStatus,
    server_status: ServerStatus,
}

#[derive(Serialize, utoipa::ToSchema)]
#[schema(as = AgentServerStatus)]
pub struct ServerStatus {
    /// Agent processes of this agent running now.
    running: usize,
    /// `running` when at least one runs.
    #[schema(value_type = String, pattern = "^(running|stopped)$")]
    status: &'static str,
}

#[derive(Serialize, utoipa::ToSchema)]
pub struct AgentList {
    agents: Vec<AgentInfo>,
    /// Present when `limit` was given and the page is full: pass it as `cursor` for the next.
    #[serde(rename = "nextCursor", skip_serializing_if = "Option::is_none")]
    next_cursor: Option<String>,
}

fn with_server_status(state: &AppState, status: crate::agents::AgentStatus) -> AgentInfo {
    let running = running_instances(state, &status.id);
    AgentInfo {
        status: status.into(),
        server_status: ServerStatus {
            running,
            status: if running > 0 { "running" } else { "stopped" },
        },
    }
}

/// How many agent processes of this agent the proxy runs now.
fn running_instances(state: &AppState, agent: &str) -> usize {
    state.acp.running_count(agent)
}

/// Every known agent (built in and from the agents file) with install and runtime status.
#[utoipa::path(
    get,
    path = "/v1/agents",
    operation_id = "listAgents",
    tag = "agents",
    params(
        ("limit" = Option<u32>, Query, description = "At most this many agents (1..=1000), by \
            id; without it, every agent", minimum = 1, maximum = 1000),
        ("cursor" = Option<String>, Query, description = "The `nextCursor` of the page before, \
            unchanged"),
    ),
    responses(
        (status = 200, description = "Every known agent (or one page, by id)", body = AgentList),
        (status = 400, description = "A bad `limit` or `cursor`"),
    ),
)]
async fn list(
    State(state): State<AppState>,
    axum::extract::Query(q): axum::extract::Query<std::collections::HashMap<String, String>>,
) -> Result<Json<AgentList>, Problem> {
    let page = super::paging::Page::from_query(&q)?;
    let agents: Vec<AgentInfo> = state
        .agents
        .statuses()
        .into_iter()
        .map(|s| with_server_status(&state, s))
        .collect();
    let (agents, next_cursor) = page.slice(agents, |a| a.status.id.clone());
    Ok(Json(AgentList {
        agents,
        next_cursor,
    }))
}

/// One known agent.
#[utoipa::path(
    get,
    path = "/v1/agents/{agent}",
    operation_id = "getAgent",
    tag = "agents",
    params(("agent" = String, Path, description = "Agent id (e.g. `claude`, `mock`)")),
    responses(
        (status = 200, description = "The agent", body = AgentInfo),
        (status = 404, description = "No such agent"),
    )
)]
async fn one(
    State(state): State<AppState>,
    Path(agent): Path<String>,
) -> Result<Json<AgentInfo>, Problem> {
    let status = state
        .agents
        .status(&agent)
        .ok_or_else(|| Problem::not_found(format!("unknown agent `{agent}`")))?;
    Ok(Json(with_server_status(&state, status)))
}

/// Install options; every member is optional, and so is the body.
#[derive(Debug, Default, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[schema(as = InstallRequest)]
struct InstallBody {
    /// Install again even when installed.
    #[serde(default)]
    reinstall: bool,
    /// Version of the native CLI, for agents that install one separately.
    #[serde(default)]
    #[schema(min_length = 1)]
    agent_version: Option<String>,
    /// Version of the ACP agent process.
    #[serde(default)]
    #[schema(min_length = 1)]
    agent_process_version: Option<String>,
}

/// Installs an agent (or checks that it is installed) and waits for the install to finish.
#[utoipa::path(
    post,
    path = "/v1/agents/{agent}/install",
    operation_id = "installAgent",
    tag = "agents",
    params(("agent" = String, Path, description = "Agent id (e.g. `claude`, `mock`)")),
    request_body(content = Option<InstallBody>, content_type = "application/json",
        description = "Optional; no body (or an empty one) means defaults",
        example = json!({"reinstall": false})),
    responses(
        (status = 200, description = "Installed (or already installed): the artifacts and where \
            they came from", body = InstallOutcome,
            example = json!({"alreadyInstalled": false, "already_installed": false,
                "source": "registry", "version": "0.4.1", "artifacts": [{"kind": "agent_process",
                "path": "/var/lib/sandbox-agent/agents/claude/0.4.1/node_modules/.bin/claude-agent-acp",
                "version": "0.4.1", "source": "registry"}]})),
        (status = 400, description = "Invalid body or version pin"),
        (status = 404, description = "No such agent"),
        (status = 409, description = "Not installed and `--require-preinstall` is set; \
            `installCommand` says how to install it",
            body = super::openapi::ProblemSchema, content_type = "application/problem+json",
            example = json!({"type": "urn:sandbox-agent:problem:agent-not-installed",
                "title": "Agent Not Installed", "status": 409,
                "detail": "agent `claude` is not installed and installs at run time are \
                    disabled; run `sandbox-agent agents install claude`",
                "agent": "claude", "installCommand": "sandbox-agent agents install claude"})),
        (status = 502, description = "The install failed (download, checksum, npm); `detail` \
            says why"),
    )
)]
async fn install(
    State(state): State<AppState>,
    Path(agent): Path<String>,
    body: Bytes,
) -> Result<Json<InstallOutcome>, Problem> {
    if !state.agents.is_known(&agent) {
        return Err(Problem::not_found(format!("unknown agent `{agent}`")));
    }
    // No body (or an empty one) means defaults: the npm client posts without a body.
    let body: InstallBody = if body.iter().all(u8::is_ascii_whitespace) {
        InstallBody::default()
    } else {
        serde_json::from_slice(&body)
            .map_err(|e| Problem::bad_request(format!("invalid install request body: {e}")))?
    };
    let blank = |v: &Option<String>| v.as_deref().is_some_and(|s| s.trim().is_empty());
    if blank(&body.agent_version) || blank(&body.agent_process_version) {
        return Err(Problem::bad_request("a version pin must not be empty"));
    }
    // With --require-preinstall nothing is installed at run time; an installed agent still
    // answers (idempotently) so clients can check it.
    let would_install = body.reinstall
        || body.agent_version.is_some()
        || body.agent_process_version.is_some()
        || state.agents.status(&agent).is_some_and(|s| !s.installed);
    if state.config.require_preinstall && would_install {
        return Err(AgentError::PreinstallRequired {
            command: crate::agents::install_command(&agent),
            agent,
        }
        .into());
    }
    let outcome = state
        .agents
        .install(
            &agent,
            InstallRequest {
                reinstall: body.reinstall,
                agent_version: body.agent_version,
                agent_process_version: body.agent_process_version,
            },
        )
        .await?;
    Ok(Json(outcome.into()))
}
