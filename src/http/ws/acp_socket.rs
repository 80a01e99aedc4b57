//! The ACP face: `GET /v1/acp/{serverId}` with `Upgrade: websocket` (our own endpoint,
//! resumable with `?lastEventId=`, `?agent=` to create the instance), checked before the upgrade.

use axum::http::Uri;
use axum::response::{IntoResponse, Response};

use super::{SocketPlan, Upgrade, UpgradeRejection, run_socket};
use crate::http::{AppState, Problem};

#[derive(Default, serde::Deserialize)]
struct SocketQuery {
    agent: Option<String>,
    #[serde(rename = "lastEventId")]
    last_event_id: Option<String>,
}

fn parse_query(uri: &Uri) -> Result<(Option<String>, Option<u64>), Problem> {
    let q = match uri.query() {
        None => SocketQuery::default(),
        Some(_) => {
            axum::extract::Query::<SocketQuery>::try_from_uri(uri)
                .map_err(|e| Problem::bad_request(format!("bad query string: {e}")))?
                .0
        }
    };
    let last = match q.last_event_id {
        None => None,
        Some(v) => Some(
            v.trim()
                .parse::<u64>()
                .map_err(|_| Problem::bad_request("lastEventId must be a non-negative integer"))?,
        ),
    };
    Ok((q.agent.filter(|a| !a.is_empty()), last))
}

/// `GET /v1/acp/{serverId}` with `Upgrade: websocket`. Everything that can fail is checked before
/// the upgrade, so that it is answered as problem+json.
pub async fn acp_socket(
    st: AppState,
    server_id: String,
    uri: Uri,
    upgrade: Result<Upgrade, UpgradeRejection>,
    hold: Option<crate::http::StreamHold>,
) -> Response {
    let upgrade = match upgrade {
        Ok(u) => u,
        Err(e) => {
            return Problem::bad_request(format!("bad WebSocket upgrade: {e}"))
                .with("serverId", server_id)
                .into_response();
        }
    };
    let (agent, last_event_id) = match parse_query(&uri) {
        Ok(q) => q,
        Err(p) => return p.with("serverId", server_id).into_response(),
    };
    if let Some(agent) = &agent
        && let Err(e) = st.acp.open(&server_id, Some(agent))
    {
        return Problem::from(e).into_response();
    }
    let sub = match st.acp.subscribe(&server_id, last_event_id) {
        Ok(s) => s,
        Err(e) => return Problem::from(e).into_response(),
    };
    let plan = SocketPlan {
        server_id,
        sub,
        after: last_event_id.unwrap_or(0),
        gap_notifications: true,
        connection: None,
        hold,
    };
    upgrade.on_upgrade(&st.clone(), move |socket| run_socket(socket, st, plan))
}
