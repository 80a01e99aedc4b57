//! Drives the official Rust ACP SDK's HTTP or WebSocket client (`agent-client-protocol-http`,
//! feature `client`, unmodified) against the daemon's `/v1/agents/mock/acp`: initialize →
//! session/new → prompt with streamed updates → a permission request answered → cancel of a
//! `/hang` prompt → close. Prints one JSON line with what it saw (the same shape as
//! `ts-client.mjs` and `py-client.py`); exits non-zero on any failure.
//! Usage: acp-interop-rust http|ws <base-url> [token]

use std::sync::{Arc, Mutex};
use std::time::Duration;

use agent_client_protocol::schema::ProtocolVersion;
use agent_client_protocol::v1::ConnectionTo;
use agent_client_protocol::v1::schema::{
    CancelNotification, ContentBlock, InitializeRequest, NewSessionRequest, PermissionOptionKind,
    PromptRequest, RequestPermissionOutcome, RequestPermissionRequest, RequestPermissionResponse,
    SelectedPermissionOutcome, SessionNotification, SessionUpdate, TextContent,
};
use agent_client_protocol::{Agent, Client};
use agent_client_protocol_http::HttpClient;
use serde_json::{Value, json};

type Failure = Box<dyn std::error::Error + Send + Sync>;

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (mode, base) = match (args.first(), args.get(1)) {
        (Some(m), Some(b)) if m == "http" || m == "ws" => (m.clone(), b.clone()),
        _ => {
            eprintln!("usage: acp-interop-rust http|ws <base-url> [token]");
            std::process::exit(2);
        }
    };
    let token = args.get(2).cloned();
    match tokio::time::timeout(Duration::from_secs(30), run(&mode, &base, token)).await {
        Ok(Ok(result)) => println!("{result}"),
        Ok(Err(e)) => {
            eprintln!("failed: {e}");
            std::process::exit(1);
        }
        Err(_) => {
            eprintln!("timed out");
            std::process::exit(3);
        }
    }
}

fn text_prompt(
    session: &agent_client_protocol::v1::schema::SessionId,
    text: &str,
) -> PromptRequest {
    PromptRequest::new(
        session.clone(),
        vec![ContentBlock::Text(TextContent::new(text.to_string()))],
    )
}

async fn run(mode: &str, base: &str, token: Option<String>) -> Result<Value, Failure> {
    let endpoint = format!("{base}/v1/agents/mock/acp");
    let endpoint = if mode == "ws" {
        endpoint.replacen("http", "ws", 1)
    } else {
        endpoint
    };
    let mut headers = reqwest::header::HeaderMap::new();
    if let Some(t) = &token {
        headers.insert(
            reqwest::header::AUTHORIZATION,
            format!("Bearer {t}").parse()?,
        );
    }
    let transport = HttpClient::builder_with_endpoint(&endpoint)
        .configure_http({
            let headers = headers.clone();
            move |http| http.default_headers(headers).no_proxy()
        })
        .build()?;
    // The daemon's own listing, to see when the `/hang` prompt has reached the agent.
    let plain = reqwest::Client::builder()
        .default_headers(headers)
        .no_proxy()
        .build()?;
    let listing = format!("{base}/v1/acp");

    // (session, text) of every agent_message_chunk received.
    let chunks: Arc<Mutex<Vec<(String, String)>>> = Arc::default();
    let asked = Arc::new(Mutex::new(0u32));
    let result: Arc<Mutex<Option<Value>>> = Arc::default();
    let (chunks2, asked2, result2) = (chunks.clone(), asked.clone(), result.clone());

    Client
        .v1()
        .on_receive_notification(
            async move |n: SessionNotification, _cx| {
                if let SessionUpdate::AgentMessageChunk(chunk) = n.update
                    && let ContentBlock::Text(t) = chunk.content
                {
                    chunks2
                        .lock()
                        .unwrap()
                        .push((n.session_id.to_string(), t.text));
                }
                Ok(())
            },
            agent_client_protocol::on_receive_notification!(),
        )
        .on_receive_request(
            async move |request: RequestPermissionRequest, responder, _cx| {
                *asked2.lock().unwrap() += 1;
                let allow = request
                    .options
                    .iter()
                    .find(|o| o.kind == PermissionOptionKind::AllowOnce)
                    .map(|o| o.option_id.clone());
                let outcome = match allow {
                    Some(id) => {
                        RequestPermissionOutcome::Selected(SelectedPermissionOutcome::new(id))
                    }
                    None => RequestPermissionOutcome::Cancelled,
                };
                responder.respond(RequestPermissionResponse::new(outcome))
            },
            agent_client_protocol::on_receive_request!(),
        )
        .connect_with(transport, async move |cx: ConnectionTo<Agent>| {
            let init = cx
                .send_request(InitializeRequest::new(ProtocolVersion::V1))
                .block_task()
                .await?;
            let session = cx
                .send_request(NewSessionRequest::new(std::path::PathBuf::from("/tmp")))
                .block_task()
                .await?
                .session_id;
            let streamed = cx
                .send_request(text_prompt(&session, "/stream 3"))
                .block_task()
                .await?;
            let permission = cx
                .send_request(text_prompt(&session, "/permission"))
                .block_task()
                .await?;
            let hang = cx.send_request(text_prompt(&session, "/hang")).block_task();
            let cancel = async {
                // Cancel only once the daemon has written the prompt to the agent.
                for _ in 0..3000 {
                    let v: Value = plain.get(&listing).send().await?.json().await?;
                    let pending = v["servers"]
                        .as_array()
                        .is_some_and(|s| s.iter().any(|s| s["pendingRequests"].as_u64() > Some(0)));
                    if pending {
                        cx.send_notification(CancelNotification::new(session.clone()))?;
                        return Ok::<(), Failure>(());
                    }
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
                Err("the /hang prompt never reached the agent".into())
            };
            let (cancelled, sent) = tokio::join!(hang, cancel);
            sent.map_err(|e| agent_client_protocol::Error::internal_error().data(e.to_string()))?;
            let cancelled = cancelled?;
            let session_text = session.to_string();
            let texts: Vec<String> = chunks
                .lock()
                .unwrap()
                .iter()
                .filter(|(s, _)| *s == session_text)
                .map(|(_, t)| t.clone())
                .collect();
            *result2.lock().unwrap() = Some(json!({
                "agent": init.agent_info.map(|i| i.name),
                "sessionId": session_text,
                "streamedStop": serde_json::to_value(streamed.stop_reason).unwrap_or_default(),
                "texts": texts,
                "permissionAsked": *asked.lock().unwrap(),
                "permissionStop": serde_json::to_value(permission.stop_reason).unwrap_or_default(),
                "cancelledStop": serde_json::to_value(cancelled.stop_reason).unwrap_or_default(),
            }));
            Ok(())
        })
        .await?;
    let seen = result.lock().unwrap().take();
    seen.ok_or_else(|| "the connection ended before the script finished".into())
}
