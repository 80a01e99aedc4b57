//! JSON-RPC 2.0 framing as the proxy needs it, and no more: classify an envelope (request,
//! notification, response) and derive the key that correlates a request with its response.
//! **Invariant:** the proxy never rewrites a message's members; it only folds whitespace line
//! breaks into spaces so that every message travels as exactly one line.

use bytes::Bytes;
use serde::Deserialize;
use serde::de::IgnoredAny;
use serde_json::value::RawValue;

/// What a client POSTed.
#[derive(Debug)]
pub struct Envelope {
    pub kind: Kind,
    /// The object on one line, without the trailing newline.
    pub line: Bytes,
}

#[derive(Debug)]
pub enum Kind {
    /// `method` and `id`: answered with the agent's response.
    Request {
        key: IdKey,
        /// The id exactly as the client wrote it.
        raw_id: Box<RawValue>,
    },
    /// `method` without `id`.
    Notification,
    /// `id` without `method`: a client's answer to an agent→client request.
    Response,
}

/// The canonical JSON text of an id: `1` and `1` match, `"1"` and `1` do not, `"\u0041"` and
/// `"A"` do.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct IdKey(pub Box<str>);

#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum EnvelopeError {
    #[error("batches (JSON arrays) are not supported; POST one JSON-RPC object")]
    Batch,
    #[error("the body is not a JSON object")]
    NotAnObject,
    #[error("the body is not valid JSON: {0}")]
    Json(String),
    #[error("the object has neither `method` nor `id`, so it is no JSON-RPC message")]
    NoMethodNoId,
}

#[derive(Deserialize)]
struct Members<'a> {
    #[serde(borrow, default)]
    id: Option<&'a RawValue>,
    #[serde(default)]
    method: Option<IgnoredAny>,
}

impl IdKey {
    pub fn from_raw(raw: &RawValue) -> IdKey {
        let text = raw.get();
        let b = text.as_bytes();
        // Fast path for the ids clients actually use: plain integers and escape-free strings are
        // already canonical.
        let plain_int = !b.is_empty() && b.iter().all(u8::is_ascii_digit);
        let plain_str =
            b.len() >= 2 && b[0] == b'"' && b[b.len() - 1] == b'"' && !b.contains(&b'\\');
        if plain_int || plain_str {
            return IdKey(text.into());
        }
        match serde_json::from_str::<serde_json::Value>(text) {
            Ok(v) => IdKey(v.to_string().into()),
            Err(_) => IdKey(text.into()),
        }
    }
}

/// Classifies a POST body. Line breaks (only possible as whitespace in valid JSON) become spaces.
pub fn parse_envelope(body: Bytes) -> Result<Envelope, EnvelopeError> {
    let first = body.iter().find(|b| !b.is_ascii_whitespace()).copied();
    match first {
        Some(b'[') => {
            // Only call it a batch when it is valid JSON; otherwise report the syntax error.
            if let Err(e) = serde_json::from_slice::<IgnoredAny>(&body) {
                return Err(EnvelopeError::Json(e.to_string()));
            }
            return Err(EnvelopeError::Batch);
        }
        Some(b'{') => {}
        _ => {
            return Err(match serde_json::from_slice::<IgnoredAny>(&body) {
                Ok(_) => EnvelopeError::NotAnObject,
                Err(e) => EnvelopeError::Json(e.to_string()),
            });
        }
    }
    let members: Members<'_> =
        serde_json::from_slice(&body).map_err(|e| EnvelopeError::Json(e.to_string()))?;
    let kind = match (members.method.is_some(), members.id) {
        (true, Some(id)) => Kind::Request {
            key: IdKey::from_raw(id),
            raw_id: id.to_owned(),
        },
        (true, None) => Kind::Notification,
        (false, Some(_)) => Kind::Response,
        (false, None) => return Err(EnvelopeError::NoMethodNoId),
    };
    Ok(Envelope {
        kind,
        line: one_line(body),
    })
}

/// What the agent wrote on one stdout line.
#[derive(Debug, PartialEq, Eq)]
pub enum AgentLine {
    /// `id` without `method`: may answer a waiting POST.
    Response(IdKey),
    /// A notification or an agent→client request.
    Message,
}

/// Classifies one stdout line; `None` when it is not exactly one JSON object.
pub fn classify_agent_line(line: &[u8]) -> Option<AgentLine> {
    let first = line.iter().find(|b| !b.is_ascii_whitespace())?;
    if *first != b'{' {
        return None;
    }
    let members: Members<'_> = serde_json::from_slice(line).ok()?;
    Some(match (members.method.is_some(), members.id) {
        (false, Some(id)) => AgentLine::Response(IdKey::from_raw(id)),
        _ => AgentLine::Message,
    })
}

/// Folds CR and LF into spaces (valid JSON has them only as whitespace between tokens), copying
/// only when there is something to fold.
pub fn one_line(text: Bytes) -> Bytes {
    if !text.iter().any(|b| *b == b'\n' || *b == b'\r') {
        return text;
    }
    let mut v = text.to_vec();
    for b in &mut v {
        if *b == b'\n' || *b == b'\r' {
            *b = b' ';
        }
    }
    let trimmed = v.trim_ascii_end().len();
    v.truncate(trimmed);
    Bytes::from(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(body: &str, expected: Result<(&str, Option<&str>), EnvelopeError>) {
        let got = parse_envelope(Bytes::from(body.to_string())).map(|e| {
            let kind = match &e.kind {
                Kind::Request { key, .. } => ("request", Some(key.0.to_string())),
                Kind::Notification => ("notification", None),
                Kind::Response => ("response", None),
            };
            (kind.0, kind.1)
        });
        let expected = expected.map(|(k, id)| (k, id.map(str::to_string)));
        assert_eq!(got, expected, "body {body:?}");
    }

    #[test]
    fn envelopes() {
        check(
            r#"{"jsonrpc":"2.0","id":0,"method":"initialize"}"#,
            Ok(("request", Some("0"))),
        );
        check(r#"{"id":"a","method":"x"}"#, Ok(("request", Some("\"a\""))));
        check(
            r#"{"id":"\u0041","method":"x"}"#,
            Ok(("request", Some("\"A\""))),
        );
        check(r#"{"id":1.5,"method":"x"}"#, Ok(("request", Some("1.5"))));
        check(r#"{"method":"x"}"#, Ok(("notification", None)));
        check(r#"{"method":"x","id":null}"#, Ok(("notification", None)));
        check(r#"{"id":3,"result":{}}"#, Ok(("response", None)));
        check(r#"[{"method":"x"}]"#, Err(EnvelopeError::Batch));
        check("42", Err(EnvelopeError::NotAnObject));
        check(r#"{"result":1}"#, Err(EnvelopeError::NoMethodNoId));
        assert!(matches!(
            parse_envelope(Bytes::from_static(b"{nope")),
            Err(EnvelopeError::Json(_))
        ));
        assert!(matches!(
            parse_envelope(Bytes::from_static(b"[1,")),
            Err(EnvelopeError::Json(_))
        ));
    }

    #[test]
    fn pretty_bodies_become_one_line() {
        let e = parse_envelope(Bytes::from_static(b"{\n  \"method\": \"x\"\r\n}\n")).unwrap();
        assert_eq!(&e.line[..], b"{   \"method\": \"x\"  }");
    }

    #[test]
    fn agent_lines() {
        let key = |s: &str| AgentLine::Response(IdKey(s.into()));
        assert_eq!(
            classify_agent_line(br#"{"id":7,"result":{}}"#),
            Some(key("7"))
        );
        assert_eq!(
            classify_agent_line(br#"{"id":"x","error":{}}"#),
            Some(key("\"x\""))
        );
        assert_eq!(
            classify_agent_line(br#"{"id":1,"method":"session/request_permission"}"#),
            Some(AgentLine::Message)
        );
        assert_eq!(
            classify_agent_line(br#"{"method":"session/update"}"#),
            Some(AgentLine::Message)
        );
        assert_eq!(classify_agent_line(b"not json"), None);
        assert_eq!(classify_agent_line(b"[1]"), None);
        assert_eq!(classify_agent_line(b"{\"a\":1} trailing"), None);
    }
}
