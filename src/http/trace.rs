//! Traces of the ACP envelopes every face sends (`POST /v1/acp/{serverId}`, the RFD transport's
//! POST, the ACP WebSocket): the request's `acp <method>` span and the context handed to the
//! agent in `params._meta.traceparent` (docs/observability.md, "Traces"). Nothing is made while
//! traces are off.

use crate::acp::{self, AcpError, Delivered, Kind};

use super::AppState;

/// `AcpService::post` inside the request's ACP span (see [`trace_request`]), which records how
/// the request ended: `ok` (the agent answered), `accepted` (written; the answer goes to the
/// stream), else the kind of failure.
pub(crate) async fn post_traced(
    st: &AppState,
    server_id: &str,
    agent: Option<&str>,
    envelope: acp::Envelope,
    respond_async: bool,
    header_parent: bool,
) -> Result<Delivered, AcpError> {
    let (envelope, span) = trace_request(st, envelope, server_id, agent, header_parent);
    if span.is_none() {
        return st.acp.post(server_id, agent, envelope, respond_async).await;
    }
    use tracing::Instrument;
    let posted = st
        .acp
        .post(server_id, agent, envelope, respond_async)
        .instrument(span.clone())
        .await;
    match &posted {
        Ok(Delivered::Response { .. }) => crate::telemetry::acp_done(&span, "ok", false),
        Ok(Delivered::Accepted) => crate::telemetry::acp_done(&span, "accepted", false),
        Err(e) => crate::telemetry::acp_done(&span, failure(e), true),
    }
    posted
}

/// How a failed ACP request is named on its span (`acp.outcome`).
pub(crate) fn failure(e: &AcpError) -> &'static str {
    match e {
        AcpError::Timeout { .. } => "timeout",
        AcpError::AgentGone { .. } | AcpError::Gone { .. } => "agent_gone",
        AcpError::Capacity { .. } => "refused",
        AcpError::DuplicateId { .. } => "duplicate_id",
        _ => "error",
    }
}

/// While traces are on, a request gets its span (POST to answer) and the agent gets the span's
/// context as `params._meta.traceparent`; otherwise the envelope goes on untouched. Every face
/// that sends envelopes uses it (this route, the RFD transport, the WebSocket). The span names
/// the instance's agent (`agent` only names it for the first POST, which creates the instance);
/// `header_parent`: the request carried a `traceparent` header, whose trace then wins over one
/// in the envelope's `_meta`.
pub(crate) fn trace_request(
    st: &AppState,
    mut envelope: acp::Envelope,
    server_id: &str,
    agent: Option<&str>,
    header_parent: bool,
) -> (acp::Envelope, tracing::Span) {
    if !crate::telemetry::enabled() || !matches!(envelope.kind, Kind::Request { .. }) {
        return (envelope, tracing::Span::none());
    }
    let agent = match st.acp.get(server_id) {
        Some(inst) => inst.agent.clone(),
        None => agent.unwrap_or_default().to_string(),
    };
    let (line, span) =
        crate::telemetry::acp_request(&envelope.line, header_parent, server_id, &agent);
    if let Some(line) = line {
        envelope.line = line;
    }
    (envelope, span)
}
