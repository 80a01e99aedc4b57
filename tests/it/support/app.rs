//! The in-process tier: the daemon's real `Router`, built by the same composition root as the
//! binary (`AppState::build` around a real `Supervisor`), driven request by request with
//! `tower::ServiceExt::oneshot`, without a socket or a process of its own. Route tests that need
//! no process (signals, PID 1, reload, systemd, the accept loop's caps) live here and take
//! milliseconds; agents and programs the routes start are still real child processes (the mock
//! agent is the real binary's `mock-agent`).

use std::ffi::OsString;
use std::path::PathBuf;
use std::sync::Arc;

use axum::body::{Body, Bytes};
use axum::http::{HeaderMap, Method, Request, StatusCode, header};
use clap::Parser;
use sandbox_agent::cli::ServerArgs;
use sandbox_agent::config::Config;
use sandbox_agent::http::AppState;
use tokio_util::sync::CancellationToken;
use tower::ServiceExt;

/// `sandbox-agent server`'s arguments, parsed as the command line would.
#[derive(Parser)]
struct Server {
    #[command(flatten)]
    args: ServerArgs,
}

/// One answer, read whole.
pub struct Answer {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Bytes,
}

impl Answer {
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(&self.body)))
    }

    pub fn content_type(&self) -> &str {
        self.headers
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
    }

    /// Asserts an RFC 9457 problem with `status` and returns its body.
    pub fn problem(&self, status: StatusCode) -> serde_json::Value {
        assert_eq!(
            self.status,
            status,
            "{}",
            String::from_utf8_lossy(&self.body)
        );
        assert_eq!(self.content_type(), "application/problem+json");
        let p = self.json();
        assert_eq!(p["status"], status.as_u16(), "{p}");
        assert!(p["title"].is_string() && p["detail"].is_string(), "{p}");
        p
    }
}

/// The daemon's services and router in this process, over temporary data and work dirs.
pub struct App {
    router: axum::Router,
    state: AppState,
    services: CancellationToken,
    dirs: tempfile::TempDir,
}

impl App {
    /// The daemon as `sandbox-agent server ARGS` would build it, with its own data and work dirs.
    pub async fn start<I, S>(args: I) -> App
    where
        I: IntoIterator<Item = S>,
        S: Into<OsString>,
    {
        let dirs = tempfile::tempdir().unwrap();
        let (data, work) = (dirs.path().join("data"), dirs.path().join("work"));
        std::fs::create_dir_all(&data).unwrap();
        std::fs::create_dir_all(&work).unwrap();
        let mut argv: Vec<OsString> = vec!["sandbox-agent".into(), "--data-dir".into()];
        argv.push(data.into());
        argv.push("--work-dir".into());
        argv.push(work.into());
        // Agent cgroups are the binary-level tests' (they need a process of the daemon's own to
        // nest under); here agents get rlimits only, and nothing is left in /sys/fs/cgroup.
        argv.extend(["--agent-cgroups".into(), "off".into()]);
        argv.extend(args.into_iter().map(Into::into));
        let parsed = Server::try_parse_from(argv)
            .expect("the test's arguments")
            .args;
        let mut config = Config::load(&parsed).unwrap_or_else(|e| panic!("config: {e}"));
        // Agents are started from the daemon's own binary (`mock-agent`); here that is not the
        // test binary.
        config.exe = PathBuf::from(env!("CARGO_BIN_EXE_sandbox-agent"));
        let config = Arc::new(config);
        let supervisor = Arc::new(sandbox_agent::supervisor::Supervisor::new(&config));
        let services = CancellationToken::new();
        let state = AppState::build(
            config,
            supervisor,
            services.child_token(),
            services.child_token(),
            None,
            tokio_util::task::TaskTracker::new(),
        )
        .await
        .expect("the services");
        let router = sandbox_agent::http::router(state.clone());
        App {
            router,
            state,
            services,
            dirs,
        }
    }

    /// The work dir (the fs API's default root and the agents' default cwd).
    pub fn work_dir(&self) -> PathBuf {
        self.dirs.path().join("work")
    }

    pub fn path(&self, rel: &str) -> PathBuf {
        self.work_dir().join(rel)
    }

    /// The daemon's data dir (`--data-dir`), as `Daemon::data_dir` answers it.
    pub fn data_dir(&self) -> PathBuf {
        self.dirs.path().join("data")
    }

    /// Sends one request through the router (the same middleware, routes and fallbacks as the
    /// binary's listener serves) and reads the whole answer.
    pub async fn send(&self, req: Request<Body>) -> Answer {
        let resp = self
            .router
            .clone()
            .oneshot(req)
            .await
            .expect("the router is infallible");
        let (parts, body) = resp.into_parts();
        let body = axum::body::to_bytes(body, usize::MAX)
            .await
            .expect("the body");
        Answer {
            status: parts.status,
            headers: parts.headers,
            body,
        }
    }

    pub async fn request(
        &self,
        method: Method,
        uri: &str,
        body: Option<serde_json::Value>,
    ) -> Answer {
        let mut req = Request::builder()
            .method(method)
            .uri(uri)
            .header(header::HOST, "127.0.0.1");
        let body = match body {
            Some(v) => {
                req = req.header(header::CONTENT_TYPE, "application/json");
                Body::from(v.to_string())
            }
            None => Body::empty(),
        };
        self.send(req.body(body).unwrap()).await
    }

    pub async fn get(&self, uri: &str) -> Answer {
        self.request(Method::GET, uri, None).await
    }

    pub async fn post(&self, uri: &str, body: serde_json::Value) -> Answer {
        self.request(Method::POST, uri, Some(body)).await
    }

    pub async fn delete(&self, uri: &str) -> Answer {
        self.request(Method::DELETE, uri, None).await
    }

    /// `PUT` of raw bytes (`application/octet-stream`).
    pub async fn put_bytes(&self, uri: &str, bytes: impl Into<Bytes>) -> Answer {
        let req = Request::builder()
            .method(Method::PUT)
            .uri(uri)
            .header(header::HOST, "127.0.0.1")
            .header(header::CONTENT_TYPE, "application/octet-stream")
            .body(Body::from(bytes.into()))
            .unwrap();
        self.send(req).await
    }
}

impl Drop for App {
    fn drop(&mut self) {
        // Every agent and process a test started is killed with its process group: no test
        // leaves a child behind, whether it passed or panicked.
        self.state.supervisor.emergency_kill_all();
        self.services.cancel();
    }
}
