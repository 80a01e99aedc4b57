//! The bytes a reload carries across its `execve` inside the services' hand-off state (event
//! frames, output chunks, outbox messages, a reader's unread bytes). The services hold them in
//! their export and adopt types; the daemon's reload (`daemon/reload/wire.rs`) writes them raw
//! beside the hand-off's JSON head and reads them back. A leaf: it knows neither side.

use bytes::Bytes;

/// Bulk bytes carried by a hand-off: raw beside the head (version 3), or text in a version-1/2
/// JSON document. In the version-3 head it is an empty string.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Payload(pub Bytes);

impl Payload {
    pub fn new(b: impl Into<Bytes>) -> Payload {
        Payload(b.into())
    }
}

impl serde::Serialize for Payload {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        if !self.0.is_empty() {
            return Err(serde::ser::Error::custom(
                "a payload was left in the hand-off's head",
            ));
        }
        s.serialize_str("")
    }
}

impl<'de> serde::Deserialize<'de> for Payload {
    /// Versions 1 and 2: the text itself (event frames, outbox messages).
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        Ok(Payload(Bytes::from(s.into_bytes())))
    }
}

/// Bulk bytes that versions 1 and 2 wrote as hex (output chunks, a reader's unread bytes); bad
/// hex is an error, never skipped. Version 3 carries it raw, like [`Payload`].
#[derive(Debug, Clone, Default, PartialEq)]
pub struct HexPayload(pub Bytes);

impl serde::Serialize for HexPayload {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        Payload(self.0.clone()).serialize(s)
    }
}

impl<'de> serde::Deserialize<'de> for HexPayload {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        unhex_strict(&s)
            .map(|b| HexPayload(b.into()))
            .map_err(serde::de::Error::custom)
    }
}

/// Why a hex string could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HexError {
    #[error("hex text of odd length {0}")]
    OddLength(usize),
    #[error("not a hex digit at {0}")]
    NotADigit(usize),
}

/// The bytes of a hex string; an error for anything that is not pairs of hex digits.
pub fn unhex_strict(s: &str) -> Result<Vec<u8>, HexError> {
    let b = s.as_bytes();
    if !b.len().is_multiple_of(2) {
        return Err(HexError::OddLength(b.len()));
    }
    let digit = |c: u8, at: usize| -> Result<u8, HexError> {
        match c {
            b'0'..=b'9' => Ok(c - b'0'),
            b'a'..=b'f' => Ok(c - b'a' + 10),
            b'A'..=b'F' => Ok(c - b'A' + 10),
            _ => Err(HexError::NotADigit(at)),
        }
    };
    b.chunks(2)
        .enumerate()
        .map(|(i, p)| Ok(digit(p[0], 2 * i)? << 4 | digit(p[1], 2 * i + 1)?))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strict_hex_refuses_what_it_cannot_read() {
        let check = |s: &str, want: Result<Vec<u8>, ()>| {
            assert_eq!(unhex_strict(s).map_err(|_| ()), want, "{s:?}")
        };
        check("00ff7A", Ok(vec![0, 255, 0x7a]));
        check("", Ok(vec![]));
        check("0", Err(()));
        check("zz00", Err(()));
        check("0g", Err(()));
    }
}
