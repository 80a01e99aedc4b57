//! `/v1/git/*`: status, diff, log, commit, branches, checkout, worktrees and clone.

use axum::Json;
use axum::extract::rejection::JsonRejection;
use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::super::{AppState, Problem};
use super::json;
use crate::workspace::git::{self, CloneRequest};

pub(super) fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(git_status))
        .routes(routes!(git_diff))
        .routes(routes!(git_log))
        .routes(routes!(git_commit))
        .routes(routes!(git_branches))
        .routes(routes!(git_checkout))
        .routes(routes!(list_worktrees, add_worktree, remove_worktree))
        .routes(routes!(git_clone))
}

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
        (status = 422, description = "The remote wants credentials and none were given, or \
            refused those given (not 401: the daemon's own token was accepted)"),
        (status = 403, description = "The destination or a local source is outside the fs root"),
        (status = 404, description = "No such repository or branch"),
        (status = 409, description = "The destination exists and is not empty"),
        (status = 500, description = "git failed"),
        (status = 502, description = "The remote could not be reached or was not trusted \
            (DNS, connection, TLS certificate, the remote's own server error)"),
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
