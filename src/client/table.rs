//! Plain-text tables for people: left-aligned columns two spaces apart, a header row, and every
//! cell stripped of control characters so that a name chosen by someone else cannot move the
//! terminal's cursor or change its colours.

/// Renders `header` and `rows` as aligned lines (each ending in `\n`).
pub fn render(header: &[&str], rows: &[Vec<String>]) -> String {
    let cells: Vec<Vec<String>> = std::iter::once(header.iter().map(|h| h.to_string()).collect())
        .chain(
            rows.iter()
                .map(|r| r.iter().map(|c| printable(c)).collect()),
        )
        .collect();
    let mut widths = vec![0; header.len()];
    for row in &cells {
        for (i, c) in row.iter().enumerate().take(widths.len()) {
            widths[i] = widths[i].max(c.chars().count());
        }
    }
    let mut out = String::new();
    for row in &cells {
        let mut line = String::new();
        for (i, c) in row.iter().enumerate().take(widths.len()) {
            if i + 1 == widths.len() {
                line.push_str(c);
            } else {
                line.push_str(c);
                line.extend(std::iter::repeat_n(' ', widths[i] - c.chars().count() + 2));
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

/// Control characters (escape sequences among them) shown escaped, the rest as is.
pub fn printable(s: &str) -> String {
    if !s.chars().any(char::is_control) {
        return s.to_string();
    }
    s.chars()
        .map(|c| {
            if c.is_control() {
                c.escape_default().to_string()
            } else {
                c.to_string()
            }
        })
        .collect()
}

/// `1.5M`, `320K`, `12B`: binary units, one decimal below 10.
pub fn bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "K", "M", "G", "T"];
    let mut v = n as f64;
    let mut unit = 0;
    while v >= 1024.0 && unit + 1 < UNITS.len() {
        v /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{n}B")
    } else if v < 10.0 {
        format!("{v:.1}{}", UNITS[unit])
    } else {
        format!("{v:.0}{}", UNITS[unit])
    }
}

/// CPU time: `0.12s`, `3.4s`, `2m05s`.
pub fn cpu(ms: u64) -> String {
    if ms < 10_000 {
        format!("{:.2}s", ms as f64 / 1000.0)
    } else if ms < 60_000 {
        format!("{:.1}s", ms as f64 / 1000.0)
    } else {
        format!("{}m{:02}s", ms / 60_000, (ms / 1000) % 60)
    }
}

/// A JSON member as a cell: numbers and strings as they are, absent or null as `-`.
pub fn cell(v: &serde_json::Value) -> String {
    match v {
        serde_json::Value::Null => "-".to_string(),
        serde_json::Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// A JSON value in words, for a two-column listing: an object as its `path` (when it has one)
/// then its other members as `name: value` in parentheses, `true`/`false` as yes/no, null
/// members left out — never raw JSON.
pub fn words(v: &serde_json::Value) -> String {
    use serde_json::Value;
    match v {
        Value::Null => "-".to_string(),
        Value::Bool(b) => if *b { "yes" } else { "no" }.to_string(),
        Value::Number(n) => n.to_string(),
        Value::String(s) => s.clone(),
        Value::Array(items) if items.is_empty() => "none".to_string(),
        Value::Array(items) => items.iter().map(words).collect::<Vec<_>>().join(", "),
        Value::Object(members) => {
            let head = members.get("path").and_then(Value::as_str);
            let rest: Vec<String> = members
                .iter()
                .filter(|(k, v)| !(v.is_null() || (head.is_some() && k.as_str() == "path")))
                .map(|(k, v)| format!("{k}: {}", words(v)))
                .collect();
            match (head, rest.is_empty()) {
                (Some(p), true) => p.to_string(),
                (Some(p), false) => format!("{p} ({})", rest.join(", ")),
                (None, true) => "-".to_string(),
                (None, false) => rest.join(", "),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(header: &[&str], rows: &[&[&str]], expected: &str) {
        let rows: Vec<Vec<String>> = rows
            .iter()
            .map(|r| r.iter().map(|c| c.to_string()).collect())
            .collect();
        assert_eq!(render(header, &rows), expected);
    }

    #[test]
    fn tables() {
        check(
            &["ID", "AGENT", "PID"],
            &[&["demo", "mock", "12"], &["a-longer-id", "claude", "-"]],
            "ID           AGENT   PID\ndemo         mock    12\na-longer-id  claude  -\n",
        );
        check(&["NAME"], &[&["\u{1b}[31mred"]], "NAME\n\\u{1b}[31mred\n");
        check(&["A", "B"], &[], "A  B\n");
    }

    #[test]
    fn values_in_words() {
        use serde_json::json;
        assert_eq!(
            words(&json!({"path": "/d", "writable": true, "problem": null})),
            "/d (writable: yes)"
        );
        assert_eq!(
            words(&json!({"path": "/d", "writable": false, "problem": "denied"})),
            "/d (problem: denied, writable: no)"
        );
        assert_eq!(words(&json!({"bytes": 3, "ok": true})), "bytes: 3, ok: yes");
        assert_eq!(words(&json!(false)), "no");
        assert_eq!(words(&json!(null)), "-");
        assert_eq!(words(&json!(["a", 1])), "a, 1");
    }

    #[test]
    fn units() {
        assert_eq!(bytes(512), "512B");
        assert_eq!(bytes(1536), "1.5K");
        assert_eq!(bytes(50 << 20), "50M");
        assert_eq!(cpu(120), "0.12s");
        assert_eq!(cpu(12_345), "12.3s");
        assert_eq!(cpu(125_000), "2m05s");
    }
}
