//! `?limit=&cursor=` on list routes: parsing, the opaque cursor, and the 400s of bad values.
//!
//! A cursor is the base64url (no padding) of `v1:` and the sort key of the last item of the page
//! before; clients pass it back unchanged and must not build one. Without `limit` a list route
//! answers every item (as before paging); with it, at most `limit` items (1..=`MAX_LIMIT`) and a
//! `nextCursor` when more may follow.

use std::collections::HashMap;

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;

use super::Problem;

/// The response header naming the next page of a list answered as a bare JSON array.
pub const NEXT_CURSOR: &str = "sandbox-agent-next-cursor";

/// The largest page a client may ask for.
pub const MAX_LIMIT: usize = 1000;

const PREFIX: &str = "v1:";

/// A page request: the sort key to start after, and how many items at most.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Page {
    pub after: Option<String>,
    /// `None`: no `limit` given, every item.
    pub limit: Option<usize>,
}

impl Page {
    /// Reads `limit` and `cursor` from the query; other parameters are the route's own.
    pub fn from_query(q: &HashMap<String, String>) -> Result<Page, Problem> {
        let limit = match q.get("limit").map(String::as_str) {
            None | Some("") => None,
            Some(v) => match v.parse::<usize>() {
                Ok(n) if (1..=MAX_LIMIT).contains(&n) => Some(n),
                _ => {
                    return Err(Problem::bad_request(format!(
                        "limit must be an integer from 1 to {MAX_LIMIT}"
                    ))
                    .title("Invalid limit")
                    .with("limit", MAX_LIMIT as u64));
                }
            },
        };
        let after = match q.get("cursor").map(String::as_str) {
            None | Some("") => None,
            Some(c) => Some(decode(c).ok_or_else(|| {
                Problem::bad_request(
                    "cursor is not one this daemon gave out (pass nextCursor back unchanged)",
                )
                .title("Invalid cursor")
            })?),
        };
        Ok(Page { after, limit })
    }

    /// How many items to take.
    pub fn take(&self) -> usize {
        self.limit.unwrap_or(usize::MAX)
    }

    /// The cursor of the page after one that ends with `last_key`, when it was a full page.
    pub fn next(&self, got: usize, last_key: Option<&str>) -> Option<String> {
        match (self.limit, last_key) {
            (Some(n), Some(k)) if got >= n => Some(encode(k)),
            _ => None,
        }
    }

    /// One page of a list computed whole, `key` giving each item its sort key: without
    /// parameters every item in the given order; otherwise the items sorted by key, after the
    /// cursor's, at most `limit`, and the next cursor when the page is full.
    pub fn slice<T>(&self, items: Vec<T>, key: impl Fn(&T) -> String) -> (Vec<T>, Option<String>) {
        if self.after.is_none() && self.limit.is_none() {
            return (items, None);
        }
        let mut keyed: Vec<(String, T)> = items
            .into_iter()
            .map(|t| (key(&t), t))
            .filter(|(k, _)| self.after.as_deref().is_none_or(|a| k.as_str() > a))
            .collect();
        keyed.sort_by(|a, b| a.0.cmp(&b.0));
        keyed.truncate(self.take());
        let next = self.next(keyed.len(), keyed.last().map(|(k, _)| k.as_str()));
        (keyed.into_iter().map(|(_, t)| t).collect(), next)
    }
}

pub fn encode(key: &str) -> String {
    URL_SAFE_NO_PAD.encode(format!("{PREFIX}{key}"))
}

fn decode(cursor: &str) -> Option<String> {
    let raw = URL_SAFE_NO_PAD.decode(cursor).ok()?;
    let s = String::from_utf8(raw).ok()?;
    s.strip_prefix(PREFIX).map(str::to_string)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn a_cursor_round_trips_and_bad_values_are_400() {
        let p = Page::from_query(&q(&[("limit", "2"), ("cursor", &encode("s-1"))])).unwrap();
        assert_eq!(p.after.as_deref(), Some("s-1"));
        assert_eq!(p.limit, Some(2));
        assert_eq!(p.next(2, Some("s-3")), Some(encode("s-3")));
        assert_eq!(p.next(1, Some("s-3")), None, "a short page is the last");
        assert_eq!(Page::from_query(&q(&[])).unwrap().limit, None);
        let all = Page::from_query(&q(&[])).unwrap();
        assert_eq!(
            all.slice(vec!["b", "a"], |s| s.to_string()),
            (vec!["b", "a"], None)
        );
        let two = Page::from_query(&q(&[("limit", "2")])).unwrap();
        let (page, next) = two.slice(vec!["c", "a", "d", "b"], |s| s.to_string());
        assert_eq!(page, ["a", "b"]);
        let rest = Page::from_query(&q(&[("limit", "2"), ("cursor", &next.unwrap())])).unwrap();
        assert_eq!(
            rest.slice(vec!["d", "c", "a"], |s| s.to_string()).0,
            ["c", "d"]
        );
        for bad in [
            ("limit", "0"),
            ("limit", "1001"),
            ("limit", "x"),
            ("limit", "-1"),
            ("cursor", "%%"),
            ("cursor", "czE"),
            ("cursor", "not-base64!"),
        ] {
            let e = Page::from_query(&q(&[bad])).unwrap_err();
            assert_eq!(e.status, axum::http::StatusCode::BAD_REQUEST, "{bad:?}");
        }
    }
}
