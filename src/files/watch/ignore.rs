//! The `?ignore=` patterns of a watch: globs over a path beneath the watched directory, matched
//! without recursion (two cursors and one backtrack point per level), so no pattern or path can
//! make the match deep or slow. `*` is any run of characters but `/`, `?` one character but `/`,
//! and `**` as a whole component any number of components. A pattern without `/` is matched
//! against every entry's name (so `node_modules` ignores it at any depth); one with `/` against
//! the path relative to the watched directory (a leading `/` is dropped).

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

/// Most patterns one watch takes.
pub const MAX_PATTERNS: usize = 64;
/// Longest pattern, in bytes.
pub const MAX_PATTERN_LEN: usize = 256;

/// Why the `ignore` values were refused (the text is the 400's detail).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IgnoreError {
    #[error("more than {MAX_PATTERNS} ignore patterns")]
    TooMany,
    #[error("an ignore pattern is longer than {MAX_PATTERN_LEN} bytes")]
    TooLong,
    #[error("an ignore pattern contains a NUL byte")]
    Nul,
}

#[derive(Debug, Default, Clone)]
pub struct IgnoreSet {
    /// Patterns without `/`, matched against the entry's name.
    names: Vec<Vec<u8>>,
    /// Patterns with `/`, as components, matched against the relative path's components.
    paths: Vec<Vec<Vec<u8>>>,
}

impl IgnoreSet {
    /// Parses the `ignore` values: each a comma-separated list; empty items are skipped.
    pub fn parse<'a>(values: impl IntoIterator<Item = &'a str>) -> Result<IgnoreSet, IgnoreError> {
        let mut set = IgnoreSet::default();
        let mut count = 0;
        for value in values {
            for pattern in value.split(',').map(str::trim).filter(|p| !p.is_empty()) {
                count += 1;
                if count > MAX_PATTERNS {
                    return Err(IgnoreError::TooMany);
                }
                if pattern.len() > MAX_PATTERN_LEN {
                    return Err(IgnoreError::TooLong);
                }
                if pattern.contains('\0') {
                    return Err(IgnoreError::Nul);
                }
                let trimmed = pattern.trim_start_matches('/');
                if trimmed.contains('/') {
                    let parts: Vec<Vec<u8>> = trimmed
                        .split('/')
                        .filter(|c| !c.is_empty())
                        .map(|c| c.as_bytes().to_vec())
                        .collect();
                    if !parts.is_empty() {
                        set.paths.push(parts);
                    }
                } else if !trimmed.is_empty() {
                    set.names.push(trimmed.as_bytes().to_vec());
                }
            }
        }
        Ok(set)
    }

    pub fn is_empty(&self) -> bool {
        self.names.is_empty() && self.paths.is_empty()
    }

    /// True when the entry `rel` (relative to the watched directory, never empty) is ignored.
    pub fn matches(&self, rel: &Path) -> bool {
        if self.is_empty() {
            return false;
        }
        let name = rel.file_name().map_or(&b""[..], OsStr::as_bytes);
        if self.names.iter().any(|p| glob(p, name)) {
            return true;
        }
        if self.paths.is_empty() {
            return false;
        }
        let parts: Vec<&[u8]> = rel.iter().map(OsStr::as_bytes).collect();
        self.paths.iter().any(|p| components(p, &parts))
    }
}

/// `*` and `?` within one component (neither matches `/`, which a component never contains).
fn glob(pattern: &[u8], text: &[u8]) -> bool {
    let (mut p, mut t) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while t < text.len() {
        if p < pattern.len() && (pattern[p] == b'?' || pattern[p] == text[t]) {
            p += 1;
            t += 1;
        } else if p < pattern.len() && pattern[p] == b'*' {
            star = Some((p, t));
            p += 1;
        } else if let Some((sp, st)) = star {
            // Let the last star take one more character and retry from there.
            p = sp + 1;
            t = st + 1;
            star = Some((sp, st + 1));
        } else {
            return false;
        }
    }
    pattern[p..].iter().all(|&c| c == b'*')
}

/// The same two-cursor walk one level up: `**` takes any number of components.
fn components(pattern: &[Vec<u8>], parts: &[&[u8]]) -> bool {
    let (mut p, mut t) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while t < parts.len() {
        if p < pattern.len() && pattern[p] != b"**" && glob(&pattern[p], parts[t]) {
            p += 1;
            t += 1;
        } else if p < pattern.len() && pattern[p] == b"**" {
            star = Some((p, t));
            p += 1;
        } else if let Some((sp, st)) = star {
            p = sp + 1;
            t = st + 1;
            star = Some((sp, st + 1));
        } else {
            return false;
        }
    }
    pattern[p..].iter().all(|c| c == b"**")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(patterns: &str, rel: &str, expected: bool) {
        let set = IgnoreSet::parse([patterns]).unwrap();
        assert_eq!(
            set.matches(Path::new(rel)),
            expected,
            "{patterns:?} on {rel:?}"
        );
    }

    #[test]
    fn patterns_match_names_anywhere_and_paths_from_the_top() {
        check(".git,node_modules", ".git", true);
        check(".git,node_modules", "a/b/node_modules", true);
        check(".git,node_modules", "a/node_modules_x", false);
        check("*.log", "build/out.log", true);
        check("*.log", "build/out.log.gz", false);
        check("a?c", "x/abc", true);
        check("a?c", "x/ac", false);
        check("build/*", "build/x", true);
        check("build/*", "build", false);
        check("build/*", "sub/build/x", false);
        check("/build/*.o", "build/a.o", true);
        check("**/dist", "dist", true);
        check("**/dist", "a/b/dist", true);
        check("src/**/gen", "src/gen", true);
        check("src/**/gen", "src/a/b/gen", true);
        check("src/**/gen", "lib/a/gen", false);
        check("src/**", "src/a/b", true);
        check("", "anything", false);
        check(" , ,", "anything", false);
        check("*", "x", true);
        check("**", "x", true);
    }

    #[test]
    fn hostile_patterns_stay_fast() {
        let pattern = "*a".repeat(100);
        let text = "a".repeat(4000) + "b";
        let set = IgnoreSet::parse([pattern.as_str()]).unwrap();
        // Quadratic at worst (200 x 4000 steps); a backtracking matcher would never finish.
        assert!(!set.matches(Path::new(&text)));
    }

    #[test]
    fn limits_are_enforced() {
        let many = vec!["x"; MAX_PATTERNS + 1].join(",");
        assert!(IgnoreSet::parse([many.as_str()]).is_err());
        let long = "x".repeat(MAX_PATTERN_LEN + 1);
        assert!(IgnoreSet::parse([long.as_str()]).is_err());
        assert!(IgnoreSet::parse(["a,b", "c"]).is_ok());
    }
}
