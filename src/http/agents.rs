//! `/v1/agents`: the known agents with install and runtime status, and explicit installs. An
//! install request waits for the install (there is one per agent at a time) and answers with the
//! artifacts and where they came from.

use axum::Json;
use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::routing::{get, post};
use serde::Deserialize;
use serde_json::{Value, json};

use super::{AppState, Problem};
use crate::agents::{AgentError, AgentStatus, InstallRequest};

pub fn routes() -> Router<AppState> {
    Router::new()
        .route("/v1/agents", get(list))
        .route("/v1/agents/{agent}", get(one))
        .route("/v1/agents/{agent}/install", post(install))
}

fn with_server_status(state: &AppState, status: AgentStatus) -> Value {
    let running = running_instances(state, &status.id);
    let mut v = serde_json::to_value(status).unwrap_or_default();
    v["serverStatus"] = json!({
        "running": running,
        "status": if running > 0 { "running" } else { "stopped" },
    });
    v
}

/// How many agent processes of this agent the proxy runs now.
fn running_instances(state: &AppState, agent: &str) -> usize {
    state.acp.running_count(agent)
}

async fn list(State(state): State<AppState>) -> Json<Value> {
    let agents: Vec<Value> = state
        .agents
        .statuses()
        .into_iter()
        .map(|s| with_server_status(&state, s))
        .collect();
    Json(json!({ "agents": agents }))
}

async fn one(
    State(state): State<AppState>,
    Path(agent): Path<String>,
) -> Result<Json<Value>, Problem> {
    let status = state
        .agents
        .status(&agent)
        .ok_or_else(|| Problem::not_found(format!("unknown agent `{agent}`")))?;
    Ok(Json(with_server_status(&state, status)))
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct InstallBody {
    #[serde(default)]
    reinstall: bool,
    #[serde(default)]
    agent_version: Option<String>,
    #[serde(default)]
    agent_process_version: Option<String>,
}

async fn install(
    State(state): State<AppState>,
    Path(agent): Path<String>,
    body: Bytes,
) -> Result<Json<Value>, Problem> {
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
    Ok(Json(serde_json::to_value(outcome).unwrap_or_default()))
}
