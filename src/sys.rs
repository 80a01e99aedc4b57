//! The few system calls that Rust marks `unsafe`, each wrapped once with the reason it is sound.
//! Everything else in the crate is `#![deny(unsafe_code)]`.
#![allow(unsafe_code)]

use std::io;
use std::os::fd::{FromRawFd, RawFd};

/// Result of [`fork`].
pub enum Forked {
    Parent { child: nix::unistd::Pid },
    Child,
}

/// Forks the process. Only called from `main` before any thread exists (no tokio runtime, no
/// logging thread), so the child inherits a consistent single-threaded address space.
pub fn fork() -> io::Result<Forked> {
    // SAFETY: called while the process is single-threaded (see the doc comment); the child only
    // returns into ordinary Rust code, it does not run async-signal-unsafe code on another
    // thread's locks because there are no other threads.
    match unsafe { nix::unistd::fork() }.map_err(io::Error::from)? {
        nix::unistd::ForkResult::Parent { child } => Ok(Forked::Parent { child }),
        nix::unistd::ForkResult::Child => Ok(Forked::Child),
    }
}

/// Takes ownership of a listening socket passed by the service manager (socket activation).
pub fn tcp_listener_from_fd(fd: RawFd) -> io::Result<std::net::TcpListener> {
    use nix::fcntl::{FcntlArg, FdFlag, fcntl};
    // SAFETY: `fd` comes from LISTEN_FDS (validated by the caller: LISTEN_PID is ours and the fd is
    // in the range systemd passed), nothing else in the process owns it, and it is taken once.
    let listener = unsafe { std::net::TcpListener::from_raw_fd(fd) };
    // Inherited sockets come without close-on-exec; agents must not inherit our listener.
    fcntl(&listener, FcntlArg::F_SETFD(FdFlag::FD_CLOEXEC)).map_err(io::Error::from)?;
    Ok(listener)
}

/// Registers `f` to run in the child between fork and exec.
pub fn pre_exec<F>(cmd: &mut tokio::process::Command, f: F)
where
    F: FnMut() -> io::Result<()> + Send + Sync + 'static,
{
    // SAFETY: every closure passed here only makes async-signal-safe system calls (setsid,
    // setrlimit, prctl, write to an already-open cgroup file, setgid/setuid) on values prepared
    // before the fork, and allocates nothing.
    unsafe {
        cmd.pre_exec(f);
    }
}

/// Makes the child of `cmd` start a new session (setsid) before exec, leaving our process group.
pub fn new_session_on_exec(cmd: &mut std::process::Command) {
    use std::os::unix::process::CommandExt;
    // SAFETY: the closure only calls setsid(2), which is async-signal-safe and allocates nothing.
    unsafe {
        cmd.pre_exec(|| {
            nix::unistd::setsid().map_err(io::Error::from)?;
            Ok(())
        });
    }
}

/// Ignores SIGTERM in this process from now on (the mock agent's `/ignore-term`).
pub fn ignore_sigterm() -> io::Result<()> {
    use nix::sys::signal::{SigHandler, Signal, signal};
    // SAFETY: installing SIG_IGN runs no handler code, so no signal-safety rules apply.
    unsafe { signal(Signal::SIGTERM, SigHandler::SigIgn) }
        .map(|_| ())
        .map_err(io::Error::from)
}

/// What an agent's child process does between fork and exec, prepared entirely before the fork
/// (the child allocates nothing).
pub struct ChildSetup {
    /// Open `cgroup.procs` files; the child writes "0" to each to join before anything else runs,
    /// so no grandchild can start outside the cgroup.
    pub cgroup_procs: Vec<RawFd>,
    /// `(resource, limit)` pairs set as both soft and hard limit.
    pub rlimits: Vec<(nix::sys::resource::Resource, u64)>,
    /// uid, gid and supplementary groups to switch to (last, after joining the cgroups).
    pub user: Option<(nix::unistd::Uid, nix::unistd::Gid, Vec<nix::unistd::Gid>)>,
}

/// Registers the agent's child setup: new session, cgroups, rlimits, close-on-exec on every
/// inherited descriptor, then the agent user.
pub fn agent_child_setup(cmd: &mut tokio::process::Command, setup: ChildSetup) {
    // SAFETY: the closure only makes async-signal-safe system calls (setsid, write, setrlimit,
    // close_range, setgroups, setgid, setuid) on data prepared before the fork; it allocates
    // nothing (error values carry a plain errno). The cgroup fds stay open in the parent until
    // `spawn` has returned, so they are valid in the child.
    unsafe {
        cmd.pre_exec(move || {
            nix::unistd::setsid().map_err(io::Error::from)?;
            for fd in &setup.cgroup_procs {
                if libc::write(*fd, b"0".as_ptr().cast(), 1) != 1 {
                    return Err(io::Error::last_os_error());
                }
            }
            for (resource, limit) in &setup.rlimits {
                nix::sys::resource::setrlimit(*resource, *limit, *limit)
                    .map_err(io::Error::from)?;
            }
            // Descriptors a parent of ours leaked to us without close-on-exec must not reach the
            // agent. Marking (not closing) keeps std's exec-error pipe working. Old kernels
            // without close_range(2) keep the inherited set.
            libc::syscall(
                libc::SYS_close_range,
                3u32,
                u32::MAX,
                libc::CLOSE_RANGE_CLOEXEC,
            );
            if let Some((uid, gid, groups)) = &setup.user {
                nix::unistd::setgroups(groups).map_err(io::Error::from)?;
                nix::unistd::setgid(*gid).map_err(io::Error::from)?;
                nix::unistd::setuid(*uid).map_err(io::Error::from)?;
            }
            Ok(())
        });
    }
}

/// Clock ticks per second (the unit of CPU times in `/proc/<pid>/stat`).
pub fn clock_ticks() -> u64 {
    // SAFETY: sysconf has no preconditions and touches no memory of ours.
    let v = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if v > 0 { v as u64 } else { 100 }
}

/// The memory page size in bytes.
pub fn page_size() -> u64 {
    // SAFETY: as above.
    let v = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if v > 0 { v as u64 } else { 4096 }
}

/// Starts writeback of `len` bytes at `offset` without waiting for it, so that a final `fsync`
/// of a large streamed file has little left to do (the disk works while the body arrives).
pub fn start_writeback(fd: std::os::fd::BorrowedFd<'_>, offset: u64, len: u64) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    // SAFETY: a plain system call on a descriptor the caller keeps open for the duration of the
    // call (it is borrowed); no memory is shared with the kernel.
    let r = unsafe {
        libc::sync_file_range(
            fd.as_raw_fd(),
            offset as libc::off64_t,
            len as libc::off64_t,
            libc::SYNC_FILE_RANGE_WRITE,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

// ---- Process API: terminals (kept in one block) ----

/// Makes fd 0 of `cmd`'s child its controlling terminal before exec. Register it after
/// `agent_child_setup`, whose `setsid` must come first (only a session leader without a
/// controlling terminal may take one).
pub fn controlling_tty_on_exec(cmd: &mut tokio::process::Command) {
    // SAFETY: the closure only calls ioctl(2) on fd 0, which std has already set to the
    // terminal; async-signal-safe and allocation-free.
    unsafe {
        cmd.pre_exec(|| {
            if libc::ioctl(0, libc::TIOCSCTTY, 0) != 0 {
                return Err(io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

/// Sets a terminal's window size (TIOCSWINSZ); the kernel then sends SIGWINCH to the
/// terminal's foreground process group.
pub fn set_window_size(fd: std::os::fd::BorrowedFd<'_>, cols: u16, rows: u16) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    let size = libc::winsize {
        ws_row: rows,
        ws_col: cols,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    // SAFETY: `fd` is borrowed, so open for the call; TIOCSWINSZ reads exactly one `winsize`
    // from the pointer, which points at a live local.
    let r = unsafe {
        libc::ioctl(
            fd.as_raw_fd(),
            libc::TIOCSWINSZ,
            &size as *const libc::winsize,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Registers an owned descriptor (a terminal's master side) with the reactor.
pub fn async_fd(
    fd: std::os::fd::OwnedFd,
) -> io::Result<tokio::io::unix::AsyncFd<std::os::fd::OwnedFd>> {
    use tokio::io::Interest;
    // SAFETY: an `OwnedFd` is a valid open descriptor that only it closes, and its `as_raw_fd`
    // returns that same descriptor for its whole life; the `AsyncFd` owns it from here on.
    unsafe {
        tokio::io::unix::AsyncFd::register_with_interest(
            fd,
            Interest::READABLE | Interest::WRITABLE,
        )
    }
    .map_err(io::Error::from)
}
