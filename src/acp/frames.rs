//! Reading the event log's SSE frames back as messages, for the faces of an instance that are not
//! SSE (the WebSocket endpoints and the RFD transport's router). **Invariant:** the frames parsed
//! here are only those `events.rs` makes (`event: message\nid: N\ndata: <one line>\n\n` and
//! `event: gap\ndata: {...}\n\n`), so a frame is split without copying its JSON.

use bytes::Bytes;

/// One frame of a chunk that `Subscription::next` returned.
#[derive(Debug, PartialEq, Eq)]
pub enum LogItem {
    /// An event: its id, the agent's JSON line, and the whole SSE frame.
    Message { id: u64, json: Bytes, frame: Bytes },
    /// Events `from..=to` were evicted before this reader got them.
    Gap { from: u64, to: u64 },
}

/// Splits a chunk of whole frames. Anything that is not one of the two shapes is skipped (it
/// cannot happen: `events.rs` makes every frame).
pub fn split(chunk: &Bytes) -> Vec<LogItem> {
    let mut out = Vec::new();
    let mut rest = chunk.clone();
    while !rest.is_empty() {
        let Some(end) = find_bytes!(&rest, b"\n\n") else {
            break;
        };
        let frame = rest.slice(..end + 2);
        rest = rest.slice(end + 2..);
        if let Some(item) = parse_frame(frame) {
            out.push(item);
        }
    }
    out
}

/// One whole frame (as `Subscription::next_into` hands them out).
pub fn parse_frame(frame: Bytes) -> Option<LogItem> {
    let body = frame.strip_suffix(b"\n\n")?;
    if let Some(after) = body.strip_prefix(b"event: message\nid: ") {
        let nl = memchr::memchr(b'\n', after)?;
        let id = std::str::from_utf8(&after[..nl]).ok()?.parse().ok()?;
        let data = after[nl + 1..].strip_prefix(b"data: ")?;
        let start = body.len() - data.len();
        let json = frame.slice(start..body.len());
        return Some(LogItem::Message { id, json, frame });
    }
    if let Some(data) = body.strip_prefix(b"event: gap\ndata: ") {
        #[derive(serde::Deserialize)]
        struct Gap {
            from: u64,
            to: u64,
        }
        let g: Gap = serde_json::from_slice(data).ok()?;
        return Some(LogItem::Gap {
            from: g.from,
            to: g.to,
        });
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(chunk: &str, expected: &[(u64, &str)]) {
        let got: Vec<(u64, String)> = split(&Bytes::from(chunk.to_string()))
            .into_iter()
            .map(|i| match i {
                LogItem::Message { id, json, frame } => {
                    assert!(frame.ends_with(b"\n\n"));
                    (id, String::from_utf8(json.to_vec()).unwrap())
                }
                LogItem::Gap { from, to } => (0, format!("gap {from}-{to}")),
            })
            .collect();
        let expected: Vec<(u64, String)> =
            expected.iter().map(|(i, s)| (*i, s.to_string())).collect();
        assert_eq!(got, expected);
    }

    #[test]
    fn frames() {
        check("", &[]);
        check("event: message\nid: 7\ndata: {}\n\n", &[(7, "{}")]);
        check(
            "event: gap\ndata: {\"from\":1,\"to\":3}\n\nevent: message\nid: 4\ndata: {\"a\":\"b\\n\"}\n\nevent: message\nid: 5\ndata: {}\n\n",
            &[(0, "gap 1-3"), (4, "{\"a\":\"b\\n\"}"), (5, "{}")],
        );
    }
}
