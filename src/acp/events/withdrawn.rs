//! Requests an agent withdrew. A request a client answers (`session/request_permission`,
//! `elicitation/create`) that the agent later cancels (`$/cancel_request` naming its id) is not
//! offered to a new subscriber, nor is the cancellation. Live, the instance notes both as they
//! pass (`AcpInstance::note_asked`); a log read back (after a restart, from a session bundle,
//! across a reload) finds them again in its own events with [`scan`]: the withdrawal's record
//! is the agent's `$/cancel_request` itself, kept in the log with its id, so the format of the
//! state dir, of bundles and of the hand-off carries it without a field of its own.

use std::collections::HashMap;

use crate::acp::jsonrpc::IdKey;

/// Most requests of the agent waiting for an answer that are remembered (past it they are all
/// forgotten, and a later withdrawal of one is not seen: only an agent flooding requests that
/// nobody answers gets there).
pub const MAX_ASKED: usize = 256;

/// What one agent line is to the withdrawal bookkeeping.
#[derive(Debug, PartialEq, Eq)]
pub enum Asked {
    /// A request a client answers, by its JSON-RPC id.
    Request(IdKey),
    /// `$/cancel_request` naming this id.
    Cancel(IdKey),
}

/// Two substring scans for a line that is neither; a parse only for a line that may be one.
pub fn classify(line: &[u8]) -> Option<Asked> {
    if let Some(raw) = crate::acp::jsonrpc::cancelled_id(line) {
        return Some(Asked::Cancel(IdKey::from_raw(&raw)));
    }
    if find_bytes!(line, b"\"session/request_permission\"").is_none()
        && find_bytes!(line, b"\"elicitation/create\"").is_none()
    {
        return None;
    }
    #[derive(serde::Deserialize)]
    struct Req {
        id: Option<Box<serde_json::value::RawValue>>,
        method: Option<String>,
    }
    match serde_json::from_slice::<Req>(line) {
        Ok(Req {
            id: Some(raw),
            method: Some(m),
        }) if m == "session/request_permission" || m == "elicitation/create" => {
            Some(Asked::Request(IdKey::from_raw(&raw)))
        }
        _ => None,
    }
}

/// What a log's events say about withdrawals, in id order.
#[derive(Debug, Default)]
pub struct Found {
    /// The withdrawn requests' event ids and their cancellations', ascending.
    pub withdrawn: Vec<u64>,
    /// Requests still waiting for an answer: their JSON-RPC id → event id.
    pub open: HashMap<IdKey, u64>,
}

/// Goes through `events` (id, agent JSON line), oldest first, as the live path would have.
/// A log without any cancellation costs one substring scan per event.
pub fn scan<B: AsRef<[u8]>>(events: impl IntoIterator<Item = (u64, B)> + Clone) -> Found {
    let mut found = Found::default();
    let any = events
        .clone()
        .into_iter()
        .any(|(_, l)| find_bytes!(l.as_ref(), b"\"$/cancel_request\"").is_some());
    if !any {
        return found;
    }
    for (id, line) in events {
        match classify(line.as_ref()) {
            Some(Asked::Request(key)) => {
                if found.open.len() >= MAX_ASKED {
                    found.open.clear();
                }
                found.open.insert(key, id);
            }
            Some(Asked::Cancel(key)) => {
                if let Some(request) = found.open.remove(&key) {
                    found.withdrawn.push(request);
                    found.withdrawn.push(id);
                }
            }
            None => {}
        }
    }
    found.withdrawn.sort_unstable();
    found
}

/// The JSON line of an event's SSE frame (`…\ndata: LINE\n\n`).
pub fn frame_line(frame: &[u8]) -> Option<&[u8]> {
    let start = memchr::memmem::find(frame, b"\ndata: ")? + 7;
    let end = frame.len().checked_sub(2)?;
    (start <= end).then(|| &frame[start..end])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ask(id: &str) -> Vec<u8> {
        format!(
            r#"{{"jsonrpc":"2.0","id":{id},"method":"session/request_permission","params":{{}}}}"#
        )
        .into_bytes()
    }

    fn cancel(id: &str) -> Vec<u8> {
        format!(r#"{{"jsonrpc":"2.0","method":"$/cancel_request","params":{{"id":{id}}}}}"#)
            .into_bytes()
    }

    /// A request withdrawn is found with its cancellation; one still open is not; an id an
    /// agent reuses after a restart is matched with its own request, in order.
    #[test]
    fn a_scan_pairs_each_cancellation_with_the_request_it_names() {
        let update = br#"{"jsonrpc":"2.0","method":"session/update","params":{"x":"session/request_permission"}}"#.to_vec();
        let events: Vec<(u64, Vec<u8>)> = vec![
            (1, ask("0")),
            (2, update),
            (3, cancel("0")),
            (4, ask("\"e\"")),
            // The restarted agent numbers from 0 again: this request is not withdrawn.
            (16_390, ask("0")),
            // A cancellation of a request that is not in the log is kept.
            (16_391, cancel("7")),
        ];
        let found = scan(events.iter().map(|(id, l)| (*id, l)));
        assert_eq!(found.withdrawn, vec![1, 3]);
        assert_eq!(found.open.len(), 2);
        assert_eq!(found.open[&IdKey("0".into())], 16_390);
        assert_eq!(found.open[&IdKey("\"e\"".into())], 4);
    }

    #[test]
    fn a_frame_gives_back_its_line() {
        assert_eq!(
            frame_line(b"event: message\nid: 3\ndata: {\"a\":1}\n\n"),
            Some(&b"{\"a\":1}"[..])
        );
        assert_eq!(frame_line(b"garbage"), None);
    }
}
