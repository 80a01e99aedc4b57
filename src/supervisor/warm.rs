//! Warm spawns: children started ahead of need, each already in its own session, its own cgroup
//! (limits written and read back), with its rlimits and as the agent user, waiting in a small stub
//! (our own binary, `sandbox-agent spawn-stub <fd>`) for the program it is to become.
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
//! The control protocol (one Unix stream socket per stub): the stub writes one byte when it is
//! ready; the daemon writes one launch message (`encode`); the stub makes its control socket
//! close-on-exec and execs, so end of file means the program runs, and four bytes (an errno, little
//! endian) mean the exec failed (the stub then exits 127).

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
/// wait is on the caller's thread, as std's own spawn waits for its child's exec; the bound keeps
/// a stub stopped by someone (SIGSTOP) from holding that thread.
const STUB_TIMEOUT: Duration = Duration::from_secs(2);

/// Largest launch message a stub accepts (argv and environment are bounded by the kernel's
/// `ARG_MAX`-like limits well below this).
const MAX_MESSAGE: usize = 16 << 20;

/// How long after the last start the pool refills (see `Pool::take`).
const REFILL_QUIET: Duration = Duration::from_millis(10);

/// Consecutive failures to make a stub after which the pool stops trying (and says so): a daemon
/// binary that cannot run as the agent user, say, would otherwise fail on every start.
const MAX_FAILURES: u32 = 3;

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
    pub user: Option<AgentUser>,
    /// Our own binary (`/proc/self/exe` in the daemon).
    pub program: PathBuf,
}

#[derive(Default)]
struct State {
    ready: VecDeque<Stub>,
    /// Stubs being made (counted against the size so refills never overshoot).
    making: usize,
    failures: u32,
}

/// At most `size` warm stubs, refilled in the background after each one taken.
pub(super) struct Pool {
    recipe: Recipe,
    size: usize,
    state: Mutex<State>,
    closed: AtomicBool,
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
            let next = self.state.lock().expect("pool lock").ready.pop_front();
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
            let mut st = self.state.lock().expect("pool lock");
            if st.failures >= MAX_FAILURES {
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
                let mut st = pool.state.lock().expect("pool lock");
                st.making -= 1;
                match made {
                    Ok(stub) if !pool.closed.load(Ordering::Acquire) => {
                        st.failures = 0;
                        st.ready.push_back(stub);
                    }
                    Ok(stub) => {
                        drop(st);
                        pool.discard(stub);
                    }
                    Err(e) => {
                        st.failures += 1;
                        if st.failures == MAX_FAILURES {
                            tracing::warn!(error = %e, "cannot keep warm spawns (stubs fail to start); every start now pays its own cgroup join");
                        } else {
                            tracing::debug!(error = %e, "warm spawn stub failed to start");
                        }
                    }
                }
            });
        }
    }

    /// Kills a stub, reaps it and removes its cgroups, in a tracked task.
    fn discard(&self, stub: Stub) {
        self.tasks.spawn(async move { dispose(stub).await });
    }

    /// No more stubs: waits for those being made, then kills, reaps and removes every one.
    pub async fn close(&self) {
        self.closed.store(true, Ordering::Release);
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
            user: r.user.clone(),
            after_join,
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
                _ => Err(io::Error::other(
                    "the stub ended before it was ready (is the daemon binary runnable as the agent user?)",
                )),
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
}

/// The launch message for `what`, or `None` when it is larger than a stub accepts (the start
/// then takes the direct path, where the kernel judges the size).
pub(super) fn message(what: &Launch<'_>) -> Option<Vec<u8>> {
    let msg = encode(what);
    (msg.len() - 4 <= MAX_MESSAGE).then_some(msg)
}

/// Tells a stub to exec (`msg` from `message`); returns once it has, or the exec's error.
/// Blocking, bounded by `STUB_TIMEOUT`.
pub(super) fn launch(stub: &mut Stub, msg: &[u8]) -> io::Result<()> {
    stub.control.write_all(msg)?;
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
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!("the spawn stub did not exec within {STUB_TIMEOUT:?}"),
                ));
            }
            Err(e) => return Err(e),
        }
    }
    match got {
        0 => Ok(()),
        4 => Err(io::Error::from_raw_os_error(i32::from_le_bytes(reply))),
        _ => Err(io::Error::other("the spawn stub answered a partial errno")),
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
    rest.is_empty().then_some(Decoded {
        program,
        cwd,
        args,
        env,
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
    // A stub runs as the agent user while it waits: non-dumpable, another process of that user
    // (an agent) cannot ptrace it or write its memory to run its own code in this cgroup. The
    // exec below makes the program dumpable again, as a direct spawn's program is.
    let _ = nix::sys::prctl::set_dumpable(false);
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
    // std resets the signal mask and SIGPIPE (which our runtime ignores) before the exec, and
    // searches PATH of the new environment, as the direct spawn does.
    let err = std::process::Command::new(&d.program)
        .args(&d.args)
        .env_clear()
        .envs(d.env)
        .current_dir(&d.cwd)
        .exec();
    refuse(control, err.raw_os_error().unwrap_or(libc::EIO))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn launch_messages_round_trip_with_non_utf8_bytes() {
        let args = vec![OsString::from("-c"), OsString::from_vec(vec![0xff, b'x'])];
        let w = Launch {
            program: std::path::Path::new("/bin/sh"),
            args: &args,
            env: vec![
                ("PATH".into(), "/usr/bin".into()),
                ("EMPTY".into(), "".into()),
            ],
            cwd: std::path::Path::new("/tmp"),
        };
        let msg = encode(&w);
        let len = u32::from_le_bytes(msg[..4].try_into().unwrap()) as usize;
        assert_eq!(len, msg.len() - 4);
        let d = decode(&msg[4..]).expect("decodes");
        assert_eq!(d.program, OsString::from("/bin/sh"));
        assert_eq!(d.cwd, OsString::from("/tmp"));
        assert_eq!(d.args, args);
        assert_eq!(d.env[1], ("EMPTY".into(), "".into()));
    }

    #[test]
    fn malformed_launch_messages_are_refused_not_panicked_on() {
        let args = vec![OsString::from("a")];
        let w = Launch {
            program: std::path::Path::new("p"),
            args: &args,
            env: vec![],
            cwd: std::path::Path::new("/"),
        };
        let msg = encode(&w);
        let body = &msg[4..];
        // Every truncation, and trailing garbage, is refused.
        for cut in 0..body.len() {
            assert_eq!(decode(&body[..cut]), None, "cut at {cut}");
        }
        let mut long = body.to_vec();
        long.push(0);
        assert_eq!(decode(&long), None);
        // A huge count is refused before anything is allocated for it.
        let mut lie = Vec::new();
        for s in [&b"p"[..], b"/"] {
            lie.extend_from_slice(&(s.len() as u32).to_le_bytes());
            lie.extend_from_slice(s);
        }
        lie.extend_from_slice(&u32::MAX.to_le_bytes());
        assert_eq!(decode(&lie), None);
    }
}
