//! `GET /v1/processes/{id}/logs`: a process's output as JSON, or followed as SSE (`follow=true`),
//! each chunk with its byte offset as `sequence` and SSE `id`, a gap for output no longer held.

use super::*;

/// `GET /v1/processes/{id}/logs` without `follow`.
#[derive(serde::Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
struct ProcessLogsResponse {
    process_id: String,
    stream: wire::StreamFilter,
    entries: Vec<LogEntry>,
    /// Bytes of output written so far.
    end: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(nullable = false)]
    gap: Option<Gap>,
}

/// One chunk of output (`ProcessLogEntry`).
#[derive(serde::Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
struct LogEntry {
    /// Byte offset just after the chunk in the process's combined output.
    sequence: u64,
    stream: wire::LogStream,
    timestamp_ms: u64,
    /// The bytes: base64, or with `encoding=utf8` the text (invalid UTF-8 replaced by U+FFFD).
    data: String,
    /// `base64` (the default), or `utf8` when asked for.
    #[schema(value_type = String, example = "base64")]
    encoding: &'static str,
}

/// Output that was asked for but is no longer held: bytes `[from, to)`.
#[derive(serde::Serialize, utoipa::ToSchema)]
struct Gap {
    from: u64,
    to: u64,
}

/// One log entry on the wire (`ProcessLogEntry`): `sequence` is the byte offset just after the
/// chunk, so `since=<sequence>` resumes right after it. Written by hand rather than through a
/// `Value`: the follow stream's throughput is bound by this copy, and base64 and the stream names
/// never need JSON escaping.
fn entry_json(c: &Chunk, out: &mut String, utf8: bool) {
    use std::fmt::Write;
    let stream = match c.stream {
        LogStream::Stdout => "stdout",
        LogStream::Stderr => "stderr",
        LogStream::Pty => "pty",
    };
    let _ = write!(
        out,
        r#"{{"sequence":{},"stream":"{stream}","timestampMs":{},"data":""#,
        c.end(),
        c.at_ms
    );
    if utf8 {
        // The JSON string literal without its quotes (the opening one is already written).
        let text = serde_json::to_string(&String::from_utf8_lossy(&c.data)).unwrap_or_default();
        out.push_str(&text[1..]);
        out.push_str(r#","encoding":"utf8"}"#);
    } else {
        B64.encode_string(&c.data, out);
        out.push_str(r#"","encoding":"base64"}"#);
    }
}

/// The same entry as a value, for the JSON answer.
fn entry(c: &Chunk, utf8: bool) -> LogEntry {
    LogEntry {
        sequence: c.end(),
        stream: c.stream.into(),
        timestamp_ms: c.at_ms,
        data: if utf8 {
            String::from_utf8_lossy(&c.data).into_owned()
        } else {
            B64.encode(&c.data)
        },
        encoding: if utf8 { "utf8" } else { "base64" },
    }
}

/// `encoding=utf8` (or `text`): entries carry their bytes as text, lossily; `base64` (the
/// default) keeps every byte.
fn wants_utf8(q: &std::collections::HashMap<String, String>) -> Result<bool, Problem> {
    match q.get("encoding").map(String::as_str) {
        None | Some("") | Some("base64") => Ok(false),
        Some("utf8" | "utf-8" | "text") => Ok(true),
        Some(other) => Err(Problem::bad_request(format!(
            "encoding must be base64 or utf8, not `{other}`"
        ))),
    }
}

fn gap_json((from, to): (u64, u64)) -> String {
    format!(r#"{{"from":{from},"to":{to}}}"#)
}

/// The process's output: a JSON page, or with `follow=true` an SSE stream.
#[utoipa::path(
    get,
    path = "/v1/processes/{id}/logs",
    operation_id = "getProcessLogs",
    tag = "processes",
    params(
        ("id" = String, Path, description = "Process id", example = "proc_1"),
        ("since" = Option<u64>, Query, description = "Only entries after this byte offset \
            (an entry's `sequence` is the offset just after it)"),
        ("tail" = Option<u64>, Query, description = "Only the last N entries"),
        ("stream" = Option<wire::StreamFilter>, Query, description = "Which stream; default `pty` for \
            a terminal process, else `combined`"),
        ("follow" = Option<bool>, Query, description = "Answer with an SSE stream that replays, \
            then follows, and ends when the process has exited and all output was sent",
            example = true),
        ("encoding" = Option<String>, Query, description = "`base64` (the default: every byte \
            kept) or `utf8`: each entry's `data` as text, invalid UTF-8 (a character cut between \
            two entries included) replaced by U+FFFD — for people reading along, not for \
            exact bytes", example = "utf8"),
        ("Last-Event-ID" = Option<String>, Header, description = "With `follow`: resume after \
            this offset (overrides `since`)", pattern = "^\\s*[0-9]{1,19}\\s*$"),
    ),
    responses(
        (status = 200, description = "The entries (JSON), or with `follow=true` a \
            `text/event-stream` of `event: log` / `id: <sequence>` / `data: <entry>` frames; \
            output that was dropped before the reader got it is announced as `event: gap` with \
            `data: {\"from\":F,\"to\":T}` (bytes [F, T) lost) and no id.",
            content(
                (ProcessLogsResponse = "application/json"),
                (String = "text/event-stream"),
            )),
        (status = 400, description = "An invalid parameter or `Last-Event-ID`"),
        (status = 404, description = "No such process"),
        (status = 429, description = "16 readers follow this process already (`Retry-After`)"),
    )
)]
pub(super) async fn logs(
    State(st): State<AppState>,
    Path(id): Path<String>,
    Query(q): Params,
    headers: HeaderMap,
) -> Result<Response, Problem> {
    let stream: Option<StreamFilter> = match q.get("stream").map(String::as_str) {
        None | Some("") => None,
        Some(s) => Some(
            serde_json::from_value::<wire::StreamFilter>(Value::String(s.to_string()))
                .map_err(|_| {
                    Problem::bad_request(format!(
                        "stream must be one of stdout, stderr, combined, pty, not `{s}`"
                    ))
                })?
                .into(),
        ),
    };
    let mut since: Option<u64> = param(&q, "since")?;
    let tail: Option<usize> = param(&q, "tail")?;
    let follow = param::<bool>(&q, "follow")?.unwrap_or(false);
    let utf8 = wants_utf8(&q)?;
    if !follow {
        let logs = st.processes.logs(&id, since, tail, stream)?;
        let body = ProcessLogsResponse {
            process_id: id,
            stream: logs.stream.into(),
            entries: logs.chunks.iter().map(|c| entry(c, utf8)).collect(),
            end: logs.end,
            gap: logs.gap.map(|(from, to)| Gap { from, to }),
        };
        return Ok(axum::Json(body).into_response());
    }
    // A reconnecting EventSource resumes after the last id it saw.
    if let Some(v) = headers.get("last-event-id") {
        match v.to_str().ok().and_then(|s| s.trim().parse::<u64>().ok()) {
            Some(n) => since = Some(n),
            None => {
                return Err(Problem::bad_request(
                    "Last-Event-ID must be a non-negative integer (a log offset)",
                ));
            }
        }
    }
    let slot = st.processes.reader(&id)?;
    let filter = stream.unwrap_or(default_filter(&slot.process));
    let start = match (since, tail) {
        (Some(s), _) => s,
        // `tail` without `since`: replay the last n entries, then follow.
        (None, Some(n)) => slot
            .process
            .log
            .tail(0, filter, n)
            .first()
            .map_or(slot.process.log.end(), |c| c.start),
        (None, None) => 0,
    };
    let body = Body::from_stream(sse_frames(
        slot,
        filter,
        start,
        utf8,
        st.config.keepalive,
        st.shutdown.clone(),
    ));
    Ok(crate::http::sse_response(body))
}

/// The follow stream: `event: log` frames with `id: <offset>`, an `event: gap` frame (no id) when
/// output the reader asked for was dropped, keepalive comments, ending once the process has ended
/// and everything was sent (or at shutdown).
fn sse_frames(
    slot: ReaderSlot,
    filter: StreamFilter,
    start: u64,
    utf8: bool,
    keepalive: Duration,
    shutdown: tokio_util::sync::CancellationToken,
) -> impl futures_util::Stream<Item = Result<Bytes, Infallible>> + Send {
    let keepalive = keepalive.max(Duration::from_millis(10));
    let rx = slot.process.log.subscribe();
    futures_util::stream::unfold(Some((slot, rx, start)), move |state| {
        let shutdown = shutdown.clone();
        async move {
            let (slot, mut rx, mut cursor) = state?;
            loop {
                rx.borrow_and_update();
                let read = slot.process.log.read_after(cursor, filter, BATCH_BYTES);
                let mut out = String::new();
                if let Some(gap) = read.gap {
                    out.push_str(&format!("event: gap\ndata: {}\n\n", gap_json(gap)));
                }
                for c in &read.chunks {
                    out.push_str("event: log\nid: ");
                    out.push_str(&c.end().to_string());
                    out.push_str("\ndata: ");
                    entry_json(c, &mut out, utf8);
                    out.push_str("\n\n");
                }
                cursor = read.cursor;
                if !out.is_empty() {
                    let next = (!read.finished).then_some((slot, rx, cursor));
                    return Some((Ok(Bytes::from(out)), next));
                }
                if read.finished {
                    return None;
                }
                tokio::select! {
                    biased;
                    _ = shutdown.cancelled() => return None,
                    changed = rx.changed() => if changed.is_err() { return None },
                    _ = tokio::time::sleep(keepalive) => {
                        return Some((Ok(Bytes::from_static(b": keepalive\n\n")), Some((slot, rx, cursor))));
                    }
                }
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_hand_written_sse_entry_is_the_json_entry() {
        for (stream, data) in [
            (LogStream::Stdout, &b"hello\n"[..]),
            (LogStream::Stderr, &b"\xff\x00\"\\"[..]),
            (LogStream::Pty, &b""[..]),
        ] {
            let c = Chunk {
                start: 7,
                stream,
                at_ms: 1234,
                data: Bytes::copy_from_slice(data),
            };
            for utf8 in [false, true] {
                let mut s = String::new();
                entry_json(&c, &mut s, utf8);
                let by_hand: Value = serde_json::from_str(&s).expect("valid JSON");
                assert_eq!(by_hand, serde_json::to_value(entry(&c, utf8)).unwrap());
                assert_eq!(by_hand["sequence"], 7 + data.len() as u64);
            }
        }
    }
}
