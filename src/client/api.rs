//! The HTTP side of the client: one `reqwest::Client` with the bearer token, URLs built by the
//! `url` rules (each path segment and query value encoded), and every way a call can fail sorted
//! into one `ClientError` whose class gives the exit code.

use reqwest::{Method, RequestBuilder, Response, StatusCode, Url};

use crate::config::ClientTarget;

pub const EX_USAGE: u8 = 64;
pub const EX_DATAERR: u8 = 65;
pub const EX_NOINPUT: u8 = 66;
pub const EX_UNAVAILABLE: u8 = 69;
pub const EX_SOFTWARE: u8 = 70;
pub const EX_OSERR: u8 = 71;
pub const EX_IOERR: u8 = 74;
pub const EX_TEMPFAIL: u8 = 75;
pub const EX_PROTOCOL: u8 = 76;
pub const EX_NOPERM: u8 = 77;
pub const EX_CONFIG: u8 = 78;

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// A bad argument the command line parser could not see (JSON that does not parse, …).
    #[error("{0}")]
    Usage(String),
    /// The address or token settings (config file, token file) are wrong.
    #[error("{0}")]
    Config(String),
    /// Nothing answers at the address, or the connection broke before or during the answer.
    #[error("cannot reach the daemon at {url}: {cause}")]
    Connect { url: String, cause: String },
    /// The daemon answered with an error status; `problem` is its problem+json body. `hint`,
    /// when set, says the same in the command line's terms (its flags, not the HTTP request
    /// the daemon saw) and is shown instead of the daemon's detail.
    #[error("{what}: {status}{}", match hint {
        Some(h) => format!(": {h}"),
        None => detail(*.status, .problem, .body),
    })]
    Http {
        what: String,
        status: StatusCode,
        problem: Option<serde_json::Value>,
        body: String,
        hint: Option<String>,
    },
    /// What the command names does not exist (checked by the client before acting).
    #[error("{0}")]
    NotFound(String),
    /// The daemon answered something this client does not understand.
    #[error("unexpected answer from the daemon: {0}")]
    Protocol(String),
    /// Reading or writing a local file.
    #[error("{what}: {source}")]
    Local {
        what: String,
        #[source]
        source: std::io::Error,
    },
    /// Writing to our own stdout.
    #[error("writing to stdout: {0}")]
    Stdout(#[source] std::io::Error),
    #[error("cannot start the async runtime: {0}")]
    Runtime(#[source] std::io::Error),
    /// Stopped by this signal before the command was done.
    #[error("interrupted by signal {0}")]
    Interrupted(i32),
}

/// ` (<title>): <detail>` from a problem body (the title only when it says more than the
/// status), else the start of whatever the body was.
fn detail(status: StatusCode, problem: &Option<serde_json::Value>, body: &str) -> String {
    if let Some(p) = problem {
        let title = p["title"]
            .as_str()
            .filter(|t| Some(*t) != status.canonical_reason() && !t.is_empty());
        let mut s = title.map(|t| format!(" ({t})")).unwrap_or_default();
        if let Some(detail) = p["detail"].as_str().filter(|d| !d.is_empty()) {
            s.push_str(": ");
            s.push_str(detail);
        }
        if let Some(tail) = p["stderrTail"].as_str().filter(|t| !t.trim().is_empty()) {
            s.push_str("\nthe agent's last stderr lines:\n");
            s.push_str(tail.trim_end());
        }
        if let Some(cmd) = p["installCommand"].as_str() {
            s.push_str(&format!("\ninstall it with: {cmd}"));
        }
        return s;
    }
    let body = body.trim();
    if body.is_empty() {
        String::new()
    } else {
        let cut: String = body.chars().take(200).collect();
        format!(": {cut}")
    }
}

impl ClientError {
    /// The exit code of the failure's class (the table in docs/cli.md).
    pub fn exit_code(&self) -> u8 {
        match self {
            ClientError::Usage(_) => EX_USAGE,
            ClientError::Config(_) => EX_CONFIG,
            ClientError::Connect { .. } => EX_UNAVAILABLE,
            ClientError::Http { status, .. } => match status.as_u16() {
                401 | 403 => EX_NOPERM,
                404 | 410 => EX_NOINPUT,
                429 | 503 => EX_TEMPFAIL,
                400..=499 => EX_DATAERR,
                _ => EX_SOFTWARE,
            },
            ClientError::NotFound(_) => EX_NOINPUT,
            ClientError::Protocol(_) => EX_PROTOCOL,
            ClientError::Local { .. } | ClientError::Stdout(_) => EX_IOERR,
            ClientError::Runtime(_) => EX_OSERR,
            ClientError::Interrupted(signal) => (128 + signal).clamp(0, 255) as u8,
        }
    }

    /// The class's name, for `--json` error lines.
    pub fn class(&self) -> &'static str {
        match self.exit_code() {
            EX_USAGE => "usage",
            EX_CONFIG => "config",
            EX_UNAVAILABLE => "unreachable",
            EX_NOPERM => "auth",
            EX_NOINPUT => "not-found",
            EX_TEMPFAIL => "busy",
            EX_DATAERR => "refused",
            EX_SOFTWARE => "server-error",
            EX_PROTOCOL => "protocol",
            EX_IOERR => "io",
            EX_OSERR => "internal",
            _ => "interrupted",
        }
    }

    pub fn status(&self) -> Option<u16> {
        match self {
            ClientError::Http { status, .. } => Some(status.as_u16()),
            _ => None,
        }
    }

    pub fn problem(&self) -> Option<&serde_json::Value> {
        match self {
            ClientError::Http { problem, .. } => problem.as_ref(),
            _ => None,
        }
    }

    pub fn is_broken_pipe(&self) -> bool {
        matches!(self, ClientError::Stdout(e) if e.kind() == std::io::ErrorKind::BrokenPipe)
    }

    /// The same error, said in the command line's terms (see `Http::hint`).
    pub fn with_hint(self, text: impl Into<String>) -> Self {
        match self {
            ClientError::Http {
                what,
                status,
                problem,
                body,
                ..
            } => ClientError::Http {
                what,
                status,
                problem,
                body,
                hint: Some(text.into()),
            },
            other => other,
        }
    }

    pub fn local(what: impl Into<String>, source: std::io::Error) -> Self {
        ClientError::Local {
            what: what.into(),
            source,
        }
    }
}

/// The daemon at one base URL, with its token.
pub struct Api {
    http: reqwest::Client,
    base: Url,
    token: Option<String>,
}

impl Api {
    pub fn new(target: ClientTarget) -> Result<Api, ClientError> {
        let base = Url::parse(&target.base_url)
            .map_err(|e| ClientError::Config(format!("`{}` is not a URL: {e}", target.base_url)))?;
        // No proxy: the daemon is on loopback (or a port-forward to it), and a proxy from the
        // environment would only be in the way. No overall timeout: streams and prompts are long.
        // A plain `http://` address needs no CA certificates (a minimal image has none).
        let mut builder = reqwest::Client::builder()
            .no_proxy()
            .connect_timeout(std::time::Duration::from_secs(10))
            .user_agent(concat!("sandbox-agent-cli/", env!("CARGO_PKG_VERSION")));
        if base.scheme() == "http" {
            builder = crate::http_client::plain_http(builder);
        }
        let http = builder.build().map_err(|e| {
            ClientError::Config(format!(
                "cannot build the HTTP client for {}: {}",
                target.base_url,
                crate::http_client::build_error(&e)
            ))
        })?;
        Ok(Api {
            http,
            base,
            token: target.token,
        })
    }

    pub fn base(&self) -> &str {
        self.base.as_str().trim_end_matches('/')
    }

    /// `base` + the path segments (each encoded) + the query pairs (each encoded).
    pub fn url(&self, segments: &[&str], query: &[(&str, &str)]) -> Url {
        let mut url = self.base.clone();
        {
            let mut path = url
                .path_segments_mut()
                .expect("an http(s) URL has path segments");
            path.pop_if_empty();
            path.extend(segments);
        }
        if !query.is_empty() {
            let mut pairs = url.query_pairs_mut();
            for (k, v) in query {
                pairs.append_pair(k, v);
            }
        }
        url
    }

    /// A request with the token, if any.
    pub fn request(&self, method: Method, url: Url) -> RequestBuilder {
        let rb = self.http.request(method, url);
        match &self.token {
            Some(t) => rb.bearer_auth(t),
            None => rb,
        }
    }

    /// Sends; a transport failure is `Connect`, a non-2xx answer `Http` (its body read, bounded).
    pub async fn send(&self, what: &str, rb: RequestBuilder) -> Result<Response, ClientError> {
        let resp = rb.send().await.map_err(|e| self.transport(e))?;
        if resp.status().is_success() {
            return Ok(resp);
        }
        let status = resp.status();
        let body = read_bounded(resp, 64 * 1024).await;
        let problem = serde_json::from_str::<serde_json::Value>(&body)
            .ok()
            .filter(|v| v.is_object());
        // A token refused is a flag to fix, not a header to add.
        let hint = (status == StatusCode::UNAUTHORIZED).then(|| match &self.token {
            None => "the daemon needs a token: pass --token <token> or --token-file <file>, \
                     or set SANDBOX_AGENT_TOKEN"
                .to_string(),
            Some(_) => "the daemon refused the token given (--token, --token-file, \
                        SANDBOX_AGENT_TOKEN or the config file's `token`): it is not the \
                        daemon's token"
                .to_string(),
        });
        Err(ClientError::Http {
            what: what.to_string(),
            status,
            problem,
            body,
            hint,
        })
    }

    /// `send`, then the body as JSON.
    pub async fn json(
        &self,
        what: &str,
        rb: RequestBuilder,
    ) -> Result<serde_json::Value, ClientError> {
        let resp = self.send(what, rb).await?;
        let bytes = resp.bytes().await.map_err(|e| self.transport(e))?;
        serde_json::from_slice(&bytes)
            .map_err(|e| ClientError::Protocol(format!("{what}: the answer is not JSON: {e}")))
    }

    /// `GET` of a JSON document.
    pub async fn get_json(
        &self,
        what: &str,
        segments: &[&str],
        query: &[(&str, &str)],
    ) -> Result<serde_json::Value, ClientError> {
        let rb = self.request(Method::GET, self.url(segments, query));
        self.json(what, rb).await
    }

    /// A transport error (connect, or the connection breaking mid-answer) as `Connect`.
    pub fn transport(&self, e: reqwest::Error) -> ClientError {
        // Every cause in the chain: reqwest's own layer says only "error sending request for
        // url (…)", the one below what happened ("Connection refused (os error 111)", an
        // untrusted certificate, …). The URL is said once, by `Connect`.
        let cause = crate::http_client::chain(&e.without_url());
        ClientError::Connect {
            url: self.base().to_string(),
            cause,
        }
    }
}

/// At most `max` bytes of an (error) body, as text; a broken body gives what arrived.
async fn read_bounded(mut resp: Response, max: usize) -> String {
    let mut buf = Vec::new();
    while buf.len() < max {
        match resp.chunk().await {
            Ok(Some(chunk)) => buf.extend_from_slice(&chunk[..chunk.len().min(max - buf.len())]),
            _ => break,
        }
    }
    String::from_utf8_lossy(&buf).into_owned()
}
