//! `sandbox-agent status` (is the daemon there, which version, what it holds) and
//! `sandbox-agent instances` (the `GET /v1/acp` table).

use serde_json::{Value, json};

use super::api::{Api, ClientError};
use super::{out, out_json, table};

pub async fn status(api: &Api, json: bool) -> Result<u8, ClientError> {
    // `/` needs no token, so "cannot reach" and "token refused" are told apart below.
    let root = api.get_json("daemon info", &[""], &[]).await?;
    let health = api.get_json("health", &["v1", "health"], &[]).await?;
    let servers = api.get_json("instances", &["v1", "acp"], &[]).await?;
    let processes = api.get_json("processes", &["v1", "processes"], &[]).await?;
    let instances = count_by_status(&servers["servers"], &["starting", "running", "exited"]);
    let processes = count_by_status(&processes["processes"], &["running", "exited"]);
    let report = json!({
        "url": api.base(),
        "name": root["name"],
        "version": root["version"],
        "health": health,
        "instances": instances,
        "processes": processes,
    });
    if json {
        return out_json(&report).map(|()| 0);
    }
    let mut rows = vec![
        vec![
            "daemon".to_string(),
            format!(
                "{} ({} {})",
                api.base(),
                table::cell(&root["name"]),
                table::cell(&root["version"])
            ),
        ],
        vec!["health".to_string(), table::cell(&health["status"])],
    ];
    // Whatever else the health answer reports (durable state, …), one line per member.
    if let Some(members) = health.as_object() {
        for (k, v) in members.iter().filter(|(k, _)| k.as_str() != "status") {
            rows.push(vec![k.clone(), table::words(v)]);
        }
    }
    rows.push(vec!["instances".to_string(), counts_line(&instances)]);
    rows.push(vec!["processes".to_string(), counts_line(&processes)]);
    let text = table::render(&["", ""], &rows);
    // The header of this two-column listing is empty: drop its line.
    out(text
        .split_once('\n')
        .map_or("", |(_, rest)| rest)
        .as_bytes())
    .map(|()| 0)
}

pub async fn instances(api: &Api, json: bool) -> Result<u8, ClientError> {
    let list = api.get_json("instances", &["v1", "acp"], &[]).await?;
    if json {
        return out_json(&list).map(|()| 0);
    }
    let servers = list["servers"]
        .as_array()
        .ok_or_else(|| ClientError::Protocol("instances: no `servers` list".into()))?;
    let rows: Vec<Vec<String>> = servers
        .iter()
        .map(|s| {
            let status = match (s["status"].as_str(), s["exitReason"].as_str()) {
                (Some("exited"), Some(reason)) => format!("exited ({reason})"),
                _ => table::cell(&s["status"]),
            };
            vec![
                table::cell(&s["serverId"]),
                table::cell(&s["agent"]),
                status,
                table::cell(&s["pid"]),
                s["rssBytes"].as_u64().map_or("-".into(), table::bytes),
                s["cpuMs"].as_u64().map_or("-".into(), table::cpu),
                table::cell(&s["subscribers"]),
            ]
        })
        .collect();
    if rows.is_empty() {
        // A header with nothing under it reads like a failure: say it.
        return out(b"no instances (`sandbox-agent acp send <serverId> --agent <id> <message>` starts one)\n")
            .map(|()| 0);
    }
    let header = [
        "SERVER ID",
        "AGENT",
        "STATUS",
        "PID",
        "RSS",
        "CPU",
        "SUBSCRIBERS",
    ];
    out(table::render(&header, &rows).as_bytes()).map(|()| 0)
}

/// Most sessions the command reads (pages of 1000); the daemon holds at most 4096.
const SESSIONS_MAX: usize = 10_000;

/// `sandbox-agent sessions`: every page of `GET /v1/sessions`, as a table or one JSON object
/// `{"sessions": [...]}`.
pub async fn sessions(api: &Api, json: bool) -> Result<u8, ClientError> {
    let mut all: Vec<Value> = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let mut query = vec![("limit", "1000")];
        if let Some(c) = &cursor {
            query.push(("cursor", c.as_str()));
        }
        let page = api
            .get_json("sessions", &["v1", "sessions"], &query)
            .await?;
        let items = page["sessions"]
            .as_array()
            .ok_or_else(|| ClientError::Protocol("sessions: no `sessions` list".into()))?;
        all.extend(items.iter().cloned());
        match page["nextCursor"].as_str() {
            Some(c) if all.len() < SESSIONS_MAX => cursor = Some(c.to_string()),
            _ => break,
        }
    }
    if json {
        return out_json(&json!({ "sessions": all })).map(|()| 0);
    }
    if all.is_empty() {
        return out(b"no sessions\n").map(|()| 0);
    }
    let rows: Vec<Vec<String>> = all
        .iter()
        .map(|s| {
            vec![
                table::cell(&s["serverId"]),
                table::cell(&s["sessionId"]),
                table::cell(&s["agent"]),
                table::cell(&s["state"]),
                s["cwd"].as_str().map_or("-".into(), table::printable),
                s["title"].as_str().map_or("-".into(), table::printable),
                s["lastActivityAtMs"].as_u64().map_or("-".into(), |ms| {
                    let t = std::time::UNIX_EPOCH + std::time::Duration::from_millis(ms);
                    humantime::format_rfc3339_seconds(t).to_string()
                }),
            ]
        })
        .collect();
    let header = [
        "SERVER ID",
        "SESSION ID",
        "AGENT",
        "STATE",
        "CWD",
        "TITLE",
        "LAST ACTIVITY",
    ];
    out(table::render(&header, &rows).as_bytes()).map(|()| 0)
}

/// `{"total": n, "<status>": n, …}` over a list of records with a `status` member.
fn count_by_status(list: &Value, statuses: &[&str]) -> Value {
    let items = list.as_array().map(Vec::as_slice).unwrap_or_default();
    let mut counts = serde_json::Map::new();
    counts.insert("total".into(), json!(items.len()));
    for status in statuses {
        let n = items.iter().filter(|i| i["status"] == *status).count();
        counts.insert((*status).into(), json!(n));
    }
    Value::Object(counts)
}

/// `3 (2 running, 1 exited)`, leaving out the zeros.
fn counts_line(counts: &Value) -> String {
    let total = counts["total"].as_u64().unwrap_or(0);
    let parts: Vec<String> = counts
        .as_object()
        .into_iter()
        .flatten()
        .filter(|(k, v)| k.as_str() != "total" && v.as_u64().unwrap_or(0) > 0)
        .map(|(k, v)| format!("{v} {k}"))
        .collect();
    if parts.is_empty() {
        total.to_string()
    } else {
        format!("{total} ({})", parts.join(", "))
    }
}
