//! The browser: one supervised Chromium per daemon, headless or on the running desktop's
//! display, with its DevTools endpoint on loopback (`--remote-debugging-port=0`; the port is read
//! from the `DevToolsActivePort` file Chromium writes into its profile). The profile directory is
//! private to the daemon (mode 0700 under the data directory) and removed at stop. Chromium is a
//! child of the supervisor like an agent: its own process group and cgroup, stderr logged apart,
//! and its death reported by `status` at once (a task waits on its exit). The operations on it
//! (tabs, navigation, screenshots, content, accessibility) are in `cdp.rs`; the HTTP face is
//! `http/browser.rs` and `http/browser_cdp.rs` (the DevTools WebSocket proxy). docs/browser.md.
//!
//! States: `inactive` → `starting` → `active` → `stopping` → `inactive`, or `failed` when
//! Chromium could not start. When Chromium dies on its own, the daemon restarts it with the same
//! settings (a fresh profile: tabs are not restored): `active` → `restarting` (its processes
//! ended, a back-off wait of `RESTART_BASE` doubled per quick crash, at most `RESTART_MAX`) →
//! `starting` → `active`. A crash within `STABLE_RUN` of the last (re)start is quick; after
//! `MAX_QUICK_CRASHES` quick crashes in a row it stays `failed` (`restart_exhausted`) until a
//! client starts it again. `restarts` counts the restarts since the last client `start`.

pub mod cdp;
pub mod page;

use std::ffi::OsString;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use crate::config::Config;
use crate::supervisor::{ChildHandle, SpawnSpec, Supervisor};

/// How long Chromium gets to open its DevTools port.
const START_TIMEOUT: Duration = Duration::from_secs(20);
/// Grace at stop (TERM, then KILL of the whole group and cgroup).
const STOP_GRACE: Duration = Duration::from_secs(3);
/// Largest viewport side accepted at start.
pub const MAX_SIDE: u32 = 4096;
/// The wait before the first restart after a crash; doubled for each quick crash in a row.
pub const RESTART_BASE: Duration = Duration::from_millis(250);
/// The longest wait before a restart.
pub const RESTART_MAX: Duration = Duration::from_secs(8);
/// A run at least this long makes the next crash count as the first of a series again.
pub const STABLE_RUN: Duration = Duration::from_secs(30);
/// Quick crashes in a row after which the browser stays down.
pub const MAX_QUICK_CRASHES: u32 = 5;

/// The back-off before the restart that follows the `quick`-th quick crash in a row (1-based).
pub fn restart_delay(quick: u32) -> Duration {
    let doubled = RESTART_BASE.saturating_mul(1u32 << quick.saturating_sub(1).min(16));
    doubled.min(RESTART_MAX)
}

#[derive(Debug, thiserror::Error)]
pub enum BrowserError {
    #[error("the browser is not running (POST /v1/browser/start first)")]
    NotRunning,
    #[error("{0}")]
    Conflict(String),
    #[error("{field}: {message}")]
    Invalid {
        field: &'static str,
        message: String,
    },
    #[error("chromium is not installed (Debian package chromium; `sandbox-agent install browser`)")]
    MissingChromium,
    #[error("{0}")]
    NotFound(String),
    /// Chromium answered with an error, or not as expected.
    #[error("{0}")]
    Failed(String),
    #[error("{0}")]
    Unavailable(String),
    #[error("{0}")]
    Timeout(String),
}

impl BrowserError {
    pub fn invalid(field: &'static str, message: impl Into<String>) -> Self {
        BrowserError::Invalid {
            field,
            message: message.into(),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    Inactive,
    Starting,
    Active,
    /// Chromium died; waiting out the back-off before starting it again.
    Restarting,
    Stopping,
    Failed,
}

impl State {
    pub fn as_str(self) -> &'static str {
        match self {
            State::Inactive => "inactive",
            State::Starting => "starting",
            State::Active => "active",
            State::Restarting => "restarting",
            State::Stopping => "stopping",
            State::Failed => "failed",
        }
    }
}

#[derive(Debug, Clone, Default)]
pub struct StartRequest {
    /// On the desktop's display instead of headless.
    pub headful: bool,
    pub width: Option<u32>,
    pub height: Option<u32>,
}

#[derive(Debug, Clone)]
pub struct Status {
    pub state: State,
    pub headless: Option<bool>,
    pub display: Option<String>,
    pub pid: Option<u32>,
    pub version: Option<String>,
    pub started_at: Option<SystemTime>,
    pub last_error: Option<(String, String)>,
    /// `chromium` when it is not installed.
    pub missing: Option<&'static str>,
    /// Restarts after a crash since the last client `start`.
    pub restarts: u32,
    /// When the pending restart happens (state `restarting`).
    pub next_restart_at: Option<SystemTime>,
}

/// The running browser: what the operations need.
#[derive(Clone)]
pub struct Endpoint {
    /// The DevTools HTTP/WebSocket port on 127.0.0.1.
    pub port: u16,
    /// The browser target's WebSocket path (`/devtools/browser/<id>`).
    pub browser_path: String,
}

struct Running {
    endpoint: Endpoint,
    child: ChildHandle,
    headless: bool,
    display: Option<String>,
    version: Option<String>,
    started_at: SystemTime,
}

/// What a restart brings up again: the settings of the last client `start`.
#[derive(Clone)]
struct Settings {
    display: Option<String>,
    width: u32,
    height: u32,
}

struct Inner {
    state: State,
    running: Option<Running>,
    last_error: Option<(String, String)>,
    generation: u64,
    settings: Option<Settings>,
    restarts: u32,
    /// Quick crashes in a row.
    quick_crashes: u32,
    next_restart_at: Option<SystemTime>,
}

pub struct BrowserService {
    supervisor: Arc<Supervisor>,
    cwd: PathBuf,
    profile_root: PathBuf,
    inner: Mutex<Inner>,
    http: reqwest::Client,
    /// CDP proxy connections open now (`http/browser_cdp.rs`).
    pub proxies: Arc<std::sync::atomic::AtomicUsize>,
}

impl BrowserService {
    pub fn new(config: &Config, supervisor: Arc<Supervisor>) -> Self {
        crate::install_crypto_provider();
        let http = crate::http_client::plain_http(reqwest::Client::builder())
            .timeout(Duration::from_secs(10))
            .no_proxy()
            .build()
            .unwrap_or_default();
        BrowserService {
            supervisor,
            cwd: config.work_dir.clone(),
            profile_root: config.data_dir.join("browser"),
            inner: Mutex::new(Inner {
                state: State::Inactive,
                running: None,
                last_error: None,
                generation: 0,
                settings: None,
                restarts: 0,
                quick_crashes: 0,
                next_restart_at: None,
            }),
            http,
            proxies: Arc::new(std::sync::atomic::AtomicUsize::new(0)),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        crate::sys::lock(&self.inner)
    }

    pub(crate) fn http(&self) -> &reqwest::Client {
        &self.http
    }

    fn chromium(&self) -> Option<PathBuf> {
        let env = self.supervisor.child_base_env();
        ["chromium", "chromium-browser", "google-chrome"]
            .iter()
            .find_map(|n| crate::desktop::which(&env, n))
    }

    pub fn status(&self) -> Status {
        let inner = self.lock();
        let r = inner.running.as_ref();
        let active = inner.state == State::Active;
        let st = Status {
            state: inner.state,
            headless: r.map(|r| r.headless),
            display: r.and_then(|r| r.display.clone()),
            pid: r.map(|r| r.child.pid()),
            version: r.and_then(|r| r.version.clone()),
            started_at: r.map(|r| r.started_at),
            last_error: inner.last_error.clone(),
            missing: None,
            restarts: inner.restarts,
            next_restart_at: inner.next_restart_at,
        };
        drop(inner);
        Status {
            missing: (!active && self.chromium().is_none()).then_some("chromium"),
            ..st
        }
    }

    /// The running browser's endpoint, or 409.
    pub fn endpoint(&self) -> Result<Endpoint, BrowserError> {
        let inner = self.lock();
        match (&inner.state, &inner.running) {
            (State::Active, Some(r)) => Ok(r.endpoint.clone()),
            _ => Err(BrowserError::NotRunning),
        }
    }

    /// Starts Chromium. A start while one runs answers its status when the request agrees with
    /// it, else 409; a start while starting or stopping is 409.
    pub async fn start(
        self: &Arc<Self>,
        req: StartRequest,
        desktop: Option<String>,
    ) -> Result<Status, BrowserError> {
        let side = |field: &'static str, v: Option<u32>, d: u32| match v.unwrap_or(d) {
            v @ 64..=MAX_SIDE => Ok(v),
            v => Err(BrowserError::invalid(
                field,
                format!("{v} is outside 64..={MAX_SIDE}"),
            )),
        };
        let width = side("width", req.width, 1280)?;
        let height = side("height", req.height, 720)?;
        if req.headful && desktop.is_none() {
            return Err(BrowserError::Conflict(
                "headless: false needs a running desktop (POST /v1/desktop/start first)".into(),
            ));
        }
        {
            let mut inner = self.lock();
            match inner.state {
                State::Starting | State::Stopping | State::Restarting => {
                    return Err(BrowserError::Conflict(format!(
                        "the browser is {}",
                        inner.state.as_str()
                    )));
                }
                State::Active => {
                    let same = inner
                        .running
                        .as_ref()
                        .is_some_and(|r| r.headless != req.headful);
                    drop(inner);
                    return if same {
                        Ok(self.status())
                    } else {
                        Err(BrowserError::Conflict(
                            "a browser with other settings is running; stop it first".into(),
                        ))
                    };
                }
                State::Inactive | State::Failed => {
                    if inner.running.is_some() {
                        return Err(BrowserError::Conflict(
                            "the previous browser is still being cleaned up; stop it first".into(),
                        ));
                    }
                }
            }
            inner.state = State::Starting;
            inner.generation += 1;
            inner.last_error = None;
            inner.restarts = 0;
            inner.quick_crashes = 0;
            inner.next_restart_at = None;
        }
        let display = if req.headful { desktop } else { None };
        self.lock().settings = Some(Settings {
            display: display.clone(),
            width,
            height,
        });
        match self.bring_up(display, width, height).await {
            Ok(()) => Ok(self.status()),
            Err(e) => {
                let mut inner = self.lock();
                inner.state = State::Failed;
                inner.last_error = Some(("start_failed".into(), e.to_string()));
                Err(e)
            }
        }
    }

    async fn bring_up(
        self: &Arc<Self>,
        display: Option<String>,
        width: u32,
        height: u32,
    ) -> Result<(), BrowserError> {
        let program = self.chromium().ok_or(BrowserError::MissingChromium)?;
        let started_in = self.lock().generation;
        let profile = self.profile_root.join("profile");
        let p2 = profile.clone();
        let root = self.profile_root.clone();
        crate::sys::blocking(move || -> std::io::Result<()> {
            use std::os::unix::fs::DirBuilderExt;
            let _ = std::fs::remove_dir_all(&p2);
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(&root)?;
            std::fs::DirBuilder::new().mode(0o700).create(&p2)
        })
        .await
        .map_err(|e| {
            BrowserError::Unavailable(format!("cannot make the browser's profile directory: {e}"))
        })?;
        let mut args: Vec<OsString> = vec![
            "--remote-debugging-port=0".into(),
            "--remote-debugging-address=127.0.0.1".into(),
            "--remote-allow-origins=*".into(),
            format!("--user-data-dir={}", profile.display()).into(),
            "--no-first-run".into(),
            "--no-default-browser-check".into(),
            "--no-sandbox".into(),
            "--disable-gpu".into(),
            "--disable-dev-shm-usage".into(),
            "--disable-background-networking".into(),
            "--disable-component-update".into(),
            "--disable-sync".into(),
            "--password-store=basic".into(),
            "--use-mock-keychain".into(),
            format!("--window-size={width},{height}").into(),
        ];
        if display.is_none() {
            args.push("--headless".into());
        }
        args.push("about:blank".into());
        let mut env = Vec::new();
        if let Some(d) = &display {
            env.push(("DISPLAY".into(), d.into()));
        }
        let p = self
            .supervisor
            .start(SpawnSpec {
                program,
                args,
                env,
                cwd: self.cwd.clone(),
                name: "browser".into(),
                agent: "browser:chromium".into(),
            })
            .await
            .map_err(|e| BrowserError::Unavailable(e.to_string()))?;
        crate::desktop::discard(p.stdout);
        drop(p.stdin);
        let child = p.handle;
        let port_file = profile.join("DevToolsActivePort");
        let deadline = tokio::time::Instant::now() + START_TIMEOUT;
        let endpoint = loop {
            if let Some(exit) = child.exit() {
                return Err(BrowserError::Unavailable(format!(
                    "chromium ended at start ({}): {}",
                    exit.reason.as_str(),
                    child.stderr_excerpt(2000)
                )));
            }
            if let Ok(text) = tokio::fs::read_to_string(&port_file).await {
                let mut lines = text.lines();
                if let (Some(port), Some(path)) = (lines.next(), lines.next())
                    && let Ok(port) = port.trim().parse::<u16>()
                    && path.starts_with("/devtools/browser/")
                {
                    break Endpoint {
                        port,
                        browser_path: path.trim().to_string(),
                    };
                }
            }
            if tokio::time::Instant::now() > deadline {
                child.stop(STOP_GRACE).await;
                return Err(BrowserError::Unavailable(
                    "chromium did not open its DevTools port within 20 s".into(),
                ));
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        };
        let version = cdp::version(&self.http, &endpoint)
            .await
            .ok()
            .and_then(|v| v.get("Browser").and_then(|b| b.as_str()).map(String::from));
        let generation = {
            let mut inner = self.lock();
            if inner.generation != started_in {
                None
            } else {
                inner.running = Some(Running {
                    endpoint,
                    child: child.clone(),
                    headless: display.is_none(),
                    display,
                    version,
                    started_at: SystemTime::now(),
                });
                inner.state = State::Active;
                inner.next_restart_at = None;
                Some(inner.generation)
            }
        };
        let Some(generation) = generation else {
            // The daemon shut down while Chromium came up: it must not outlive that.
            child.stop(STOP_GRACE).await;
            return Err(BrowserError::Unavailable(
                "the browser was stopped while it started".into(),
            ));
        };
        // Reports Chromium's death at once, clears what it left, and restarts it.
        let me = Arc::downgrade(self);
        tokio::spawn(async move {
            let exit = child.wait().await;
            let Some(me) = me.upgrade() else { return };
            me.crashed(generation, exit).await;
        });
        Ok(())
    }

    /// Chromium of `generation` ended without being asked to: end what it left, then restart it
    /// after the back-off, or stay `failed` after too many quick crashes.
    /// (Boxed: it starts Chromium again, whose watcher calls this again.)
    fn crashed(
        self: Arc<Self>,
        generation: u64,
        exit: crate::supervisor::ExitInfo,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>> {
        Box::pin(async move { self.crashed_inner(generation, exit).await })
    }

    async fn crashed_inner(self: Arc<Self>, generation: u64, exit: crate::supervisor::ExitInfo) {
        let how = match (exit.code, exit.signal) {
            (_, Some(sig)) => format!("chromium ended ({}, signal {sig})", exit.reason.as_str()),
            (Some(code), None) => format!(
                "chromium ended ({}, exit code {code})",
                exit.reason.as_str()
            ),
            (None, None) => format!("chromium ended ({})", exit.reason.as_str()),
        };
        let delay = {
            let mut inner = self.lock();
            if inner.generation != generation || inner.state != State::Active {
                return;
            }
            let ran = inner
                .running
                .as_ref()
                .and_then(|r| r.started_at.elapsed().ok())
                .unwrap_or_default();
            inner.quick_crashes = if ran < STABLE_RUN {
                inner.quick_crashes + 1
            } else {
                1
            };
            if inner.quick_crashes >= MAX_QUICK_CRASHES || inner.settings.is_none() {
                inner.state = State::Failed;
                inner.last_error = Some((
                    "restart_exhausted".into(),
                    format!(
                        "{how}; it crashed {} times in a row within {} s of starting, so it stays down; POST /v1/browser/start to start it again",
                        inner.quick_crashes,
                        STABLE_RUN.as_secs()
                    ),
                ));
                None
            } else {
                let delay = restart_delay(inner.quick_crashes);
                inner.state = State::Restarting;
                inner.next_restart_at = Some(SystemTime::now() + delay);
                inner.last_error = Some((
                    "browser_exited".into(),
                    format!("{how}; restarted after {} ms", delay.as_millis()),
                ));
                Some(delay)
            }
        };
        self.teardown().await;
        let Some(delay) = delay else { return };
        let me = Arc::downgrade(&self);
        drop(self);
        tokio::time::sleep(delay).await;
        let Some(me) = me.upgrade() else { return };
        let settings = {
            let mut inner = me.lock();
            if inner.generation != generation || inner.state != State::Restarting {
                return; // stopped, or the daemon is shutting down
            }
            inner.state = State::Starting;
            inner.next_restart_at = None;
            inner.restarts += 1;
            inner.settings.clone()
        };
        let Some(s) = settings else { return };
        if let Err(e) = me.bring_up(s.display, s.width, s.height).await {
            let mut inner = me.lock();
            if inner.generation == generation {
                inner.state = State::Failed;
                inner.last_error = Some(("restart_failed".into(), e.to_string()));
            }
        }
    }

    /// Ends Chromium (its whole process group and cgroup) and removes its profile.
    async fn teardown(&self) {
        let running = self.lock().running.take();
        if let Some(r) = running {
            r.child.stop(STOP_GRACE).await;
        }
        let profile = self.profile_root.join("profile");
        crate::sys::blocking(move || {
            let _ = std::fs::remove_dir_all(&profile);
        })
        .await;
    }

    /// Stops the browser; stopping an inactive one answers its status.
    pub async fn stop(&self) -> Result<Status, BrowserError> {
        {
            let mut inner = self.lock();
            if matches!(inner.state, State::Starting | State::Stopping) {
                return Err(BrowserError::Conflict(format!(
                    "the browser is {}",
                    inner.state.as_str()
                )));
            }
            inner.state = State::Stopping;
            inner.generation += 1;
            inner.next_restart_at = None;
        }
        self.teardown().await;
        self.lock().state = State::Inactive;
        Ok(self.status())
    }

    /// At daemon shutdown.
    pub async fn shutdown(&self) {
        self.lock().generation += 1;
        self.teardown().await;
        self.lock().state = State::Inactive;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn restart_back_off_doubles_and_is_bounded() {
        assert_eq!(restart_delay(1), RESTART_BASE);
        assert_eq!(restart_delay(2), RESTART_BASE * 2);
        assert_eq!(restart_delay(4), RESTART_BASE * 8);
        assert_eq!(restart_delay(0), RESTART_BASE);
        for q in [6, 30, 64, u32::MAX] {
            assert_eq!(restart_delay(q), RESTART_MAX);
        }
        // The last restart before giving up waits less than the cap: the give-up is reached in
        // bounded time (at most the sum of the waits).
        let total: Duration = (1..MAX_QUICK_CRASHES).map(restart_delay).sum();
        assert!(total < Duration::from_secs(10), "{total:?}");
    }
}
