//! A small Chrome DevTools Protocol client for the daemon's own operations: the DevTools HTTP
//! endpoints of the browser the daemon started (`/json/version`, `/json/list`, `/json/new`,
//! `/json/close`, `/json/activate`, always on 127.0.0.1 at the port Chromium reported), and one
//! WebSocket session per operation to a page target, which sends commands and waits for their
//! answers (events are read and dropped). Every call has a deadline; messages are capped.

use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use serde_json::{Value, json};
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::protocol::WebSocketConfig;

use super::{BrowserError, Endpoint};

/// Largest CDP message the daemon reads from Chromium (a screenshot is one message).
pub const MAX_MESSAGE: usize = 64 << 20;
/// Most tabs the daemon lets `POST /v1/browser/tabs` open.
pub const MAX_TABS: usize = 32;

fn base(ep: &Endpoint) -> String {
    format!("http://127.0.0.1:{}", ep.port)
}

fn unreachable(e: reqwest::Error) -> BrowserError {
    BrowserError::Unavailable(format!(
        "the browser's DevTools endpoint did not answer: {}",
        crate::http_client::chain(&e)
    ))
}

async fn get_json(
    client: &reqwest::Client,
    req: reqwest::RequestBuilder,
) -> Result<Value, BrowserError> {
    let _ = client;
    let resp = req.send().await.map_err(unreachable)?;
    let status = resp.status();
    let bytes = resp.bytes().await.map_err(unreachable)?;
    if !status.is_success() {
        return Err(BrowserError::Failed(format!(
            "DevTools answered {status}: {}",
            String::from_utf8_lossy(&bytes[..bytes.len().min(500)])
        )));
    }
    if bytes.is_empty() {
        return Ok(Value::Null);
    }
    serde_json::from_slice(&bytes)
        .or_else(|_| Ok(Value::String(String::from_utf8_lossy(&bytes).into())))
}

/// `/json/version` of the browser.
pub async fn version(client: &reqwest::Client, ep: &Endpoint) -> Result<Value, BrowserError> {
    get_json(client, client.get(format!("{}/json/version", base(ep)))).await
}

/// A page target (a tab).
#[derive(Debug, Clone, serde::Serialize)]
pub struct Tab {
    pub id: String,
    pub url: String,
    pub title: String,
}

/// The tabs (targets of type `page`), in Chromium's order (most recently active first).
pub async fn tabs(client: &reqwest::Client, ep: &Endpoint) -> Result<Vec<Tab>, BrowserError> {
    let v = get_json(client, client.get(format!("{}/json/list", base(ep)))).await?;
    let list = v.as_array().cloned().unwrap_or_default();
    Ok(list
        .iter()
        .filter(|t| t.get("type").and_then(Value::as_str) == Some("page"))
        .filter_map(|t| {
            Some(Tab {
                id: t.get("id")?.as_str()?.to_string(),
                url: t.get("url").and_then(Value::as_str).unwrap_or("").into(),
                title: t.get("title").and_then(Value::as_str).unwrap_or("").into(),
            })
        })
        .collect())
}

/// Whether `id` has the shape of a target id (so that it can go into a DevTools URL path).
pub fn valid_tab_id(id: &str) -> bool {
    (1..=64).contains(&id.len()) && id.bytes().all(|b| b.is_ascii_alphanumeric())
}

/// The tab `id`, or 404; `None` picks the first tab (the active one).
pub async fn tab(
    client: &reqwest::Client,
    ep: &Endpoint,
    id: Option<&str>,
) -> Result<Tab, BrowserError> {
    if let Some(id) = id
        && !valid_tab_id(id)
    {
        return Err(BrowserError::invalid(
            "tabId",
            "a tab id is 1 to 64 ASCII letters and digits",
        ));
    }
    let all = tabs(client, ep).await?;
    match id {
        Some(id) => all
            .into_iter()
            .find(|t| t.id == id)
            .ok_or_else(|| BrowserError::NotFound(format!("no tab {id}"))),
        None => all
            .into_iter()
            .next()
            .ok_or_else(|| BrowserError::NotFound("the browser has no tab open".into())),
    }
}

/// Opens a tab on `url` (already validated), at most `MAX_TABS`.
pub async fn open(client: &reqwest::Client, ep: &Endpoint, url: &str) -> Result<Tab, BrowserError> {
    if tabs(client, ep).await?.len() >= MAX_TABS {
        return Err(BrowserError::Conflict(format!(
            "{MAX_TABS} tabs are open; close one first"
        )));
    }
    let mut u = reqwest::Url::parse(&format!("{}/json/new", base(ep)))
        .map_err(|e| BrowserError::Failed(e.to_string()))?;
    u.set_query(Some(url));
    let v = get_json(client, client.put(u)).await?;
    Ok(Tab {
        id: v
            .get("id")
            .and_then(Value::as_str)
            .ok_or_else(|| BrowserError::Failed("DevTools opened no tab".into()))?
            .into(),
        url: v.get("url").and_then(Value::as_str).unwrap_or("").into(),
        title: v.get("title").and_then(Value::as_str).unwrap_or("").into(),
    })
}

pub async fn close(client: &reqwest::Client, ep: &Endpoint, id: &str) -> Result<(), BrowserError> {
    tab(client, ep, Some(id)).await?;
    get_json(client, client.get(format!("{}/json/close/{id}", base(ep)))).await?;
    Ok(())
}

pub async fn activate(
    client: &reqwest::Client,
    ep: &Endpoint,
    id: &str,
) -> Result<(), BrowserError> {
    tab(client, ep, Some(id)).await?;
    get_json(
        client,
        client.get(format!("{}/json/activate/{id}", base(ep))),
    )
    .await?;
    Ok(())
}

type Ws = tokio_tungstenite::WebSocketStream<tokio::net::TcpStream>;

/// A CDP session on one page target.
pub struct Session {
    ws: Ws,
    next: u64,
}

impl Session {
    /// Connects to the page target `id` of the browser at `ep`.
    pub async fn connect(ep: &Endpoint, id: &str) -> Result<Session, BrowserError> {
        let tcp = tokio::time::timeout(
            Duration::from_secs(5),
            tokio::net::TcpStream::connect(("127.0.0.1", ep.port)),
        )
        .await
        .map_err(|_| BrowserError::Timeout("the browser's DevTools port did not answer".into()))?
        .map_err(|e| BrowserError::Unavailable(format!("cannot reach the browser: {e}")))?;
        let url = format!("ws://127.0.0.1:{}/devtools/page/{id}", ep.port);
        let config = WebSocketConfig::default()
            .max_message_size(Some(MAX_MESSAGE))
            .max_frame_size(Some(MAX_MESSAGE));
        let (ws, _) = tokio::time::timeout(
            Duration::from_secs(5),
            tokio_tungstenite::client_async_with_config(url, tcp, Some(config)),
        )
        .await
        .map_err(|_| BrowserError::Timeout("the browser's DevTools socket did not open".into()))?
        .map_err(|e| BrowserError::Unavailable(format!("cannot open a DevTools session: {e}")))?;
        Ok(Session { ws, next: 1 })
    }

    /// Sends `method` and waits up to `timeout` for its answer.
    pub async fn call(
        &mut self,
        method: &str,
        params: Value,
        timeout: Duration,
    ) -> Result<Value, BrowserError> {
        let id = self.next;
        self.next += 1;
        let msg = json!({"id": id, "method": method, "params": params}).to_string();
        let deadline = tokio::time::Instant::now() + timeout;
        let wait = async {
            self.ws
                .send(Message::text(msg))
                .await
                .map_err(|e| BrowserError::Unavailable(format!("DevTools session ended: {e}")))?;
            loop {
                let Some(m) = self.ws.next().await else {
                    return Err(BrowserError::Unavailable("DevTools session ended".into()));
                };
                let m = m.map_err(|e| BrowserError::Failed(format!("DevTools session: {e}")))?;
                let Message::Text(text) = m else { continue };
                let Ok(v) = serde_json::from_str::<Value>(&text) else {
                    continue;
                };
                if v.get("id").and_then(Value::as_u64) != Some(id) {
                    continue;
                }
                if let Some(err) = v.get("error") {
                    let msg = err
                        .get("message")
                        .and_then(Value::as_str)
                        .unwrap_or("error");
                    return Err(BrowserError::Failed(format!("{method}: {msg}")));
                }
                return Ok(v.get("result").cloned().unwrap_or(Value::Null));
            }
        };
        tokio::time::timeout_at(deadline, wait)
            .await
            .map_err(|_| BrowserError::Timeout(format!("{method} did not finish in time")))?
    }

    pub async fn close(mut self) {
        let _ = tokio::time::timeout(Duration::from_secs(1), self.ws.close(None)).await;
    }
}
