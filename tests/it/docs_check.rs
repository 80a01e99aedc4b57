//! The user documentation stands alone: no page under docs/ (nor the READMEs) cites design
//! documents users do not have (the team's specs, its shared notes, its seed files), and every
//! page a relative link names exists — the README's first of all, since it is where people start.

use std::path::{Path, PathBuf};

const REPO: &str = env!("CARGO_MANIFEST_DIR");

/// Words that only make sense to someone holding the design documents.
const FORBIDDEN: &[&str] = &["spec 00", "spec-00", "../shared", "/work/shared", "seeds/"];

/// The pages users read: README.md, every .md under docs/ and the SDKs' READMEs.
fn pages() -> Vec<PathBuf> {
    let mut pages = vec![Path::new(REPO).join("README.md")];
    let mut dirs = vec![Path::new(REPO).join("docs")];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap().flatten() {
            let path = entry.path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "md") {
                pages.push(path);
            }
        }
    }
    for sdk in std::fs::read_dir(Path::new(REPO).join("sdks"))
        .unwrap()
        .flatten()
    {
        let readme = sdk.path().join("README.md");
        if readme.is_file() {
            pages.push(readme);
        }
    }
    pages.sort();
    pages
}

/// Every forbidden word of `text`, with its line number.
fn citations(text: &str) -> Vec<(usize, String)> {
    let mut found = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let lower = line.to_lowercase();
        for word in FORBIDDEN {
            if lower.contains(word) {
                found.push((i + 1, format!("`{word}` in: {}", line.trim())));
            }
        }
    }
    found
}

/// The targets of the relative Markdown links `[text](target)` of `text` (no scheme, no
/// pure anchor), without their `#anchor`.
fn relative_links(text: &str) -> Vec<String> {
    let mut links = Vec::new();
    let mut rest = text;
    while let Some(at) = rest.find("](") {
        rest = &rest[at + 2..];
        let Some(end) = rest.find(')') else { break };
        let target = rest[..end].trim();
        let target = target.split_whitespace().next().unwrap_or("");
        let path = target.split('#').next().unwrap_or("");
        if !path.is_empty() && !path.contains("://") && !path.starts_with("mailto:") {
            links.push(path.to_string());
        }
    }
    links
}

#[test]
fn no_page_cites_documents_users_do_not_have() {
    // The check itself finds what it must (and nothing in plain prose).
    assert_eq!(
        citations("as spec 002 §3 says\nsee ../shared/x.md").len(),
        2
    );
    assert!(citations("the specification of ACP").is_empty());
    let mut bad = Vec::new();
    for page in pages() {
        let text = std::fs::read_to_string(&page).unwrap();
        for (line, what) in citations(&text) {
            bad.push(format!(
                "{}:{line}: {what}",
                page.strip_prefix(REPO).unwrap().display()
            ));
        }
    }
    assert!(
        bad.is_empty(),
        "pages cite design documents:\n{}",
        bad.join("\n")
    );
}

#[test]
fn every_linked_page_exists() {
    assert_eq!(
        relative_links("see [a](docs/a.md#x), [b](https://x/y) and [c](#here) [d](e.md \"t\")"),
        ["docs/a.md", "e.md"]
    );
    let readme = Path::new(REPO).join("README.md");
    let readme_links = relative_links(&std::fs::read_to_string(&readme).unwrap());
    assert!(
        readme_links.iter().any(|l| l.starts_with("docs/")),
        "the README links no page of docs/: {readme_links:?}"
    );
    let mut missing = Vec::new();
    for page in pages() {
        let text = std::fs::read_to_string(&page).unwrap();
        let dir = page.parent().unwrap();
        for link in relative_links(&text) {
            if !dir.join(&link).exists() {
                missing.push(format!(
                    "{} links {link}",
                    page.strip_prefix(REPO).unwrap().display()
                ));
            }
        }
    }
    assert!(
        missing.is_empty(),
        "links to pages that do not exist:\n{}",
        missing.join("\n")
    );
}
