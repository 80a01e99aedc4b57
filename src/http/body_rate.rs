//! The minimum body rate (`--body-min-rate`) for every request body the routes read whole: the
//! JSON bodies (config entries, processes, agents' install, file moves, the RFD transport's POST).
//! A body sent a byte at a time is never silent long enough for the connection's idle timeout,
//! so without this it could hold its connection (and the handler's buffer) as long as the client
//! likes. Past a grace of `--idle-timeout` the body must average `--body-min-rate` bytes per
//! second; a body that falls behind ends with an error, and `edge` answers the request 408.
//!
//! The routes that stream or budget their bodies themselves apply the same rule on their own:
//! `POST /v1/acp/{serverId}` (`http/acp.rs`), `PUT /v1/fs/file` and `POST /v1/fs/upload-batch`
//! (`files/body.rs`). A request without a body (every GET, a `Content-Length: 0`) is not wrapped,
//! so it costs nothing.

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::Body;
use axum::extract::Request;
use axum::http::{Method, header};
use tokio::time::{Instant, Sleep};

use super::error::Problem;

/// Set when the body fell behind the rate: the request is then answered 408, whatever the
/// handler made of the cut body (an extractor's 400, typically).
#[derive(Clone, Default)]
pub(crate) struct Tripped(Arc<AtomicBool>);

impl Tripped {
    pub(crate) fn is_set(&self) -> bool {
        self.0.load(Ordering::Acquire)
    }
}

/// Whether the edge wraps this request's body: it has one, the rate is on, and its route does
/// not apply the rule itself.
pub(crate) fn applies(req: &Request, min_rate: u64) -> bool {
    use http_body::Body as _;
    if min_rate == 0 || req.body().is_end_stream() {
        return false;
    }
    let path = req.uri().path();
    let own = match *req.method() {
        Method::POST => path.starts_with("/v1/acp/") || path == "/v1/fs/upload-batch",
        Method::PUT => path == "/v1/fs/file",
        _ => false,
    };
    !own
}

/// Replaces the request's body by one that ends with an error once it falls behind the rate.
pub(crate) fn wrap(req: Request, grace: Duration, min_rate: u64) -> (Request, Tripped) {
    let tripped = Tripped::default();
    let (parts, inner) = req.into_parts();
    let body = RateBody {
        inner,
        started: Instant::now(),
        grace,
        min_rate,
        received: 0,
        timer: None,
        tripped: tripped.clone(),
    };
    (Request::from_parts(parts, Body::new(body)), tripped)
}

/// The answer to a body that fell behind.
pub(crate) fn too_slow(min_rate: u64) -> Problem {
    crate::metrics::refused(crate::metrics::Limit::BodyMinRate);
    Problem::new(
        axum::http::StatusCode::REQUEST_TIMEOUT,
        format!(
            "the body arrived slower than the minimum of {min_rate} bytes per second \
             (--body-min-rate, after a grace of --idle-timeout)"
        ),
    )
    .with("minRate", min_rate)
    .header(header::CONNECTION, "close")
}

struct RateBody {
    inner: Body,
    started: Instant,
    grace: Duration,
    min_rate: u64,
    received: u64,
    /// Armed only while the body waits for bytes; moved, not re-created, as bytes arrive.
    timer: Option<Pin<Box<Sleep>>>,
    tripped: Tripped,
}

#[derive(Debug)]
struct BodyTooSlow;

impl std::fmt::Display for BodyTooSlow {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("the request body arrived slower than --body-min-rate")
    }
}

impl std::error::Error for BodyTooSlow {}

impl http_body::Body for RateBody {
    type Data = bytes::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        let this = &mut *self;
        if this.tripped.is_set() {
            return Poll::Ready(Some(Err(axum::Error::new(BodyTooSlow))));
        }
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref() {
                    this.received += data.len() as u64;
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Pending => {
                let due = crate::files::rate_deadline(
                    this.started,
                    this.grace,
                    this.received,
                    this.min_rate,
                )
                .unwrap_or_else(|| this.started + Duration::from_secs(1 << 32));
                let timer = this
                    .timer
                    .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(due)));
                if timer.deadline() != due {
                    timer.as_mut().reset(due);
                }
                if timer.as_mut().poll(cx).is_ready() {
                    this.tripped.0.store(true, Ordering::Release);
                    return Poll::Ready(Some(Err(axum::Error::new(BodyTooSlow))));
                }
                Poll::Pending
            }
            other => other,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(method: Method, path: &str, body: Body) -> Request {
        Request::builder()
            .method(method)
            .uri(path)
            .body(body)
            .unwrap()
    }

    #[test]
    fn only_bodies_of_routes_without_their_own_rule_are_wrapped() {
        let some = || Body::from("{}");
        assert!(applies(
            &request(Method::PUT, "/v1/config/mcp", some()),
            1024
        ));
        assert!(applies(
            &request(Method::POST, "/v1/agents/mock/acp", some()),
            1024
        ));
        assert!(!applies(&request(Method::PUT, "/v1/config/mcp", some()), 0));
        assert!(!applies(&request(Method::POST, "/v1/acp/s1", some()), 1024));
        assert!(!applies(&request(Method::PUT, "/v1/fs/file", some()), 1024));
        assert!(!applies(
            &request(Method::POST, "/v1/fs/upload-batch", some()),
            1024
        ));
        assert!(!applies(
            &request(Method::GET, "/v1/health", Body::empty()),
            1024
        ));
    }

    #[tokio::test(start_paused = true)]
    async fn a_trickled_body_trips_after_the_grace_and_a_fast_one_does_not() {
        // A body that never ends: 1 byte, then silence. Grace 1 s, 1000 B/s: due at ~1.001 s.
        let (tx, rx) = tokio::sync::mpsc::channel::<Result<bytes::Bytes, std::io::Error>>(4);
        tx.send(Ok(bytes::Bytes::from_static(b"x"))).await.unwrap();
        let stream = tokio_stream::wrappers::ReceiverStream::new(rx);
        let req = request(Method::PUT, "/v1/config/mcp", Body::from_stream(stream));
        let (req, tripped) = wrap(req, Duration::from_secs(1), 1000);
        let started = Instant::now();
        let err = axum::body::to_bytes(req.into_body(), usize::MAX)
            .await
            .unwrap_err();
        assert!(tripped.is_set(), "{err}");
        let took = started.elapsed();
        assert!(
            took >= Duration::from_secs(1) && took < Duration::from_millis(1100),
            "{took:?}"
        );
        drop(tx);

        let req = request(Method::PUT, "/v1/config/mcp", Body::from(vec![b'y'; 4096]));
        let (req, tripped) = wrap(req, Duration::from_secs(1), 1000);
        let body = axum::body::to_bytes(req.into_body(), usize::MAX)
            .await
            .unwrap();
        assert_eq!(body.len(), 4096);
        assert!(!tripped.is_set());
    }
}
