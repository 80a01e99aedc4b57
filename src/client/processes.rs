//! `sandbox-agent processes run|start|list|logs|stop`: the process API (`/v1/processes`).

use std::io::Write;

use base64::Engine;
use base64::engine::general_purpose::STANDARD as B64;
use reqwest::Method;
use reqwest::header::ACCEPT;
use serde_json::{Value, json};

use super::api::{Api, ClientError};
use super::sse::read_events;
use super::{out, out_json, table};
use crate::cli::{ProcessSpec, ProcessesCommand};

/// `timeout(1)`'s exit code for a program it had to kill.
const EXIT_TIMED_OUT: u8 = 124;

pub async fn run(api: &Api, command: ProcessesCommand, json: bool) -> Result<u8, ClientError> {
    match command {
        ProcessesCommand::Run { timeout, spec, .. } => {
            run_to_end(api, &spec, timeout.as_deref(), json).await
        }
        ProcessesCommand::Start { spec, .. } => start(api, &spec, json).await,
        ProcessesCommand::List { .. } => list(api, json).await,
        ProcessesCommand::Logs {
            id,
            follow,
            stream,
            tail,
            ..
        } => logs(api, &id, follow, stream.as_deref(), tail, json).await,
        ProcessesCommand::Stop { id, kill, wait, .. } => {
            stop(api, &id, kill, wait.as_deref(), json).await
        }
    }
}

/// The request body shared by `run` and `start`.
fn spec_body(spec: &ProcessSpec) -> Result<serde_json::Map<String, Value>, ClientError> {
    let (command, args) = spec
        .command
        .split_first()
        .ok_or_else(|| ClientError::Usage("no command given".into()))?;
    let mut env = serde_json::Map::new();
    for pair in &spec.env {
        match pair.split_once('=') {
            Some((k, v)) if !k.is_empty() => {
                env.insert(k.to_string(), json!(v));
            }
            _ => {
                return Err(ClientError::Usage(format!(
                    "--env `{pair}`: expected KEY=VALUE"
                )));
            }
        }
    }
    let mut body = serde_json::Map::new();
    body.insert("command".into(), json!(command));
    body.insert("args".into(), json!(args));
    if let Some(cwd) = &spec.cwd {
        body.insert("cwd".into(), json!(cwd));
    }
    if !env.is_empty() {
        body.insert("env".into(), Value::Object(env));
    }
    Ok(body)
}

fn duration_ms(flag: &str, raw: &str) -> Result<u64, ClientError> {
    crate::config::parse_duration(raw)
        .map(|d| d.as_millis().min(u64::MAX as u128) as u64)
        .map_err(|e| ClientError::Usage(format!("{flag}: {e}")))
}

/// Runs to completion; its output goes to our stdout and stderr, its exit code becomes ours.
async fn run_to_end(
    api: &Api,
    spec: &ProcessSpec,
    timeout: Option<&str>,
    json: bool,
) -> Result<u8, ClientError> {
    let mut body = spec_body(spec)?;
    if let Some(t) = timeout {
        body.insert("timeoutMs".into(), json!(duration_ms("--timeout", t)?));
    }
    let rb = api
        .request(Method::POST, api.url(&["v1", "processes", "run"], &[]))
        .json(&body);
    let answer = api.json("running the program", rb).await?;
    let code = if answer["timedOut"] == true {
        EXIT_TIMED_OUT
    } else if let Some(code) = answer["exitCode"].as_i64() {
        (code & 0xff) as u8
    } else if let Some(signal) = answer["exitSignal"].as_i64() {
        (128 + signal).clamp(0, 255) as u8
    } else {
        return Err(ClientError::Protocol(format!(
            "running the program: no exit code in {answer}"
        )));
    };
    if json {
        out_json(&answer)?;
        return Ok(code);
    }
    out(answer["stdout"].as_str().unwrap_or("").as_bytes())?;
    let mut err = std::io::stderr().lock();
    let _ = err.write_all(answer["stderr"].as_str().unwrap_or("").as_bytes());
    for stream in ["stdout", "stderr"] {
        if answer[format!("{stream}Truncated")] == true {
            let _ = writeln!(err, "sandbox-agent: the program's {stream} was cut short");
        }
    }
    if answer["timedOut"] == true {
        let _ = writeln!(err, "sandbox-agent: the program timed out and was killed");
    }
    Ok(code)
}

async fn start(api: &Api, spec: &ProcessSpec, json: bool) -> Result<u8, ClientError> {
    let body = spec_body(spec)?;
    let rb = api
        .request(Method::POST, api.url(&["v1", "processes"], &[]))
        .json(&body);
    let process = api.json("starting the program", rb).await?;
    if json {
        return out_json(&process).map(|()| 0);
    }
    out(format!("{}\n", table::cell(&process["id"])).as_bytes()).map(|()| 0)
}

async fn list(api: &Api, json: bool) -> Result<u8, ClientError> {
    let list = api
        .get_json("listing processes", &["v1", "processes"], &[])
        .await?;
    if json {
        return out_json(&list).map(|()| 0);
    }
    let processes = list["processes"]
        .as_array()
        .ok_or_else(|| ClientError::Protocol("processes: no `processes` list".into()))?;
    let rows: Vec<Vec<String>> = processes
        .iter()
        .map(|p| {
            let exit = match (p["exitCode"].as_i64(), p["exitSignal"].as_i64()) {
                (Some(code), _) => code.to_string(),
                (None, Some(signal)) => format!("signal {signal}"),
                _ => "-".to_string(),
            };
            let mut command = table::cell(&p["command"]);
            for arg in p["args"].as_array().into_iter().flatten() {
                command.push(' ');
                command.push_str(&table::cell(arg));
            }
            vec![
                table::cell(&p["id"]),
                table::cell(&p["status"]),
                table::cell(&p["pid"]),
                exit,
                p["stats"]["rssBytes"]
                    .as_u64()
                    .map_or("-".into(), table::bytes),
                p["stats"]["cpuMs"].as_u64().map_or("-".into(), table::cpu),
                command,
            ]
        })
        .collect();
    let header = ["ID", "STATUS", "PID", "EXIT", "RSS", "CPU", "COMMAND"];
    out(table::render(&header, &rows).as_bytes()).map(|()| 0)
}

/// Prints the log: decoded bytes (stderr chunks to stderr) or, with `--json`, the answer (one
/// document; with `--follow` one line per event). A gap is told on stderr, never skipped quietly.
async fn logs(
    api: &Api,
    id: &str,
    follow: bool,
    stream: Option<&str>,
    tail: Option<u64>,
    json: bool,
) -> Result<u8, ClientError> {
    let tail = tail.map(|t| t.to_string());
    let mut query: Vec<(&str, &str)> = Vec::new();
    if let Some(s) = stream {
        query.push(("stream", s));
    }
    if let Some(t) = &tail {
        query.push(("tail", t));
    }
    let what = format!("the log of {id}");
    if !follow {
        let answer = api
            .get_json(&what, &["v1", "processes", id, "logs"], &query)
            .await?;
        if json {
            return out_json(&answer).map(|()| 0);
        }
        if answer["gap"].is_object() {
            print_gap(&answer["gap"]);
        }
        for entry in answer["entries"].as_array().into_iter().flatten() {
            print_entry(entry)?;
        }
        return Ok(0);
    }
    query.push(("follow", "true"));
    let rb = api
        .request(
            Method::GET,
            api.url(&["v1", "processes", id, "logs"], &query),
        )
        .header(ACCEPT, "text/event-stream");
    let resp = api.send(&what, rb).await?;
    // The stream ends when the process has exited and all its output was sent (or when the
    // daemon stops, which stops the process too).
    read_events(api, resp, |event| {
        let data: Value = serde_json::from_str(&event.data).map_err(|e| {
            ClientError::Protocol(format!("a log event whose data is not JSON: {e}"))
        })?;
        if json {
            let mut line = json!({"event": event.event, "data": data});
            if let Some(id) = &event.id {
                line["id"] = json!(id.parse::<u64>().ok());
            }
            return out_json(&line);
        }
        match event.event.as_str() {
            "log" => print_entry(&data),
            "gap" => {
                print_gap(&data);
                Ok(())
            }
            _ => Ok(()),
        }
    })
    .await?;
    Ok(0)
}

/// One chunk's bytes, to stdout (or stderr for the program's stderr).
fn print_entry(entry: &Value) -> Result<(), ClientError> {
    let data = entry["data"].as_str().unwrap_or("");
    let bytes = B64
        .decode(data)
        .map_err(|e| ClientError::Protocol(format!("a log entry that is not base64: {e}")))?;
    if entry["stream"] == "stderr" {
        let mut err = std::io::stderr().lock();
        let _ = err.write_all(&bytes).and_then(|()| err.flush());
        Ok(())
    } else {
        out(&bytes)
    }
}

fn print_gap(gap: &Value) {
    eprintln!(
        "sandbox-agent: output bytes {}..{} were dropped before they could be read",
        table::cell(&gap["from"]),
        table::cell(&gap["to"])
    );
}

async fn stop(
    api: &Api,
    id: &str,
    kill: bool,
    wait: Option<&str>,
    json: bool,
) -> Result<u8, ClientError> {
    let wait_ms = match wait {
        Some(w) => duration_ms("--wait", w)?,
        None => 10_000,
    }
    .to_string();
    let action = if kill { "kill" } else { "stop" };
    let rb = api.request(
        Method::POST,
        api.url(&["v1", "processes", id, action], &[("waitMs", &wait_ms)]),
    );
    let process = api.json(&format!("stopping {id}"), rb).await?;
    if json {
        return out_json(&process).map(|()| 0);
    }
    let line = match (
        process["status"].as_str(),
        process["exitCode"].as_i64(),
        process["exitSignal"].as_i64(),
    ) {
        (Some("exited"), Some(code), _) => format!("{id} exited (code {code})"),
        (Some("exited"), None, Some(signal)) => format!("{id} exited (signal {signal})"),
        (Some("exited"), ..) => format!("{id} exited"),
        _ => format!("{id} is still stopping"),
    };
    out(format!("{line}\n").as_bytes()).map(|()| 0)
}
