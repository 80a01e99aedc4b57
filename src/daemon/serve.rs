//! The accept loop and the per-connection driver: HTTP/1.1 and HTTP/2 with prior knowledge (h2c) on
//! one port, upgrades (WebSocket) enabled, served by hyper (`protocol.rs` tells the two apart) with
//! axum's router as the service. **Invariants:** a request head not complete within
//! `header_read_timeout` of its first byte closes the connection; a connection with no request in
//! flight and no bytes moved for `idle_timeout` (a fresh one that never sent anything included) is
//! closed; at most `max_connections` sockets are held at once. At the cap, the connection with no
//! request in flight that has been quiet longest is closed to admit the new one (idle sockets
//! cannot lock honest clients out); only when every held connection has a request in flight is a
//! socket refused, with a canned 503 that is never read but always arrives whole (the close lingers
//! until the client's request bytes are drained, so no reset cuts the answer). Under pressure
//! (three quarters of the cap held) a new connection that sends nothing is closed after
//! `FRESH_UNDER_PRESSURE`. A request head is at most `MAX_HEAD_BYTES` (431 above). An accept error
//! from descriptor or memory exhaustion backs off instead of spinning. Timeouts never apply to a
//! request in flight, so SSE streams and long POSTs keep working. A panic in a handler becomes a
//! plain 500 problem (the panic hook logged it once) and the connection goes on.
//!
//! One concern although over 800 lines: the cap, the idle and head timeouts and the eviction at
//! the cap all read and write the same per-connection activity record, so they stay together.

use std::convert::Infallible;
use std::io;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::Request;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use futures_util::FutureExt;
use futures_util::task::AtomicWaker;
use hyper::body::Incoming;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::http::guard::{ConnAddrs, LocalAddr, needs_conn_addrs};
use crate::http::{Problem, StreamHold};

use super::protocol::Protocols;

/// The connection-level limits (from `Config`).
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// From the first byte of a request (on a new or a kept-alive connection) until its head is
    /// complete.
    pub header_read_timeout: Duration,
    /// How long a connection with no request in flight may stay silent.
    pub idle_timeout: Duration,
    /// Open sockets held at once (upgraded ones included).
    pub max_connections: usize,
}

/// The largest request head (request line and headers) read: HTTP/1.1 answers 431 above it,
/// HTTP/2 refuses the header list. Without it, hyper bounds a head only by its read buffer
/// (about 400 KiB by default, ours `protocol::READ_BUFFER_MAX`), which a few hundred
/// connections sending slow heads could turn into hundreds of MB.
pub const MAX_HEAD_BYTES: usize = 64 << 10;

/// Under pressure, how long a new connection may stay silent before it is closed.
pub const FRESH_UNDER_PRESSURE: Duration = Duration::from_secs(2);

/// At the cap, how long the accept loop waits for the slot of the idle connection it closed.
const EVICT_WAIT: Duration = Duration::from_millis(200);

/// Refused sockets whose close lingers (their request bytes read and discarded, for at most
/// `LINGER`) at once; past it a refused socket is closed at once.
const MAX_LINGERING: usize = 256;
const LINGER: Duration = Duration::from_secs(1);

/// The canned answer to a socket over the cap: written without reading anything, then closed.
const OVER_CAP: &[u8] = b"HTTP/1.1 503 Service Unavailable\r\n\
content-type: application/problem+json\r\n\
retry-after: 1\r\n\
connection: close\r\n\
content-length: 150\r\n\r\n\
{\"type\":\"urn:sandbox-agent:problem:service-unavailable\",\"title\":\"Service Unavailable\",\"status\":503,\"detail\":\"too many open connections; retry\"}";

/// Serves `app` on `listener` until `stop` is cancelled, then asks every connection to finish
/// gracefully (in-flight requests complete, idle keep-alives close). Connection tasks are
/// spawned on `tracker`, so the caller can wait for the drain with `tracker.wait()`.
pub async fn serve(
    listener: Arc<TcpListener>,
    app: Router,
    limits: Limits,
    stop: CancellationToken,
    tracker: TaskTracker,
) {
    let permits = Arc::new(Semaphore::new(limits.max_connections));
    let open = Arc::new(Open::default());
    let lingering = Arc::new(Semaphore::new(MAX_LINGERING));
    let protocols = Arc::new(Protocols::new(MAX_HEAD_BYTES));
    // The graceful stop reaches every connection through its flag, so that a connection's task
    // polls no shared cancellation future on every wake-up (see `Activity::attention`).
    {
        let (open, stop) = (open.clone(), stop.clone());
        tokio::spawn(async move {
            stop.cancelled().await;
            open.stop_all();
        });
    }
    let mut backoff = Backoff::default();
    let mut over_cap = Burst::default();
    loop {
        let accepted = tokio::select! {
            biased;
            _ = stop.cancelled() => break,
            r = listener.accept() => r,
        };
        let (stream, _peer) = match accepted {
            Ok(pair) => {
                backoff.reset();
                pair
            }
            Err(e) => {
                if backoff.pause(&e, &stop).await.is_err() {
                    break;
                }
                continue;
            }
        };
        let permit = match permits.clone().try_acquire_owned() {
            Ok(p) => Some(p),
            // At the cap: close the connection that has been quiet longest with nothing in
            // flight, and take its slot once its socket is gone.
            Err(_) if open.evict_quietest() => {
                tokio::time::timeout(EVICT_WAIT, permits.clone().acquire_owned())
                    .await
                    .ok()
                    .and_then(Result::ok)
            }
            Err(_) => None,
        };
        let Some(permit) = permit else {
            over_cap.hit(|| {
                tracing::warn!(
                    max_connections = limits.max_connections,
                    "connection cap reached with a request in flight on every connection; \
                     answering new connections 503 until some close"
                )
            });
            crate::metrics::refused(crate::metrics::Limit::MaxConnections);
            refuse(stream, &lingering);
            continue;
        };
        over_cap.end(|n| tracing::info!(refused = n, "below the connection cap again"));
        let pressure = permits.available_permits() < limits.max_connections / 4;
        // Nagle would hold a small SSE event back behind an unacknowledged one until the
        // client's delayed ACK (up to 40 ms on a real network).
        if let Err(e) = stream.set_nodelay(true) {
            tracing::debug!(error = %e, "cannot set TCP_NODELAY");
        }
        tracker.spawn(connection(
            stream,
            permit,
            Registered::new(&open, pressure),
            app.clone(),
            protocols.clone(),
            limits,
            stop.clone(),
        ));
    }
    // The caller holds the listener: at shutdown it drops it (the kernel stops completing
    // handshakes for us); a reload keeps it open across the exec, so connections wait in the
    // backlog.
}

/// Answers a socket over the cap with the canned 503. Its request may already be in the socket's
/// receive buffer, and closing a socket with unread data sends a reset that can destroy the
/// answer before the client reads it; so the write side is shut (FIN after the answer) and the
/// socket kept, reading and discarding, until the client closes or `LINGER` passes (at most
/// `MAX_LINGERING` such sockets; past that, closed at once).
fn refuse(stream: TcpStream, lingering: &Arc<Semaphore>) {
    // A fresh socket's send buffer takes the whole answer at once.
    let _ = stream.try_write(OVER_CAP);
    let Ok(slot) = lingering.clone().try_acquire_owned() else {
        return;
    };
    tokio::spawn(async move {
        let _slot = slot;
        let mut stream = stream;
        let _ = tokio::io::AsyncWriteExt::shutdown(&mut stream).await;
        let mut sink = [0u8; 4096];
        let mut left = 64usize << 10;
        let drain = async {
            while left > 0 {
                match tokio::io::AsyncReadExt::read(&mut stream, &mut sink).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => left = left.saturating_sub(n),
                }
            }
        };
        let _ = tokio::time::timeout(LINGER, drain).await;
    });
}

/// Every connection being served (not yet upgraded), for choosing which one to close at the cap.
#[derive(Default)]
struct Open {
    conns: std::sync::Mutex<std::collections::HashMap<u64, Arc<Activity>>>,
    next: AtomicU64,
}

impl Open {
    fn lock(&self) -> std::sync::MutexGuard<'_, std::collections::HashMap<u64, Arc<Activity>>> {
        // Held only to insert, remove or scan; a panic cannot leave the map inconsistent.
        crate::sys::lock(&self.conns)
    }

    /// Marks the connection with no request in flight that has been quiet longest for closing
    /// and wakes its driver; false when every connection has a request in flight.
    fn evict_quietest(&self) -> bool {
        let conns = self.lock();
        let victim = conns
            .values()
            .filter(|a| {
                a.in_flight.load(Ordering::Acquire) == 0 && !a.evict.load(Ordering::Relaxed)
            })
            .min_by_key(|a| a.quiet_since());
        match victim {
            Some(a) => {
                a.evict.store(true, Ordering::Release);
                a.attention.wake();
                true
            }
            None => false,
        }
    }

    /// Asks every connection to finish gracefully (the daemon is stopping).
    fn stop_all(&self) {
        for a in self.lock().values() {
            a.stopping.store(true, Ordering::Release);
            a.attention.wake();
        }
    }
}

/// A connection's entry in `Open`, removed when the driver returns (an upgraded socket leaves
/// the map then, keeping its slot under the cap).
struct Registered {
    open: Arc<Open>,
    id: u64,
    activity: Arc<Activity>,
}

impl Registered {
    fn new(open: &Arc<Open>, pressure: bool) -> Self {
        let activity = Arc::new(Activity::new(pressure));
        let id = open.next.fetch_add(1, Ordering::Relaxed);
        open.lock().insert(id, activity.clone());
        Registered {
            open: open.clone(),
            id,
            activity,
        }
    }
}

impl Drop for Registered {
    fn drop(&mut self) {
        self.open.lock().remove(&self.id);
    }
}

/// Drives one connection to its end, enforcing the header-read and idle timeouts.
async fn connection(
    stream: TcpStream,
    permit: OwnedSemaphorePermit,
    registered: Registered,
    app: Router,
    protocols: Arc<Protocols>,
    limits: Limits,
    stop: CancellationToken,
) {
    let activity = registered.activity.clone();
    // The guard needs the local address only to admit a Host naming it; a loopback one it
    // admits anyway, so a loopback connection's requests carry none (no extension map per request).
    let local = stream
        .local_addr()
        .ok()
        .filter(|a| !a.ip().is_loopback())
        .map(LocalAddr);
    let addrs = match (stream.peer_addr(), stream.local_addr()) {
        (Ok(peer), Ok(local)) => Some(ConnAddrs { peer, local }),
        _ => None,
    };
    let io = Tracked {
        inner: stream,
        activity: activity.clone(),
        _permit: permit,
    };
    let svc = {
        let activity = activity.clone();
        hyper::service::service_fn(move |mut req: Request<Incoming>| {
            let guard = activity.request_started();
            if let Some(local) = local {
                req.extensions_mut().insert(local);
            }
            if let Some(a) = addrs
                && needs_conn_addrs(req.uri().path())
            {
                req.extensions_mut().insert(a);
            }
            // Boxed: hyper keeps a slot of the service's future type for every HTTP/1
            // connection, in flight or not (~0.9 KiB for `handle` inline, 16 bytes boxed).
            Box::pin(handle(app.clone(), req, guard)) as HandleFuture
        })
    };
    // Registered before this check: a stop that came earlier is seen here, a later one sets
    // the flag (`Open::stop_all`).
    if stop.is_cancelled() {
        activity.stopping.store(true, Ordering::Release);
    }
    let conn = protocols.serve(io, svc);
    tokio::pin!(conn);
    let mut draining = false;
    // Set once the connection was told to close for a timeout; it gets this long to do so.
    let mut closing_by: Option<Instant> = None;
    // No wake-up per request: the watcher looks at least every `header_read_timeout` (and
    // `idle_timeout`), so a head clock or an idle clock that started since is never checked
    // later than its own deadline (see `Activity::verdict`).
    let mut first_check = limits.idle_timeout.min(limits.header_read_timeout);
    if activity.pressure {
        first_check = first_check.min(FRESH_UNDER_PRESSURE);
    }
    let timer = tokio::time::sleep(first_check);
    tokio::pin!(timer);
    loop {
        // Biased: the connection first (each of its wake-ups polls the two cheap branches too,
        // an atomic flag and a timer, but no lock and no random branch order).
        let stop_seen = draining;
        tokio::select! {
            biased;
            r = conn.as_mut() => {
                if let Err(e) = r {
                    // hyper answers a request head over the cap with 431 itself and ends the
                    // connection with this error: the one place to count that refusal.
                    if e.downcast_ref::<hyper::Error>().is_some_and(hyper::Error::is_parse_too_large) {
                        crate::metrics::refused(crate::metrics::Limit::RequestHead);
                    }
                    tracing::debug!(error = %e, "connection ended with an error");
                }
                return;
            }
            _ = std::future::poll_fn(|cx| activity.poll_attention(cx, stop_seen)) => {}
            _ = &mut timer => {}
        }
        if !draining && activity.stopping.load(Ordering::Acquire) {
            draining = true;
            conn.as_mut().graceful_shutdown();
        }
        if closing_by.is_some_and(|by| Instant::now() >= by) {
            return;
        }
        // Chosen to make room at the cap while nothing was in flight: closed at once (a request
        // that began since keeps it open; the accept loop then refuses instead).
        if activity.evict.load(Ordering::Acquire) {
            if activity.in_flight.load(Ordering::Acquire) == 0 {
                tracing::debug!("closing a quiet connection to admit a new one at the cap");
                return;
            }
            activity.evict.store(false, Ordering::Release);
        }
        let next = match activity.verdict(&limits) {
            Verdict::CheckAt(at) => at,
            verdict @ (Verdict::HeadTooSlow | Verdict::Idle) => {
                if closing_by.is_none() {
                    tracing::debug!(
                        slow_head = matches!(verdict, Verdict::HeadTooSlow),
                        "closing a connection: request head too slow, or idle"
                    );
                    // Nothing is in flight: h1 closes at once, h2 sends GOAWAY first.
                    draining = true;
                    conn.as_mut().graceful_shutdown();
                    closing_by = Some(Instant::now() + CLOSE_GRACE);
                }
                Instant::now() + CLOSE_GRACE
            }
        };
        let next = closing_by.map_or(next, |by| next.min(by));
        timer.as_mut().reset(next);
    }
}

/// How long a connection told to close for a timeout may take before it is dropped.
const CLOSE_GRACE: Duration = Duration::from_secs(1);

/// What the service returns per request (see `connection`).
type HandleFuture =
    Pin<Box<dyn std::future::Future<Output = Result<Response<GuardedBody>, Infallible>> + Send>>;

/// Calls the router, turning a panic into a plain 500 (the panic hook has logged it) and keeping
/// the in-flight guard alive until the response body is finished or dropped.
async fn handle(
    mut app: Router,
    mut req: Request<Incoming>,
    guard: InFlight,
) -> Result<Response<GuardedBody>, Infallible> {
    // An HTTP/2 CONNECT becomes a stream of its own (a WebSocket) once answered; hyper drops the
    // response body then, so the guard travels with the request instead and whoever serves the
    // stream holds it: the connection is never closed as idle under an open socket.
    let (guard, hold) = if req.method() == axum::http::Method::CONNECT
        && req.version() == axum::http::Version::HTTP_2
    {
        let hold = StreamHold::new(guard);
        req.extensions_mut().insert(hold.clone());
        (None, Some(hold))
    } else {
        (Some(guard), None)
    };
    let fut = tower_service::Service::call(&mut app, req);
    let mut resp = match AssertUnwindSafe(fut).catch_unwind().await {
        Ok(Ok(resp)) => resp,
        Ok(Err(never)) => match never {},
        Err(_panic) => internal_error(),
    };
    drop_connect_from_allow(&mut resp);
    // Until the response is done, the request holds the guard in either case. Hyper takes the
    // wrapper as the body type itself: the body is not boxed a second time.
    Ok(resp.map(|body| GuardedBody {
        inner: body,
        _guard: guard,
        _hold: hold,
    }))
}

/// The answer to a panic: nothing about it (no message, no task id) reaches the client.
pub fn internal_error() -> Response {
    Problem::new(
        StatusCode::INTERNAL_SERVER_ERROR,
        "internal error; the daemon's log has the details",
    )
    .into_response()
}

/// What the watcher decides after a wake-up.
enum Verdict {
    HeadTooSlow,
    Idle,
    CheckAt(Instant),
}

/// Per-connection bookkeeping shared by the socket wrapper, the service and the watcher.
/// Times are milliseconds since `born` (atomics, so the runtime may have several workers).
struct Activity {
    born: Instant,
    last_io: AtomicU64,
    /// When the current wait for a request head began; `NONE` while none is awaited.
    head_since: AtomicU64,
    in_flight: AtomicUsize,
    /// Set once any byte was read; a connection that never sent one may get a shorter deadline.
    used: std::sync::atomic::AtomicBool,
    /// Opened under pressure: closed after `FRESH_UNDER_PRESSURE` if it sends nothing.
    pressure: bool,
    /// Chosen by the accept loop to make room at the cap.
    evict: std::sync::atomic::AtomicBool,
    /// The daemon is stopping: finish gracefully.
    stopping: std::sync::atomic::AtomicBool,
    /// Wakes the driver for `evict` or `stopping` only; requests never wake it (its timer
    /// looks often enough, see `verdict`), so a request costs no extra poll of the connection.
    attention: AtomicWaker,
}

const NONE: u64 = u64::MAX;

impl Activity {
    fn new(pressure: bool) -> Self {
        Activity {
            born: Instant::now(),
            used: std::sync::atomic::AtomicBool::new(false),
            pressure,
            evict: std::sync::atomic::AtomicBool::new(false),
            last_io: AtomicU64::new(0),
            // A new connection that has sent nothing is idle, not slow: clients open connections
            // ahead of need and keep them pooled, and closing those at the header deadline races
            // with the request the client is about to send on them.
            head_since: AtomicU64::new(NONE),
            in_flight: AtomicUsize::new(0),
            stopping: std::sync::atomic::AtomicBool::new(false),
            attention: AtomicWaker::new(),
        }
    }

    /// Ready when the accept loop chose this connection to close, or the daemon is stopping
    /// and the driver has not seen it yet (`stop_seen`).
    fn poll_attention(&self, cx: &mut Context<'_>, stop_seen: bool) -> Poll<()> {
        self.attention.register(cx.waker());
        if self.evict.load(Ordering::Acquire)
            || (!stop_seen && self.stopping.load(Ordering::Acquire))
        {
            Poll::Ready(())
        } else {
            Poll::Pending
        }
    }

    fn now_ms(&self) -> u64 {
        self.born.elapsed().as_millis() as u64
    }

    fn at(&self, ms: u64) -> Instant {
        self.born + Duration::from_millis(ms)
    }

    /// When the connection last moved a byte (its birth if never), for choosing a victim.
    fn quiet_since(&self) -> Instant {
        self.at(self.last_io.load(Ordering::Relaxed))
    }

    fn on_read(&self) {
        let now = self.now_ms();
        self.last_io.store(now, Ordering::Relaxed);
        if !self.used.load(Ordering::Relaxed) {
            self.used.store(true, Ordering::Relaxed);
        }
        // The first byte of a new request on an idle connection starts the head clock (the
        // watcher is due within `header_read_timeout` anyway: no wake-up).
        if self.in_flight.load(Ordering::Acquire) == 0
            && self.head_since.load(Ordering::Relaxed) == NONE
        {
            let _ =
                self.head_since
                    .compare_exchange(NONE, now, Ordering::AcqRel, Ordering::Relaxed);
        }
    }

    fn on_write(&self) {
        self.last_io.store(self.now_ms(), Ordering::Relaxed);
    }

    fn request_started(self: &Arc<Self>) -> InFlight {
        self.in_flight.fetch_add(1, Ordering::AcqRel);
        self.head_since.store(NONE, Ordering::Release);
        InFlight(self.clone())
    }

    /// What the watcher does now. Its next look is never more than `header_read_timeout` (nor
    /// `idle_timeout`) ahead unless a head is being read: a head clock that starts after this
    /// look starts after it, so its deadline is never earlier than that next look; the same
    /// holds for the idle clock of a request that ends meanwhile. That is what lets requests
    /// start and end without waking the watcher.
    fn verdict(&self, limits: &Limits) -> Verdict {
        let now = self.now_ms();
        let head_ms = limits.header_read_timeout.as_millis() as u64;
        let idle_ms = limits.idle_timeout.as_millis() as u64;
        let look_by = now.saturating_add(head_ms.min(idle_ms));
        let head_since = self.head_since.load(Ordering::Acquire);
        if head_since != NONE {
            let due = head_since.saturating_add(head_ms);
            return if now >= due {
                Verdict::HeadTooSlow
            } else {
                Verdict::CheckAt(self.at(due))
            };
        }
        if self.in_flight.load(Ordering::Acquire) > 0 {
            // Nothing times out while a request is in flight; look again later.
            return Verdict::CheckAt(self.at(look_by));
        }
        let mut due = self.last_io.load(Ordering::Relaxed).saturating_add(idle_ms);
        if self.pressure && !self.used.load(Ordering::Relaxed) {
            due = due.min(FRESH_UNDER_PRESSURE.as_millis() as u64);
        }
        if now >= due {
            Verdict::Idle
        } else {
            Verdict::CheckAt(self.at(due.min(look_by)))
        }
    }
}

/// Counts a request as in flight from the call until its response body is done or dropped.
struct InFlight(Arc<Activity>);

impl Drop for InFlight {
    fn drop(&mut self) {
        let activity = &self.0;
        // The idle clock starts now; the watcher looks again within `idle_timeout` anyway.
        activity.last_io.store(activity.now_ms(), Ordering::Relaxed);
        activity.in_flight.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A response body that holds the in-flight guard.
struct GuardedBody {
    inner: Body,
    _guard: Option<InFlight>,
    _hold: Option<StreamHold>,
}

impl http_body::Body for GuardedBody {
    type Data = bytes::Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

/// The socket, noting every read and write, and holding the connection's slot under the cap
/// for as long as the socket lives (through an upgrade too: hyper moves the IO into `Upgraded`).
struct Tracked {
    inner: TcpStream,
    activity: Arc<Activity>,
    _permit: OwnedSemaphorePermit,
}

impl AsyncRead for Tracked {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let r = Pin::new(&mut self.inner).poll_read(cx, buf);
        if matches!(r, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            self.activity.on_read();
        }
        r
    }
}

impl AsyncWrite for Tracked {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let r = Pin::new(&mut self.inner).poll_write(cx, buf);
        if matches!(r, Poll::Ready(Ok(n)) if n > 0) {
            self.activity.on_write();
        }
        r
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let r = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        if matches!(r, Poll::Ready(Ok(n)) if n > 0) {
            self.activity.on_write();
        }
        r
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// Accept errors: out of descriptors or memory → wait (10 ms doubling to 1 s) and warn once per
/// burst; anything else is about one failed handshake and is retried at once.
#[derive(Default)]
struct Backoff {
    delay: Option<Duration>,
    errors: u64,
}

impl Backoff {
    fn reset(&mut self) {
        if self.delay.take().is_some() {
            tracing::info!(failed_accepts = self.errors, "accepting connections again");
        }
        self.errors = 0;
    }

    /// Waits as the error asks; `Err` when `stop` was cancelled meanwhile.
    async fn pause(&mut self, e: &io::Error, stop: &CancellationToken) -> Result<(), ()> {
        self.errors += 1;
        if !is_exhaustion(e) {
            tracing::debug!(error = %e, "accept failed");
            return Ok(());
        }
        let delay = match self.delay {
            None => {
                tracing::warn!(
                    error = %e,
                    "cannot accept connections (out of descriptors or memory); backing off until \
                     some close"
                );
                Duration::from_millis(10)
            }
            Some(d) => (d * 2).min(Duration::from_secs(1)),
        };
        self.delay = Some(delay);
        tokio::select! {
            _ = stop.cancelled() => Err(()),
            _ = tokio::time::sleep(delay) => Ok(()),
        }
    }
}

fn is_exhaustion(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EMFILE | libc::ENFILE | libc::ENOBUFS | libc::ENOMEM)
    )
}

/// Logs once at the start of a burst of refusals and once when it ends.
#[derive(Default)]
struct Burst {
    count: u64,
}

impl Burst {
    fn hit(&mut self, first: impl FnOnce()) {
        if self.count == 0 {
            first();
        }
        self.count += 1;
    }

    fn end(&mut self, last: impl FnOnce(u64)) {
        if self.count > 0 {
            last(self.count);
            self.count = 0;
        }
    }
}

/// The WebSocket routes accept CONNECT for the HTTP/2 extended CONNECT of RFC 8441 (its
/// `:protocol` pseudo-header makes it a request to the path); as a plain method, which is what
/// `Allow` lists, CONNECT is no method of any resource here (in HTTP/1.1 it names a proxy
/// target), and OpenAPI cannot describe it, so `Allow` leaves it out. Called by the connection's
/// service (`handle`): axum adds `Allow` outside every layer, to whatever the method
/// fallback answered (a 405, or the edge's 401/403 on an unmatched method).
fn drop_connect_from_allow(resp: &mut Response) {
    let Some(allow) = resp.headers().get(axum::http::header::ALLOW) else {
        return;
    };
    let Ok(text) = allow.to_str() else { return };
    if !text.split(',').any(|m| m.trim() == "CONNECT") {
        return;
    }
    let kept: Vec<&str> = text
        .split(',')
        .map(str::trim)
        .filter(|m| *m != "CONNECT")
        .collect();
    if let Ok(v) = axum::http::HeaderValue::from_str(&kept.join(",")) {
        resp.headers_mut().insert(axum::http::header::ALLOW, v);
    }
}

#[cfg(test)]
mod tests {
    //! The accept loop with a router of its own (a panicking handler, a WebSocket echo), served
    //! on 127.0.0.1 and driven over raw TCP.

    use super::*;
    use axum::extract::ws::{Message, WebSocketUpgrade};
    use axum::routing::get;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    async fn start(app: Router) -> (std::net::SocketAddr, CancellationToken, TaskTracker) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let stop = CancellationToken::new();
        let tracker = TaskTracker::new();
        let limits = Limits {
            header_read_timeout: Duration::from_secs(5),
            idle_timeout: Duration::from_secs(5),
            max_connections: 16,
        };
        tokio::spawn(serve(
            Arc::new(listener),
            app,
            limits,
            stop.clone(),
            tracker.clone(),
        ));
        (addr, stop, tracker)
    }

    /// Reads one response with a Content-Length body from a keep-alive connection.
    async fn read_response(s: &mut TcpStream) -> String {
        let mut buf = Vec::new();
        let mut chunk = [0u8; 4096];
        loop {
            let n = s.read(&mut chunk).await.unwrap();
            assert!(n > 0, "closed early: {}", String::from_utf8_lossy(&buf));
            buf.extend_from_slice(&chunk[..n]);
            let text = String::from_utf8_lossy(&buf).into_owned();
            if let Some((head, body)) = text.split_once("\r\n\r\n") {
                let len: usize = head
                    .lines()
                    .find_map(|l| {
                        l.to_ascii_lowercase()
                            .strip_prefix("content-length: ")
                            .map(|v| v.trim().parse().unwrap())
                    })
                    .unwrap_or(0);
                if body.len() >= len {
                    return text;
                }
            }
        }
    }

    #[tokio::test]
    async fn a_panicking_handler_is_a_plain_500_and_the_connection_goes_on() {
        let app = Router::new()
            .route(
                "/panic",
                get(|| async {
                    if std::hint::black_box(true) {
                        panic!("secret internals");
                    }
                    "unreachable"
                }),
            )
            .route(
                "/blocking-panic",
                get(|| async {
                    tokio::task::spawn_blocking(|| -> &'static str { panic!("blocking internals") })
                        .await
                        .unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic()))
                }),
            )
            .route("/ok", get(|| async { "fine" }));
        let (addr, stop, _) = start(app).await;
        let mut s = TcpStream::connect(addr).await.unwrap();
        for path in ["/panic", "/blocking-panic"] {
            s.write_all(format!("GET {path} HTTP/1.1\r\nHost: localhost\r\n\r\n").as_bytes())
                .await
                .unwrap();
            let text = read_response(&mut s).await;
            assert!(text.starts_with("HTTP/1.1 500"), "{text}");
            assert!(text.contains("application/problem+json"), "{text}");
            assert!(
                !text.contains("internals") && !text.contains("panicked"),
                "{text}"
            );
        }
        s.write_all(b"GET /ok HTTP/1.1\r\nHost: localhost\r\n\r\n")
            .await
            .unwrap();
        let text = read_response(&mut s).await;
        assert!(
            text.starts_with("HTTP/1.1 200") && text.ends_with("fine"),
            "{text}"
        );
        stop.cancel();
    }

    #[tokio::test]
    async fn websocket_upgrades_pass_through() {
        let app = Router::new().route(
            "/ws",
            get(|ws: WebSocketUpgrade| async move {
                ws.on_upgrade(|mut socket| async move {
                    while let Some(Ok(msg)) = socket.recv().await {
                        if let Message::Text(t) = msg {
                            let _ = socket.send(Message::Text(t)).await;
                        }
                    }
                })
            }),
        );
        let (addr, stop, tracker) = start(app).await;
        let mut s = TcpStream::connect(addr).await.unwrap();
        s.write_all(
            b"GET /ws HTTP/1.1\r\nHost: localhost\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n",
        )
        .await
        .unwrap();
        let mut head = Vec::new();
        while !head.ends_with(b"\r\n\r\n") {
            let mut b = [0u8; 1];
            assert_eq!(s.read(&mut b).await.unwrap(), 1);
            head.push(b[0]);
        }
        let head = String::from_utf8_lossy(&head);
        assert!(head.starts_with("HTTP/1.1 101"), "{head}");
        // RFC 6455's own example key and accept value.
        assert!(head.contains("s3pPLMBiTxaQ9kYGzzhZRbK+xOo="), "{head}");
        // A masked text frame "hi"; the echo comes back unmasked.
        let mask = [1u8, 2, 3, 4];
        let payload: Vec<u8> = b"hi"
            .iter()
            .zip(mask.iter().cycle())
            .map(|(b, m)| b ^ m)
            .collect();
        let mut frame = vec![0x81, 0x80 | 2];
        frame.extend_from_slice(&mask);
        frame.extend_from_slice(&payload);
        s.write_all(&frame).await.unwrap();
        let mut echo = [0u8; 4];
        s.read_exact(&mut echo).await.unwrap();
        assert_eq!(echo, [0x81, 2, b'h', b'i']);
        stop.cancel();
        tracker.close();
    }
}
