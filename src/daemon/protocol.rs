//! HTTP/1.1 and HTTP/2 with prior knowledge (h2c) on one socket: the first bytes tell them apart
//! (the HTTP/2 connection preface), then hyper serves the connection with upgrades enabled.
//!
//! Ours rather than hyper-util's automatic builder because that one does not expose hyper's
//! HTTP/1 header limit: the only bound it has on a request head is the read buffer's size, and a
//! read buffer of 64 KiB made every upload arrive 64 KiB per `recv`, ~15 % more CPU per byte than
//! 256 KiB reads on loopback (the kernel's window updates, not the copy; docs/performance.md).
//! Here the head is capped on its own (`MAX_HEAD_BYTES`, 431 above it) and the read buffer grows
//! to `READ_BUFFER_MAX` only while reads keep filling it, i.e. during a bulk body.
//!
//! **Invariants:** bytes read while telling the protocols apart are handed to hyper first, in
//! order; a connection asked to close before it sent enough to tell ends at once with nothing
//! answered (it had no request in flight).

use std::error::Error as StdError;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use hyper::body::{Body, Incoming};
use hyper::server::conn::{http1, http2};
use hyper::service::HttpService;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// The client's first bytes on an HTTP/2 connection with prior knowledge (RFC 9113 §3.4).
const H2_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// The most an HTTP/1 connection's read buffer grows to (it starts at 8 KiB and doubles only
/// while each read fills it).
pub const READ_BUFFER_MAX: usize = 256 << 10;

/// The error a connection ends with.
pub type ConnError = Box<dyn StdError + Send + Sync>;

/// Both protocols' settings, shared by every connection.
pub struct Protocols {
    http1: http1::Builder,
    http2: http2::Builder<TokioExecutor>,
}

impl Protocols {
    /// `max_head`: the largest request head (HTTP/1 request line and headers; HTTP/2 header
    /// list).
    pub fn new(max_head: usize) -> Self {
        let mut http1 = http1::Builder::new();
        // Our own watcher enforces the header-read timeout for both protocols; hyper's would
        // also cut idle keep-alives at the same deadline, and it needs a timer we do not give it.
        http1
            .header_read_timeout(None)
            .keep_alive(true)
            .max_header_size(max_head)
            .max_buf_size(READ_BUFFER_MAX.max(max_head));
        let mut http2 = http2::Builder::new(TokioExecutor::new());
        // RFC 8441: WebSockets over HTTP/2 are extended CONNECT requests (`:protocol
        // websocket`), which a server must announce in its SETTINGS before a client may send one.
        http2
            .enable_connect_protocol()
            .max_header_list_size(max_head as u32);
        Protocols { http1, http2 }
    }

    /// Serves `io` with `service` once its first bytes tell the protocol.
    pub fn serve<I, S>(self: &std::sync::Arc<Self>, io: I, service: S) -> Served<I, S>
    where
        S: HttpService<Incoming>,
    {
        Served {
            state: State::Sniffing {
                io: Some(io),
                seen: [0; H2_PREFACE.len()],
                len: 0,
                service: Some(service),
                protocols: self.clone(),
            },
        }
    }
}

/// One connection: first telling the protocol, then served by hyper.
pub struct Served<I, S>
where
    S: HttpService<Incoming>,
{
    state: State<I, S>,
}

/// What hyper reads and writes: the socket with the sniffed bytes put back.
type Io<I> = TokioIo<Replay<I>>;

enum State<I, S>
where
    S: HttpService<Incoming>,
{
    Sniffing {
        io: Option<I>,
        seen: [u8; H2_PREFACE.len()],
        len: usize,
        service: Option<S>,
        protocols: std::sync::Arc<Protocols>,
    },
    Http1(Pin<Box<http1::UpgradeableConnection<Io<I>, S>>>),
    Http2(Pin<Box<http2::Connection<Io<I>, S, TokioExecutor>>>),
    Closed,
}

impl<I, S, B> Served<I, S>
where
    S: HttpService<Incoming, ResBody = B>,
    S::Error: Into<ConnError>,
    S::Future: Send + 'static,
    B: Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<ConnError>,
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    /// Finishes the requests in flight and closes (HTTP/2 sends GOAWAY first); a connection
    /// still being told apart closes at once.
    pub fn graceful_shutdown(self: Pin<&mut Self>) {
        let this = self.get_mut();
        match &mut this.state {
            State::Sniffing { .. } => this.state = State::Closed,
            State::Http1(c) => c.as_mut().graceful_shutdown(),
            State::Http2(c) => c.as_mut().graceful_shutdown(),
            State::Closed => {}
        }
    }
}

impl<I, S> Unpin for Served<I, S> where S: HttpService<Incoming> {}

impl<I, S, B> Future for Served<I, S>
where
    S: HttpService<Incoming, ResBody = B>,
    S::Error: Into<ConnError>,
    S::Future: Send + 'static,
    B: Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<ConnError>,
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    type Output = Result<(), ConnError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        loop {
            match &mut this.state {
                State::Sniffing {
                    io,
                    seen,
                    len,
                    service,
                    protocols,
                } => {
                    let Some(stream) = io.as_mut() else {
                        return Poll::Ready(Ok(()));
                    };
                    // HTTP/2 as long as every byte so far matches the preface.
                    let mut http2 = true;
                    while *len < H2_PREFACE.len() {
                        let mut buf = ReadBuf::new(&mut seen[*len..]);
                        ready!(Pin::new(&mut *stream).poll_read(cx, &mut buf))?;
                        let n = buf.filled().len();
                        let was = *len;
                        *len += n;
                        if n == 0 || seen[was..*len] != H2_PREFACE[was..*len] {
                            http2 = false;
                            break;
                        }
                    }
                    let (Some(stream), Some(service)) = (io.take(), service.take()) else {
                        return Poll::Ready(Ok(()));
                    };
                    let io = TokioIo::new(Replay {
                        pre: seen[..*len].to_vec(),
                        at: 0,
                        failed: None,
                        inner: stream,
                    });
                    this.state = if http2 {
                        State::Http2(Box::pin(protocols.http2.serve_connection(io, service)))
                    } else {
                        State::Http1(Box::pin(
                            protocols
                                .http1
                                .serve_connection(io, service)
                                .with_upgrades(),
                        ))
                    };
                }
                State::Http1(c) => return c.as_mut().poll(cx).map_err(Into::into),
                State::Http2(c) => return c.as_mut().poll(cx).map_err(Into::into),
                State::Closed => return Poll::Ready(Ok(())),
            }
        }
    }
}

/// The socket, with the bytes already read to tell the protocol given back first.
pub struct Replay<I> {
    pre: Vec<u8>,
    at: usize,
    /// An error the socket gave while the sniffed bytes were being handed over.
    failed: Option<io::Error>,
    inner: I,
}

impl<I: AsyncRead + Unpin> AsyncRead for Replay<I> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if self.at < self.pre.len() {
            let n = buf.remaining().min(self.pre.len() - self.at);
            let from = self.at;
            buf.put_slice(&self.pre[from..from + n]);
            self.at += n;
            if self.at < self.pre.len() {
                return Poll::Ready(Ok(()));
            }
            self.pre = Vec::new();
            self.at = 0;
            // The rest of what arrived with them in the same read: hyper asks for another 8 KiB
            // of buffer when a read leaves its head unfinished, which doubled every HTTP/1
            // connection's read buffer to 16 KiB for the sniffed bytes alone. Nothing more yet
            // is fine (the sniffed bytes are the answer; the waker stays registered).
            if buf.remaining() > 0
                && let Poll::Ready(Err(e)) = Pin::new(&mut self.inner).poll_read(cx, buf)
            {
                // Reported with the next read; these bytes are delivered first.
                self.failed = Some(e);
            }
            return Poll::Ready(Ok(()));
        }
        if let Some(e) = self.failed.take() {
            return Poll::Ready(Err(e));
        }
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<I: AsyncWrite + Unpin> AsyncWrite for Replay<I> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
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

#[cfg(test)]
mod tests {
    use std::convert::Infallible;
    use std::sync::Arc;
    use std::time::Duration;

    use axum::body::Body as AxumBody;
    use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream};

    use super::*;

    type Answer = hyper::Response<AxumBody>;

    async fn body_text(body: Incoming) -> String {
        let bytes = axum::body::to_bytes(AxumBody::new(body), usize::MAX)
            .await
            .unwrap();
        String::from_utf8_lossy(&bytes).into_owned()
    }

    /// A connection served by `Protocols` on one end of an in-memory pipe; the service answers
    /// with the request's version and the size of its body.
    fn served(
        protocols: &Arc<Protocols>,
    ) -> (DuplexStream, tokio::task::JoinHandle<Result<(), ConnError>>) {
        let (client, server) = tokio::io::duplex(1 << 20);
        let svc = hyper::service::service_fn(|req: hyper::Request<Incoming>| async move {
            let version = format!("{:?}", req.version());
            let body = body_text(req.into_body()).await.len();
            Ok::<Answer, Infallible>(hyper::Response::new(AxumBody::from(format!(
                "{version} {body}"
            ))))
        });
        let conn = protocols.serve(server, svc);
        (client, tokio::spawn(conn))
    }

    async fn read_answer(client: &mut DuplexStream) -> String {
        let mut out = Vec::new();
        let mut buf = [0u8; 4096];
        while !String::from_utf8_lossy(&out).ends_with(" 0") {
            let n = tokio::time::timeout(Duration::from_secs(5), client.read(&mut buf))
                .await
                .expect("an answer in time")
                .unwrap();
            assert!(n > 0, "closed early: {}", String::from_utf8_lossy(&out));
            out.extend_from_slice(&buf[..n]);
        }
        String::from_utf8_lossy(&out).into_owned()
    }

    /// HTTP/1.1 is recognised whatever pieces its first bytes come in, including a first piece
    /// that could still be the HTTP/2 preface ("P" of "PUT"), and nothing of it is lost.
    #[tokio::test]
    async fn http1_is_told_apart_however_its_first_bytes_arrive() {
        let protocols = Arc::new(Protocols::new(64 << 10));
        for request in [
            "GET /a HTTP/1.1\r\nhost: x\r\n\r\n",
            "PUT /b HTTP/1.1\r\nhost: x\r\ncontent-length: 0\r\n\r\n",
            "PRI /c HTTP/1.1\r\nhost: x\r\ncontent-length: 0\r\n\r\n",
        ] {
            let (mut client, conn) = served(&protocols);
            for b in request.as_bytes() {
                client.write_all(&[*b]).await.unwrap();
                tokio::task::yield_now().await;
            }
            let answer = read_answer(&mut client).await;
            assert!(answer.starts_with("HTTP/1.1 200"), "{request:?}: {answer}");
            assert!(answer.ends_with("HTTP/1.1 0"), "{request:?}: {answer}");
            drop(client);
            conn.await.unwrap().unwrap();
        }
    }

    /// A request whose body exceeds the head cap many times over is served (the read buffer
    /// is not the head limit), while a head over the cap is refused with 431.
    #[tokio::test]
    async fn the_head_cap_is_apart_from_the_read_buffer() {
        let protocols = Arc::new(Protocols::new(4 << 10));
        let (mut client, _conn) = served(&protocols);
        let body = vec![7u8; 1 << 20];
        client
            .write_all(
                format!(
                    "PUT /big HTTP/1.1\r\nhost: x\r\ncontent-length: {}\r\n\r\n",
                    body.len()
                )
                .as_bytes(),
            )
            .await
            .unwrap();
        client.write_all(&body).await.unwrap();
        let mut out = Vec::new();
        let mut buf = [0u8; 4096];
        while !String::from_utf8_lossy(&out).ends_with(&format!(" {}", body.len())) {
            let n = client.read(&mut buf).await.unwrap();
            assert!(n > 0, "{}", String::from_utf8_lossy(&out));
            out.extend_from_slice(&buf[..n]);
        }
        // The same connection, its buffer grown by that body: a head over 4 KiB is refused.
        let big = "a".repeat(8 << 10);
        client
            .write_all(format!("GET /h HTTP/1.1\r\nhost: x\r\nx-big: {big}\r\n\r\n").as_bytes())
            .await
            .unwrap();
        let mut rest = Vec::new();
        let _ = tokio::time::timeout(Duration::from_secs(5), client.read_to_end(&mut rest)).await;
        let rest = String::from_utf8_lossy(&rest);
        assert!(rest.starts_with("HTTP/1.1 431"), "{rest}");
    }

    /// The sniffed bytes come back in one read with whatever arrived after them (hyper grows
    /// its read buffer when a first read leaves the head unfinished); with nothing after them
    /// they come alone, at once; an error after them waits for the next read.
    #[tokio::test]
    async fn the_sniffed_bytes_come_back_with_what_followed_them() {
        let request = b"GET /a HTTP/1.1\r\nhost: x\r\n\r\n";
        let (at, pre) = (H2_PREFACE.len(), request[..H2_PREFACE.len()].to_vec());
        let (mut client, server) = tokio::io::duplex(1024);
        client.write_all(&request[at..]).await.unwrap();
        let mut replay = Replay {
            pre: pre.clone(),
            at: 0,
            failed: None,
            inner: server,
        };
        let mut buf = [0u8; 8192];
        let n = replay.read(&mut buf).await.unwrap();
        assert_eq!(&buf[..n], request, "one read, in order");

        let (mut client, server) = tokio::io::duplex(1024);
        let mut replay = Replay {
            pre: pre.clone(),
            at: 0,
            failed: None,
            inner: server,
        };
        let mut read = Box::pin(replay.read(&mut buf));
        let Poll::Ready(n) = futures_util::poll!(&mut read) else {
            panic!("the sniffed bytes wait for nothing");
        };
        assert_eq!(n.unwrap(), at);
        drop(read);
        client.write_all(&request[at..]).await.unwrap();
        let n = replay.read(&mut buf).await.unwrap();
        assert_eq!(&buf[..n], &request[at..]);

        let mut replay = Replay {
            pre,
            at: 0,
            failed: None,
            inner: Failing,
        };
        assert_eq!(replay.read(&mut buf).await.unwrap(), at);
        let e = replay.read(&mut buf).await.unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::ConnectionReset);
    }

    /// A socket whose every read fails.
    struct Failing;

    impl AsyncRead for Failing {
        fn poll_read(
            self: Pin<&mut Self>,
            _cx: &mut Context<'_>,
            _buf: &mut ReadBuf<'_>,
        ) -> Poll<io::Result<()>> {
            Poll::Ready(Err(io::ErrorKind::ConnectionReset.into()))
        }
    }

    /// HTTP/2 with prior knowledge is recognised with its preface cut into single bytes.
    #[tokio::test]
    async fn http2_is_told_apart_with_its_preface_in_pieces() {
        let protocols = Arc::new(Protocols::new(64 << 10));
        let (client, conn) = served(&protocols);
        // hyper's client writes into `near`; a relay passes its preface on one byte at a time,
        // then everything as it comes, and the answers back.
        let (near, far) = tokio::io::duplex(1 << 16);
        let (mut client_r, mut client_w) = tokio::io::split(client);
        let (mut far_r, mut far_w) = tokio::io::split(far);
        let up = tokio::spawn(async move {
            let mut first = [0u8; H2_PREFACE.len()];
            far_r.read_exact(&mut first).await.unwrap();
            for b in first {
                client_w.write_all(&[b]).await.unwrap();
                tokio::task::yield_now().await;
            }
            tokio::io::copy(&mut far_r, &mut client_w).await.ok();
        });
        let down = tokio::spawn(async move {
            tokio::io::copy(&mut client_r, &mut far_w).await.ok();
        });
        let (mut sender, h2) =
            hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(near))
                .await
                .unwrap();
        tokio::spawn(h2);
        let req = hyper::Request::builder()
            .uri("http://x/a")
            .body(AxumBody::from("abc"))
            .unwrap();
        let resp = sender.send_request(req).await.unwrap();
        assert_eq!(resp.status(), 200);
        assert_eq!(body_text(resp.into_body()).await, "HTTP/2.0 3");
        drop(sender);
        let _ = tokio::time::timeout(Duration::from_secs(5), conn).await;
        up.abort();
        down.abort();
    }

    /// Asked to close before the protocol is known (nothing in flight), the connection ends at
    /// once, and so does one whose client closes without a byte.
    #[tokio::test]
    async fn a_connection_closes_at_once_while_its_protocol_is_unknown() {
        let protocols = Arc::new(Protocols::new(64 << 10));
        let (mut client, server) = tokio::io::duplex(1024);
        let svc = hyper::service::service_fn(|_req: hyper::Request<Incoming>| async {
            Ok::<Answer, Infallible>(hyper::Response::new(AxumBody::empty()))
        });
        let mut conn = protocols.serve(server, svc);
        client.write_all(b"PRI * HT").await.unwrap();
        assert!(
            futures_util::poll!(&mut conn).is_pending(),
            "waits for the rest of the preface"
        );
        Pin::new(&mut conn).graceful_shutdown();
        let r = tokio::time::timeout(Duration::from_secs(1), conn).await;
        assert!(matches!(r, Ok(Ok(()))), "ended at once");

        let (client, conn) = served(&protocols);
        drop(client);
        let r = tokio::time::timeout(Duration::from_secs(1), conn).await;
        assert!(r.is_ok(), "a silent client that closes ends its connection");
    }
}
