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
        /// The method's index in `metrics::ACP_METHODS` (`other` outside ACP's known set).
        method: u8,
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
    #[error("the body is not valid UTF-8 (byte {offset})")]
    InvalidUtf8 { offset: usize },
    #[error("the body has a lone UTF-16 surrogate escape (`\\u{code:04x}`) at byte {offset}")]
    LoneSurrogate { offset: usize, code: u16 },
    /// JSON-RPC 2.0: an id is a string, a number or null. An agent cannot echo any other id in
    /// its answer, so a request carrying one would wait for an answer that never comes.
    #[error("`id` must be a string, a number or null (JSON-RPC 2.0), not {found}")]
    BadId { found: &'static str },
    #[error("`method` must be a string (JSON-RPC 2.0), not {found}")]
    BadMethod { found: &'static str },
}

/// What kind of JSON value a raw value's text is, for the messages above.
fn json_kind(raw: &RawValue) -> &'static str {
    match raw.get().as_bytes().first() {
        Some(b'"') => "a string",
        Some(b'{') => "an object",
        Some(b'[') => "an array",
        Some(b't' | b'f') => "a boolean",
        Some(b'n') => "null",
        _ => "a number",
    }
}

#[derive(Deserialize)]
struct Members<'a> {
    #[serde(borrow, default)]
    id: Option<&'a RawValue>,
    #[serde(borrow, default)]
    method: Option<&'a RawValue>,
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

/// Checks that `text` is valid UTF-8 and that no `\\uXXXX` escape in it denotes a lone UTF-16
/// surrogate. serde_json skips over members it does not keep (`IgnoredAny`) without checking
/// either, and an agent handed such bytes may die of them, so both directions check first.
/// One linear pass without recursion; meant for text that is otherwise valid JSON, where every
/// backslash is inside a string.
pub fn check_text(text: &[u8]) -> Result<(), EnvelopeError> {
    if let Err(e) = std::str::from_utf8(text) {
        return Err(EnvelopeError::InvalidUtf8 {
            offset: e.valid_up_to(),
        });
    }
    let mut i = 0;
    // A high surrogate escape seen last (its offset and value): its low half must follow at once.
    let mut high: Option<(usize, u16)> = None;
    while let Some(pos) = text.get(i..).and_then(|t| memchr::memchr(b'\\', t)) {
        let at = i + pos;
        let is_u = text.get(at + 1) == Some(&b'u');
        let code = if is_u {
            text.get(at + 2..at + 6)
                .and_then(|h| std::str::from_utf8(h).ok())
                .and_then(|h| u16::from_str_radix(h, 16).ok())
        } else {
            None
        };
        if let Some((offset, code_hi)) = high.take() {
            let low_follows =
                at == offset + 6 && code.is_some_and(|c| (0xDC00..=0xDFFF).contains(&c));
            if !low_follows {
                return Err(EnvelopeError::LoneSurrogate {
                    offset,
                    code: code_hi,
                });
            }
            i = at + 6;
            continue;
        }
        match code {
            Some(c @ 0xD800..=0xDBFF) => high = Some((at, c)),
            Some(c @ 0xDC00..=0xDFFF) => {
                return Err(EnvelopeError::LoneSurrogate {
                    offset: at,
                    code: c,
                });
            }
            _ => {}
        }
        // Past the escape: `\\` must not be read as the start of another one.
        i = if code.is_some() { at + 6 } else { at + 2 };
    }
    match high {
        Some((offset, code)) => Err(EnvelopeError::LoneSurrogate { offset, code }),
        None => Ok(()),
    }
}

/// Classifies a POST body. Line breaks (only possible as whitespace in valid JSON) become spaces.
/// Only valid UTF-8 JSON without lone surrogate escapes is accepted.
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
    check_text(&body)?;
    // serde reads a member that is `null` as absent: an `id` of null is no id, a `method` of
    // null no method (a response or nothing), as before.
    if let Some(found @ ("an object" | "an array" | "a boolean")) = members.id.map(json_kind) {
        return Err(EnvelopeError::BadId { found });
    }
    if let Some(found) = members.method.map(json_kind).filter(|k| *k != "a string") {
        return Err(EnvelopeError::BadMethod { found });
    }
    let kind = match (members.method.is_some(), members.id) {
        (true, Some(id)) => Kind::Request {
            key: IdKey::from_raw(id),
            raw_id: id.to_owned(),
            method: members
                .method
                .map_or(u8::MAX, |m| crate::metrics::acp_method_index(m.get())),
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

/// Why an agent's stdout line is dropped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum BadLine {
    #[error("not a JSON object")]
    NotAnObject,
    #[error("not valid UTF-8")]
    InvalidUtf8,
    #[error("a lone UTF-16 surrogate escape")]
    LoneSurrogate,
}

/// Classifies one stdout line: exactly one JSON object, valid UTF-8, no lone surrogate escape.
pub fn classify_agent_line(line: &[u8]) -> Result<AgentLine, BadLine> {
    let first = line
        .iter()
        .find(|b| !b.is_ascii_whitespace())
        .ok_or(BadLine::NotAnObject)?;
    if *first != b'{' {
        return Err(BadLine::NotAnObject);
    }
    let members: Members<'_> = serde_json::from_slice(line).map_err(|_| BadLine::NotAnObject)?;
    check_text(line).map_err(|e| match e {
        EnvelopeError::LoneSurrogate { .. } => BadLine::LoneSurrogate,
        _ => BadLine::InvalidUtf8,
    })?;
    Ok(match (members.method.is_some(), members.id) {
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

/// The `params.id` of a `$/cancel_request` notification (one substring scan for every other).
pub(super) fn cancelled_id(line: &[u8]) -> Option<Box<serde_json::value::RawValue>> {
    find_bytes!(line, b"\"$/cancel_request\"")?;
    #[derive(serde::Deserialize)]
    struct Params {
        id: Box<serde_json::value::RawValue>,
    }
    #[derive(serde::Deserialize)]
    struct Msg {
        method: String,
        params: Params,
    }
    let m: Msg = serde_json::from_slice(line).ok()?;
    (m.method == "$/cancel_request").then_some(m.params.id)
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
    fn only_valid_utf8_without_lone_surrogates_is_accepted() {
        let bad = |b: &[u8]| parse_envelope(Bytes::copy_from_slice(b)).err();
        assert!(matches!(
            bad(b"{\"method\":\"x\",\"params\":\"\xff\xfe\"}"),
            Some(EnvelopeError::InvalidUtf8 { offset: 24 })
        ));
        for body in [
            r#"{"method":"x","params":"\ud800"}"#,
            r#"{"method":"x","params":"\uDFFF"}"#,
            r#"{"method":"x","params":"\ud800\u0041"}"#,
            r#"{"method":"x","params":"\ud800\ud800\udc00"}"#,
            r#"{"method":"x","params":"\ud800 \udc00"}"#,
            r#"{"id":"\ud800","method":"x"}"#,
        ] {
            assert!(
                matches!(
                    bad(body.as_bytes()),
                    Some(EnvelopeError::LoneSurrogate { .. })
                ),
                "{body}"
            );
        }
        for body in [
            r#"{"method":"x","params":"\ud83d\ude00 \u00e9 é \\ud800 \\"}"#,
            r#"{"method":"x","params":"\\\ud83d\ude00"}"#,
            r#"{"method":"x","params":"\\"}"#,
        ] {
            assert!(bad(body.as_bytes()).is_none(), "{body}");
        }
        assert!(check_text(b"\\").is_ok());
        assert!(check_text(b"\\u").is_ok());
        assert!(check_text(b"\\ud8").is_ok());
    }

    /// An id no agent can echo (found by schemathesis: the request waited out the 20 s timeout
    /// and answered 504) and a method that is not a string are refused at once.
    #[test]
    fn ids_and_methods_of_the_wrong_type_are_refused() {
        let parse = |t: &str| parse_envelope(Bytes::copy_from_slice(t.as_bytes()));
        for (id, found) in [
            ("{}", "an object"),
            (r#"{"a":[1]}"#, "an object"),
            ("[1]", "an array"),
            ("true", "a boolean"),
            ("false", "a boolean"),
        ] {
            for body in [
                format!(r#"{{"jsonrpc":"2.0","id":{id},"method":"x"}}"#),
                format!(r#"{{"jsonrpc":"2.0","id":{id},"result":{{}}}}"#),
            ] {
                assert_eq!(
                    parse(&body).err(),
                    Some(EnvelopeError::BadId { found }),
                    "{body}"
                );
            }
        }
        for (method, found) in [("1", "a number"), ("{}", "an object"), ("[]", "an array")] {
            let body = format!(r#"{{"jsonrpc":"2.0","id":1,"method":{method}}}"#);
            assert_eq!(
                parse(&body).err(),
                Some(EnvelopeError::BadMethod { found }),
                "{body}"
            );
        }
        // What JSON-RPC allows still passes: string, number (any form) and null ids.
        for id in ["\"a\"", "1", "-2.5e3", "null"] {
            let body = format!(r#"{{"jsonrpc":"2.0","id":{id},"method":"x"}}"#);
            assert!(parse(&body).is_ok(), "{body}");
        }
        let e = parse(r#"{"id":7,"method":null,"result":1}"#).unwrap();
        assert!(matches!(e.kind, Kind::Response));
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
            Ok(key("7"))
        );
        assert_eq!(
            classify_agent_line(br#"{"id":"x","error":{}}"#),
            Ok(key("\"x\""))
        );
        assert_eq!(
            classify_agent_line(br#"{"id":1,"method":"session/request_permission"}"#),
            Ok(AgentLine::Message)
        );
        assert_eq!(
            classify_agent_line(br#"{"method":"session/update"}"#),
            Ok(AgentLine::Message)
        );
        assert_eq!(classify_agent_line(b"not json"), Err(BadLine::NotAnObject));
        assert_eq!(classify_agent_line(b"[1]"), Err(BadLine::NotAnObject));
        assert_eq!(
            classify_agent_line(b"{\"a\":1} trailing"),
            Err(BadLine::NotAnObject)
        );
        assert_eq!(
            classify_agent_line(b"{\"method\":\"x\",\"params\":\"\xff\xfe\"}"),
            Err(BadLine::InvalidUtf8)
        );
        assert_eq!(
            classify_agent_line(br#"{"method":"x","params":"\ud800"}"#),
            Err(BadLine::LoneSurrogate)
        );
    }
}

/// Property tests against serde_json's full parser as the oracle: whatever the bytes, the
/// classification never panics, and it accepts exactly the valid UTF-8 JSON objects without lone
/// surrogates (`serde_json::Value` refuses those) that are JSON-RPC shaped. A few hundred cases
/// run with every `cargo test`; `PROPTEST_CASES=200000` runs them longer (docs/acp.md).
#[cfg(test)]
mod properties {
    use super::*;
    use proptest::prelude::*;
    use serde_json::Value;

    /// One piece of a JSON string literal's body, escapes included (surrogates on purpose).
    fn piece() -> impl Strategy<Value = String> {
        prop_oneof![
            "[a-z é😀]{0,3}".prop_map(|s| s),
            Just("\\\\".to_string()),
            Just("\\\"".to_string()),
            Just("\\n".to_string()),
            Just("\\\\u".to_string()),
            (0xD7F0u32..0xE010).prop_map(|c| format!("\\u{c:04x}")),
            any::<u16>().prop_map(|c| format!("\\u{c:04X}")),
        ]
    }

    fn string_literal() -> impl Strategy<Value = String> {
        prop::collection::vec(piece(), 0..6).prop_map(|p| format!("\"{}\"", p.concat()))
    }

    /// JSON text (objects with distinct keys), built by hand so the escapes stay as generated.
    fn json_text() -> impl Strategy<Value = String> {
        let leaf = prop_oneof![
            Just("null".to_string()),
            Just("true".to_string()),
            any::<i64>().prop_map(|n| n.to_string()),
            string_literal(),
        ];
        leaf.prop_recursive(4, 32, 6, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..4)
                    .prop_map(|v| format!("[{}]", v.join(","))),
                prop::collection::btree_map("[a-z]{1,3}", inner, 0..4).prop_map(|m| {
                    let members: Vec<String> =
                        m.into_iter().map(|(k, v)| format!("\"{k}\":{v}")).collect();
                    format!("{{{}}}", members.join(",\n"))
                }),
            ]
        })
    }

    /// A message-shaped object: optional `id`, optional `method`, other members.
    fn message() -> impl Strategy<Value = String> {
        (
            prop::option::of(prop_oneof![
                any::<u32>().prop_map(|n| n.to_string()),
                string_literal(),
                Just("null".to_string()),
            ]),
            prop::option::of(string_literal()),
            prop::option::of(json_text()),
        )
            .prop_map(|(id, method, params)| {
                let mut m = vec![r#""jsonrpc":"2.0""#.to_string()];
                if let Some(id) = id {
                    m.push(format!("\"id\":{id}"));
                }
                if let Some(method) = method {
                    m.push(format!("\"method\":{method}"));
                }
                if let Some(p) = params {
                    m.push(format!("\"params\":{p}"));
                }
                format!("{{{}}}", m.join(","))
            })
    }

    /// What the oracle says a body is: `Some((has_method, has_id))` for a valid object.
    fn oracle(bytes: &[u8]) -> Option<(bool, bool)> {
        let v: Value = serde_json::from_slice(bytes).ok()?;
        let o = v.as_object()?;
        Some((
            o.contains_key("method"),
            o.get("id").is_some_and(|id| !id.is_null()),
        ))
    }

    proptest! {
        #[test]
        fn envelopes_match_the_oracle(text in message()) {
            let got = parse_envelope(Bytes::from(text.clone()));
            match oracle(text.as_bytes()) {
                None => prop_assert!(got.is_err(), "accepted {text:?}"),
                Some((false, false)) => prop_assert_eq!(got.err(), Some(EnvelopeError::NoMethodNoId)),
                Some((method, id)) => {
                    let e = got.map_err(|e| TestCaseError::fail(format!("{e} for {text:?}")))?;
                    prop_assert!(!e.line.contains(&b'\n') && !e.line.contains(&b'\r'));
                    prop_assert!(std::str::from_utf8(&e.line).is_ok());
                    let kind_ok = match e.kind {
                        Kind::Request { .. } => method && id,
                        Kind::Notification => method && !id,
                        Kind::Response => !method && id,
                    };
                    prop_assert!(kind_ok, "{text:?}");
                }
            }
        }

        #[test]
        fn agent_lines_match_the_oracle(text in message()) {
            let line = text.replace('\n', " ");
            let got = classify_agent_line(line.as_bytes());
            match oracle(line.as_bytes()) {
                None => prop_assert!(got.is_err(), "accepted {line:?}"),
                Some((method, id)) => {
                    let want_response = !method && id;
                    prop_assert_eq!(matches!(got, Ok(AgentLine::Response(_))), want_response);
                    prop_assert!(got.is_ok());
                }
            }
        }

        #[test]
        fn surrogate_check_matches_serde(lit in string_literal()) {
            let serde_ok = serde_json::from_str::<String>(&lit).is_ok();
            prop_assert_eq!(check_text(lit.as_bytes()).is_ok(), serde_ok, "{}", lit);
        }

        #[test]
        fn arbitrary_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..64)) {
            let _ = check_text(&bytes);
            let _ = classify_agent_line(&bytes);
            if let Ok(e) = parse_envelope(Bytes::from(bytes.clone())) {
                prop_assert!(oracle(&bytes).is_some());
                prop_assert!(std::str::from_utf8(&e.line).is_ok());
            }
        }

        #[test]
        fn raw_bytes_inside_strings_are_refused_unless_utf8(
            prefix in "[a-z]{0,4}",
            raw in prop::collection::vec(128u8..=255, 1..4),
        ) {
            let mut body = format!(r#"{{"method":"x","params":"{prefix}"#).into_bytes();
            body.extend_from_slice(&raw);
            body.extend_from_slice(b"\"}");
            let utf8 = std::str::from_utf8(&body).is_ok();
            prop_assert_eq!(parse_envelope(Bytes::from(body.clone())).is_ok(), utf8);
            prop_assert_eq!(classify_agent_line(&body).is_ok(), utf8);
        }
    }
}
