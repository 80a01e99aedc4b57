//! The git half of the workspace API: every call spawns the `git` CLI (short-lived, supervised by
//! `supervisor::run_capped`: own process group, timeout, output cap) in a directory resolved
//! beneath the fs root. Invariants: nothing a client sends reaches git's argv where git could
//! read it as an option (values that start with `-` are refused, paths are absolute, revisions
//! follow `--end-of-options`); a repository's own configuration cannot make the daemon run a
//! program ([`HARDENING`], [`neutral_filters`], the environment of [`GitRunner::command`]).
//!
//! One concern although over 800 lines: `Git` is the workspace routes' git operations, each a
//! short argv built over the same hardened runner, value checks and output parsers (all here),
//! and keeping them together is what lets one read that no argv escapes those checks.

use std::ffi::OsString;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::process::Output;
use std::sync::Arc;
use std::time::Duration;

use crate::files::{FileError, PathPolicy, SandboxPath};
use crate::supervisor::ToolError;

/// What a git call can fail with; `http/error.rs` maps it to a status.
#[derive(Debug, thiserror::Error)]
pub enum GitError {
    #[error(transparent)]
    Path(#[from] FileError),
    #[error("{}: not a git repository", path.display())]
    NotARepository { path: PathBuf },
    #[error("{}: the repository lies outside the filesystem root", path.display())]
    RepositoryOutsideRoot { path: PathBuf },
    #[error("{0}")]
    Invalid(String),
    #[error("unknown revision {rev:?}")]
    UnknownRevision { rev: String },
    #[error("{0}")]
    Conflict(String),
    #[error("{0}")]
    NotFound(String),
    /// The remote refused the clone's credentials, or wanted some and none were given.
    #[error("the remote repository refused the credentials: {0}")]
    Unauthorized(String),
    /// A clone could not reach the remote, or did not trust it (DNS, connection, TLS, the
    /// remote's own server error).
    #[error("the remote repository could not be reached: {0}")]
    Remote(String),
    #[error("git failed: {0}")]
    Failed(String),
    #[error("git did not finish within {0:?}")]
    Timeout(Duration),
    #[error("git's output is larger than the limit of {limit} bytes")]
    TooLarge { limit: usize },
    #[error("cannot run git: {0}")]
    Spawn(String),
}

/// `-c` settings on every git call. Command-line configuration wins over every file git reads
/// (the repository's `config`, its includes, `config.worktree`), so a hostile repository cannot
/// turn these back on.
pub const HARDENING: &[&str] = &[
    // Programs a repository's config could name.
    "core.fsmonitor=false",
    "core.hooksPath=/dev/null",
    "diff.external=",
    "core.pager=cat",
    "core.editor=false",
    "sequence.editor=false",
    "core.sshCommand=false",
    "core.gitProxy=",
    "core.askPass=",
    "credential.helper=",
    "core.alternateRefsCommand=",
    "uploadpack.packObjectsHook=",
    "commit.gpgSign=false",
    "tag.gpgSign=false",
    "gpg.program=false",
    // Background work git may start after a command.
    "gc.auto=0",
    "maintenance.auto=false",
    "fetch.recurseSubmodules=false",
    "submodule.recurse=false",
    // Transports: local, file:// and http(s) only (no ssh, no `ext::` commands).
    "protocol.allow=never",
    "protocol.file.allow=always",
    "protocol.http.allow=always",
    "protocol.https.allow=always",
    // Ownership checks exist to keep another user's config from running programs; the settings
    // above do that for every call, and the daemon often serves repositories an agent user owns.
    "safe.directory=*",
    "core.quotePath=false",
    "color.ui=false",
];

/// The output cap of one git call (each of stdout and stderr).
pub const OUTPUT_CAP: usize = 64 << 20;

/// The empty tree's object name (SHA-1 repositories): the base of a diff in a repository
/// without commits.
const EMPTY_TREE: &str = "4b825dc642cb6eb9a060e54bf8d69288fbee4904";

/// At most this many git processes run at once; further calls wait for a slot (each request
/// holds its connection, so the wait is bounded by `--max-connections`).
pub const MAX_CONCURRENT: usize = 8;

/// The daemon's environment variables that reach git: where to find trusted certificate
/// authorities (git's own `GIT_SSL_CAINFO`/`GIT_SSL_CAPATH`, and OpenSSL's, for a git built
/// against it).
pub const CA_VARS: &[&str] = &[
    "GIT_SSL_CAINFO",
    "GIT_SSL_CAPATH",
    "SSL_CERT_FILE",
    "SSL_CERT_DIR",
];

#[derive(Clone)]
pub struct GitRunner {
    pub timeout: Duration,
    pub clone_timeout: Duration,
    pub slots: Arc<tokio::sync::Semaphore>,
}

impl GitRunner {
    /// `git` with [`HARDENING`] and a closed environment: no `GIT_*` variable of the daemon's
    /// own, no system or global config file, no terminal prompt, no pager, no editor.
    pub fn command(&self, cwd: &Path) -> tokio::process::Command {
        let mut cmd = tokio::process::Command::new("git");
        cmd.env_clear();
        for (k, v) in [
            ("PATH", "/usr/local/bin:/usr/bin:/bin"),
            ("LC_ALL", "C"),
            ("GIT_CONFIG_NOSYSTEM", "1"),
            ("GIT_CONFIG_GLOBAL", "/dev/null"),
            ("GIT_TERMINAL_PROMPT", "0"),
            ("GIT_ASKPASS", "false"),
            ("SSH_ASKPASS", "false"),
            ("GIT_PAGER", "cat"),
            ("GIT_EDITOR", "false"),
            ("GIT_OPTIONAL_LOCKS", "0"),
            ("GIT_NO_REPLACE_OBJECTS", "1"),
            ("GIT_PROTOCOL_FROM_USER", "0"),
            ("HOME", "/nonexistent"),
        ] {
            cmd.env(k, v);
        }
        // The daemon's own PATH, if it has one, finds the same git the tests see.
        if let Some(p) = std::env::var_os("PATH") {
            cmd.env("PATH", p);
        }
        // Which certificate authorities an https remote is checked against: the operator's
        // choice (a private CA, a TLS-inspecting proxy), set in the daemon's environment.
        // Files and directories only, never a program.
        for k in CA_VARS {
            if let Some(v) = std::env::var_os(k) {
                cmd.env(k, v);
            }
        }
        cmd.current_dir(cwd);
        cmd.arg("--no-pager");
        for c in HARDENING {
            cmd.arg("-c").arg(c);
        }
        cmd
    }

    async fn run(
        &self,
        mut cmd: tokio::process::Command,
        timeout: Duration,
    ) -> Result<Output, GitError> {
        // Nothing that reads from a terminal or stdin.
        cmd.stdin(std::process::Stdio::null());
        let _slot = self
            .slots
            .acquire()
            .await
            .map_err(|_| GitError::Spawn("shutting down".into()))?;
        match crate::supervisor::run_capped(cmd, timeout, OUTPUT_CAP).await {
            Ok(o) => Ok(o),
            Err(ToolError::Timeout { timeout, .. }) => Err(GitError::Timeout(timeout)),
            Err(ToolError::OutputTooLarge { limit, .. }) => Err(GitError::TooLarge { limit }),
            Err(e) => Err(GitError::Spawn(e.to_string())),
        }
    }

    /// Runs git in `cwd` with `args`; a non-zero exit is [`GitError::Failed`] with git's message.
    async fn ok(&self, repo: &Repo, args: &[&str]) -> Result<Vec<u8>, GitError> {
        let out = self.raw(repo, args, &[]).await?;
        if out.status.success() {
            Ok(out.stdout)
        } else {
            Err(GitError::Failed(message(&out)))
        }
    }

    async fn raw(
        &self,
        repo: &Repo,
        args: &[&str],
        env: &[(&str, OsString)],
    ) -> Result<Output, GitError> {
        let mut cmd = self.command(&repo.cwd);
        for f in &repo.filters {
            cmd.arg("-c").arg(f);
        }
        cmd.args(args);
        for (k, v) in env {
            cmd.env(k, v);
        }
        self.run(cmd, self.timeout).await
    }
}

/// git's own message from a failed call: its stderr, trimmed, at most 2 KiB.
fn message(out: &Output) -> String {
    let text = String::from_utf8_lossy(&out.stderr);
    let mut t = text.trim().to_string();
    if t.len() > 2048 {
        let mut cut = 2048;
        while !t.is_char_boundary(cut) {
            cut -= 1;
        }
        t.truncate(cut);
    }
    if t.is_empty() {
        format!("git exited with {}", out.status)
    } else {
        t
    }
}

/// A directory inside a repository, resolved and checked.
pub struct Repo {
    /// The real directory git runs in.
    pub cwd: PathBuf,
    /// The work tree's top level (absent for a bare repository).
    pub top: Option<PathBuf>,
    pub git_dir: PathBuf,
    pub common_dir: PathBuf,
    /// `-c filter.<driver>.*=` for every filter driver the repository's config defines.
    filters: Vec<String>,
}

/// Refuses a value git could read as an option, or that holds a NUL or a newline.
pub fn plain(what: &str, v: &str) -> Result<(), GitError> {
    if v.is_empty() {
        return Err(GitError::Invalid(format!("{what} is empty")));
    }
    if v.starts_with('-') {
        return Err(GitError::Invalid(format!(
            "{what} {v:?} starts with '-' and could be read as an option"
        )));
    }
    if v.contains(['\0', '\n', '\r']) {
        return Err(GitError::Invalid(format!(
            "{what} contains a NUL byte or a line break"
        )));
    }
    Ok(())
}

/// A branch name git itself accepts (checked by the rules of `git check-ref-format`, locally).
pub fn branch_name(v: &str) -> Result<(), GitError> {
    plain("branch", v)?;
    let bad = v.contains("..")
        || v.contains("@{")
        || v == "@"
        || v.ends_with('/')
        || v.ends_with(".lock")
        || v.ends_with('.')
        || v.starts_with('/')
        || v.contains("//")
        || v.split('/').any(|c| c.starts_with('.') || c.is_empty())
        || v.chars().any(|c| {
            c.is_ascii_control() || matches!(c, ' ' | '~' | '^' | ':' | '?' | '*' | '[' | '\\')
        });
    if bad {
        return Err(GitError::Invalid(format!(
            "{v:?} is not a valid branch name"
        )));
    }
    Ok(())
}

/// The git half of the workspace service.
pub struct Git {
    pub policy: Arc<PathPolicy>,
    pub runner: GitRunner,
}

fn lines0(b: &[u8]) -> impl Iterator<Item = &[u8]> {
    b.split(|c| *c == 0).filter(|s| !s.is_empty())
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn trimmed(b: &[u8]) -> String {
    String::from_utf8_lossy(b).trim().to_string()
}

// ---- wire-neutral answers (their JSON twins live in http/wire/workspace.rs) ----

#[derive(Debug, Clone)]
pub struct FileChange {
    pub path: String,
    pub old_path: Option<String>,
    pub status: &'static str,
    pub staged: bool,
}

#[derive(Debug, Clone)]
pub struct Status {
    pub branch: Option<String>,
    pub head: Option<String>,
    pub upstream: Option<String>,
    pub ahead: Option<u64>,
    pub behind: Option<u64>,
    pub files: Vec<FileChange>,
}

#[derive(Debug, Clone)]
pub struct DiffFile {
    pub path: String,
    pub old_path: Option<String>,
    pub status: &'static str,
    pub additions: u64,
    pub deletions: u64,
    pub binary: bool,
    pub patch: String,
}

#[derive(Debug, Clone)]
pub struct Diff {
    pub base: String,
    pub files: Vec<DiffFile>,
}

#[derive(Debug, Clone)]
pub struct Commit {
    pub sha: String,
    pub parents: Vec<String>,
    pub author_name: String,
    pub author_email: String,
    pub time: i64,
    pub subject: String,
}

#[derive(Debug, Clone)]
pub struct Branch {
    pub name: String,
    pub head: String,
}

#[derive(Debug, Clone)]
pub struct Worktree {
    pub path: String,
    pub branch: Option<String>,
    pub head: Option<String>,
}

pub struct CloneRequest {
    pub url: String,
    pub dest: String,
    pub depth: Option<u32>,
    pub branch: Option<String>,
    pub username: Option<String>,
    pub password: Option<String>,
}

fn status_word(c: u8) -> &'static str {
    match c {
        b'A' | b'C' => "added",
        b'D' => "deleted",
        b'R' => "renamed",
        b'U' => "conflicted",
        _ => "modified",
    }
}

impl Git {
    fn resolve(&self, input: &str) -> Result<SandboxPath, GitError> {
        Ok(self.policy.resolve(input)?)
    }

    /// Resolves `path` (beneath the root), finds its repository and checks that the work tree
    /// and the git directories git reports lie beneath the root too (a `.git` file or
    /// `core.worktree` could point elsewhere).
    pub async fn open(&self, path: &str, need_worktree: bool) -> Result<Repo, GitError> {
        let p = self.resolve(path)?;
        let policy = self.policy.clone();
        let p2 = p.clone();
        let cwd = tokio::task::spawn_blocking(move || policy.real_dir(&p2))
            .await
            .map_err(|e| GitError::Spawn(e.to_string()))??;
        let mut repo = Repo {
            cwd,
            top: None,
            git_dir: PathBuf::new(),
            common_dir: PathBuf::new(),
            filters: Vec::new(),
        };
        let out = self
            .runner
            .raw(
                &repo,
                &[
                    "rev-parse",
                    "--path-format=absolute",
                    "--absolute-git-dir",
                    "--git-common-dir",
                    "--is-bare-repository",
                ],
                &[],
            )
            .await?;
        if !out.status.success() {
            let m = message(&out);
            if m.contains("not a git repository") {
                return Err(GitError::NotARepository { path: p.abs });
            }
            return Err(GitError::Failed(m));
        }
        let s = text(&out.stdout);
        let mut l = s.lines();
        repo.git_dir = PathBuf::from(l.next().unwrap_or_default());
        repo.common_dir = PathBuf::from(l.next().unwrap_or_default());
        let bare = l.next() == Some("true");
        if !bare {
            let top = self
                .runner
                .ok(&repo, &["rev-parse", "--show-toplevel"])
                .await;
            match top {
                Ok(t) => repo.top = Some(PathBuf::from(trimmed(&t))),
                // Inside the git dir itself, say.
                Err(_) if !need_worktree => {}
                Err(_) => return Err(GitError::NotARepository { path: p.abs }),
            }
        } else if need_worktree {
            return Err(GitError::Invalid(format!(
                "{}: a bare repository has no work tree",
                p.abs.display()
            )));
        }
        for d in [
            Some(&repo.git_dir),
            Some(&repo.common_dir),
            repo.top.as_ref(),
        ]
        .into_iter()
        .flatten()
        {
            if !self.policy.contains(d) || d.as_os_str().is_empty() {
                return Err(GitError::RepositoryOutsideRoot { path: p.abs });
            }
        }
        repo.filters = neutral_filters(&self.runner, &repo).await?;
        Ok(repo)
    }

    /// `sha` of a revision (commit), or UnknownRevision.
    async fn rev(&self, repo: &Repo, rev: &str) -> Result<String, GitError> {
        plain("revision", rev)?;
        let spec = format!("{rev}^{{commit}}");
        let out = self
            .runner
            .raw(
                repo,
                &[
                    "rev-parse",
                    "--verify",
                    "--quiet",
                    "--end-of-options",
                    &spec,
                ],
                &[],
            )
            .await?;
        if out.status.success() {
            Ok(trimmed(&out.stdout))
        } else {
            Err(GitError::UnknownRevision {
                rev: rev.to_string(),
            })
        }
    }

    async fn head(&self, repo: &Repo) -> Result<Option<String>, GitError> {
        let out = self
            .runner
            .raw(repo, &["rev-parse", "--verify", "--quiet", "HEAD"], &[])
            .await?;
        Ok(out.status.success().then(|| trimmed(&out.stdout)))
    }

    pub async fn status(&self, path: &str) -> Result<Status, GitError> {
        let repo = self.open(path, true).await?;
        let out = self
            .runner
            .ok(
                &repo,
                &[
                    "status",
                    "--porcelain=v2",
                    "-z",
                    "--branch",
                    "--untracked-files=all",
                    "--ignore-submodules=none",
                ],
            )
            .await?;
        Ok(parse_status(&out))
    }

    /// The HEAD commit of the repository `path` is in, when it has one (for `gitBase`).
    pub async fn head_of(&self, path: &str) -> Option<String> {
        let repo = self.open(path, false).await.ok()?;
        self.head(&repo).await.ok().flatten()
    }

    pub async fn diff(&self, path: &str, base: Option<&str>) -> Result<Diff, GitError> {
        let repo = self.open(path, true).await?;
        let base = match base {
            Some(b) => self.rev(&repo, b).await?,
            None => match self.head(&repo).await? {
                Some(h) => h,
                None => EMPTY_TREE.to_string(),
            },
        };
        // Untracked files are diffed through a private copy of the index in which they are
        // marked intent-to-add: the real index is never touched. What that writes (the empty
        // blob) goes to a private object directory too, the repository's own objects read as an
        // alternate: nothing is written into the repository.
        let index = TempIndex::new(&repo).await?;
        let env = [
            ("GIT_INDEX_FILE", index.path.clone().into_os_string()),
            (
                "GIT_OBJECT_DIRECTORY",
                index.objects.clone().into_os_string(),
            ),
            (
                "GIT_ALTERNATE_OBJECT_DIRECTORIES",
                repo.common_dir.join("objects").into_os_string(),
            ),
        ];
        let add = self
            .runner
            .raw(
                &repo,
                &["add", "--all", "--intent-to-add", "--", ":/"],
                &env,
            )
            .await?;
        if !add.status.success() {
            return Err(GitError::Failed(message(&add)));
        }
        let common = ["diff", "--no-ext-diff", "--no-textconv", "--no-color", "-M"];
        let mut a: Vec<&str> = common.to_vec();
        a.extend(["--raw", "--numstat", "-z", "--end-of-options", &base, "--"]);
        let raw = self.runner.raw(&repo, &a, &env).await?;
        if !raw.status.success() {
            return Err(GitError::Failed(message(&raw)));
        }
        let mut b: Vec<&str> = common.to_vec();
        b.extend(["-p", "--end-of-options", &base, "--"]);
        let patch = self.runner.raw(&repo, &b, &env).await?;
        drop(index);
        if !patch.status.success() {
            return Err(GitError::Failed(message(&patch)));
        }
        let mut files = parse_raw_numstat(&raw.stdout);
        for (f, p) in files.iter_mut().zip(split_patches(&patch.stdout)) {
            f.patch = p;
        }
        Ok(Diff { base, files })
    }

    pub async fn log(&self, path: &str, limit: u32) -> Result<Vec<Commit>, GitError> {
        let repo = self.open(path, false).await?;
        if self.head(&repo).await?.is_none() {
            return Ok(Vec::new());
        }
        let n = format!("--max-count={limit}");
        let out = self
            .runner
            .ok(
                &repo,
                &[
                    "log",
                    "-z",
                    &n,
                    "--format=%H%x00%P%x00%an%x00%ae%x00%at%x00%s",
                    "HEAD",
                    "--",
                ],
            )
            .await?;
        let fields: Vec<&[u8]> = out.split(|c| *c == 0).collect();
        let mut commits = Vec::new();
        for c in fields.chunks(6) {
            if c.len() < 6 {
                break;
            }
            let sha = trimmed(c[0]);
            if sha.is_empty() {
                break;
            }
            commits.push(Commit {
                sha,
                parents: text(c[1]).split_whitespace().map(String::from).collect(),
                author_name: text(c[2]),
                author_email: text(c[3]),
                time: trimmed(c[4]).parse().unwrap_or(0),
                subject: text(c[5]),
            });
        }
        Ok(commits)
    }

    pub async fn commit(
        &self,
        path: &str,
        message_text: &str,
        all: bool,
        author: Option<(String, String)>,
    ) -> Result<String, GitError> {
        if message_text.trim().is_empty() {
            return Err(GitError::Invalid("the commit message is empty".into()));
        }
        if message_text.contains('\0') {
            return Err(GitError::Invalid(
                "the commit message contains a NUL byte".into(),
            ));
        }
        let mut env: Vec<(&str, OsString)> = Vec::new();
        if let Some((name, email)) = &author {
            for v in [name, email] {
                if v.trim().is_empty() || v.contains(['<', '>', '\n', '\0']) {
                    return Err(GitError::Invalid(format!("invalid author {v:?}")));
                }
            }
            env.extend([
                ("GIT_AUTHOR_NAME", name.into()),
                ("GIT_AUTHOR_EMAIL", email.into()),
                ("GIT_COMMITTER_NAME", name.into()),
                ("GIT_COMMITTER_EMAIL", email.into()),
            ]);
        }
        let repo = self.open(path, true).await?;
        if author.is_none() {
            // The repository's identity if it has one, else the daemon's.
            for (key, var, fallback) in [
                ("user.name", "GIT_AUTHOR_NAME", "Sandbox Agent"),
                ("user.email", "GIT_AUTHOR_EMAIL", "sandbox-agent@localhost"),
            ] {
                let out = self
                    .runner
                    .raw(&repo, &["config", "--get", key], &[])
                    .await?;
                if !out.status.success() || out.stdout.trim_ascii().is_empty() {
                    env.push((var, fallback.into()));
                    env.push((
                        if var == "GIT_AUTHOR_NAME" {
                            "GIT_COMMITTER_NAME"
                        } else {
                            "GIT_COMMITTER_EMAIL"
                        },
                        fallback.into(),
                    ));
                }
            }
        }
        if all {
            self.runner.ok(&repo, &["add", "--all", "--", ":/"]).await?;
        }
        let staged = self
            .runner
            .raw(
                &repo,
                &["diff", "--cached", "--quiet", "--no-ext-diff"],
                &[],
            )
            .await?;
        match staged.status.code() {
            Some(0) => {
                // An unborn HEAD with an empty index is also "nothing to commit".
                return Err(GitError::Conflict("nothing to commit".into()));
            }
            Some(1) => {}
            _ => return Err(GitError::Failed(message(&staged))),
        }
        let m = format!("--message={message_text}");
        let out = self
            .runner
            .raw(&repo, &["commit", "--no-verify", "--quiet", &m], &env)
            .await?;
        if !out.status.success() {
            return Err(GitError::Failed(message(&out)));
        }
        self.head(&repo)
            .await?
            .ok_or_else(|| GitError::Failed("no HEAD after the commit".into()))
    }

    pub async fn branches(&self, path: &str) -> Result<(Option<String>, Vec<Branch>), GitError> {
        let repo = self.open(path, false).await?;
        let current = self
            .runner
            .raw(&repo, &["symbolic-ref", "--quiet", "--short", "HEAD"], &[])
            .await?;
        let current = current
            .status
            .success()
            .then(|| trimmed(&current.stdout))
            .filter(|s| !s.is_empty());
        let out = self
            .runner
            .ok(
                &repo,
                &[
                    "for-each-ref",
                    "--format=%(refname:strip=2)%00%(objectname)",
                    "refs/heads/",
                ],
            )
            .await?;
        let mut branches = Vec::new();
        for line in out.split(|c| *c == b'\n') {
            let mut it = line.split(|c| *c == 0);
            if let (Some(n), Some(h)) = (it.next(), it.next())
                && !n.is_empty()
            {
                branches.push(Branch {
                    name: text(n),
                    head: text(h),
                });
            }
        }
        Ok((current, branches))
    }

    pub async fn checkout(&self, path: &str, branch: &str, create: bool) -> Result<(), GitError> {
        branch_name(branch)?;
        let repo = self.open(path, true).await?;
        let mut args = vec!["switch", "--no-guess"];
        if create {
            args.push("--create");
        }
        args.push(branch);
        let out = self.runner.raw(&repo, &args, &[]).await?;
        if out.status.success() {
            return Ok(());
        }
        let m = message(&out);
        if m.contains("would be overwritten")
            || m.contains("already exists")
            || m.contains("is already used by worktree")
            || m.contains("is already checked out")
            || m.contains("you need to resolve your current index")
        {
            Err(GitError::Conflict(m))
        } else if m.contains("invalid reference") || m.contains("did not match") {
            Err(GitError::NotFound(format!("no branch {branch:?}")))
        } else {
            Err(GitError::Failed(m))
        }
    }

    /// Where a new directory (clone or worktree) goes: beneath the root, its parent created,
    /// itself absent or an empty directory. Returns its real path.
    async fn new_dir(&self, dest: &str) -> Result<PathBuf, GitError> {
        let d = self.resolve(dest)?;
        let policy = self.policy.clone();
        tokio::task::spawn_blocking(move || -> Result<PathBuf, GitError> {
            let (parent_rel, name) = d.split()?;
            let parent_abs = d.abs.parent().unwrap_or(Path::new("/")).to_path_buf();
            policy.create_dirs(&parent_rel, &parent_abs)?;
            let parent = SandboxPath {
                abs: parent_abs,
                rel: parent_rel,
            };
            let real_parent = policy.real_dir(&parent)?;
            let real = real_parent.join(&name);
            match std::fs::symlink_metadata(&real) {
                Err(_) => Ok(real),
                Ok(m) if m.is_dir() => {
                    let empty = std::fs::read_dir(&real)
                        .map(|mut r| r.next().is_none())
                        .unwrap_or(false);
                    if empty {
                        Ok(real)
                    } else {
                        Err(GitError::Conflict(format!(
                            "{}: already exists and is not empty",
                            d.abs.display()
                        )))
                    }
                }
                Ok(_) => Err(GitError::Conflict(format!(
                    "{}: already exists",
                    d.abs.display()
                ))),
            }
        })
        .await
        .map_err(|e| GitError::Spawn(e.to_string()))?
    }

    pub async fn add_worktree(
        &self,
        path: &str,
        dest: &str,
        branch: &str,
        base: Option<&str>,
    ) -> Result<Worktree, GitError> {
        branch_name(branch)?;
        let repo = self.open(path, false).await?;
        let base = match base {
            Some(b) => self.rev(&repo, b).await?,
            None => self
                .head(&repo)
                .await?
                .ok_or_else(|| GitError::Invalid("the repository has no commit yet".into()))?,
        };
        let dest = self.new_dir(dest).await?;
        let dest_s = dest.to_string_lossy().into_owned();
        let out = self
            .runner
            .raw(
                &repo,
                &["worktree", "add", "--quiet", "-b", branch, &dest_s, &base],
                &[],
            )
            .await?;
        if !out.status.success() {
            let m = message(&out);
            if m.contains("already exists") {
                return Err(GitError::Conflict(m));
            }
            return Err(GitError::Failed(m));
        }
        Ok(Worktree {
            path: dest_s,
            branch: Some(branch.to_string()),
            head: Some(base),
        })
    }

    pub async fn worktrees(&self, path: &str) -> Result<Vec<Worktree>, GitError> {
        let repo = self.open(path, false).await?;
        let out = self
            .runner
            .ok(&repo, &["worktree", "list", "--porcelain", "-z"])
            .await?;
        let mut list = Vec::new();
        let mut cur: Option<Worktree> = None;
        for field in out.split(|c| *c == 0) {
            if field.is_empty() {
                list.extend(cur.take());
                continue;
            }
            let f = text(field);
            if let Some(p) = f.strip_prefix("worktree ") {
                list.extend(cur.take());
                cur = Some(Worktree {
                    path: p.to_string(),
                    branch: None,
                    head: None,
                });
            } else if let Some(w) = cur.as_mut() {
                if let Some(h) = f.strip_prefix("HEAD ") {
                    w.head = Some(h.to_string());
                } else if let Some(b) = f.strip_prefix("branch ") {
                    w.branch = Some(b.strip_prefix("refs/heads/").unwrap_or(b).to_string());
                }
            }
        }
        list.extend(cur);
        Ok(list)
    }

    pub async fn remove_worktree(&self, path: &str, force: bool) -> Result<(), GitError> {
        let repo = self.open(path, true).await?;
        let top = repo.top.clone().unwrap_or_default();
        if repo.git_dir == repo.common_dir {
            return Err(GitError::Invalid(format!(
                "{}: the main work tree of a repository is not a removable worktree",
                top.display()
            )));
        }
        let dirty = self
            .runner
            .ok(&repo, &["status", "--porcelain", "--untracked-files=all"])
            .await?;
        if !dirty.is_empty() && !force {
            return Err(GitError::Conflict(format!(
                "{}: the worktree has changes (force=true removes it anyway)",
                top.display()
            )));
        }
        // From the shared git dir, not from inside the tree being removed.
        let main = Repo {
            cwd: repo.common_dir.clone(),
            top: None,
            git_dir: repo.common_dir.clone(),
            common_dir: repo.common_dir.clone(),
            filters: repo.filters.clone(),
        };
        let top_s = top.to_string_lossy().into_owned();
        let mut args = vec!["worktree", "remove"];
        if force {
            args.extend(["--force", "--force"]);
        }
        args.push(&top_s);
        self.runner.ok(&main, &args).await?;
        Ok(())
    }

    pub async fn clone_repo(&self, req: CloneRequest) -> Result<Worktree, GitError> {
        plain("url", &req.url)?;
        let url = self.clone_source(&req.url).await?;
        if let Some(b) = &req.branch {
            branch_name(b)?;
        }
        let dest = self.new_dir(&req.dest).await?;
        let dest_s = dest.to_string_lossy().into_owned();
        let parent = dest.parent().unwrap_or(Path::new("/")).to_path_buf();
        let mut cmd = self.runner.command(&parent);
        // Credentials reach git through its environment only (`GIT_CONFIG_COUNT`), as an
        // `http.extraHeader` for this one call: never in argv, the URL or the new repository's
        // config, never logged.
        if let Some(user) = &req.username {
            use base64::Engine;
            let pair = format!("{user}:{}", req.password.as_deref().unwrap_or(""));
            let token = base64::engine::general_purpose::STANDARD.encode(pair);
            cmd.env("GIT_CONFIG_COUNT", "1")
                .env("GIT_CONFIG_KEY_0", "http.extraHeader")
                .env(
                    "GIT_CONFIG_VALUE_0",
                    format!("Authorization: Basic {token}"),
                );
        } else if let Some(token) = &req.password {
            cmd.env("GIT_CONFIG_COUNT", "1")
                .env("GIT_CONFIG_KEY_0", "http.extraHeader")
                .env(
                    "GIT_CONFIG_VALUE_0",
                    format!("Authorization: Bearer {token}"),
                );
        }
        cmd.args(["clone", "--quiet", "--no-local", "--template="]);
        if let Some(d) = req.depth {
            cmd.arg(format!("--depth={d}"));
        }
        if let Some(b) = &req.branch {
            cmd.arg(format!("--branch={b}"));
        }
        cmd.arg("--end-of-options").arg(&url).arg(&dest_s);
        let out = self.runner.run(cmd, self.runner.clone_timeout).await;
        let failed = match out {
            Ok(o) if o.status.success() => None,
            Ok(o) => Some(GitError::Failed(message(&o))),
            Err(e) => Some(e),
        };
        if let Some(e) = failed {
            // No half-made clone is left behind.
            let d = dest.clone();
            let _ = tokio::task::spawn_blocking(move || std::fs::remove_dir_all(d)).await;
            return Err(match e {
                GitError::Failed(m)
                    if m.contains("not found")
                        || m.contains("does not appear to be a git repository")
                        || m.contains("Could not find remote branch") =>
                {
                    GitError::NotFound(m)
                }
                // A 401 with credentials makes git ask for others, which it may not
                // (no prompt, no askpass, no helper); without credentials, the same.
                GitError::Failed(m)
                    if m.contains("could not read Username")
                        || m.contains("could not read Password")
                        || m.contains("Authentication failed")
                        || m.contains("returned error: 401") =>
                {
                    GitError::Unauthorized(m)
                }
                // git prefixes every transport failure of an http(s) remote this way.
                GitError::Failed(m) if m.contains("unable to access") => GitError::Remote(m),
                e => e,
            });
        }
        let repo = self.open(&dest_s, false).await?;
        let head = self.head(&repo).await?;
        let branch = self
            .runner
            .raw(&repo, &["symbolic-ref", "--quiet", "--short", "HEAD"], &[])
            .await?;
        Ok(Worktree {
            path: dest_s,
            branch: branch
                .status
                .success()
                .then(|| trimmed(&branch.stdout))
                .filter(|s| !s.is_empty()),
            head,
        })
    }

    /// What `git clone` may read: an http(s) URL without credentials in it, or a local
    /// repository (a path or `file://`) beneath the root, given to git as its real path.
    async fn clone_source(&self, url: &str) -> Result<String, GitError> {
        let lower = url.to_ascii_lowercase();
        if lower.starts_with("https://") || lower.starts_with("http://") {
            let rest = &url[url.find("://").map_or(0, |i| i + 3)..];
            let authority = rest.split('/').next().unwrap_or("");
            if authority.contains('@') {
                return Err(GitError::Invalid(
                    "credentials in the URL would be stored in the clone's config; \
                     pass them as username/password"
                        .into(),
                ));
            }
            return Ok(url.to_string());
        }
        let local = if let Some(p) = url.strip_prefix("file://") {
            p.to_string()
        } else if url.contains("://") || url.contains("::") {
            return Err(GitError::Invalid(format!(
                "unsupported URL {url:?}: https, http, file:// and local paths are cloned"
            )));
        } else {
            url.to_string()
        };
        let p = self.resolve(&local)?;
        let policy = self.policy.clone();
        let real = tokio::task::spawn_blocking(move || policy.real_dir(&p))
            .await
            .map_err(|e| GitError::Spawn(e.to_string()))??;
        Ok(real.to_string_lossy().into_owned())
    }
}

/// `-c filter.<driver>.{clean,smudge,process}=` (and not required) for every filter driver the
/// repository's configuration defines: a driver named by `.gitattributes` would otherwise run
/// its program on `status`, `diff`, `add` and `checkout`. Attributes cannot be switched off
/// wholesale, so each driver is emptied by name; an empty command means "no filter".
async fn neutral_filters(runner: &GitRunner, repo: &Repo) -> Result<Vec<String>, GitError> {
    let out = runner
        .raw(
            repo,
            &[
                "config",
                "--includes",
                "-z",
                "--name-only",
                "--get-regexp",
                r"^filter\.",
            ],
            &[],
        )
        .await?;
    let mut drivers: Vec<String> = Vec::new();
    for key in lines0(&out.stdout) {
        let key = text(key);
        let key = key.trim();
        // filter.<driver>.<var>; the driver may itself contain dots.
        if let Some(rest) = key.strip_prefix("filter.")
            && let Some((driver, _)) = rest.rsplit_once('.')
            && !drivers.iter().any(|d| d == driver)
        {
            drivers.push(driver.to_string());
        }
    }
    let mut args = Vec::new();
    for d in drivers {
        for var in ["clean", "smudge", "process"] {
            args.push(format!("filter.{d}.{var}="));
        }
        args.push(format!("filter.{d}.required=false"));
    }
    Ok(args)
}

/// A private copy of the index, removed when dropped.
/// A private copy of a repository's index and a private object directory, in a directory of its own (0700, a fresh random name
/// under the system's temporary directory, made with `mkdir` so nothing planted is followed):
/// never inside the repository, so a repository the daemon can read but not write (read-only
/// mount, another owner) diffs as well as any. Removed with its directory when dropped.
struct TempIndex {
    dir: PathBuf,
    path: PathBuf,
    /// The object directory the diff writes into.
    objects: PathBuf,
}

impl TempIndex {
    async fn new(repo: &Repo) -> Result<Self, GitError> {
        let src = repo.git_dir.join("index");
        tokio::task::spawn_blocking(move || {
            let failed = |what: &str, e: std::io::Error| {
                GitError::Failed(format!("cannot {what} a private copy of the index: {e}"))
            };
            let dir = std::env::temp_dir().join(format!(
                "sandbox-agent-index-{}",
                crate::sys::random_hex::<12>()
            ));
            std::fs::DirBuilder::new()
                .mode(0o700)
                .create(&dir)
                .map_err(|e| failed("make", e))?;
            // Owned from here: dropped on any failure below, the directory goes with it.
            let index = TempIndex {
                path: dir.join("index"),
                objects: dir.join("objects"),
                dir,
            };
            std::fs::create_dir(&index.objects).map_err(|e| failed("make", e))?;
            match std::fs::copy(&src, &index.path) {
                // The copy keeps the index's mtime: git trusts an entry's cached stat only when
                // the file is older than the index ("racy git"), and a fresh mtime on the copy
                // would make a same-size change made in the index's second invisible.
                Ok(_) => {
                    let mtime = std::fs::metadata(&src)
                        .and_then(|m| m.modified())
                        .map_err(|e| failed("make", e))?;
                    std::fs::File::options()
                        .write(true)
                        .open(&index.path)
                        .and_then(|f| f.set_modified(mtime))
                        .map_err(|e| failed("make", e))?;
                    Ok(index)
                }
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(index),
                Err(e) => Err(failed("make", e)),
            }
        })
        .await
        .map_err(|e| GitError::Spawn(e.to_string()))?
    }
}

impl Drop for TempIndex {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

pub fn parse_status(out: &[u8]) -> Status {
    let mut st = Status {
        branch: None,
        head: None,
        upstream: None,
        ahead: None,
        behind: None,
        files: Vec::new(),
    };
    let mut records = out.split(|c| *c == 0);
    while let Some(r) = records.next() {
        if r.is_empty() {
            continue;
        }
        let line = text(r);
        if let Some(h) = line.strip_prefix("# ") {
            if let Some(v) = h.strip_prefix("branch.oid ") {
                st.head = (v != "(initial)").then(|| v.to_string());
            } else if let Some(v) = h.strip_prefix("branch.head ") {
                st.branch = (v != "(detached)").then(|| v.to_string());
            } else if let Some(v) = h.strip_prefix("branch.upstream ") {
                st.upstream = Some(v.to_string());
            } else if let Some(v) = h.strip_prefix("branch.ab ") {
                let mut it = v.split_whitespace();
                st.ahead = it
                    .next()
                    .and_then(|a| a.trim_start_matches('+').parse().ok());
                st.behind = it
                    .next()
                    .and_then(|b| b.trim_start_matches('-').parse().ok());
            }
            continue;
        }
        let kind = line.as_bytes()[0];
        match kind {
            b'?' => st.files.push(FileChange {
                path: line[2..].to_string(),
                old_path: None,
                status: "untracked",
                staged: false,
            }),
            b'1' | b'2' | b'u' => {
                let n = match kind {
                    b'1' => 8,
                    b'2' => 9,
                    _ => 10,
                };
                let parts: Vec<&str> = line.splitn(n + 1, ' ').collect();
                let Some(path) = parts.get(n) else { continue };
                let xy = parts.get(1).map(|s| s.as_bytes()).unwrap_or(b"..");
                let old_path = if kind == b'2' {
                    records.next().map(text)
                } else {
                    None
                };
                if kind == b'u' {
                    st.files.push(FileChange {
                        path: path.to_string(),
                        old_path: None,
                        status: "conflicted",
                        staged: false,
                    });
                    continue;
                }
                let (x, y) = (xy[0], xy.get(1).copied().unwrap_or(b'.'));
                if x != b'.' {
                    st.files.push(FileChange {
                        path: path.to_string(),
                        old_path: old_path.clone(),
                        status: status_word(x),
                        staged: true,
                    });
                }
                if y != b'.' {
                    st.files.push(FileChange {
                        path: path.to_string(),
                        old_path: if x == b'.' { old_path } else { None },
                        status: status_word(y),
                        staged: false,
                    });
                }
            }
            _ => {}
        }
    }
    st
}

/// `git diff --raw --numstat -z`: the raw records (`:modes shas STATUS\0path\0[path\0]`),
/// then one numstat record per file (`add\tdel\tpath\0`, or `add\tdel\t\0old\0new\0` for a
/// rename), in the same order.
pub fn parse_raw_numstat(out: &[u8]) -> Vec<DiffFile> {
    let mut it = out.split(|c| *c == 0).peekable();
    let mut files = Vec::new();
    while let Some(r) = it.peek() {
        if !r.starts_with(b":") {
            break;
        }
        let r = text(it.next().unwrap_or_default());
        let code = r
            .rsplit(' ')
            .next()
            .unwrap_or("M")
            .as_bytes()
            .first()
            .copied();
        let first = it.next().map(text).unwrap_or_default();
        let (path, old_path) = if matches!(code, Some(b'R') | Some(b'C')) {
            (it.next().map(text).unwrap_or_default(), Some(first))
        } else {
            (first, None)
        };
        files.push(DiffFile {
            path,
            old_path,
            status: status_word(code.unwrap_or(b'M')),
            additions: 0,
            deletions: 0,
            binary: false,
            patch: String::new(),
        });
    }
    for f in files.iter_mut() {
        let Some(r) = it.next() else { break };
        let r = text(r);
        let mut parts = r.splitn(3, '\t');
        let (a, d, rest) = (parts.next(), parts.next(), parts.next());
        if a == Some("-") && d == Some("-") {
            f.binary = true;
        } else {
            f.additions = a.and_then(|v| v.parse().ok()).unwrap_or(0);
            f.deletions = d.and_then(|v| v.parse().ok()).unwrap_or(0);
        }
        if rest == Some("") {
            // A rename: the two paths follow as records of their own.
            it.next();
            it.next();
        }
    }
    files
}

/// Splits `git diff -p` output at each `diff --git ` header, in order.
pub fn split_patches(out: &[u8]) -> Vec<String> {
    let mut starts = Vec::new();
    if out.starts_with(b"diff --git ") {
        starts.push(0);
    }
    let needle = b"\ndiff --git ";
    let mut i = 0;
    while let Some(pos) = memchr::memmem::find(&out[i..], needle) {
        starts.push(i + pos + 1);
        i += pos + 1;
    }
    let mut patches = Vec::with_capacity(starts.len());
    for (k, s) in starts.iter().enumerate() {
        let e = starts.get(k + 1).copied().unwrap_or(out.len());
        patches.push(text(&out[*s..e]));
    }
    patches
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check_branch(v: &str, ok: bool) {
        assert_eq!(branch_name(v).is_ok(), ok, "{v:?}");
    }

    #[test]
    fn branch_names_follow_git_rules_and_never_look_like_options() {
        check_branch("feature/x", true);
        check_branch("agent-1", true);
        check_branch("-b", false);
        check_branch("--upload-pack=x", false);
        check_branch("a..b", false);
        check_branch("a b", false);
        check_branch("a.lock", false);
        check_branch(".hidden", false);
        check_branch("x/", false);
        check_branch("@", false);
    }

    #[test]
    fn status_records_become_one_entry_per_side() {
        let out = b"# branch.oid abc\0# branch.head main\0# branch.ab +1 -2\0\
1 MM N... 100644 100644 100644 a a x.txt\0\
2 R. N... 100644 100644 100644 a a R100 new.txt\0old.txt\0? u.txt\0";
        let st = parse_status(out);
        assert_eq!(st.branch.as_deref(), Some("main"));
        assert_eq!((st.ahead, st.behind), (Some(1), Some(2)));
        let got: Vec<_> = st
            .files
            .iter()
            .map(|f| (f.path.as_str(), f.status, f.staged, f.old_path.as_deref()))
            .collect();
        assert_eq!(
            got,
            vec![
                ("x.txt", "modified", true, None),
                ("x.txt", "modified", false, None),
                ("new.txt", "renamed", true, Some("old.txt")),
                ("u.txt", "untracked", false, None),
            ]
        );
    }

    #[test]
    fn raw_and_numstat_records_pair_up() {
        let out = b":100644 100644 a b M\0x.txt\0:100644 100644 a b R090\0old\0new\0\
:000000 100644 0 0 A\0bin\0\
3\t1\tx.txt\0\
1\t1\t\0old\0new\0-\t-\tbin\0";
        let f = parse_raw_numstat(out);
        assert_eq!(f.len(), 3);
        assert_eq!(
            (f[0].path.as_str(), f[0].additions, f[0].deletions),
            ("x.txt", 3, 1)
        );
        assert_eq!(
            (f[1].path.as_str(), f[1].old_path.as_deref()),
            ("new", Some("old"))
        );
        assert_eq!(f[1].status, "renamed");
        assert!(f[2].binary);
        assert_eq!(f[2].status, "added");
    }
}
