//! Warm spawns: children started ahead of need, each already in its own session, its own cgroup
//! (limits written and read back) and with its rlimits, waiting in a small stub (our own binary,
//! `sandbox-agent spawn-stub <fd>`) for the program it is to become. A stub waits as the
//! daemon's user, not as the agent user: a process of the agent user can neither ptrace it
//! (and rewrite its registers at its exec to run its own program in the client's place) nor
//! signal it. Told what to run, it switches to the agent user, enters the working directory as
//! that user (`sys::enter_as`, the step a direct spawn takes too) and execs.
//!
//! Why: joining a cgroup (the child's write to `cgroup.procs`) takes the kernel's
//! `cgroup_threadgroup_rwsem` for writing, and on kernels from 6.0 on (without the
//! `favordynmods` mount option) that writer first waits for an RCU grace period — 10 to 40 ms
//! on a 2-core VM, most of the start of a supervised process (docs/performance.md, "Process
//! API"). A warm stub has paid that before anyone asked; a start then costs one message and an
//! `execve`, and several stubs made at once share one grace period.
//!
//! **Invariants:** a stub is exactly what `spawn` makes before its exec (the same cgroup
//! creation and the same `agent_child_setup` closure), so the guarantees of a supervised
//! process hold unchanged; until it is told what to run it runs nothing but our binary, which
//! reads its control socket and nothing else; it exits on its own when that socket closes (the
//! daemon died), so no stub outlives the daemon (and a SIGKILLed daemon's stub cgroups are
//! leftovers like any other); the pool never holds more than its size; `close` kills and reaps
//! every stub and removes its cgroups, and the supervisor's shutdown awaits it.
//!
//! The control protocol (one Unix stream socket per stub): the stub names itself `STUB_COMM`
//! and writes one byte when it is ready; the daemon writes one launch message (`encode`); the stub
//! makes its control socket close-on-exec and execs, so end of file means the program runs — or
//! that the stub died — and four bytes (an errno, little endian) mean the exec failed (the stub
//! then exits 127). An exec is told from a death by the name: the kernel renames a process
//! at its exec, before the new program runs, and a dead stub keeps its name (`exec_happened`).

use std::collections::VecDeque;
use std::ffi::OsString;
use std::io::{self, Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{ExitCode, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio_util::task::TaskTracker;

use super::cgroup::{AgentCgroup, Applied, Cgroups};
use super::limits::{AgentUser, Limits};

/// How long the daemon waits for a stub to say it is ready, or to exec (or fail to). The launch
/// wait is on the caller's thread (a blocking-pool thread), as std's own spawn waits for its
/// child's exec; the bound keeps a stub stopped by someone (SIGSTOP) from holding that thread.
/// 10 s, not less: on a machine at a load of 10 or more per core an exec has been seen to take
/// over 2 s, and a start failed for that is worse than a thread held a little longer.
const STUB_TIMEOUT: Duration = Duration::from_secs(10);

/// Largest launch message a stub accepts (argv and environment are bounded by the kernel's
/// `ARG_MAX`-like limits well below this).
const MAX_MESSAGE: usize = 16 << 20;

/// How long after the last start the pool refills (see `Pool::take`).
const REFILL_QUIET: Duration = Duration::from_millis(10);

/// After a failure to make a stub the pool waits before it tries again, twice as long after
/// each failure in a row, from `BACKOFF_MIN` up to `BACKOFF_MAX`: a stub that cannot start at
/// all costs one attempt per `BACKOFF_MAX`, and a pool whose stubs were killed for a while (an
/// OOM kill, an operator) fills again by itself — it never stops for good.
const BACKOFF_MIN: Duration = Duration::from_millis(50);
const BACKOFF_MAX: Duration = Duration::from_secs(5);

/// Consecutive failures after which a failure is logged as a warning (earlier ones: debug).
const WARN_AFTER: u32 = 3;

/// The name (`comm`) a stub gives itself while it waits; its exec replaces it.
const STUB_COMM: &std::ffi::CStr = c"sa-spawn-stub";

/// How a launch went wrong.
#[derive(Debug)]
pub(super) enum LaunchError {
    /// The stub was gone before its exec (killed, or dead by itself): the program never ran.
    DiedBeforeExec,
    /// The exec failed (its errno), or the stub could not be told or did not answer in time.
    Failed(io::Error),
}

fn backoff(failures: u32) -> Duration {
    BACKOFF_MIN
        .saturating_mul(1u32 << failures.saturating_sub(1).min(16))
        .min(BACKOFF_MAX)
}

/// A child waiting to exec: its tokio handle (pipes included), its control socket and its cgroup.
pub(super) struct Stub {
    pub child: tokio::process::Child,
    control: UnixStream,
    pub cgroup: Option<AgentCgroup>,
    pub applied: Applied,
    /// The CPU weight its groups had before the stub was made (restored when it is taken).
    cpu_weight: Vec<(PathBuf, String)>,
}

/// What every stub is made of (the supervisor's settings).
pub(super) struct Recipe {
    pub cgroups: Arc<Cgroups>,
    pub limits: Limits,
    /// Our own binary (`/proc/self/exe` in the daemon).
    pub program: PathBuf,
}

#[derive(Default)]
struct State {
    ready: VecDeque<Stub>,
    /// Stubs being made (counted against the size so refills never overshoot).
    making: usize,
    /// Failures to make a stub in a row, and until when the pool waits before the next try.
    failures: u32,
    retry_at: Option<std::time::Instant>,
    /// A task waits for `retry_at` to refill.
    retry_pending: bool,
}

/// At most `size` warm stubs, refilled in the background after each one taken.
pub(super) struct Pool {
    recipe: Recipe,
    size: usize,
    state: Mutex<State>,
    closed: AtomicBool,
    /// Cancelled by `close`: ends a refill task waiting out a back-off.
    closing: tokio_util::sync::CancellationToken,
    tasks: TaskTracker,
    /// Starts so far; a refill waits until this has not moved for `REFILL_QUIET`.
    takes: AtomicU64,
}

impl Pool {
    pub fn new(recipe: Recipe, size: usize) -> Arc<Self> {
        Arc::new(Pool {
            recipe,
            size,
            state: Mutex::new(State::default()),
            closed: AtomicBool::new(false),
            closing: tokio_util::sync::CancellationToken::new(),
            tasks: TaskTracker::new(),
            takes: AtomicU64::new(0),
        })
    }

    /// A ready stub, if one is waiting (a stub that died meanwhile is discarded). The refill
    /// starts once no start has come for `REFILL_QUIET`: making a stub costs about 2 ms of CPU
    /// (the exec of our binary), which a burst of starts would pay on top of its own work, while
    /// within a burst the kernel keeps joins cheap by itself (a join within about a grace
    /// period of the previous one does not wait).
    pub fn take(self: &Arc<Self>) -> Option<Stub> {
        let mut got = None;
        loop {
            let next = crate::sys::lock(&self.state).ready.pop_front();
            let Some(mut stub) = next else { break };
            // Back to the normal CPU weight before it execs anything (one write per group). A
            // stub stopped by someone (an agent of the same user can SIGSTOP it) would hold the
            // launch for the whole `STUB_TIMEOUT` and fail the start: skip it.
            if matches!(stub.child.try_wait(), Ok(None))
                && !stub
                    .child
                    .id()
                    .and_then(|pid| super::stats::read_stat(pid as i32))
                    .is_some_and(|st| st.stopped)
                && AgentCgroup::restore_cpu_weight(&stub.cpu_weight)
            {
                got = Some(stub);
                break;
            }
            self.discard(stub);
        }
        let generation = self.takes.fetch_add(1, Ordering::AcqRel) + 1;
        if tokio::runtime::Handle::try_current().is_ok() && !self.closed.load(Ordering::Acquire) {
            let pool = self.clone();
            self.tasks.spawn(async move {
                tokio::time::sleep(REFILL_QUIET).await;
                if pool.takes.load(Ordering::Acquire) == generation {
                    pool.refill();
                }
            });
        }
        got
    }

    /// Starts making stubs until ready + being made reaches the size. They are made on the
    /// blocking pool: the spawn waits for the child's exec, which waits for its cgroup join.
    pub fn refill(self: &Arc<Self>) {
        if self.closed.load(Ordering::Acquire) || tokio::runtime::Handle::try_current().is_err() {
            return;
        }
        let missing = {
            let mut st = crate::sys::lock(&self.state);
            if let Some(at) = st.retry_at
                && std::time::Instant::now() < at
            {
                self.retry_later(&mut st, at);
                return;
            }
            let n = self.size.saturating_sub(st.ready.len() + st.making);
            st.making += n;
            n
        };
        for _ in 0..missing {
            let pool = self.clone();
            self.tasks.spawn(async move {
                let me = pool.clone();
                let made = tokio::task::spawn_blocking(move || make(&me.recipe))
                    .await
                    .unwrap_or_else(|e| Err(io::Error::other(e)));
                let mut st = crate::sys::lock(&pool.state);
                st.making -= 1;
                match made {
                    Ok(stub) if !pool.closed.load(Ordering::Acquire) => {
                        st.failures = 0;
                        st.retry_at = None;
                        st.ready.push_back(stub);
                    }
                    Ok(stub) => {
                        drop(st);
                        pool.discard(stub);
                    }
                    Err(e) => {
                        st.failures = st.failures.saturating_add(1);
                        let wait = backoff(st.failures);
                        let at = std::time::Instant::now() + wait;
                        st.retry_at = Some(st.retry_at.map_or(at, |t| t.max(at)));
                        if st.failures == WARN_AFTER {
                            tracing::warn!(error = %e, failures = st.failures, retry_in_ms = wait.as_millis() as u64, "warm spawn stubs fail to start; starts pay their own cgroup join until one does");
                        } else {
                            tracing::debug!(error = %e, failures = st.failures, "warm spawn stub failed to start");
                        }
                        let at = st.retry_at.expect("just set");
                        pool.retry_later(&mut st, at);
                    }
                }
            });
        }
    }

    /// Refills at `at` (once: a refill already waiting covers this one), unless closed first.
    fn retry_later(self: &Arc<Self>, st: &mut State, at: std::time::Instant) {
        if st.retry_pending || self.closed.load(Ordering::Acquire) {
            return;
        }
        st.retry_pending = true;
        let pool = self.clone();
        self.tasks.spawn(async move {
            tokio::select! {
                _ = tokio::time::sleep_until(at.into()) => {
                    crate::sys::lock(&pool.state).retry_pending = false;
                    pool.refill();
                }
                _ = pool.closing.cancelled() => {}
            }
        });
    }

    /// Kills a stub, reaps it and removes its cgroups, in a tracked task.
    fn discard(&self, stub: Stub) {
        self.tasks.spawn(async move { dispose(stub).await });
    }

    /// No more stubs: waits for those being made, then kills, reaps and removes every one.
    pub async fn close(&self) {
        self.closed.store(true, Ordering::Release);
        self.closing.cancel();
        self.tasks.close();
        self.tasks.wait().await;
        let ready: Vec<Stub> = self
            .state
            .lock()
            .expect("pool lock")
            .ready
            .drain(..)
            .collect();
        futures_util::future::join_all(ready.into_iter().map(dispose)).await;
    }

    /// Best-effort synchronous clean-up when the supervisor is dropped without `close`: kill the
    /// stubs and remove their cgroups (their zombies are reaped by tokio's orphan reaper).
    pub fn kill_now(&self) {
        self.closed.store(true, Ordering::Release);
        let ready: Vec<Stub> = match self.state.lock() {
            Ok(mut st) => st.ready.drain(..).collect(),
            Err(_) => return,
        };
        for mut stub in ready {
            let _ = stub.child.start_kill();
            if let Some(cg) = &stub.cgroup {
                cg.kill_all();
                cg.remove_dirs();
            }
        }
    }
}

async fn dispose(mut stub: Stub) {
    let _ = stub.child.start_kill();
    let _ = stub.child.wait().await;
    if let Some(cg) = stub.cgroup {
        let _ = tokio::task::spawn_blocking(move || {
            cg.kill_all();
            cg.remove_dirs();
        })
        .await;
    }
}

/// Makes one stub: its cgroup, then the child (joined to the cgroup before its exec, exactly as
/// `spawn` does), then waits for its ready byte. Blocking.
fn make(r: &Recipe) -> io::Result<Stub> {
    let (cgroup, applied) = if r.cgroups.enabled() {
        let (cg, applied) = r.cgroups.create("warm", &r.limits)?;
        (Some(cg), applied)
    } else {
        (None, Applied::default())
    };
    let fail = |cgroup: &Option<AgentCgroup>, e: io::Error| {
        if let Some(cg) = cgroup {
            cg.kill_all();
            cg.remove_dirs();
        }
        e
    };
    // The stub's start (an exec of our binary, ~2 ms of CPU) runs at the lowest CPU weight, so
    // it does not slow the programs already running in the agents' cgroups. The child lowers
    // it after its joins: a task that joins (and so holds the kernel's cgroup locks, which stop
    // every fork and exit on the machine) at that weight could wait long for the CPU.
    let weight_files = cgroup
        .as_ref()
        .map(|c| c.cpu_weight_files())
        .unwrap_or_default();
    let after_join: Vec<(i32, &'static [u8])> = weight_files
        .iter()
        .map(|(f, _, low)| (f.as_raw_fd(), *low))
        .collect();
    let cpu_weight: Vec<(PathBuf, String)> = weight_files
        .iter()
        .map(|(_, saved, _)| saved.clone())
        .collect();
    let procs = match cgroup.as_ref().map(|c| c.open_procs()).transpose() {
        Ok(files) => files.unwrap_or_default(),
        Err(e) => return Err(fail(&cgroup, e)),
    };
    let (mut ours, theirs) = match UnixStream::pair() {
        Ok(p) => p,
        Err(e) => return Err(fail(&cgroup, e)),
    };
    let mut cmd = tokio::process::Command::new(&r.program);
    cmd.arg0("sandbox-agent")
        .arg("spawn-stub")
        .arg(theirs.as_raw_fd().to_string())
        .env_clear()
        .current_dir("/")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(false);
    crate::sys::agent_child_setup(
        &mut cmd,
        crate::sys::ChildSetup {
            cgroup_procs: procs.iter().map(|f| f.as_raw_fd()).collect(),
            rlimits: r.limits.fallback_rlimits(applied),
            // The stub waits as our user; it switches to the agent user when told what to run.
            user: None,
            after_join,
            cwd: None,
        },
    );
    crate::sys::keep_fd_on_exec(&mut cmd, theirs.as_raw_fd());
    let spawned = cmd.spawn();
    drop(procs);
    drop(weight_files);
    drop(theirs);
    drop(cmd);
    let mut child = match spawned {
        Ok(c) => c,
        Err(e) => return Err(fail(&cgroup, e)),
    };
    let ready = ours
        .set_read_timeout(Some(STUB_TIMEOUT))
        .and_then(|()| ours.set_write_timeout(Some(STUB_TIMEOUT)))
        .and_then(|()| {
            let mut b = [0u8; 1];
            match ours.read(&mut b)? {
                1 if b[0] == READY => Ok(()),
                _ => Err(io::Error::other("the stub ended before it was ready")),
            }
        });
    if let Err(e) = ready {
        let _ = child.start_kill();
        // Reaped by tokio's orphan reaper once dropped.
        drop(child);
        return Err(fail(&cgroup, e));
    }
    Ok(Stub {
        child,
        control: ours,
        cgroup,
        applied,
        cpu_weight,
    })
}

/// The stub's readiness byte.
const READY: u8 = b'R';

/// What a stub is to become.
pub(super) struct Launch<'a> {
    pub program: &'a std::path::Path,
    pub args: &'a [OsString],
    pub env: Vec<(OsString, OsString)>,
    pub cwd: &'a std::path::Path,
    /// The user to switch to before entering `cwd` and exec'ing.
    pub user: Option<&'a AgentUser>,
}

/// The launch message for `what`, or `None` when a stub cannot take it: larger than a stub
/// accepts (the direct path then lets the kernel judge the size), or a program whose name is
/// the stub's own (its exec could not be told from the stub's death).
pub(super) fn message(what: &Launch<'_>) -> Option<Vec<u8>> {
    let name = what.program.file_name()?.as_bytes();
    if name[..name.len().min(15)] == *STUB_COMM.to_bytes() {
        return None;
    }
    let msg = encode(what);
    (msg.len() - 4 <= MAX_MESSAGE).then_some(msg)
}

/// Tells a stub to exec (`msg` from `message`); returns once it has, or why not.
/// Blocking, bounded by `STUB_TIMEOUT`.
pub(super) fn launch(stub: &mut Stub, msg: &[u8]) -> Result<(), LaunchError> {
    let Some(pid) = stub.child.id() else {
        return Err(LaunchError::DiedBeforeExec);
    };
    if let Err(e) = stub.control.write_all(msg) {
        // A dead stub's socket is closed (EPIPE): nothing ran.
        return match exec_happened(pid) {
            Ok(false) => Err(LaunchError::DiedBeforeExec),
            _ => Err(LaunchError::Failed(e)),
        };
    }
    let mut reply = [0u8; 4];
    let mut got = 0;
    while got < reply.len() {
        match stub.control.read(&mut reply[got..]) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) =>
            {
                return Err(LaunchError::Failed(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!("the spawn stub did not exec within {STUB_TIMEOUT:?}"),
                )));
            }
            Err(e) => return Err(LaunchError::Failed(e)),
        }
    }
    match got {
        // End of file: the exec closed the socket, or the stub died.
        0 => match exec_happened(pid) {
            Ok(true) => Ok(()),
            Ok(false) => Err(LaunchError::DiedBeforeExec),
            Err(e) => Err(LaunchError::Failed(e)),
        },
        4 => Err(LaunchError::Failed(io::Error::from_raw_os_error(
            i32::from_le_bytes(reply),
        ))),
        _ => Err(LaunchError::Failed(io::Error::other(
            "the spawn stub answered a partial errno",
        ))),
    }
}

/// Whether our child `pid`, a stub whose control socket just closed, exec'd (true) or died
/// before its exec (false). The kernel renames a process during its exec (to the program's file
/// name), before the program runs; a dead process keeps its name until it is reaped. The
/// socket closes a little before the rename (close-on-exec comes first) and a little before a
/// dying process turns into a zombie, so this waits, within `STUB_TIMEOUT`, for one of the two:
/// a new name, or an exit with the stub's name still on it.
fn exec_happened(pid: u32) -> io::Result<bool> {
    use nix::sys::wait::{Id, WaitPidFlag, WaitStatus, waitid};
    let named_stub = || -> io::Result<bool> {
        let comm = std::fs::read(format!("/proc/{pid}/comm"))?;
        Ok(comm.strip_suffix(b"\n").unwrap_or(&comm) == STUB_COMM.to_bytes())
    };
    let deadline = std::time::Instant::now() + STUB_TIMEOUT;
    let mut round = 0u32;
    loop {
        if !named_stub()? {
            return Ok(true);
        }
        let flags = WaitPidFlag::WEXITED | WaitPidFlag::WNOWAIT | WaitPidFlag::WNOHANG;
        match waitid(Id::Pid(nix::unistd::Pid::from_raw(pid as i32)), flags) {
            // Exited: its name, read again now that it cannot change, says whether the exec
            // got that far (a program that ran and died at once has its own name).
            Ok(WaitStatus::Exited(..) | WaitStatus::Signaled(..)) => return Ok(!named_stub()?),
            Ok(_) => {}
            Err(e) => return Err(io::Error::from(e)),
        }
        if std::time::Instant::now() >= deadline {
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "the spawn stub neither exec'd nor exited",
            ));
        }
        // The rename or the exit is microseconds away: yield first (the stub may be waiting
        // for this very CPU), then poll gently.
        round += 1;
        if round < 64 {
            std::thread::yield_now();
        } else {
            std::thread::sleep(Duration::from_micros(200));
        }
    }
}

/// The launch message: a u32 length, then byte strings each with a u32 length: program, cwd,
/// the argument count and arguments, the variable count and (name, value) pairs.
fn encode(w: &Launch<'_>) -> Vec<u8> {
    fn put(out: &mut Vec<u8>, b: &[u8]) {
        out.extend_from_slice(&(b.len() as u32).to_le_bytes());
        out.extend_from_slice(b);
    }
    let mut body = Vec::new();
    put(&mut body, w.program.as_os_str().as_bytes());
    put(&mut body, w.cwd.as_os_str().as_bytes());
    body.extend_from_slice(&(w.args.len() as u32).to_le_bytes());
    for a in w.args {
        put(&mut body, a.as_bytes());
    }
    body.extend_from_slice(&(w.env.len() as u32).to_le_bytes());
    for (k, v) in &w.env {
        put(&mut body, k.as_bytes());
        put(&mut body, v.as_bytes());
    }
    match w.user {
        None => body.push(0),
        Some((uid, gid, groups)) => {
            body.push(1);
            body.extend_from_slice(&uid.as_raw().to_le_bytes());
            body.extend_from_slice(&gid.as_raw().to_le_bytes());
            body.extend_from_slice(&(groups.len() as u32).to_le_bytes());
            for g in groups {
                body.extend_from_slice(&g.as_raw().to_le_bytes());
            }
        }
    }
    let mut out = Vec::with_capacity(body.len() + 4);
    out.extend_from_slice(&(body.len() as u32).to_le_bytes());
    out.extend_from_slice(&body);
    out
}

/// A decoded launch message.
#[derive(Debug, PartialEq, Eq)]
struct Decoded {
    program: OsString,
    cwd: OsString,
    args: Vec<OsString>,
    env: Vec<(OsString, OsString)>,
    user: Option<AgentUser>,
}

/// Parses a launch message body (without its length prefix); `None` when malformed.
fn decode(body: &[u8]) -> Option<Decoded> {
    let mut rest = body;
    let u32_ = |rest: &mut &[u8]| -> Option<usize> {
        let (n, tail) = rest.split_at_checked(4)?;
        *rest = tail;
        Some(u32::from_le_bytes(n.try_into().ok()?) as usize)
    };
    let bytes = |rest: &mut &[u8]| -> Option<OsString> {
        let (n, tail) = rest.split_at_checked(4)?;
        let n = u32::from_le_bytes(n.try_into().ok()?) as usize;
        let (b, tail) = tail.split_at_checked(n)?;
        *rest = tail;
        Some(OsString::from_vec(b.to_vec()))
    };
    let program = bytes(&mut rest)?;
    let cwd = bytes(&mut rest)?;
    let nargs = u32_(&mut rest)?;
    // Each entry takes at least its 4-byte length: a count beyond that is a lie.
    if nargs > rest.len() / 4 {
        return None;
    }
    let mut args = Vec::with_capacity(nargs);
    for _ in 0..nargs {
        args.push(bytes(&mut rest)?);
    }
    let nenv = u32_(&mut rest)?;
    if nenv > rest.len() / 8 {
        return None;
    }
    let mut env = Vec::with_capacity(nenv);
    for _ in 0..nenv {
        env.push((bytes(&mut rest)?, bytes(&mut rest)?));
    }
    let (flag, tail) = rest.split_first()?;
    rest = tail;
    let user = match flag {
        0 => None,
        1 => {
            let uid = nix::unistd::Uid::from_raw(u32_(&mut rest)? as u32);
            let gid = nix::unistd::Gid::from_raw(u32_(&mut rest)? as u32);
            let n = u32_(&mut rest)?;
            if n > rest.len() / 4 {
                return None;
            }
            let mut groups = Vec::with_capacity(n);
            for _ in 0..n {
                groups.push(nix::unistd::Gid::from_raw(u32_(&mut rest)? as u32));
            }
            Some((uid, gid, groups))
        }
        _ => return None,
    };
    rest.is_empty().then_some(Decoded {
        program,
        cwd,
        args,
        env,
        user,
    })
}

/// `sandbox-agent spawn-stub <fd>`: the stub's side. Says it is ready, waits for the launch
/// message and execs it with exactly its environment and working directory; on failure reports
/// the errno and exits 127. Exits quietly when the control socket closes first (the daemon
/// discarded the stub, or died).
pub fn stub_main(fd: i32) -> ExitCode {
    let Ok(mut control) = crate::sys::inherited_socket(fd) else {
        return ExitCode::from(126);
    };
    // A stub waits as the daemon's user, never as the agent user, and non-dumpable: no agent
    // can ptrace it or write its memory to run its own code in this cgroup. The switch to the
    // agent user below keeps it non-dumpable until the exec, which makes the program dumpable
    // again, as a direct spawn's program is.
    let _ = nix::sys::prctl::set_dumpable(false);
    // The name the daemon tells an exec from a death by (see `exec_happened`).
    if nix::sys::prctl::set_name(STUB_COMM).is_err() {
        return ExitCode::from(126);
    }
    if control.write_all(&[READY]).is_err() {
        return ExitCode::from(126);
    }
    let mut len = [0u8; 4];
    if control.read_exact(&mut len).is_err() {
        return ExitCode::SUCCESS;
    }
    let refuse = |mut control: UnixStream, errno: i32| {
        let _ = control.write_all(&errno.to_le_bytes());
        ExitCode::from(127)
    };
    let len = u32::from_le_bytes(len) as usize;
    if len > MAX_MESSAGE {
        return refuse(control, libc::E2BIG);
    }
    let mut body = vec![0u8; len];
    if control.read_exact(&mut body).is_err() {
        return ExitCode::SUCCESS;
    }
    let Some(d) = decode(&body) else {
        return refuse(control, libc::EINVAL);
    };
    drop(body);
    if let Err(e) = crate::sys::set_cloexec(&control) {
        return refuse(control, e.raw_os_error().unwrap_or(libc::EIO));
    }
    // The same last steps as a direct spawn's, in the same order: the agent user, then the
    // working directory entered as that user.
    let Ok(cwd) = std::ffi::CString::new(d.cwd.into_vec()) else {
        return refuse(control, libc::EINVAL);
    };
    if let Err(e) = crate::sys::enter_as(d.user.as_ref(), Some(&cwd)) {
        return refuse(control, e.raw_os_error().unwrap_or(libc::EPERM));
    }
    // The stub started with no signal blocked (`agent_child_setup`); std resets SIGPIPE (which
    // our runtime ignores) before the exec and searches PATH of the new environment, as the
    // direct spawn does.
    let err = std::process::Command::new(&d.program)
        .args(&d.args)
        .env_clear()
        .envs(d.env)
        .exec();
    refuse(control, err.raw_os_error().unwrap_or(libc::EIO))
}

#[cfg(test)]
mod tests;
