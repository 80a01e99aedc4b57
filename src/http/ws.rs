//! WebSocket faces of an ACP instance: `GET /v1/acp/{serverId}` with `Upgrade: websocket` (our
//! own endpoint, resumable with `?lastEventId=`) and the socket of the RFD transport's WebSocket
//! profile, over HTTP/1.1 or as an HTTP/2 extended CONNECT (RFC 8441). Both are framing only: the
//! client frames one read brought go to `AcpService::post_batch` together (never waiting, so
//! responses become events), and the instance's event log is written out frame by frame, flushed
//! once per wake-up. **Invariant:** client frames reach the agent in the order received; event
//! frames leave in log order with no frame of the log skipped silently (a gap is announced); a
//! socket whose reader fell behind is closed and its queue dropped, even while a write to it is
//! blocked.
//!
//! Where things are: this file tells an upgrade request apart and registers the HTTP/2 form;
//! `upgrade.rs` is our upgrade extractor and the socket it makes, `meter.rs` the frame meter every
//! read goes through, `acp_socket.rs` our own face (`/v1/acp/{serverId}`; the RFD profile's face is
//! `http/rfd.rs`), `socket.rs` the serving of one socket that both faces share.

use axum::http::{HeaderMap, Method, header};

mod acp_socket;
mod meter;
mod socket;
mod upgrade;

pub use acp_socket::acp_socket;
pub use meter::{MeterReport, Metered, Refusal};
pub use socket::{SocketPlan, run_socket};
pub use upgrade::{Socket, Upgrade, UpgradeRejection};

use super::AppState;

/// True when the request asks for a WebSocket: HTTP/1.1 `Upgrade: websocket`, or an HTTP/2
/// extended CONNECT (RFC 8441; the routes accept CONNECT for nothing else, and the upgrade
/// extractor checks its `:protocol`).
pub fn wants_upgrade(method: &Method, headers: &HeaderMap) -> bool {
    if method == Method::CONNECT {
        return true;
    }
    headers
        .get_all(header::UPGRADE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|p| p.trim().eq_ignore_ascii_case("websocket"))
}

/// The HTTP/2 form of a WebSocket upgrade (RFC 8441 extended CONNECT) for `handler`, a GET
/// route's handler, registered beside the GET. OpenAPI has no CONNECT operation; the GET's
/// description documents it (openapi-exempt: CONNECT cannot be described).
pub fn on_connect<H, T>(handler: H) -> axum::routing::MethodRouter<AppState>
where
    H: axum::handler::Handler<T, AppState>,
    T: 'static,
{
    // openapi-exempt: see above.
    axum::routing::on(axum::routing::MethodFilter::CONNECT, handler)
}
