//! `sandbox-agent git status|diff`, `grep` and `ports`: the workspace API (`/v1/git`,
//! `/v1/fs/grep`, `/v1/ports`) as plain text, or the daemon's JSON with `--json`. Text that comes
//! from files (patches, matching lines) has its control characters escaped, so a file cannot
//! drive the terminal.

use super::api::{Api, ClientError};
use super::{out, out_json, table};
use crate::cli::{Command, GitCommand};

/// Control characters other than tab and line feed as `\xNN`.
fn printable(s: &str) -> String {
    let mut o = String::with_capacity(s.len());
    for c in s.chars() {
        if c.is_control() && c != '\n' && c != '\t' {
            o.push_str(&format!("\\x{:02x}", c as u32));
        } else {
            o.push(c);
        }
    }
    o
}

fn list<'a>(
    v: &'a serde_json::Value,
    key: &str,
    what: &str,
) -> Result<&'a Vec<serde_json::Value>, ClientError> {
    v[key]
        .as_array()
        .ok_or_else(|| ClientError::Protocol(format!("{what}: no `{key}` list")))
}

pub async fn git(api: &Api, command: GitCommand, json: bool) -> Result<u8, ClientError> {
    match command {
        GitCommand::Status { path, .. } => {
            let path = path.unwrap_or_else(|| ".".into());
            let what = format!("the git status of {path}");
            let v = api
                .get_json(&what, &["v1", "git", "status"], &[("path", &path)])
                .await?;
            if json {
                return out_json(&v).map(|()| 0);
            }
            let mut text = format!(
                "branch {}  head {}\n",
                table::cell(&v["branch"]),
                table::cell(&v["head"])
            );
            let rows: Vec<Vec<String>> = list(&v, "files", &what)?
                .iter()
                .map(|f| {
                    vec![
                        table::cell(&f["status"]),
                        if f["staged"] == true { "staged" } else { "" }.to_string(),
                        table::cell(&f["path"]),
                    ]
                })
                .collect();
            if !rows.is_empty() {
                text.push_str(&table::render(&["STATUS", "STAGED", "PATH"], &rows));
            }
            out(text.as_bytes()).map(|()| 0)
        }
        GitCommand::Diff { path, base, .. } => {
            let path = path.unwrap_or_else(|| ".".into());
            let what = format!("the git diff of {path}");
            let mut query = vec![("path", path.as_str())];
            if let Some(b) = &base {
                query.push(("base", b.as_str()));
            }
            let v = api.get_json(&what, &["v1", "git", "diff"], &query).await?;
            if json {
                return out_json(&v).map(|()| 0);
            }
            let mut text = String::new();
            for f in list(&v, "files", &what)? {
                text.push_str(&printable(f["patch"].as_str().unwrap_or("")));
            }
            out(text.as_bytes()).map(|()| 0)
        }
    }
}

pub async fn grep(api: &Api, command: Command, json: bool) -> Result<u8, ClientError> {
    let Command::Grep {
        pattern,
        path,
        glob,
        ignore_case,
        hidden,
        limit,
        ..
    } = command
    else {
        return Err(ClientError::Usage("not a grep command".into()));
    };
    let path = path.unwrap_or_else(|| ".".into());
    let limit = limit.map(|l| l.to_string());
    let mut query = vec![("path", path.as_str()), ("pattern", pattern.as_str())];
    if let Some(g) = &glob {
        query.push(("glob", g));
    }
    if ignore_case {
        query.push(("ignoreCase", "true"));
    }
    if hidden {
        query.push(("hidden", "true"));
    }
    if let Some(l) = &limit {
        query.push(("limit", l));
    }
    let what = format!("searching {path}");
    let v = api.get_json(&what, &["v1", "fs", "grep"], &query).await?;
    if json {
        return out_json(&v).map(|()| 0);
    }
    let matches = list(&v, "matches", &what)?;
    let mut text = String::new();
    for m in matches {
        text.push_str(&printable(&format!(
            "{}:{}:{}:{}",
            m["path"].as_str().unwrap_or(""),
            m["line"],
            m["column"],
            m["text"].as_str().unwrap_or("")
        )));
        text.push('\n');
    }
    if v["truncated"] == true {
        eprintln!("sandbox-agent: more matches than the limit; the list is truncated");
    }
    out(text.as_bytes())?;
    // As grep: 1 when nothing matched.
    Ok(if matches.is_empty() { 1 } else { 0 })
}

pub async fn ports(api: &Api, json: bool) -> Result<u8, ClientError> {
    let what = "the listening ports";
    let v = api.get_json(what, &["v1", "ports"], &[]).await?;
    if json {
        return out_json(&v).map(|()| 0);
    }
    let rows: Vec<Vec<String>> = list(&v, "ports", what)?
        .iter()
        .map(|p| {
            let owner = if p["processId"].is_string() {
                table::cell(&p["processId"])
            } else {
                table::cell(&p["serverId"])
            };
            vec![
                table::cell(&p["port"]),
                table::cell(&p["address"]),
                table::cell(&p["pid"]),
                owner,
                table::cell(&p["command"]),
            ]
        })
        .collect();
    out(table::render(&["PORT", "ADDRESS", "PID", "OWNER", "COMMAND"], &rows).as_bytes())
        .map(|()| 0)
}
