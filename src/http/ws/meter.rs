//! The frame meter under every ACP WebSocket: a pass-through `AsyncRead`/`AsyncWrite` that parses
//! the client's frame headers as bytes arrive, so that an unfinished message holds a share of the
//! in-flight budget (`acp::caps::Budget`) and a deadline, whichever socket face (`super`) it
//! serves. **Invariant:** it never buffers or changes a byte; it only counts and refuses.

use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, ready};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use crate::acp::caps::{Budget, Reservation};

/// Bytes of an unfinished message a socket may hold without a share of the in-flight budget:
/// the messages of ordinary ACP traffic, so that they still go through while attackers hold the
/// whole budget (the daemon holds at most this per socket, `--max-connections` sockets).
const FREE_PER_SOCKET: u64 = 64 * 1024;

/// Beyond `FREE_PER_SOCKET`, the share of the budget grows in steps of this.
const BUDGET_STEP: u64 = 256 * 1024;

/// Why a metered socket was ended, for its close frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// The in-flight budget could not cover an unfinished message.
    BudgetFull,
    /// A message was not complete within `--idle-timeout` of its first frame.
    TooSlow,
}

/// What a `Metered` reports to the socket's reader.
#[derive(Default)]
pub struct MeterReport {
    refusal: Mutex<Option<Refusal>>,
}

impl MeterReport {
    pub fn refusal(&self) -> Option<Refusal> {
        *crate::sys::lock(&self.refusal)
    }
}

/// Where the frame parser is in the byte stream.
#[derive(Debug)]
enum FramePos {
    /// Reading a frame header: the bytes so far (at most 14).
    Header { buf: [u8; 14], have: usize },
    /// Inside a frame's payload: bytes left, whether it is a data frame and its FIN bit.
    Payload { left: u64, data: bool, fin: bool },
}

/// The reads of a server socket, followed frame by frame (headers parsed, payloads skipped) so
/// that the bytes of a data message still being assembled are known without trusting the
/// library's buffers: up to `FREE_PER_SOCKET` they are free, beyond that they hold a share of
/// the in-flight budget (`--acp-inflight-bytes`, shared with ACP request bodies), given back
/// when the message's last frame is complete; a message must be complete within its deadline
/// (`--idle-timeout` from its first frame). A socket that passes either is ended with an error
/// its reader sees as the end of the stream (and `MeterReport` says why). Writes pass through.
pub struct Metered<IO> {
    io: IO,
    pos: FramePos,
    /// A data message is being assembled (its first frame was seen, its last not yet).
    in_message: bool,
    /// Payload bytes of that message so far.
    held: u64,
    budget: Arc<Budget>,
    share: Reservation,
    shared: u64,
    limit: Duration,
    deadline: Option<Pin<Box<tokio::time::Sleep>>>,
    report: Arc<MeterReport>,
}

impl<IO> Metered<IO> {
    pub fn new(io: IO, budget: Arc<Budget>, limit: Duration) -> Self {
        Metered {
            io,
            pos: FramePos::Header {
                buf: [0; 14],
                have: 0,
            },
            in_message: false,
            held: 0,
            budget,
            share: Reservation::default(),
            shared: 0,
            limit,
            deadline: None,
            report: Arc::default(),
        }
    }

    pub fn report(&self) -> Arc<MeterReport> {
        self.report.clone()
    }

    fn refuse(&mut self, why: Refusal) -> io::Error {
        *self
            .report
            .refusal
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = Some(why);
        self.share = Reservation::default();
        self.shared = 0;
        io::Error::other(match why {
            Refusal::BudgetFull => {
                "an unfinished WebSocket message does not fit the in-flight budget"
            }
            Refusal::TooSlow => "a WebSocket message was not completed in time",
        })
    }

    /// Follows `bytes` (just read) through the frame structure.
    fn observe(&mut self, mut bytes: &[u8]) -> Result<(), Refusal> {
        while !bytes.is_empty() {
            match &mut self.pos {
                FramePos::Header { buf, have } => {
                    let mut need = 2;
                    while *have < need {
                        let Some((&b, rest)) = bytes.split_first() else {
                            return Ok(());
                        };
                        buf[*have] = b;
                        *have += 1;
                        bytes = rest;
                        if *have >= 2 {
                            let ext = match buf[1] & 0x7f {
                                126 => 2,
                                127 => 8,
                                _ => 0,
                            };
                            let mask = if buf[1] & 0x80 != 0 { 4 } else { 0 };
                            need = 2 + ext + mask;
                        }
                    }
                    let len = match buf[1] & 0x7f {
                        126 => u64::from(u16::from_be_bytes([buf[2], buf[3]])),
                        127 => u64::from_be_bytes([
                            buf[2], buf[3], buf[4], buf[5], buf[6], buf[7], buf[8], buf[9],
                        ]),
                        n => u64::from(n),
                    };
                    let fin = buf[0] & 0x80 != 0;
                    // Continuation, text and binary frames carry a message; the rest (0x8..)
                    // are control frames, which may come between a message's frames.
                    let data = buf[0] & 0x0f < 8;
                    if data && !self.in_message {
                        self.in_message = true;
                        self.deadline = Some(Box::pin(tokio::time::sleep(self.limit)));
                    }
                    self.pos = FramePos::Payload {
                        left: len,
                        data,
                        fin,
                    };
                }
                FramePos::Payload { left, data, .. } => {
                    let take = (*left).min(bytes.len() as u64);
                    *left -= take;
                    bytes = &bytes[take as usize..];
                    if *data {
                        self.held = self.held.saturating_add(take);
                    }
                }
            }
            if let FramePos::Payload { left: 0, data, fin } = self.pos {
                if data && fin {
                    // The message is complete: its share goes back.
                    self.in_message = false;
                    self.held = 0;
                    self.share = Reservation::default();
                    self.shared = 0;
                    self.deadline = None;
                }
                self.pos = FramePos::Header {
                    buf: [0; 14],
                    have: 0,
                };
            }
            while self.held > FREE_PER_SOCKET + self.shared {
                if !self.share.grow(&self.budget, BUDGET_STEP) {
                    return Err(Refusal::BudgetFull);
                }
                self.shared += BUDGET_STEP;
            }
        }
        Ok(())
    }
}

impl<IO: AsyncRead + Unpin> AsyncRead for Metered<IO> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if let Some(why) = this.report.refusal() {
            return Poll::Ready(Err(this.refuse(why)));
        }
        // Polled before the read, so that a client that went silent mid-message is woken for.
        if let Some(d) = this.deadline.as_mut()
            && d.as_mut().poll(cx).is_ready()
        {
            return Poll::Ready(Err(this.refuse(Refusal::TooSlow)));
        }
        let before = buf.filled().len();
        ready!(Pin::new(&mut this.io).poll_read(cx, buf))?;
        let filled = buf.filled();
        let new = &filled[before..];
        if let Err(why) = this.observe(new) {
            return Poll::Ready(Err(this.refuse(why)));
        }
        Poll::Ready(Ok(()))
    }
}

impl<IO: AsyncWrite + Unpin> AsyncWrite for Metered<IO> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }
}
