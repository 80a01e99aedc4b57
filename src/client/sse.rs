//! A Server-Sent Events reader for the daemon's streams (`GET /v1/acp/{id}`, process logs with
//! `follow`): bytes in as they arrive, whole events out. **Invariant:** it holds at most one
//! unfinished line and one event's data, each bounded by `max_bytes`.

use bytes::Bytes;
use futures_util::StreamExt;

use super::api::{Api, ClientError};

/// One event: `event:` (default `message`), `id:` and its `data:` lines joined by `\n`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SseEvent {
    pub event: String,
    pub id: Option<String>,
    pub data: String,
}

/// Why a stream could not be read (an agent controls the data, so each is bounded).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SseError {
    #[error("an event stream line is longer than {0} bytes")]
    LineTooLong(usize),
    #[error("an event is larger than {0} bytes")]
    EventTooLarge(usize),
    #[error("an event line is not UTF-8")]
    NotUtf8,
}

pub struct SseParser {
    line: Vec<u8>,
    event: Option<String>,
    id: Option<String>,
    data: Option<String>,
    max_bytes: usize,
}

impl SseParser {
    pub fn new(max_bytes: usize) -> Self {
        SseParser {
            line: Vec::new(),
            event: None,
            id: None,
            data: None,
            max_bytes,
        }
    }

    /// Feeds a chunk; completed events are appended to `out`.
    pub fn push(&mut self, mut chunk: &[u8], out: &mut Vec<SseEvent>) -> Result<(), SseError> {
        while let Some(nl) = memchr::memchr(b'\n', chunk) {
            self.extend_line(&chunk[..nl])?;
            let mut line = std::mem::take(&mut self.line);
            if line.last() == Some(&b'\r') {
                line.pop();
            }
            self.field(&line, out)?;
            chunk = &chunk[nl + 1..];
        }
        self.extend_line(chunk)
    }

    fn extend_line(&mut self, part: &[u8]) -> Result<(), SseError> {
        if self.line.len() + part.len() > self.max_bytes {
            return Err(SseError::LineTooLong(self.max_bytes));
        }
        self.line.extend_from_slice(part);
        Ok(())
    }

    fn field(&mut self, line: &[u8], out: &mut Vec<SseEvent>) -> Result<(), SseError> {
        if line.is_empty() {
            if let Some(data) = self.data.take() {
                out.push(SseEvent {
                    event: self.event.take().unwrap_or_else(|| "message".to_string()),
                    id: self.id.take(),
                    data,
                });
            }
            self.event = None;
            self.id = None;
            return Ok(());
        }
        if line[0] == b':' {
            return Ok(()); // a comment (the keepalive)
        }
        let line = std::str::from_utf8(line).map_err(|_| SseError::NotUtf8)?;
        let (name, value) = match line.split_once(':') {
            Some((n, v)) => (n, v.strip_prefix(' ').unwrap_or(v)),
            None => (line, ""),
        };
        match name {
            "event" => self.event = Some(value.to_string()),
            "id" => self.id = Some(value.to_string()),
            "data" => match &mut self.data {
                Some(d) => {
                    if d.len() + value.len() + 1 > self.max_bytes {
                        return Err(SseError::EventTooLarge(self.max_bytes));
                    }
                    d.push('\n');
                    d.push_str(value);
                }
                None => self.data = Some(value.to_string()),
            },
            _ => {} // `retry` and unknown fields are ignored, as the SSE rules say
        }
        Ok(())
    }
}

/// Reads a streamed answer as events, calling `on_event` for each; returns at the end of the
/// stream. The largest event accepted is 1 GiB (the daemon's default line limit is 16 MiB).
pub async fn read_events<F>(
    api: &Api,
    resp: reqwest::Response,
    mut on_event: F,
) -> Result<(), ClientError>
where
    F: FnMut(SseEvent) -> Result<(), ClientError>,
{
    let mut parser = SseParser::new(1 << 30);
    let mut body = resp.bytes_stream();
    let mut events = Vec::new();
    while let Some(chunk) = body.next().await {
        let chunk: Bytes = chunk.map_err(|e| api.transport(e))?;
        parser
            .push(&chunk, &mut events)
            .map_err(|e| ClientError::Protocol(e.to_string()))?;
        for event in events.drain(..) {
            on_event(event)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Feeds `input` split into pieces of every size from 1 byte up, and checks the events.
    fn check(input: &str, expected: &[(&str, Option<&str>, &str)]) {
        let expected: Vec<SseEvent> = expected
            .iter()
            .map(|(e, id, d)| SseEvent {
                event: e.to_string(),
                id: id.map(str::to_string),
                data: d.to_string(),
            })
            .collect();
        for size in 1..=input.len().max(1) {
            let mut parser = SseParser::new(1024);
            let mut out = Vec::new();
            for piece in input.as_bytes().chunks(size) {
                parser.push(piece, &mut out).unwrap();
            }
            assert_eq!(out, expected, "pieces of {size} bytes");
        }
    }

    #[test]
    fn events() {
        check(
            "event: message\nid: 7\ndata: {\"a\":1}\n\n",
            &[("message", Some("7"), "{\"a\":1}")],
        );
        check(
            ": keepalive\n\nevent: gap\ndata: {\"from\":1,\"to\":3}\n\n",
            &[("gap", None, "{\"from\":1,\"to\":3}")],
        );
        check("data:x\r\ndata: y\r\n\r\n", &[("message", None, "x\ny")]);
        check("event: log\nid: 1\n\n", &[]);
        check("data: unfinished", &[]);
        check(
            "id: 1\ndata: a\n\nid: 2\ndata: b\n\n",
            &[("message", Some("1"), "a"), ("message", Some("2"), "b")],
        );
    }

    #[test]
    fn long_lines_are_refused() {
        let mut parser = SseParser::new(8);
        let mut out = Vec::new();
        assert!(parser.push(b"data: 0123456789", &mut out).is_err());
        let mut parser = SseParser::new(8);
        assert!(
            parser
                .push(b"data: 0123\ndata: 4567\n\n", &mut out)
                .is_err()
        );
    }
}
