//! The desktop: one supervised X display per daemon (Xvfb and the openbox window manager, each a
//! child of the supervisor in its own process group and cgroup, stderr logged apart), and the
//! operations on it (`x.rs`: screenshots, input, windows, clipboard, apps; `recording.rs`:
//! ffmpeg recordings). The HTTP face is `http/desktop.rs`; docs/desktop.md describes both.
//!
//! States: `inactive` → `starting` → `active` → `stopping` → `inactive`, or `failed` when the
//! display server could not start or died (reported at once: a task waits on its exit). While
//! the desktop is active the supervisor gives every child it starts `DISPLAY`.

pub mod install;
pub mod recording;
pub mod x;

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use crate::config::Config;
use crate::supervisor::{ChildHandle, SpawnSpec, Supervisor};

/// Largest accepted screen side, in pixels.
pub const MAX_SIDE: u32 = 8192;
/// How long Xvfb gets to open its socket.
const START_TIMEOUT: Duration = Duration::from_secs(10);
/// Grace for each child at stop (TERM, then KILL).
const STOP_GRACE: Duration = Duration::from_secs(2);

#[derive(Debug, thiserror::Error)]
pub enum DesktopError {
    #[error("the desktop is not running (POST /v1/desktop/start first)")]
    NotRunning,
    #[error("{0}")]
    Conflict(String),
    #[error("{field}: {message}")]
    Invalid {
        field: &'static str,
        message: String,
    },
    #[error("{tool} is not installed (Debian package {package}; `sandbox-agent install desktop`)")]
    MissingTool {
        tool: &'static str,
        package: &'static str,
    },
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    Failed(String),
    #[error("{0}")]
    Unavailable(String),
}

impl DesktopError {
    pub fn invalid(field: &'static str, message: impl Into<String>) -> Self {
        DesktopError::Invalid {
            field,
            message: message.into(),
        }
    }
}

/// The programs the desktop uses, with the Debian package of each.
pub const TOOLS: &[(&str, &str)] = &[
    ("Xvfb", "xvfb"),
    ("openbox", "openbox"),
    ("xdotool", "xdotool"),
    ("xclip", "xclip"),
    ("ffmpeg", "ffmpeg"),
];

/// What `sandbox-agent install desktop` installs.
pub const PACKAGES: &[&str] = &["xvfb", "openbox", "xdotool", "xclip", "ffmpeg", "x11-utils"];

/// Finds `name` in the daemon's `PATH` (as the children see it).
pub fn which(env: &[(OsString, OsString)], name: &str) -> Option<PathBuf> {
    let path = env
        .iter()
        .rev()
        .find(|(k, _)| k == "PATH")
        .map(|(_, v)| v.clone())
        .unwrap_or_else(|| OsString::from("/usr/local/bin:/usr/bin:/bin"));
    std::env::split_paths(&path)
        .map(|d| d.join(name))
        .find(|p| is_executable(p))
}

fn is_executable(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(p)
        .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        .unwrap_or(false)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum State {
    Inactive,
    Starting,
    Active,
    Stopping,
    Failed,
}

impl State {
    pub fn as_str(self) -> &'static str {
        match self {
            State::Inactive => "inactive",
            State::Starting => "starting",
            State::Active => "active",
            State::Stopping => "stopping",
            State::Failed => "failed",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Screen {
    pub width: u32,
    pub height: u32,
    pub dpi: u32,
}

#[derive(Debug, Clone)]
pub struct StartRequest {
    pub display_num: Option<u32>,
    pub width: Option<u32>,
    pub height: Option<u32>,
    pub dpi: Option<u32>,
}

#[derive(Debug, Clone)]
pub struct ProcessInfo {
    pub name: String,
    pub pid: Option<u32>,
    pub running: bool,
}

#[derive(Debug, Clone)]
pub struct Status {
    pub state: State,
    pub display: Option<String>,
    pub screen: Option<Screen>,
    pub started_at: Option<SystemTime>,
    pub last_error: Option<(String, String)>,
    pub missing: Vec<&'static str>,
    pub processes: Vec<ProcessInfo>,
}

/// The running display: what the operations need.
#[derive(Clone)]
pub struct Display {
    pub num: u32,
    pub screen: Screen,
    /// The children's environment with `DISPLAY` set.
    pub env: Arc<Vec<(OsString, OsString)>>,
}

impl Display {
    pub fn name(&self) -> String {
        format!(":{}", self.num)
    }
}

struct Running {
    display: Display,
    xvfb: ChildHandle,
    wm: Option<ChildHandle>,
    started_at: SystemTime,
}

struct Inner {
    state: State,
    running: Option<Running>,
    last_error: Option<(String, String)>,
    /// Bumped by every start and stop: a watcher of an older start changes nothing.
    generation: u64,
    /// Children started on the display (apps, clipboard owners), stopped with it.
    extras: Vec<(String, ChildHandle)>,
}

pub struct DesktopService {
    supervisor: Arc<Supervisor>,
    cwd: PathBuf,
    inner: Mutex<Inner>,
    next: std::sync::atomic::AtomicU64,
    pub recordings: recording::Recordings,
}

impl DesktopService {
    pub fn new(config: &Config, supervisor: Arc<Supervisor>) -> Self {
        DesktopService {
            supervisor,
            cwd: config.work_dir.clone(),
            inner: Mutex::new(Inner {
                state: State::Inactive,
                running: None,
                last_error: None,
                generation: 0,
                extras: Vec::new(),
            }),
            next: std::sync::atomic::AtomicU64::new(1),
            recordings: recording::Recordings::new(config.data_dir.join("desktop-recordings")),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        crate::sys::lock(&self.inner)
    }

    fn env(&self) -> Vec<(OsString, OsString)> {
        self.supervisor.child_base_env()
    }

    /// The tools missing from `PATH`.
    pub fn missing_tools(&self) -> Vec<&'static str> {
        let env = self.env();
        TOOLS
            .iter()
            .filter(|(t, _)| which(&env, t).is_none())
            .map(|(_, p)| *p)
            .collect()
    }

    /// `tool`'s path, or the problem naming its package.
    pub fn tool(&self, tool: &'static str) -> Result<PathBuf, DesktopError> {
        let package = TOOLS
            .iter()
            .find(|(t, _)| *t == tool)
            .map(|(_, p)| *p)
            .unwrap_or("x11-utils");
        which(&self.env(), tool).ok_or(DesktopError::MissingTool { tool, package })
    }

    pub fn status(&self) -> Status {
        let inner = self.lock();
        let mut processes = Vec::new();
        if let Some(r) = &inner.running {
            processes.push(proc_info("Xvfb", &r.xvfb));
            if let Some(wm) = &r.wm {
                processes.push(proc_info("openbox", wm));
            }
        }
        Status {
            state: inner.state,
            display: inner.running.as_ref().map(|r| r.display.name()),
            screen: inner.running.as_ref().map(|r| r.display.screen),
            started_at: inner.running.as_ref().map(|r| r.started_at),
            last_error: inner.last_error.clone(),
            missing: if inner.state == State::Active {
                Vec::new()
            } else {
                drop(inner);
                self.missing_tools()
            },
            processes,
        }
    }

    /// The running display, or 409.
    pub fn display(&self) -> Result<Display, DesktopError> {
        let inner = self.lock();
        match (&inner.state, &inner.running) {
            (State::Active, Some(r)) => Ok(r.display.clone()),
            _ => Err(DesktopError::NotRunning),
        }
    }

    /// Starts the display. A start while one runs answers its status when the request agrees
    /// with it (or names nothing), else 409; a start while starting or stopping is 409.
    pub async fn start(self: &Arc<Self>, req: StartRequest) -> Result<Status, DesktopError> {
        let screen = validate(&req)?;
        let num = req.display_num.unwrap_or(99);
        {
            let mut inner = self.lock();
            match inner.state {
                State::Starting | State::Stopping => {
                    return Err(DesktopError::Conflict(format!(
                        "the desktop is {}",
                        inner.state.as_str()
                    )));
                }
                State::Active => {
                    let r = inner
                        .running
                        .as_ref()
                        .map(|r| (r.display.num, r.display.screen));
                    let same = r.is_some_and(|(n, s)| {
                        req.display_num.is_none_or(|d| d == n)
                            && req.width.is_none_or(|w| w == s.width)
                            && req.height.is_none_or(|h| h == s.height)
                            && req.dpi.is_none_or(|d| d == s.dpi)
                    });
                    drop(inner);
                    return if same {
                        Ok(self.status())
                    } else {
                        Err(DesktopError::Conflict(
                            "a desktop with other settings is running; stop it first".into(),
                        ))
                    };
                }
                State::Inactive | State::Failed => {
                    // A failed start's leftovers are ended before anything new is made.
                    if inner.running.is_some() {
                        return Err(DesktopError::Conflict(
                            "the previous desktop is still being cleaned up; stop it first".into(),
                        ));
                    }
                }
            }
            inner.state = State::Starting;
            inner.generation += 1;
        }
        match self.bring_up(num, screen).await {
            Ok(()) => Ok(self.status()),
            Err(e) => {
                let mut inner = self.lock();
                inner.state = State::Failed;
                inner.last_error = Some(("start_failed".into(), e.to_string()));
                Err(e)
            }
        }
    }

    async fn bring_up(self: &Arc<Self>, num: u32, screen: Screen) -> Result<(), DesktopError> {
        let xvfb = self.tool("Xvfb")?;
        let openbox = self.tool("openbox")?;
        self.tool("xdotool")?;
        let socket = PathBuf::from(format!("/tmp/.X11-unix/X{num}"));
        let lock = PathBuf::from(format!("/tmp/.X{num}-lock"));
        clear_stale(&lock, &socket);
        if socket.exists() || lock.exists() {
            return Err(DesktopError::Conflict(format!(
                "display :{num} is in use by another X server ({} exists)",
                if lock.exists() { &lock } else { &socket }.display()
            )));
        }
        let dname = format!(":{num}");
        let args = [
            dname.as_str(),
            "-screen",
            "0",
            &format!("{}x{}x24", screen.width, screen.height),
            "-dpi",
            &screen.dpi.to_string(),
            "-nolisten",
            "tcp",
            "-noreset",
        ]
        .iter()
        .map(OsString::from)
        .collect();
        let xh = self
            .spawn(xvfb, args, &dname, format!("desktop{dname}"), "Xvfb")
            .await?;
        // Wait for its socket, or its death.
        let deadline = tokio::time::Instant::now() + START_TIMEOUT;
        loop {
            if let Some(exit) = xh.exit() {
                let tail = xh.stderr_excerpt(2000);
                return Err(DesktopError::Unavailable(format!(
                    "Xvfb ended at start ({:?}): {tail}",
                    exit.reason
                )));
            }
            if socket.exists() {
                break;
            }
            if tokio::time::Instant::now() > deadline {
                xh.stop(STOP_GRACE).await;
                return Err(DesktopError::Unavailable(
                    "Xvfb did not open its socket within 10 s".into(),
                ));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let mut env = self.env();
        env.retain(|(k, _)| k != "DISPLAY");
        env.push(("DISPLAY".into(), dname.clone().into()));
        let wm = self
            .spawn(
                openbox,
                vec![],
                &dname,
                format!("desktop{dname}-wm"),
                "openbox",
            )
            .await
            .ok();
        let display = Display {
            num,
            screen,
            env: Arc::new(env),
        };
        let generation;
        {
            let mut inner = self.lock();
            inner.running = Some(Running {
                display,
                xvfb: xh.clone(),
                wm,
                started_at: SystemTime::now(),
            });
            inner.state = State::Active;
            inner.last_error = None;
            generation = inner.generation;
        }
        self.supervisor.set_display(Some(dname.into()));
        // Reports the display server's death at once.
        let me = Arc::downgrade(self);
        tokio::spawn(async move {
            let exit = xh.wait().await;
            let Some(me) = me.upgrade() else { return };
            let mut inner = me.lock();
            if inner.generation == generation && inner.state == State::Active {
                inner.state = State::Failed;
                inner.last_error = Some((
                    "display_server_exited".into(),
                    format!(
                        "Xvfb ended ({}, code {:?}, signal {:?}); POST /v1/desktop/start to start again",
                        exit.reason.as_str(),
                        exit.code,
                        exit.signal
                    ),
                ));
                drop(inner);
                me.supervisor.set_display(None);
                let me2 = me.clone();
                tokio::spawn(async move { me2.teardown().await });
            }
        });
        Ok(())
    }

    /// Ends every process of the desktop (recording, apps, window manager, display server).
    async fn teardown(&self) {
        let (running, extras) = {
            let mut inner = self.lock();
            (inner.running.take(), std::mem::take(&mut inner.extras))
        };
        self.recordings.stop_active().await;
        for (_, h) in extras {
            h.stop(STOP_GRACE).await;
        }
        if let Some(r) = running {
            if let Some(wm) = r.wm {
                wm.stop(STOP_GRACE).await;
            }
            r.xvfb.stop(STOP_GRACE).await;
        }
    }

    /// Stops the desktop; stopping an inactive one answers its status.
    pub async fn stop(&self) -> Result<Status, DesktopError> {
        {
            let mut inner = self.lock();
            match inner.state {
                State::Starting | State::Stopping => {
                    return Err(DesktopError::Conflict(format!(
                        "the desktop is {}",
                        inner.state.as_str()
                    )));
                }
                _ => {}
            }
            inner.state = State::Stopping;
            inner.generation += 1;
        }
        self.supervisor.set_display(None);
        self.teardown().await;
        {
            let mut inner = self.lock();
            inner.state = State::Inactive;
        }
        Ok(self.status())
    }

    /// At daemon shutdown: the recording is finished and every desktop process stopped.
    pub async fn shutdown(&self) {
        self.supervisor.set_display(None);
        self.teardown().await;
        self.lock().state = State::Inactive;
    }

    /// Keeps a child started on the display, stopped with it (at most 64; the oldest ended
    /// ones are dropped first).
    pub fn adopt(&self, name: String, handle: ChildHandle) -> Result<(), DesktopError> {
        let mut inner = self.lock();
        inner.extras.retain(|(_, h)| h.exit().is_none());
        if inner.extras.len() >= 64 {
            return Err(DesktopError::Conflict(
                "64 programs already run on the desktop".into(),
            ));
        }
        inner.extras.push((name, handle));
        Ok(())
    }

    /// Stops and forgets the extra child named `name`, if any.
    pub async fn drop_extra(&self, name: &str) {
        let found = {
            let mut inner = self.lock();
            let (keep, gone): (Vec<_>, Vec<_>) = std::mem::take(&mut inner.extras)
                .into_iter()
                .partition(|(n, _)| n != name);
            inner.extras = keep;
            gone
        };
        for (_, h) in found {
            h.stop(Duration::from_millis(200)).await;
        }
    }

    /// A fresh id with `prefix` (unique within this daemon's run).
    pub fn next_id(&self, prefix: &str) -> String {
        let n = self.next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        format!("{prefix}-{n}")
    }

    /// Starts a child of the desktop with `DISPLAY`; its stdout is read and thrown away (a
    /// dropped pipe would kill it with SIGPIPE at its first line), its stderr logged.
    pub async fn spawn(
        &self,
        program: PathBuf,
        args: Vec<OsString>,
        display: &str,
        name: String,
        what: &str,
    ) -> Result<ChildHandle, DesktopError> {
        let p = self
            .supervisor
            .start(SpawnSpec {
                program,
                args,
                env: vec![("DISPLAY".into(), display.into())],
                cwd: self.cwd.clone(),
                name,
                agent: format!("desktop:{what}"),
            })
            .await
            .map_err(|e| DesktopError::Unavailable(e.to_string()))?;
        discard(p.stdout);
        drop(p.stdin);
        Ok(p.handle)
    }

    pub fn supervisor(&self) -> &Arc<Supervisor> {
        &self.supervisor
    }

    pub fn cwd(&self) -> &Path {
        &self.cwd
    }
}

fn proc_info(name: &str, h: &ChildHandle) -> ProcessInfo {
    ProcessInfo {
        name: name.into(),
        pid: Some(h.pid()),
        running: h.exit().is_none(),
    }
}

fn validate(req: &StartRequest) -> Result<Screen, DesktopError> {
    let side = |field: &'static str, v: Option<u32>, d: u32| match v.unwrap_or(d) {
        v @ 16..=MAX_SIDE => Ok(v),
        v => Err(DesktopError::invalid(
            field,
            format!("{v} is outside 16..={MAX_SIDE}"),
        )),
    };
    let width = side("width", req.width, 1440)?;
    let height = side("height", req.height, 900)?;
    let dpi = match req.dpi.unwrap_or(96) {
        v @ 10..=1000 => v,
        v => {
            return Err(DesktopError::invalid(
                "dpi",
                format!("{v} is outside 10..=1000"),
            ));
        }
    };
    if let Some(n) = req.display_num
        && n > 32767
    {
        return Err(DesktopError::invalid(
            "displayNum",
            format!("{n} is outside 0..=32767"),
        ));
    }
    Ok(Screen { width, height, dpi })
}

/// Reads a child's pipe to its end and drops what comes (the task ends with the child).
pub fn discard(pipe: impl tokio::io::AsyncRead + Send + Unpin + 'static) {
    tokio::spawn(async move {
        let mut pipe = pipe;
        let _ = tokio::io::copy(&mut pipe, &mut tokio::io::sink()).await;
    });
}

/// Removes a display's lock file and socket when the server that wrote the lock is gone (killed
/// with SIGKILL, it cannot clean up): what X servers themselves do with a stale lock.
fn clear_stale(lock: &Path, socket: &Path) {
    let Ok(text) = std::fs::read_to_string(lock) else {
        return;
    };
    let Ok(pid) = text.trim().parse::<u32>() else {
        return;
    };
    if pid > 0 && !Path::new(&format!("/proc/{pid}")).exists() {
        tracing::info!(lock = %lock.display(), pid, "removing a dead X server's lock");
        let _ = std::fs::remove_file(lock);
        let _ = std::fs::remove_file(socket);
    }
}
