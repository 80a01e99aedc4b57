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
