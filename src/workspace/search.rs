//! `/v1/fs/glob` and `/v1/fs/grep`: ripgrep's own walker (`ignore`: parallel, gitignore-aware)
//! and line searcher (`grep-searcher` over `grep-regex`). Invariants: the walk runs on the
//! blocking pool and stops at its limit, its deadline or as soon as the request is dropped (a
//! [`Cancel`] flag the walker threads read per entry); the answer is bounded (at most `limit`
//! entries, each line cut at [`LINE_CAP`] bytes); binary files are skipped whole.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use grep_matcher::Matcher;
use grep_regex::RegexMatcherBuilder;
use grep_searcher::{BinaryDetection, SearcherBuilder, Sink, SinkMatch};
use ignore::overrides::{Override, OverrideBuilder};
use ignore::{WalkBuilder, WalkState};

use super::git::GitError;

/// The default number of results, and the largest a request may ask for.
pub const DEFAULT_LIMIT: usize = 1000;
pub const MAX_LIMIT: usize = 100_000;
/// At most this many searches walk at once; further ones wait for a slot.
pub const MAX_CONCURRENT: usize = 4;
/// A matching line longer than this is cut (at a character boundary).
pub const LINE_CAP: usize = 1024;
/// A search that has not finished by then stops and answers what it found, `truncated`.
pub const DEADLINE: Duration = Duration::from_secs(30);

/// Set when the request that started a walk goes away; the walker threads stop at their next
/// entry.
#[derive(Clone, Default)]
pub struct Cancel(Arc<AtomicBool>);

impl Cancel {
    pub fn is_set(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }
}

/// Sets the flag when dropped (held by the request's future).
pub struct CancelOnDrop(pub Cancel);

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        self.0.0.store(true, Ordering::Relaxed);
    }
}

pub struct SearchOptions {
    pub hidden: bool,
    pub limit: usize,
    pub glob: Option<String>,
}

#[derive(Debug, Clone)]
pub struct GrepMatch {
    pub path: String,
    pub line: u64,
    pub column: u64,
    pub text: String,
}

fn overrides(root: &Path, glob: Option<&str>) -> Result<Override, GitError> {
    let mut b = OverrideBuilder::new(root);
    if let Some(g) = glob {
        b.add(g)
            .map_err(|e| GitError::Invalid(format!("invalid glob {g:?}: {e}")))?;
    }
    b.build()
        .map_err(|e| GitError::Invalid(format!("invalid glob: {e}")))
}

/// The walker both searches use: `.gitignore`, `.ignore` and `.git/info/exclude` honoured even
/// outside a git repository; dotfiles only with `hidden`; symlinks not followed.
fn walker(root: &Path, opts: &SearchOptions, ov: Override) -> WalkBuilder {
    let mut b = WalkBuilder::new(root);
    let threads = std::thread::available_parallelism().map_or(2, |n| n.get().min(8));
    b.hidden(!opts.hidden)
        .require_git(false)
        .follow_links(false)
        .overrides(ov)
        .threads(threads);
    b
}

/// What the walker threads share: results up to the limit, and why the walk stopped early.
struct Shared<T> {
    items: Mutex<Vec<T>>,
    count: AtomicUsize,
    truncated: AtomicBool,
}

impl<T> Shared<T> {
    fn new() -> Self {
        Shared {
            items: Mutex::new(Vec::new()),
            count: AtomicUsize::new(0),
            truncated: AtomicBool::new(false),
        }
    }
    /// Takes `batch` up to the limit; false once the walk must stop.
    fn push(&self, batch: Vec<T>, limit: usize) -> bool {
        if batch.is_empty() {
            return true;
        }
        let mut items = crate::sys::lock(&self.items);
        let room = limit.saturating_sub(items.len());
        let over = batch.len() > room;
        items.extend(batch.into_iter().take(room));
        self.count.store(items.len(), Ordering::Relaxed);
        if over {
            self.truncated.store(true, Ordering::Relaxed);
            return false;
        }
        true
    }
    fn into_parts(self) -> (Vec<T>, bool) {
        let items = self.items.into_inner().unwrap_or_else(|p| p.into_inner());
        (items, self.truncated.load(Ordering::Relaxed))
    }
}

fn stop(cancel: &Cancel, started: Instant, truncated: &AtomicBool) -> bool {
    if cancel.is_set() {
        return true;
    }
    if started.elapsed() > DEADLINE {
        truncated.store(true, Ordering::Relaxed);
        return true;
    }
    false
}

/// The files beneath `root` whose path relative to it matches the gitignore-style `pattern`
/// (`*.rs` anywhere, `src/**/*.rs` anchored), sorted.
pub fn glob(
    root: &Path,
    pattern: &str,
    opts: &SearchOptions,
    cancel: &Cancel,
) -> Result<(Vec<String>, bool), GitError> {
    let ov = overrides(root, Some(pattern))?;
    let shared = Shared::<String>::new();
    let started = Instant::now();
    let limit = opts.limit;
    walker(root, opts, ov).build_parallel().run(|| {
        let shared = &shared;
        Box::new(move |entry| {
            if stop(cancel, started, &shared.truncated) {
                return WalkState::Quit;
            }
            let Ok(entry) = entry else {
                return WalkState::Continue;
            };
            if !entry.file_type().is_some_and(|t| t.is_file()) {
                return WalkState::Continue;
            }
            let p = entry.path().to_string_lossy().into_owned();
            if shared.push(vec![p], limit) {
                WalkState::Continue
            } else {
                WalkState::Quit
            }
        })
    });
    let (mut paths, truncated) = shared.into_parts();
    paths.sort();
    Ok((paths, truncated))
}

/// One file's matches, kept apart until the file is done: a file found binary later on (a NUL
/// past the first buffer) contributes nothing.
struct FileSink<'a> {
    matcher: &'a grep_regex::RegexMatcher,
    path: &'a str,
    found: Vec<GrepMatch>,
    binary: bool,
    limit: usize,
}

impl Sink for FileSink<'_> {
    type Error = std::io::Error;

    fn matched(
        &mut self,
        _s: &grep_searcher::Searcher,
        m: &SinkMatch<'_>,
    ) -> Result<bool, Self::Error> {
        let line = m.bytes();
        let line = line.strip_suffix(b"\n").unwrap_or(line);
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        let column = self
            .matcher
            .find(line)
            .ok()
            .flatten()
            .map_or(1, |r| r.start() as u64 + 1);
        let mut text = String::from_utf8_lossy(&line[..line.len().min(LINE_CAP)]).into_owned();
        if line.len() > LINE_CAP {
            // from_utf8_lossy may have turned a cut character into U+FFFD; drop it.
            if text.ends_with('\u{FFFD}') {
                text.pop();
            }
        }
        self.found.push(GrepMatch {
            path: self.path.to_string(),
            line: m.line_number().unwrap_or(0),
            column,
            text,
        });
        // One file never adds more than the whole answer may hold.
        Ok(self.found.len() <= self.limit)
    }

    fn binary_data(
        &mut self,
        _s: &grep_searcher::Searcher,
        _offset: u64,
    ) -> Result<bool, Self::Error> {
        self.binary = true;
        Ok(false)
    }
}

/// Lines matching the regular expression `pattern` in the files beneath `root`.
pub fn grep(
    root: &Path,
    pattern: &str,
    ignore_case: bool,
    opts: &SearchOptions,
    cancel: &Cancel,
) -> Result<(Vec<GrepMatch>, bool), GitError> {
    let matcher = RegexMatcherBuilder::new()
        .case_insensitive(ignore_case)
        .line_terminator(Some(b'\n'))
        .build(pattern)
        .map_err(|e| GitError::Invalid(format!("invalid pattern: {e}")))?;
    let ov = overrides(root, opts.glob.as_deref())?;
    let shared = Shared::<GrepMatch>::new();
    let started = Instant::now();
    let limit = opts.limit;
    walker(root, opts, ov).build_parallel().run(|| {
        let shared = &shared;
        let matcher = matcher.clone();
        let mut searcher = SearcherBuilder::new()
            .binary_detection(BinaryDetection::quit(0))
            .line_number(true)
            .build();
        Box::new(move |entry| {
            if stop(cancel, started, &shared.truncated) {
                return WalkState::Quit;
            }
            let Ok(entry) = entry else {
                return WalkState::Continue;
            };
            if !entry.file_type().is_some_and(|t| t.is_file()) {
                return WalkState::Continue;
            }
            let path = entry.path().to_string_lossy();
            let mut sink = FileSink {
                matcher: &matcher,
                path: &path,
                found: Vec::new(),
                binary: false,
                limit,
            };
            if searcher
                .search_path(&matcher, entry.path(), &mut sink)
                .is_err()
                || sink.binary
            {
                return WalkState::Continue;
            }
            if shared.push(sink.found, limit) {
                WalkState::Continue
            } else {
                WalkState::Quit
            }
        })
    });
    let (mut matches, truncated) = shared.into_parts();
    matches.sort_by(|a, b| a.path.cmp(&b.path).then(a.line.cmp(&b.line)));
    Ok((matches, truncated))
}

/// Resolves the directory a search starts from (beneath the root).
pub fn search_root(
    policy: &crate::files::PathPolicy,
    input: &str,
) -> Result<PathBuf, crate::files::FileError> {
    let p = policy.resolve(input)?;
    policy.real_dir(&p)
}
