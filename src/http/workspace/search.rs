//! `/v1/fs/glob` and `/v1/fs/grep`: gitignore-aware search.

use axum::Json;
use axum::extract::{Query, State};
use axum::http::StatusCode;
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::super::{AppState, Problem};
use crate::workspace::git::{self};
use crate::workspace::search::{self, Cancel, CancelOnDrop, SearchOptions};

pub(super) fn routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::new()
        .routes(routes!(fs_glob))
        .routes(routes!(fs_grep))
}

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
