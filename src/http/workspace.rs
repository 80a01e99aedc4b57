//! The workspace API's HTTP faces: `/v1/git/*`, `/v1/fs/glob`, `/v1/fs/grep`, `/v1/ports*`
//! and the preview links at `/preview/<opaque>/…`, over [`crate::workspace`]. Wire types used by
//! one route only are declared here, beside their handler.

use std::time::Duration;

use axum::Json;
use axum::body::Body;
use axum::extract::rejection::JsonRejection;
use axum::extract::{DefaultBodyLimit, Path, Query, Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Redirect, Response};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};
use utoipa_axum::router::{OpenApiRouter, UtoipaMethodRouterExt};
use utoipa_axum::routes;

use super::files::json_problem;
use super::{AppState, Problem};
use crate::workspace::git::{self, CloneRequest};
use crate::workspace::ports::{Listener, PortEvent};
use crate::workspace::preview::{DEFAULT_TTL, MAX_TTL, PreviewError};
use crate::workspace::proxy::{self, Forward};
use crate::workspace::search::{self, Cancel, CancelOnDrop, SearchOptions};

pub fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(git_status))
        .routes(routes!(git_diff))
        .routes(routes!(git_log))
        .routes(routes!(git_commit))
        .routes(routes!(git_branches))
        .routes(routes!(git_checkout))
        .routes(routes!(list_worktrees, add_worktree, remove_worktree))
        .routes(routes!(git_clone))
        .routes(routes!(fs_glob))
        .routes(routes!(fs_grep))
        .routes(routes!(list_ports))
        .routes(routes!(port_events))
        .routes(
            routes!(
                proxy_get,
                proxy_post,
                proxy_put,
                proxy_patch,
                proxy_delete,
                proxy_head,
                proxy_options
            )
            .layer(DefaultBodyLimit::disable()),
        )
        .routes(
            routes!(
                proxy_root_get,
                proxy_root_post,
                proxy_root_put,
                proxy_root_patch,
                proxy_root_delete,
                proxy_root_head,
                proxy_root_options
            )
            .layer(DefaultBodyLimit::disable()),
        )
        .routes(routes!(create_preview))
}

/// `/preview/<opaque>/…`: an app's pages behind a signed link, outside the API document (like
/// the inspector's files) and outside the token check (the link is the credential).
pub fn preview_routes() -> axum::Router<AppState> {
    // openapi-exempt: the preview routes below, each exempted on its own line.
    use axum::routing::{any, get};
    axum::Router::new()
        // openapi-exempt: an app's pages behind a preview link, not an API route (docs/workspace.md).
        .route("/preview/{opaque}", get(preview_bare))
        // openapi-exempt: as above.
        .route("/preview/{opaque}/", any(preview_root))
        // openapi-exempt: as above.
        .route("/preview/{opaque}/{*path}", any(preview_path))
        .layer(DefaultBodyLimit::disable())
}

impl From<git::GitError> for Problem {
    fn from(e: git::GitError) -> Self {
        use git::GitError as E;
        let detail = e.to_string();
        match e {
            E::Path(f) => f.into(),
            E::NotARepository { .. } | E::NotFound(_) => Problem::not_found(detail),
            E::RepositoryOutsideRoot { .. } => Problem::new(StatusCode::FORBIDDEN, detail),
            E::Invalid(_) | E::UnknownRevision { .. } => Problem::bad_request(detail),
            E::Conflict(_) => Problem::new(StatusCode::CONFLICT, detail),
            E::Timeout(_) => Problem::new(StatusCode::GATEWAY_TIMEOUT, detail),
            E::TooLarge { limit } => {
                Problem::new(StatusCode::INSUFFICIENT_STORAGE, detail).with("limit", limit as u64)
            }
            E::Failed(_) | E::Spawn(_) => Problem::new(StatusCode::INTERNAL_SERVER_ERROR, detail),
        }
    }
}

impl From<proxy::ProxyError> for Problem {
    fn from(e: proxy::ProxyError) -> Self {
        let detail = e.to_string();
        match e {
            proxy::ProxyError::NoListener { port } | proxy::ProxyError::Upstream { port, .. } => {
                Problem::new(StatusCode::BAD_GATEWAY, detail).with("port", port)
            }
            proxy::ProxyError::OwnPort { port } => Problem::bad_request(detail).with("port", port),
        }
    }
}

fn json<T>(body: Result<Json<T>, JsonRejection>) -> Result<T, Problem> {
    body.map(|Json(b)| b).map_err(json_problem)
}

// ---------------------------------------------------------------- git

#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
struct RepoQuery {
    /// A directory inside a repository or worktree, absolute or relative to `--work-dir`.
    path: String,
}

#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct GitFileStatus {
    /// Relative to the repository's top level.
    path: String,
    /// The path before a rename.
    #[serde(skip_serializing_if = "Option::is_none")]
    old_path: Option<String>,
    /// `modified`, `added`, `deleted`, `renamed`, `untracked` or `conflicted`.
    status: &'static str,
    /// True for the index's side of a change; a file changed in both appears twice.
    staged: bool,
}

#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct GitStatus {
    branch: Option<String>,
    head: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    upstream: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    ahead: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    behind: Option<u64>,
    files: Vec<GitFileStatus>,
}

/// The work tree's state: branch, HEAD and every changed file.
#[utoipa::path(
    get,
    path = "/v1/git/status",
    operation_id = "gitStatus",
    tag = "git",
    params(RepoQuery),
    responses(
        (status = 200, description = "The status", body = GitStatus),
        (status = 400, description = "Invalid parameter, or a bare repository"),
        (status = 403, description = "Outside the fs root"),
        (status = 404, description = "No such directory, or not in a git repository"),
        (status = 500, description = "git failed"),
        (status = 504, description = "git did not finish in time"),
    )
)]
async fn git_status(
    State(s): State<AppState>,
    Query(q): Query<RepoQuery>,
) -> Result<Json<GitStatus>, Problem> {
    let st = s.workspace.git.status(&q.path).await?;
    Ok(Json(GitStatus {
        branch: st.branch,
        head: st.head,
        upstream: st.upstream,
        ahead: st.ahead,
        behind: st.behind,
        files: st
            .files
            .into_iter()
            .map(|f| GitFileStatus {
                path: f.path,
                old_path: f.old_path,
                status: f.status,
                staged: f.staged,
            })
            .collect(),
    }))
}

#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
struct DiffQuery {
    /// A directory inside a repository or worktree.
    path: String,
    /// The revision to compare with (default `HEAD`; the empty tree in a repository without
    /// commits).
    base: Option<String>,
}

#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct GitDiffFile {
    path: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    old_path: Option<String>,
    status: &'static str,
    additions: u64,
    deletions: u64,
    binary: bool,
    /// The file's unified diff (`diff --git …`).
    patch: String,
}

#[derive(Serialize, ToSchema)]
pub struct GitDiff {
    /// The commit (or empty tree) compared with.
    base: String,
    files: Vec<GitDiffFile>,
}

/// The work tree (untracked files included) against a base revision.
#[utoipa::path(
    get,
    path = "/v1/git/diff",
    operation_id = "gitDiff",
    tag = "git",
    params(DiffQuery),
    responses(
        (status = 200, description = "The diff", body = GitDiff),
        (status = 400, description = "Unknown or option-like revision"),
        (status = 403, description = "Outside the fs root"),
        (status = 404, description = "Not in a git repository"),
        (status = 507, description = "The diff is larger than the output cap (64 MiB)"),
        (status = 500, description = "git failed"),
        (status = 504, description = "git did not finish in time"),
    )
)]
async fn git_diff(
    State(s): State<AppState>,
    Query(q): Query<DiffQuery>,
) -> Result<Json<GitDiff>, Problem> {
    let d = s.workspace.git.diff(&q.path, q.base.as_deref()).await?;
    Ok(Json(GitDiff {
        base: d.base,
        files: d
            .files
            .into_iter()
            .map(|f| GitDiffFile {
                path: f.path,
                old_path: f.old_path,
                status: f.status,
                additions: f.additions,
                deletions: f.deletions,
                binary: f.binary,
                patch: f.patch,
            })
            .collect(),
    }))
}

#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
struct LogQuery {
    path: String,
    /// At most this many commits (default 50, at most 1000).
    limit: Option<u32>,
}

#[derive(Serialize, ToSchema)]
pub struct GitAuthor {
    name: String,
    email: String,
}

#[derive(Serialize, ToSchema)]
pub struct GitCommit {
    sha: String,
    parents: Vec<String>,
    author: GitAuthor,
    /// Author time, unix seconds.
    time: i64,
    subject: String,
}

#[derive(Serialize, ToSchema)]
pub struct GitLog {
    commits: Vec<GitCommit>,
}

/// The commits reachable from HEAD, newest first.
#[utoipa::path(
    get,
    path = "/v1/git/log",
    operation_id = "gitLog",
    tag = "git",
    params(LogQuery),
    responses(
        (status = 200, description = "The commits", body = GitLog),
        (status = 400, description = "Missing or invalid parameter"),
        (status = 403, description = "Outside the fs root"),
        (status = 404, description = "Not in a git repository"),
        (status = 500, description = "git failed"),
        (status = 504, description = "git did not finish in time"),
    )
)]
async fn git_log(
    State(s): State<AppState>,
    Query(q): Query<LogQuery>,
) -> Result<Json<GitLog>, Problem> {
    let limit = q.limit.unwrap_or(50).clamp(1, 1000);
    let commits = s.workspace.git.log(&q.path, limit).await?;
    Ok(Json(GitLog {
        commits: commits
            .into_iter()
            .map(|c| GitCommit {
                sha: c.sha,
                parents: c.parents,
                author: GitAuthor {
                    name: c.author_name,
                    email: c.author_email,
                },
                time: c.time,
                subject: c.subject,
            })
            .collect(),
    }))
}

#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct GitAuthorInput {
    name: String,
    email: String,
}

#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct GitCommitRequest {
    path: String,
    message: String,
    /// Stage every change first, untracked files included (`git add --all`).
    #[serde(default)]
    all: bool,
    /// Author and committer; default the repository's `user.*`, else `Sandbox Agent`.
    author: Option<GitAuthorInput>,
}

#[derive(Serialize, ToSchema)]
pub struct GitSha {
    sha: String,
}

/// Commits what is staged (everything with `all`); hooks and signing never run.
#[utoipa::path(
    post,
    path = "/v1/git/commit",
    operation_id = "gitCommit",
    tag = "git",
    request_body = GitCommitRequest,
    responses(
        (status = 200, description = "The new commit", body = GitSha),
        (status = 400, description = "Invalid body"),
        (status = 403, description = "Outside the fs root"),
        (status = 404, description = "Not in a git repository"),
        (status = 409, description = "Nothing to commit"),
        (status = 500, description = "git failed"),
        (status = 504, description = "git did not finish in time"),
    )
)]
async fn git_commit(
    State(s): State<AppState>,
    body: Result<Json<GitCommitRequest>, JsonRejection>,
) -> Result<Json<GitSha>, Problem> {
    let b = json(body)?;
    let sha = s
        .workspace
        .git
        .commit(
            &b.path,
            &b.message,
            b.all,
            b.author.map(|a| (a.name, a.email)),
        )
        .await?;
    Ok(Json(GitSha { sha }))
}

#[derive(Serialize, ToSchema)]
pub struct GitBranch {
    name: String,
    head: String,
}

#[derive(Serialize, ToSchema)]
pub struct GitBranches {
    /// The checked-out branch (null when HEAD is detached).
    current: Option<String>,
    branches: Vec<GitBranch>,
}

/// The local branches.
#[utoipa::path(
    get,
    path = "/v1/git/branches",
    operation_id = "gitBranches",
    tag = "git",
    params(RepoQuery),
    responses(
        (status = 200, description = "The branches", body = GitBranches),
        (status = 400, description = "Missing or invalid parameter"),
        (status = 403, description = "Outside the fs root"),
        (status = 404, description = "Not in a git repository"),
        (status = 500, description = "git failed"),
        (status = 504, description = "git did not finish in time"),
    )
)]
async fn git_branches(
    State(s): State<AppState>,
    Query(q): Query<RepoQuery>,
) -> Result<Json<GitBranches>, Problem> {
    let (current, branches) = s.workspace.git.branches(&q.path).await?;
    Ok(Json(GitBranches {
        current,
        branches: branches
            .into_iter()
            .map(|b| GitBranch {
                name: b.name,
                head: b.head,
            })
            .collect(),
    }))
}

#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct GitCheckoutRequest {
    path: String,
    branch: String,
    /// Create the branch at HEAD first.
    #[serde(default)]
    create: bool,
}

#[derive(Serialize, ToSchema)]
pub struct GitCheckedOut {
    branch: String,
}

/// Switches the work tree to a branch (never discarding changes).
#[utoipa::path(
    post,
    path = "/v1/git/checkout",
    operation_id = "gitCheckout",
    tag = "git",
    request_body = GitCheckoutRequest,
    responses(
        (status = 200, description = "Switched", body = GitCheckedOut),
        (status = 400, description = "Invalid or option-like branch name"),
        (status = 403, description = "Outside the fs root"),
        (status = 404, description = "Not in a git repository, or no such branch"),
        (status = 409, description = "Local changes would be overwritten, the branch exists \
            (create), or it is checked out in another worktree"),
        (status = 500, description = "git failed"),
        (status = 504, description = "git did not finish in time"),
    )
)]
async fn git_checkout(
    State(s): State<AppState>,
    body: Result<Json<GitCheckoutRequest>, JsonRejection>,
) -> Result<Json<GitCheckedOut>, Problem> {
    let b = json(body)?;
    s.workspace
        .git
        .checkout(&b.path, &b.branch, b.create)
        .await?;
    Ok(Json(GitCheckedOut { branch: b.branch }))
}

#[derive(Serialize, ToSchema)]
pub struct GitWorktree {
    path: String,
    branch: Option<String>,
    head: Option<String>,
}

impl From<git::Worktree> for GitWorktree {
    fn from(w: git::Worktree) -> Self {
        GitWorktree {
            path: w.path,
            branch: w.branch,
            head: w.head,
        }
    }
}

#[derive(Serialize, ToSchema)]
pub struct GitWorktrees {
    worktrees: Vec<GitWorktree>,
}

#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct GitWorktreeRequest {
    /// The repository.
    path: String,
    /// The new worktree's directory (absent or empty, inside the fs root).
    dest: String,
    /// A new branch, created at `base`.
    branch: String,
    /// Default HEAD.
    base: Option<String>,
}

/// The repository's worktrees (the main one first).
#[utoipa::path(
    get,
    path = "/v1/git/worktrees",
    operation_id = "listGitWorktrees",
    tag = "git",
    params(RepoQuery),
    responses(
        (status = 200, description = "The worktrees", body = GitWorktrees),
        (status = 400, description = "Missing or invalid parameter"),
        (status = 403, description = "Outside the fs root"),
        (status = 404, description = "Not in a git repository"),
        (status = 500, description = "git failed"),
        (status = 504, description = "git did not finish in time"),
    )
)]
async fn list_worktrees(
    State(s): State<AppState>,
    Query(q): Query<RepoQuery>,
) -> Result<Json<GitWorktrees>, Problem> {
    let list = s.workspace.git.worktrees(&q.path).await?;
    Ok(Json(GitWorktrees {
        worktrees: list.into_iter().map(Into::into).collect(),
    }))
}

/// A new worktree on a new branch: a separate work tree and index sharing the repository.
#[utoipa::path(
    post,
    path = "/v1/git/worktrees",
    operation_id = "addGitWorktree",
    tag = "git",
    request_body = GitWorktreeRequest,
    responses(
        (status = 201, description = "Created", body = GitWorktree),
        (status = 400, description = "Invalid branch or revision"),
        (status = 403, description = "Outside the fs root"),
        (status = 404, description = "Not in a git repository"),
        (status = 409, description = "The branch or a non-empty destination exists"),
        (status = 500, description = "git failed"),
        (status = 504, description = "git did not finish in time"),
    )
)]
async fn add_worktree(
    State(s): State<AppState>,
    body: Result<Json<GitWorktreeRequest>, JsonRejection>,
) -> Result<Response, Problem> {
    let b = json(body)?;
    let w = s
        .workspace
        .git
        .add_worktree(&b.path, &b.dest, &b.branch, b.base.as_deref())
        .await?;
    Ok((StatusCode::CREATED, Json(GitWorktree::from(w))).into_response())
}

#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
struct RemoveWorktreeQuery {
    /// The worktree's directory.
    path: String,
    /// Remove it even with uncommitted changes.
    #[serde(default)]
    force: bool,
}

/// Removes a worktree (not the main one); its branch stays.
#[utoipa::path(
    delete,
    path = "/v1/git/worktrees",
    operation_id = "removeGitWorktree",
    tag = "git",
    params(RemoveWorktreeQuery),
    responses(
        (status = 204, description = "Removed"),
        (status = 400, description = "The main work tree"),
        (status = 403, description = "Outside the fs root"),
        (status = 404, description = "Not a worktree"),
        (status = 409, description = "It has changes and force is not set"),
        (status = 500, description = "git failed"),
        (status = 504, description = "git did not finish in time"),
    )
)]
async fn remove_worktree(
    State(s): State<AppState>,
    Query(q): Query<RemoveWorktreeQuery>,
) -> Result<StatusCode, Problem> {
    s.workspace.git.remove_worktree(&q.path, q.force).await?;
    Ok(StatusCode::NO_CONTENT)
}

#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct GitCloneRequest {
    /// `https://…`, `http://…`, `file://…` or a local path (local ones inside the fs root).
    url: String,
    /// The new clone's directory (absent or empty, inside the fs root).
    dest: String,
    /// A shallow clone of this many commits.
    #[schema(minimum = 1)]
    depth: Option<u32>,
    branch: Option<String>,
    /// For http(s): sent as Basic credentials with `password`, for this clone only.
    username: Option<String>,
    /// For http(s): the password, or alone a bearer token. Never stored or logged.
    password: Option<String>,
}

/// Clones a repository into a new directory.
#[utoipa::path(
    post,
    path = "/v1/git/clone",
    operation_id = "gitClone",
    tag = "git",
    request_body = GitCloneRequest,
    responses(
        (status = 201, description = "Cloned", body = GitWorktree),
        (status = 400, description = "Invalid URL (credentials inside it, an unsupported \
            transport, option-like) or branch"),
        (status = 403, description = "The destination or a local source is outside the fs root"),
        (status = 404, description = "No such repository or branch"),
        (status = 409, description = "The destination exists and is not empty"),
        (status = 500, description = "git failed"),
        (status = 504, description = "The clone did not finish in 10 minutes"),
    )
)]
async fn git_clone(
    State(s): State<AppState>,
    body: Result<Json<GitCloneRequest>, JsonRejection>,
) -> Result<Response, Problem> {
    let b = json(body)?;
    if b.depth == Some(0) {
        return Err(Problem::bad_request("depth must be at least 1"));
    }
    let w = s
        .workspace
        .git
        .clone_repo(CloneRequest {
            url: b.url,
            dest: b.dest,
            depth: b.depth,
            branch: b.branch,
            username: b.username,
            password: b.password,
        })
        .await?;
    Ok((StatusCode::CREATED, Json(GitWorktree::from(w))).into_response())
}

// ---------------------------------------------------------------- search

#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(rename_all = "camelCase")]
struct GlobQuery {
    /// The directory searched (default `.`).
    path: Option<String>,
    /// A gitignore-style glob: `*.rs` matches at any depth, `src/**/*.rs` from `path`.
    pattern: String,
    /// Include dotfiles and dot-directories.
    #[serde(default)]
    hidden: bool,
    /// At most this many results (default 1000, at most 100000).
    limit: Option<usize>,
}

#[derive(Serialize, ToSchema)]
pub struct GlobResult {
    /// Absolute paths of files, sorted.
    paths: Vec<String>,
    /// True when there were more than `limit` (or the search hit its 30 s deadline).
    truncated: bool,
}

fn search_options(hidden: bool, limit: Option<usize>, glob: Option<String>) -> SearchOptions {
    SearchOptions {
        hidden,
        limit: limit
            .unwrap_or(search::DEFAULT_LIMIT)
            .clamp(1, search::MAX_LIMIT),
        glob,
    }
}

async fn run_search<T: Send + 'static>(
    s: &AppState,
    path: Option<String>,
    f: impl FnOnce(&std::path::Path, &Cancel) -> Result<T, git::GitError> + Send + 'static,
) -> Result<T, Problem> {
    let _slot = s
        .workspace
        .search_slots
        .acquire()
        .await
        .map_err(|_| Problem::new(StatusCode::SERVICE_UNAVAILABLE, "shutting down"))?;
    let policy = s.workspace.policy().clone();
    let cancel = Cancel::default();
    let _guard = CancelOnDrop(cancel.clone());
    let path = path.unwrap_or_else(|| ".".into());
    tokio::task::spawn_blocking(move || {
        let root = search::search_root(&policy, &path)?;
        f(&root, &cancel)
    })
    .await
    .map_err(|e| {
        if e.is_panic() {
            std::panic::resume_unwind(e.into_panic());
        }
        Problem::new(StatusCode::SERVICE_UNAVAILABLE, "the search was cancelled")
    })?
    .map_err(Into::into)
}

/// Files whose path matches a glob, gitignore-aware.
#[utoipa::path(
    get,
    path = "/v1/fs/glob",
    operation_id = "globFs",
    tag = "fs",
    params(GlobQuery),
    responses(
        (status = 200, description = "The matching files", body = GlobResult),
        (status = 400, description = "Invalid glob"),
        (status = 403, description = "Outside the fs root"),
        (status = 404, description = "No such directory"),
    )
)]
async fn fs_glob(
    State(s): State<AppState>,
    Query(q): Query<GlobQuery>,
) -> Result<Json<GlobResult>, Problem> {
    let opts = search_options(q.hidden, q.limit, None);
    let pattern = q.pattern;
    let (paths, truncated) = run_search(&s, q.path, move |root, cancel| {
        search::glob(root, &pattern, &opts, cancel)
    })
    .await?;
    Ok(Json(GlobResult { paths, truncated }))
}

#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(rename_all = "camelCase")]
struct GrepQuery {
    /// The directory searched (default `.`).
    path: Option<String>,
    /// A regular expression (Rust `regex` syntax, as ripgrep's).
    pattern: String,
    /// Only files whose path matches this gitignore-style glob.
    glob: Option<String>,
    #[serde(default)]
    ignore_case: bool,
    /// Include dotfiles and dot-directories.
    #[serde(default)]
    hidden: bool,
    /// At most this many matching lines (default 1000, at most 100000).
    limit: Option<usize>,
}

#[derive(Serialize, ToSchema)]
pub struct GrepMatch {
    path: String,
    /// 1-based.
    line: u64,
    /// 1-based byte column of the first match in the line.
    column: u64,
    /// The line, without its line break, cut at 1024 bytes.
    text: String,
}

#[derive(Serialize, ToSchema)]
pub struct GrepResult {
    /// Sorted by path, then line.
    matches: Vec<GrepMatch>,
    truncated: bool,
}

/// Lines matching a regular expression, gitignore-aware, binary files skipped.
#[utoipa::path(
    get,
    path = "/v1/fs/grep",
    operation_id = "grepFs",
    tag = "fs",
    params(GrepQuery),
    responses(
        (status = 200, description = "The matching lines", body = GrepResult),
        (status = 400, description = "Invalid pattern or glob"),
        (status = 403, description = "Outside the fs root"),
        (status = 404, description = "No such directory"),
    )
)]
async fn fs_grep(
    State(s): State<AppState>,
    Query(q): Query<GrepQuery>,
) -> Result<Json<GrepResult>, Problem> {
    let opts = search_options(q.hidden, q.limit, q.glob);
    let (pattern, ic) = (q.pattern, q.ignore_case);
    let (matches, truncated) = run_search(&s, q.path, move |root, cancel| {
        search::grep(root, &pattern, ic, &opts, cancel)
    })
    .await?;
    Ok(Json(GrepResult {
        matches: matches
            .into_iter()
            .map(|m| GrepMatch {
                path: m.path,
                line: m.line,
                column: m.column,
                text: m.text,
            })
            .collect(),
        truncated,
    }))
}

// ---------------------------------------------------------------- ports

#[derive(Serialize, ToSchema, Clone)]
#[serde(rename_all = "camelCase")]
pub struct PortInfo {
    port: u16,
    /// The address it listens on (`0.0.0.0`, `127.0.0.1`, `::`, …).
    address: String,
    pid: Option<u32>,
    /// The owning process's command line.
    command: Option<String>,
    /// The `/v1/processes` process it belongs to (itself or an ancestor).
    #[serde(skip_serializing_if = "Option::is_none")]
    process_id: Option<String>,
    /// The agent instance it belongs to.
    #[serde(skip_serializing_if = "Option::is_none")]
    server_id: Option<String>,
}

impl From<Listener> for PortInfo {
    fn from(l: Listener) -> Self {
        PortInfo {
            port: l.port,
            address: l.address,
            pid: l.pid,
            command: l.command,
            process_id: l.process_id,
            server_id: l.server_id,
        }
    }
}

#[derive(Serialize, ToSchema)]
pub struct PortList {
    ports: Vec<PortInfo>,
    /// Present when `limit` was given and the page is full: pass it as `cursor` for the next.
    #[serde(rename = "nextCursor", skip_serializing_if = "Option::is_none")]
    next_cursor: Option<String>,
}

/// TCP listeners inside the sandbox (the daemon's own excluded).
#[utoipa::path(
    get,
    path = "/v1/ports",
    operation_id = "listPorts",
    tag = "ports",
    params(
        ("limit" = Option<u32>, Query, description = "At most this many listeners (1..=1000), \
            by port and address; without it, every listener", minimum = 1, maximum = 1000),
        ("cursor" = Option<String>, Query, description = "The `nextCursor` of the page before, \
            unchanged"),
    ),
    responses(
        (status = 200, description = "The listeners (or one page, by port and address)", body = PortList),
        (status = 400, description = "A bad `limit` or `cursor`"),
    )
)]
async fn list_ports(
    State(s): State<AppState>,
    Query(q): Query<std::collections::HashMap<String, String>>,
) -> Result<Json<PortList>, Problem> {
    let page = super::paging::Page::from_query(&q)?;
    let ports = s.workspace.ports.list().await;
    // Zero-padded, so that the text order of the keys is the numeric order of the ports.
    let (ports, next_cursor) = page.slice(ports, |l| format!("{:05} {}", l.port, l.address));
    Ok(Json(PortList {
        ports: ports.into_iter().map(Into::into).collect(),
        next_cursor,
    }))
}

fn sse_frame(event: &str, l: Listener) -> bytes::Bytes {
    let data = serde_json::to_string(&PortInfo::from(l)).unwrap_or_default();
    bytes::Bytes::from(format!("event: {event}\ndata: {data}\n\n"))
}

/// Listeners opening and closing, as SSE.
#[utoipa::path(
    get,
    path = "/v1/ports/events",
    operation_id = "portEvents",
    tag = "ports",
    responses((status = 200, description = "`event: open` for every listener at the start, \
        then `event: open` / `event: close` within 2 s of each change (data: the port object); \
        `: keepalive` comments", content_type = "text/event-stream", body = String))
)]
async fn port_events(State(s): State<AppState>) -> Response {
    let (now, rx) = s.workspace.ports.subscribe().await;
    let initial: std::collections::VecDeque<bytes::Bytes> =
        now.into_iter().map(|l| sse_frame("open", l)).collect();
    let keepalive = s.config.keepalive.max(Duration::from_millis(100));
    let shutdown = s.shutdown.clone();
    let stream = futures_util::stream::unfold(
        (initial, rx, shutdown),
        move |(mut initial, mut rx, shutdown)| async move {
            if let Some(f) = initial.pop_front() {
                return Some((Ok::<_, std::io::Error>(f), (initial, rx, shutdown)));
            }
            let frame = tokio::select! {
                _ = shutdown.cancelled() => return None,
                _ = tokio::time::sleep(keepalive) => bytes::Bytes::from_static(b": keepalive\n\n"),
                ev = rx.recv() => match ev {
                    Ok(PortEvent::Open(l)) => sse_frame("open", l),
                    Ok(PortEvent::Close(l)) => sse_frame("close", l),
                    // Too slow a reader: it reconnects and gets the whole list again.
                    Err(_) => return None,
                },
            };
            Some((Ok(frame), (initial, rx, shutdown)))
        },
    );
    super::sse_response(Body::from_stream(stream))
}

/// Everything after `/v1/ports/{port}/proxy` (or a preview's prefix), with the query.
fn target_of(uri: &axum::http::Uri, prefix: &str) -> String {
    let rest = uri.path().strip_prefix(prefix).unwrap_or("/");
    let rest = if rest.is_empty() { "/" } else { rest };
    match uri.query() {
        Some(q) => format!("{rest}?{q}"),
        None => rest.to_string(),
    }
}

async fn proxy_to(
    s: &AppState,
    port: u16,
    prefix: String,
    strip_auth: bool,
    req: Request,
) -> Response {
    if port == 0 {
        return Problem::bad_request("port 0 is not a port").into_response();
    }
    let target = target_of(req.uri(), &prefix);
    let addrs = req.extensions().get::<super::guard::ConnAddrs>().copied();
    let f = Forward {
        port,
        target,
        prefix,
        strip_authorization: strip_auth,
        peer: addrs.map(|a| a.peer),
        own_port: addrs.map(|a| a.local.port()),
        shutdown: &s.shutdown,
        tasks: &s.tasks,
    };
    match proxy::forward(f, req).await {
        Ok(r) => r,
        Err(e) => Problem::from(e).into_response(),
    }
}

#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Path)]
#[allow(dead_code)] // documents the path; the handler reads the raw URI
struct ProxyPath {
    port: u16,
    path: String,
}

#[derive(Deserialize, IntoParams)]
#[into_params(parameter_in = Path)]
struct PortPath {
    port: u16,
}

async fn proxy_port(s: AppState, port: u16, req: Request) -> Response {
    let prefix = format!("/v1/ports/{port}/proxy");
    let strip = s.config.token.is_some();
    proxy_to(&s, port, prefix, strip, req).await
}

/// One documented operation per method (an operation id is unique per method), for the path
/// below the port and for the app's root.
macro_rules! proxy_operations {
    ($($method:ident: $with_path:ident $id:literal, $root:ident $root_id:literal;)*) => {$(
        /// Reverse proxy to `127.0.0.1:{port}/{path}?query`: bodies streamed both ways,
        /// WebSocket upgrades passed through, the token never forwarded.
        #[utoipa::path(
            $method,
            path = "/v1/ports/{port}/proxy/{*path}",
            operation_id = $id,
            tag = "ports",
            params(ProxyPath),
            responses(
                (status = 200, description = "Whatever the app answers, passed on as it is"),
                (status = 400, description = "Invalid port"),
                (status = 502, description = "Nothing listens on the port, or the app failed"),
            )
        )]
        async fn $with_path(
            State(s): State<AppState>,
            Path((port, _path)): Path<(u16, String)>,
            req: Request,
        ) -> Response {
            proxy_port(s, port, req).await
        }

        /// The app's root (`/`) through the proxy.
        #[utoipa::path(
            $method,
            path = "/v1/ports/{port}/proxy/",
            operation_id = $root_id,
            tag = "ports",
            params(PortPath),
            responses(
                (status = 200, description = "Whatever the app answers, passed on as it is"),
                (status = 400, description = "Invalid port"),
                (status = 502, description = "Nothing listens on the port, or the app failed"),
            )
        )]
        async fn $root(State(s): State<AppState>, Path(p): Path<PortPath>, req: Request) -> Response {
            proxy_port(s, p.port, req).await
        }
    )*};
}

proxy_operations! {
    get: proxy_get "proxyPortGet", proxy_root_get "proxyPortRootGet";
    post: proxy_post "proxyPortPost", proxy_root_post "proxyPortRootPost";
    put: proxy_put "proxyPortPut", proxy_root_put "proxyPortRootPut";
    patch: proxy_patch "proxyPortPatch", proxy_root_patch "proxyPortRootPatch";
    delete: proxy_delete "proxyPortDelete", proxy_root_delete "proxyPortRootDelete";
    head: proxy_head "proxyPortHead", proxy_root_head "proxyPortRootHead";
    options: proxy_options "proxyPortOptions", proxy_root_options "proxyPortRootOptions";
}

#[derive(Deserialize, ToSchema, Default)]
#[serde(deny_unknown_fields)]
pub struct PreviewRequest {
    /// How long the link works (humantime: `10m`, `2h`; default 1h, at most 7 days).
    ttl: Option<String>,
}

#[derive(Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct Preview {
    /// `/preview/<opaque>/`, relative to the daemon's address; needs no token.
    url: String,
    /// RFC 3339.
    expires_at: String,
}

/// A signed, expiring link to one port that works without the token.
#[utoipa::path(
    post,
    path = "/v1/ports/{port}/preview",
    operation_id = "createPreview",
    tag = "ports",
    params(PortPath),
    request_body(content = PreviewRequest, description = "Optional"),
    responses(
        (status = 201, description = "The link", body = Preview),
        (status = 400, description = "Invalid ttl or port"),
    )
)]
async fn create_preview(
    State(s): State<AppState>,
    Path(p): Path<PortPath>,
    body: axum::body::Bytes,
) -> Result<Response, Problem> {
    if p.port == 0 {
        return Err(Problem::bad_request("port 0 is not a port"));
    }
    let req: PreviewRequest = if body.iter().all(u8::is_ascii_whitespace) {
        PreviewRequest::default()
    } else {
        serde_json::from_slice(&body)
            .map_err(|e| Problem::bad_request(format!("invalid JSON body: {e}")))?
    };
    let ttl = match req.ttl.as_deref() {
        None => DEFAULT_TTL,
        Some(t) => humantime::parse_duration(t)
            .map_err(|e| Problem::bad_request(format!("invalid ttl {t:?}: {e}")))?,
    };
    if ttl.is_zero() || ttl > MAX_TTL {
        return Err(Problem::bad_request("ttl must be between 1s and 7 days"));
    }
    let (opaque, expires) = s.workspace.previews.sign(p.port, ttl);
    let at = std::time::UNIX_EPOCH + Duration::from_secs(expires);
    Ok((
        StatusCode::CREATED,
        Json(Preview {
            url: format!("/preview/{opaque}/"),
            expires_at: humantime::format_rfc3339_seconds(at).to_string(),
        }),
    )
        .into_response())
}

// ---------------------------------------------------------------- preview links

fn preview_port(s: &AppState, opaque: &str) -> Result<u16, Box<Response>> {
    s.workspace.previews.verify(opaque).map_err(|e| {
        Box::new(
            match e {
                PreviewError::Invalid => Problem::new(
                    StatusCode::FORBIDDEN,
                    "this preview link is not valid (altered, or made before the daemon restarted)",
                ),
                PreviewError::Expired => {
                    Problem::new(StatusCode::GONE, "this preview link expired")
                }
            }
            .into_response(),
        )
    })
}

async fn preview_bare(State(s): State<AppState>, Path(opaque): Path<String>) -> Response {
    if let Err(r) = preview_port(&s, &opaque) {
        return *r;
    }
    Redirect::permanent(&format!("/preview/{opaque}/")).into_response()
}

async fn preview_root(
    State(s): State<AppState>,
    Path(opaque): Path<String>,
    req: Request,
) -> Response {
    preview(s, opaque, req).await
}

async fn preview_path(
    State(s): State<AppState>,
    Path((opaque, _)): Path<(String, String)>,
    req: Request,
) -> Response {
    preview(s, opaque, req).await
}

async fn preview(s: AppState, opaque: String, req: Request) -> Response {
    let port = match preview_port(&s, &opaque) {
        Ok(p) => p,
        Err(r) => return *r,
    };
    let prefix = format!("/preview/{opaque}");
    let mut resp = proxy_to(&s, port, prefix, false, req).await;
    // The app's pages are not the daemon's: keep them from being framed by other origins'
    // pages only if the app says so; never cache a link's answers in shared caches.
    resp.headers_mut()
        .entry(header::CACHE_CONTROL)
        .or_insert(HeaderValue::from_static("private"));
    resp
}
