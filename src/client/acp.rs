//! `sandbox-agent acp send|stream|stop|export|import`: one agent instance (serverId) of a
//! running daemon.

use std::io::Read;

use reqwest::Method;
use reqwest::header::{ACCEPT, CONTENT_TYPE};

use super::api::{Api, ClientError};
use super::sse::read_events;
use super::{out, out_json};
use crate::cli::AcpCommand;

pub async fn run(api: &Api, command: AcpCommand, json: bool) -> Result<u8, ClientError> {
    match command {
        AcpCommand::Send {
            server_id,
            message,
            agent,
            ..
        } => send(api, &server_id, &message, agent.as_deref(), json).await,
        AcpCommand::Stream {
            server_id, from, ..
        } => stream(api, &server_id, from).await,
        AcpCommand::Stop { server_id, .. } => stop(api, &server_id, json).await,
        AcpCommand::Export { server_id, .. } => export(api, &server_id).await,
        AcpCommand::Import { server_id, cwd, .. } => import(api, &server_id, &cwd, json).await,
    }
}

/// The bundle's bytes to stdout as they arrive (never whole in memory).
async fn export(api: &Api, server_id: &str) -> Result<u8, ClientError> {
    use futures_util::StreamExt;
    let rb = api.request(
        Method::GET,
        api.url(&["v1", "acp", server_id, "bundle"], &[]),
    );
    let resp = api.send(&format!("exporting {server_id}"), rb).await?;
    let mut body = resp.bytes_stream();
    while let Some(chunk) = body.next().await {
        out(&chunk.map_err(|e| api.transport(e))?)?;
    }
    Ok(0)
}

/// stdin, streamed, as the bundle to import.
async fn import(api: &Api, server_id: &str, cwd: &[String], json: bool) -> Result<u8, ClientError> {
    let query: Vec<(&str, &str)> = cwd.iter().map(|c| ("cwd", c.as_str())).collect();
    let read_error: std::sync::Arc<std::sync::Mutex<Option<std::io::Error>>> = Default::default();
    let body = reqwest::Body::wrap_stream(super::fs::chunks(
        Box::new(tokio::io::stdin()),
        read_error.clone(),
    ));
    let rb = api
        .request(
            Method::POST,
            api.url(&["v1", "acp", server_id, "bundle"], &query),
        )
        .header(CONTENT_TYPE, "application/gzip")
        .body(body);
    let result = api.json(&format!("importing {server_id}"), rb).await;
    if let Some(e) = crate::sys::lock(&read_error).take() {
        return Err(ClientError::local("reading stdin", e));
    }
    let done = result?;
    if json {
        return out_json(&done).map(|()| 0);
    }
    out(format!(
        "imported {} ({}): {} session(s), {} event(s)\n",
        super::table::printable(server_id),
        super::table::printable(&super::table::cell(&done["agent"])),
        done["sessions"].as_array().map_or(0, Vec::len),
        super::table::cell(&done["events"]),
    )
    .as_bytes())
    .map(|()| 0)
}

/// POSTs the message as given (checked to be one JSON object, never re-serialized, so key order
/// and numbers reach the agent untouched) and prints the agent's answer line.
async fn send(
    api: &Api,
    server_id: &str,
    message: &str,
    agent: Option<&str>,
    json: bool,
) -> Result<u8, ClientError> {
    let text = if message == "-" {
        let mut s = String::new();
        std::io::stdin()
            .read_to_string(&mut s)
            .map_err(|e| ClientError::local("reading the message from stdin", e))?;
        s
    } else {
        message.to_string()
    };
    match serde_json::from_str::<serde_json::Value>(&text) {
        Ok(v) if v.is_object() => {}
        Ok(_) => {
            return Err(ClientError::Usage(
                "the message must be one JSON-RPC object, e.g. \
                 '{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"initialize\",\"params\":{\"protocolVersion\":1}}'"
                    .into(),
            ));
        }
        Err(e) => {
            return Err(ClientError::Usage(format!(
                "the message is not valid JSON: {e}"
            )));
        }
    }
    let query: Vec<(&str, &str)> = agent.map(|a| ("agent", a)).into_iter().collect();
    let rb = api
        .request(Method::POST, api.url(&["v1", "acp", server_id], &query))
        .header(CONTENT_TYPE, "application/json")
        .header(ACCEPT, "application/json")
        .body(text);
    let what = format!("sending to {server_id}");
    let resp = match api.send(&what, rb).await {
        Ok(resp) => resp,
        // The daemon's words are for HTTP clients (`?agent=<id>`); say it with our flag.
        Err(e) if agent.is_none() && is_missing_agent(&e) => {
            return Err(e.with_hint(format!(
                "there is no instance `{server_id}` yet: pass --agent <id> to start one \
                 (`sandbox-agent agents list` shows the ids; `mock` is built in)"
            )));
        }
        Err(e) => return Err(e),
    };
    let status = resp.status();
    let body = resp.bytes().await.map_err(|e| api.transport(e))?;
    if status == reqwest::StatusCode::ACCEPTED || body.is_empty() {
        // A notification or a response: written to the agent, no answer to print.
        if json {
            return out_json(&serde_json::json!({"accepted": true})).map(|()| 0);
        }
        eprintln!("sandbox-agent: accepted (a notification or response has no answer)");
        return Ok(0);
    }
    let mut line = body.to_vec();
    if line.last() != Some(&b'\n') {
        line.push(b'\n');
    }
    out(&line).map(|()| 0)
}

/// Follows the event stream: one JSON line per event (`{"event":"message","id":N,"data":{…}}`
/// or `{"event":"gap","data":{"from":F,"to":T}}`). When the daemon ends the stream while the
/// agent still runs (this reader fell behind), it reconnects after the last id it printed; it
/// stops once the instance has nothing more (410 gone, 404 deleted) or a reconnection brings
/// nothing.
async fn stream(api: &Api, server_id: &str, from: Option<u64>) -> Result<u8, ClientError> {
    let mut last = from;
    let mut first = true;
    loop {
        let mut rb = api
            .request(Method::GET, api.url(&["v1", "acp", server_id], &[]))
            .header(ACCEPT, "text/event-stream");
        if let Some(id) = last {
            rb = rb.header("Last-Event-ID", id.to_string());
        }
        let what = format!("streaming {server_id}");
        let resp = match api.send(&what, rb).await {
            Ok(resp) => resp,
            Err(e) if !first && matches!(e.status(), Some(404 | 410)) => return Ok(0),
            Err(e) => return Err(e),
        };
        let mut delivered = 0u64;
        read_events(api, resp, |event| {
            // The daemon sends one JSON object per event; the line is built around it unparsed,
            // so it is checked first to keep every printed line valid JSON.
            if serde_json::from_str::<serde::de::IgnoredAny>(&event.data).is_err() {
                return Err(ClientError::Protocol(format!(
                    "an event whose data is not JSON: {}",
                    event.data.chars().take(200).collect::<String>()
                )));
            }
            let line = match event.event.as_str() {
                "message" => {
                    let id = event.id.as_deref().and_then(|i| i.parse::<u64>().ok());
                    let Some(id) = id else {
                        return Err(ClientError::Protocol(format!(
                            "an event without a numeric id: {:?}",
                            event.id
                        )));
                    };
                    last = Some(id);
                    format!(
                        "{{\"event\":\"message\",\"id\":{id},\"data\":{}}}\n",
                        event.data
                    )
                }
                "gap" => format!("{{\"event\":\"gap\",\"data\":{}}}\n", event.data),
                _ => return Ok(()),
            };
            delivered += 1;
            out(line.as_bytes())
        })
        .await?;
        if !first && delivered == 0 {
            return Ok(0);
        }
        first = false;
    }
}

/// The daemon's 400 for a POST without `?agent=` to a serverId it does not have.
fn is_missing_agent(e: &ClientError) -> bool {
    e.status() == Some(400)
        && e.problem().is_some_and(|p| {
            p.get("serverId").is_some()
                && p["detail"].as_str().is_some_and(|d| d.contains("?agent="))
        })
}

/// The API's DELETE is idempotent (204 whether or not the instance existed), so the command
/// looks first: stopping an id the daemon does not have is "not found" (exit 66), as a typo
/// should be, and nothing is sent.
async fn stop(api: &Api, server_id: &str, json: bool) -> Result<u8, ClientError> {
    let list = api.get_json("instances", &["v1", "acp"], &[]).await?;
    let servers = list["servers"]
        .as_array()
        .ok_or_else(|| ClientError::Protocol("instances: no `servers` list".into()))?;
    if !servers.iter().any(|s| s["serverId"] == server_id) {
        return Err(ClientError::NotFound(format!(
            "no instance `{server_id}` (`sandbox-agent instances` lists them)"
        )));
    }
    let rb = api.request(Method::DELETE, api.url(&["v1", "acp", server_id], &[]));
    api.send(&format!("stopping {server_id}"), rb).await?;
    if json {
        out_json(&serde_json::json!({"serverId": server_id, "stopped": true})).map(|()| 0)
    } else {
        out(format!("stopped {server_id}\n").as_bytes()).map(|()| 0)
    }
}
