//! The keys the config file knows (the table's settings) and what to say about one it does not
//! (the nearest known key, or where agents are declared instead).

use std::path::Path;

use super::error::{ConfigError, UnknownKeyHint};

/// Every key the config file accepts: the table's settings, and `config` (which it ignores).
pub(super) fn known_file_keys() -> Vec<String> {
    super::settings::table()
        .iter()
        .map(|m| m.name.to_string())
        .chain(["config".to_string()])
        .collect()
}

/// The known key nearest to an unknown one (edit distance at most a third of its length).
pub(super) fn nearest_key<'a>(unknown: &str, known: &[&'a str]) -> Option<&'a str> {
    fn distance(a: &str, b: &str) -> usize {
        let b: Vec<char> = b.chars().collect();
        let mut prev: Vec<usize> = (0..=b.len()).collect();
        for (i, ca) in a.chars().enumerate() {
            let mut cur = vec![i + 1; b.len() + 1];
            for (j, cb) in b.iter().enumerate() {
                let cost = usize::from(ca != *cb);
                cur[j + 1] = (prev[j] + cost).min(prev[j + 1] + 1).min(cur[j] + 1);
            }
            prev = cur;
        }
        prev[b.len()]
    }
    let max = (unknown.chars().count() / 3).max(1);
    known
        .iter()
        .map(|k| (distance(unknown, k), *k))
        .filter(|(d, _)| *d <= max)
        .min()
        .map(|(_, k)| k)
}

/// What to say about a key the file does not know.
pub(super) fn unknown_key(key: &str, value: &toml::Value, file: &Path) -> ConfigError {
    let hint = if value.is_table()
        || (value.is_array()
            && value
                .as_array()
                .is_some_and(|a| a.iter().all(toml::Value::is_table) && !a.is_empty()))
    {
        if matches!(key, "agent" | "agents") {
            UnknownKeyHint::Agents
        } else {
            UnknownKeyHint::Table
        }
    } else {
        let known = known_file_keys();
        let known: Vec<&str> = known.iter().map(String::as_str).collect();
        match nearest_key(key, &known) {
            Some(k) => UnknownKeyHint::Nearest(k.to_string()),
            None => UnknownKeyHint::None,
        }
    };
    ConfigError::UnknownKey {
        path: file.to_path_buf(),
        key: key.to_string(),
        hint,
    }
}
