//! `GET /metrics`: the daemon's figures for Prometheus (`crate::metrics`), behind the token like
//! every `/v1` route.

use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, header};
use axum::response::{IntoResponse, Response};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::AppState;
use crate::metrics::scrape::{self, Live};

pub fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new().routes(routes!(metrics))
}

/// The daemon's metrics: the Prometheus text format (0.0.4), or OpenMetrics 1.0 when `Accept`
/// names `application/openmetrics-text` (as Prometheus does). Every name, type and label is
/// listed in docs/operations.md ("Metrics").
#[utoipa::path(
    get,
    path = "/metrics",
    operation_id = "getMetrics",
    tag = "meta",
    responses(
        (status = 200, description = "The figures, in the Prometheus text format or OpenMetrics",
            content(
                (String = "text/plain; version=0.0.4; charset=utf-8"),
                (String = "application/openmetrics-text; version=1.0.0; charset=utf-8"),
            )),
    )
)]
async fn metrics(State(st): State<AppState>, headers: HeaderMap) -> Response {
    let openmetrics = headers
        .get_all(header::ACCEPT)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .any(|v| v.contains("application/openmetrics-text"));
    let mut live = Live {
        instances: st.acp.status_counts(),
        sse_subscribers: st.acp.subscribers_budget().used(),
        instance_figures: crate::metrics::sampled(),
        ..Live::default()
    };
    // Drop the series of an instance that went since the last sample.
    let present = st.acp.server_ids();
    live.instance_figures
        .retain(|f| present.binary_search(&f.server_id).is_ok());
    for p in st.processes.states() {
        live.processes[usize::from(!p)] += 1;
    }
    let text = crate::sys::blocking(move || scrape::encode(live, openmetrics)).await;
    let content_type = if openmetrics {
        scrape::OPENMETRICS
    } else {
        scrape::PROMETHEUS_TEXT
    };
    let mut resp = text.into_response();
    resp.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    resp
}
