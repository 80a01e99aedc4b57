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

/// Forks the process, refusing unless it is single-threaded: a child forked from a threaded
/// process may find another thread's lock held forever (the allocator's, the logger's). The
/// precondition is checked here, not left to the caller.
pub fn fork_single_threaded() -> io::Result<Forked> {
    let threads = thread_count()?;
    if threads != 1 {
        return Err(io::Error::other(format!(
            "refusing to fork a process with {threads} threads"
        )));
    }
    // SAFETY: the process has exactly one thread (checked just above; nothing between the check
    // and the fork starts one), so the child inherits a consistent address space and returns
    // into ordinary Rust code.
    match unsafe { nix::unistd::fork() }.map_err(io::Error::from)? {
        nix::unistd::ForkResult::Parent { child } => Ok(Forked::Parent { child }),
        nix::unistd::ForkResult::Child => Ok(Forked::Child),
    }
}

/// Takes ownership of the first socket passed by the service manager (fd 3, socket activation).
/// The preconditions of adopting a raw descriptor are checked here: it is taken at most once in
/// the process's life, and it must be a listening stream socket.
pub fn take_activated_listener() -> io::Result<std::net::TcpListener> {
    use nix::fcntl::{FcntlArg, FdFlag, fcntl};
    use nix::sys::socket::{getsockopt, sockopt};
    use std::os::fd::BorrowedFd;
    use std::sync::atomic::{AtomicBool, Ordering};
    const FD: RawFd = 3;
    static TAKEN: AtomicBool = AtomicBool::new(false);
    if !is_open(FD) {
        return Err(io::Error::from_raw_os_error(libc::EBADF));
    }
    if TAKEN.swap(true, Ordering::SeqCst) {
        return Err(io::Error::other("the activated socket was already taken"));
    }
    // SAFETY: open (checked above); only borrowed for the checks below, and the borrow ends
    // before ownership is taken.
    let borrowed = unsafe { BorrowedFd::borrow_raw(FD) };
    let listening = getsockopt(&borrowed, sockopt::AcceptConn).map_err(io::Error::from)?;
    let stream = getsockopt(&borrowed, sockopt::SockType).map_err(io::Error::from)?
        == nix::sys::socket::SockType::Stream;
    if !(listening && stream) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "fd 3 from socket activation is not a listening stream socket",
        ));
    }
    // SAFETY: fd 3 is open (the checks above succeeded on it), it is a listening socket that
    // systemd passed to us, and `TAKEN` guarantees it is adopted once, so nothing else owns it.
    let listener = unsafe { std::net::TcpListener::from_raw_fd(FD) };
    // Inherited sockets come without close-on-exec; agents must not inherit our listener.
    fcntl(&listener, FcntlArg::F_SETFD(FdFlag::FD_CLOEXEC)).map_err(io::Error::from)?;
    Ok(listener)
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
    /// The working directory, entered after the switch to `user` (see `enter_as`).
    pub cwd: Option<std::ffi::CString>,
    /// Open files and the bytes the child writes to each once it has joined its cgroups,
    /// best-effort (a warm stub lowers its group's CPU weight there: after the joins, so it never
    /// holds the kernel's cgroup locks at that weight).
    pub after_join: Vec<(RawFd, &'static [u8])>,
}

/// The open-file limit the daemon was started with, before `raise_nofile_limit`; children get it
/// back (programs that use `select(2)` break on descriptors past 1024).
static INHERITED_NOFILE: std::sync::OnceLock<(u64, u64)> = std::sync::OnceLock::new();

/// Raises the soft open-file limit to the hard limit (every connection, agent pipe and file
/// transfer is a descriptor; the usual soft limit of 1024 would let a few hundred idle sockets
/// exhaust it) and returns `(before, after)`. Children get the original soft limit back.
pub fn raise_nofile_limit() -> io::Result<(u64, u64)> {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE).map_err(io::Error::from)?;
    let _ = INHERITED_NOFILE.set((soft, hard));
    if soft >= hard {
        return Ok((soft, soft));
    }
    setrlimit(Resource::RLIMIT_NOFILE, hard, hard).map_err(io::Error::from)?;
    Ok((soft, hard))
}

/// The last steps before a supervised program's exec, in the one order both spawn paths use (a
/// direct spawn's child between fork and exec, a warm stub once told what to run): switch to the
/// agent user (groups, gid, uid), then enter the working directory — as that user, so that a
/// directory it could not reach by path is refused (EACCES) as it would be in a shell of its
/// own. Async-signal-safe and allocation-free (the caller prepared every argument).
pub fn enter_as(
    user: Option<&(nix::unistd::Uid, nix::unistd::Gid, Vec<nix::unistd::Gid>)>,
    cwd: Option<&std::ffi::CStr>,
) -> io::Result<()> {
    if let Some((uid, gid, groups)) = user {
        nix::unistd::setgroups(groups).map_err(io::Error::from)?;
        nix::unistd::setgid(*gid).map_err(io::Error::from)?;
        nix::unistd::setuid(*uid).map_err(io::Error::from)?;
    }
    if let Some(cwd) = cwd {
        nix::unistd::chdir(cwd).map_err(io::Error::from)?;
    }
    Ok(())
}

/// Registers the agent's child setup: new session, cgroups, rlimits, close-on-exec on every
/// inherited descriptor, then the agent user and the working directory (`enter_as`).
pub fn agent_child_setup(cmd: &mut tokio::process::Command, setup: ChildSetup) {
    let nofile = INHERITED_NOFILE.get().copied();
    // SAFETY: the closure only makes async-signal-safe system calls (setsid, write, setrlimit,
    // close_range, setgroups, setgid, setuid, chdir) on data prepared before the fork; it allocates
    // nothing (error values carry a plain errno). The cgroup fds (and `after_join`'s) stay open
    // in the parent until `spawn` has returned, so they are valid in the child.
    unsafe {
        cmd.pre_exec(move || {
            clear_signal_mask()?;
            nix::unistd::setsid().map_err(io::Error::from)?;
            for fd in &setup.cgroup_procs {
                if libc::write(*fd, b"0".as_ptr().cast(), 1) != 1 {
                    return Err(io::Error::last_os_error());
                }
            }
            for (fd, bytes) in &setup.after_join {
                libc::write(*fd, bytes.as_ptr().cast(), bytes.len());
            }
            for (resource, limit) in &setup.rlimits {
                nix::sys::resource::setrlimit(*resource, *limit, *limit)
                    .map_err(io::Error::from)?;
            }
            if let Some((soft, hard)) = nofile {
                // Lowering the soft limit never fails; the hard limit stays the daemon's.
                let _ = nix::sys::resource::setrlimit(
                    nix::sys::resource::Resource::RLIMIT_NOFILE,
                    soft,
                    hard,
                );
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
            enter_as(setup.user.as_ref(), setup.cwd.as_deref())
        });
    }
}

/// Unblocks every signal in a child between fork and exec. The daemon blocks its stop and
/// reload signals in all its threads (`daemon::signals`) and a child inherits the mask: an agent
/// or tool would otherwise never see the SIGTERM of its own stop. Async-signal-safe.
fn clear_signal_mask() -> io::Result<()> {
    nix::sys::signal::pthread_sigmask(
        nix::sys::signal::SigmaskHow::SIG_SETMASK,
        Some(&nix::sys::signal::SigSet::empty()),
        None,
    )
    .map_err(io::Error::from)
}

/// Makes the child of `cmd` start with no signal blocked (see [`clear_signal_mask`]); for
/// children that do not go through [`agent_child_setup`], which does it itself.
pub fn clear_signal_mask_on_exec(cmd: &mut tokio::process::Command) {
    // SAFETY: one sigprocmask(2) call, async-signal-safe and allocation-free.
    unsafe {
        cmd.pre_exec(clear_signal_mask);
    }
}

/// Keeps `fd` open across the exec of `cmd`: clears its close-on-exec flag in the child only
/// (for a descriptor the child is told about by number, such as a warm stub's control socket).
/// Register it after `agent_child_setup`, whose close-on-exec sweep would cover it otherwise.
pub fn keep_fd_on_exec(cmd: &mut tokio::process::Command, fd: RawFd) {
    // SAFETY: one fcntl(2) on a descriptor the parent keeps open until `spawn` returns;
    // async-signal-safe and allocation-free.
    unsafe {
        cmd.pre_exec(move || {
            if libc::fcntl(fd, libc::F_SETFD, 0) == -1 {
                return Err(io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

/// Takes ownership of a Unix socket the parent left open for us across exec, by number (a warm
/// stub's control socket, `sandbox-agent spawn-stub <fd>`). The preconditions of adopting a raw
/// descriptor are checked here: it is taken at most once in the process's life, it is not a
/// standard stream, and it is an open Unix stream socket (nothing else of ours makes those
/// before this is called, first thing in the stub's `main`).
pub fn inherited_socket(fd: RawFd) -> io::Result<std::os::unix::net::UnixStream> {
    use std::sync::atomic::{AtomicBool, Ordering};
    static TAKEN: AtomicBool = AtomicBool::new(false);
    if fd < 3 || !is_open(fd) {
        return Err(io::Error::from_raw_os_error(libc::EBADF));
    }
    if TAKEN.swap(true, Ordering::SeqCst) {
        return Err(io::Error::other("the inherited socket was already taken"));
    }
    // SAFETY: open (checked above); only borrowed for the checks below.
    let borrowed = unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) };
    let unix_stream = nix::sys::socket::getsockname::<nix::sys::socket::UnixAddr>(fd).is_ok()
        && nix::sys::socket::getsockopt(&borrowed, nix::sys::socket::sockopt::SockType)
            .is_ok_and(|t| t == nix::sys::socket::SockType::Stream);
    if !unix_stream {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "the inherited descriptor is not a Unix stream socket",
        ));
    }
    // SAFETY: an open Unix stream socket the parent handed to this freshly exec'd process by
    // number; `TAKEN` makes this the one adoption, and the process opened no socket before.
    Ok(unsafe { std::os::unix::net::UnixStream::from_raw_fd(fd) })
}

/// True when `fd` is an open descriptor of this process (asked without borrowing it).
fn is_open(fd: RawFd) -> bool {
    // SAFETY: F_GETFD reads the descriptor's flags; on a descriptor that is not open it fails
    // with EBADF and touches nothing.
    unsafe { libc::fcntl(fd, libc::F_GETFD) != -1 }
}

/// The number of threads of this process.
fn thread_count() -> io::Result<usize> {
    Ok(std::fs::read_dir("/proc/self/task")?.count())
}

/// Sets close-on-exec on a descriptor this process owns.
pub fn set_cloexec(fd: &impl std::os::fd::AsFd) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    // SAFETY: fcntl(2) on a descriptor that the borrow keeps open for the call.
    let r = unsafe { libc::fcntl(fd.as_fd().as_raw_fd(), libc::F_SETFD, libc::FD_CLOEXEC) };
    if r == -1 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// Runs `f` on the blocking pool and returns its value; a panic in it goes on unwinding in the
/// caller (the edge answers a plain 500), as if `f` had run inline.
pub async fn blocking<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    tokio::task::spawn_blocking(f)
        .await
        .unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic()))
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

/// Overwrites, in place, every copy of `secret` in this process's argument area and the value of
/// the variable `env_name` in its environment area, so that `/proc/<pid>/cmdline` and
/// `/proc/<pid>/environ` no longer show them (as databases do with passwords on their command
/// line). Returns how many copies were overwritten.
///
/// The areas are found from `/proc/self/stat` (`arg_start`..`env_end`) and rewritten through
/// `/proc/self/mem`, so no Rust reference to memory Rust did not allocate is ever made. Refused
/// unless the process is single-threaded (from `main`, before the runtime): nothing may be
/// reading `std::env::args` or the environment at the same time.
pub fn scrub_from_proc(secret: &[u8], env_name: &str) -> io::Result<usize> {
    use std::os::unix::fs::FileExt;
    if secret.is_empty() {
        return Ok(0);
    }
    let threads = thread_count()?;
    if threads != 1 {
        return Err(io::Error::other(format!(
            "refusing to rewrite the argument and environment areas with {threads} threads running"
        )));
    }
    let stat = std::fs::read_to_string("/proc/self/stat")?;
    let rest = stat
        .rsplit_once(") ")
        .map(|(_, r)| r)
        .ok_or_else(|| io::Error::other("unexpected /proc/self/stat"))?;
    // Field N of stat(5) is at index N - 3 after the command name; arg_start is field 48.
    let fields: Vec<u64> = rest
        .split_whitespace()
        .skip(45)
        .take(4)
        .map(|f| f.parse().unwrap_or(0))
        .collect();
    let [arg_start, arg_end, env_start, env_end] = fields[..] else {
        return Err(io::Error::other(
            "/proc/self/stat has no argument/environment bounds",
        ));
    };
    if arg_start == 0 || arg_end < arg_start || env_end < env_start {
        return Err(io::Error::other(
            "the argument/environment bounds are not readable",
        ));
    }
    let mem = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/proc/self/mem")?;
    let mut count = 0;
    let mut area = vec![0u8; (arg_end - arg_start) as usize];
    mem.read_exact_at(&mut area, arg_start)?;
    for at in find_all(&area, secret) {
        mem.write_all_at(&vec![b'x'; secret.len()], arg_start + at as u64)?;
        count += 1;
    }
    let mut area = vec![0u8; (env_end - env_start) as usize];
    mem.read_exact_at(&mut area, env_start)?;
    let prefix = format!("{env_name}=");
    let mut offset = 0usize;
    for entry in area.split(|b| *b == 0) {
        if let Some(value) = entry.strip_prefix(prefix.as_bytes())
            && !value.is_empty()
        {
            let at = env_start + (offset + prefix.len()) as u64;
            mem.write_all_at(&vec![b'x'; value.len()], at)?;
            count += 1;
        }
        offset += entry.len() + 1;
    }
    Ok(count)
}

/// Start offsets of the non-overlapping occurrences of `needle` in `hay`.
fn find_all(hay: &[u8], needle: &[u8]) -> Vec<usize> {
    let mut out = Vec::new();
    let mut from = 0;
    while let Some(i) = memchr::memmem::find(&hay[from..], needle) {
        out.push(from + i);
        from += i + needle.len();
    }
    out
}

/// Returns free heap memory to the system (glibc `malloc_trim`), for after a load of large
/// buffers has ended; a no-op on other C libraries. Slow-ish (walks every arena): call it on the
/// blocking pool, debounced (`trim_soon`).
pub fn trim_heap() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim takes no pointers and is thread-safe (it locks each arena).
    unsafe {
        libc::malloc_trim(0);
    }
}

/// Fixes glibc's mmap threshold at `bytes`. Left alone, glibc raises it to the size of every
/// mmapped block that is freed (up to 32 MiB), so after a few large buffers every later one
/// comes from the arenas, where buffers freed on many threads fragment the heap beyond what
/// `malloc_trim` can give back; fixed, blocks this large are mapped and unmapped on their own.
/// The trim threshold goes to four times `bytes`: glibc's default (128 KiB, no longer adjusted
/// once the mmap threshold is fixed) gave a freed transfer chunk at the top of an arena back to
/// the kernel at once, so the next chunk faulted every page in again (a 256 MiB download took
/// ~65,000 page faults); `trim_soon` still gives it all back once the transfers end.
/// Call it before any thread starts. A no-op on other C libraries.
pub fn fix_mmap_threshold(bytes: usize) {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        let trim = libc::c_int::try_from(bytes.saturating_mul(4)).unwrap_or(libc::c_int::MAX);
        let bytes = libc::c_int::try_from(bytes).unwrap_or(libc::c_int::MAX);
        // SAFETY: mallopt takes two integers; M_MMAP_THRESHOLD and M_TRIM_THRESHOLD are
        // documented parameters.
        unsafe {
            libc::mallopt(libc::M_MMAP_THRESHOLD, bytes);
            libc::mallopt(libc::M_TRIM_THRESHOLD, trim);
        }
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    let _ = bytes;
}

/// Caps glibc's malloc arenas at `arenas`, unless the operator chose a cap (`MALLOC_ARENA_MAX`,
/// or `arena_max` in `GLIBC_TUNABLES`). By default glibc gives each new thread an arena of its own
/// (up to 8 per core), and `malloc_trim` never gives back the free top of an arena other than
/// the main one: after a burst of starts and stops, the arenas of the blocking threads that did
/// them kept ~1.5 MB resident with nothing live in them (docs/performance.md, "Arenas").
/// The daemon passes its worker count (plus one for the main thread), so that workers do not
/// share an arena's lock; blocking threads share theirs. Call it before any thread starts.
/// A no-op on other C libraries.
pub fn cap_malloc_arenas(arenas: usize) {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        let chosen = operator_capped_arenas(
            std::env::var_os("MALLOC_ARENA_MAX").is_some(),
            std::env::var("GLIBC_TUNABLES").ok().as_deref(),
        );
        if !chosen {
            let arenas = libc::c_int::try_from(arenas.max(1)).unwrap_or(libc::c_int::MAX);
            // SAFETY: mallopt takes two integers; M_ARENA_MAX is a documented parameter.
            unsafe {
                libc::mallopt(libc::M_ARENA_MAX, arenas);
            }
        }
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    let _ = arenas;
}

/// Whether the daemon's environment already caps the arenas: `MALLOC_ARENA_MAX`, or
/// `glibc.malloc.arena_max` among the colon-separated `GLIBC_TUNABLES`.
#[cfg_attr(not(all(target_os = "linux", target_env = "gnu")), allow(dead_code))]
fn operator_capped_arenas(malloc_arena_max: bool, tunables: Option<&str>) -> bool {
    malloc_arena_max
        || tunables.is_some_and(|t| {
            t.split(':')
                .any(|kv| kv.split('=').next() == Some("glibc.malloc.arena_max"))
        })
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

/// A pidfd for our child `pid`, registered with the reactor: it turns readable when the child
/// exits, before anyone reaps it, so the supervisor can learn of the exit while the pid (and
/// the process group id it names) is still held by the zombie. `Err` on kernels without
/// `pidfd_open` (before 5.3).
pub fn pidfd(pid: u32) -> io::Result<tokio::io::unix::AsyncFd<std::os::fd::OwnedFd>> {
    let pid = libc::pid_t::try_from(pid).map_err(|_| io::Error::from_raw_os_error(libc::ESRCH))?;
    // SAFETY: pidfd_open takes a pid and a flags word and returns a new descriptor or -1; no
    // memory is passed.
    let r = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0 as libc::c_uint) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    let raw = RawFd::try_from(r).map_err(|_| io::Error::from_raw_os_error(libc::EBADF))?;
    // SAFETY: `raw` was just returned by the kernel as a new descriptor nobody else owns.
    let fd = unsafe { std::os::fd::OwnedFd::from_raw_fd(raw) };
    // SAFETY: as in `async_fd`: the `OwnedFd` is valid, only it closes it, and the `AsyncFd`
    // owns it from here on.
    unsafe { tokio::io::unix::AsyncFd::register_with_interest(fd, tokio::io::Interest::READABLE) }
        .map_err(io::Error::from)
}

/// Locks `m`. A lock poisoned by a panic elsewhere is taken anyway: every lock of the daemon
/// guards state that each critical section leaves consistent at its every step (no invariant is
/// broken halfway), and a panic in a request is a 500 for that request, not a reason to fail
/// every later request that touches the same data. The one way the crate treats poisoning.
pub fn lock<T: ?Sized>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// `N` random bytes from the kernel (`getrandom(2)`, which never blocks once the kernel's pool is
/// initialised, long before a daemon serves requests) as `2N` hex digits: the one source of
/// random names and ids. Should the call fail (a seccomp filter, say), the time and a
/// process-wide counter stand in: every caller uses these only where a collision is detected or
/// harmless (an `O_EXCL` create, an id that is not a credential).
pub fn random_hex<const N: usize>() -> String {
    use std::fmt::Write;
    let mut b = [0u8; N];
    if getrandom::getrandom(&mut b).is_err() {
        use std::sync::atomic::{AtomicU64, Ordering};
        static SEQ: AtomicU64 = AtomicU64::new(0);
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0);
        let seq = SEQ.fetch_add(1, Ordering::Relaxed);
        for (i, x) in b.iter_mut().enumerate() {
            let w = if i < 8 { t } else { seq };
            *x = (w >> (8 * (i % 8))) as u8;
        }
    }
    let mut out = String::with_capacity(2 * N);
    for x in b {
        let _ = write!(out, "{x:02x}");
    }
    out
}

static TRIM_PENDING: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
/// When the late trim is due, in milliseconds of `trim_clock`; 0 while none is pending.
static LATE_TRIM_DUE: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// How long after the last call of a burst the second trim comes: the runtime's blocking threads
/// idle out 10 s after their last task (tokio's default keep-alive; the first trim's thread is
/// one of them), and what a thread's cache held goes back to its arena only when it ends; then
/// nothing else would trim in an idle daemon.
const LATE_TRIM: std::time::Duration = std::time::Duration::from_secs(12);

fn trim_clock() -> u64 {
    static EPOCH: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    let epoch = *EPOCH.get_or_init(std::time::Instant::now);
    // Never 0 (0 means "none pending").
    u64::try_from(epoch.elapsed().as_millis()).unwrap_or(u64::MAX - 1) + 1
}

/// Gives freed heap memory back to the system shortly (debounced, on the blocking pool), and once
/// more `LATE_TRIM` after the last call of a burst, when its blocking threads have idled out:
/// glibc keeps freed memory of large buffers in its arenas otherwise, and the daemon's RSS would
/// stay at its peak after a load ends (measured in docs/performance.md). The late trim trails:
/// each call moves it, so one burst that follows another (the agents deleted a few seconds after
/// they were started) still gets its own.
pub fn trim_soon() {
    use std::sync::atomic::Ordering;
    let Ok(rt) = tokio::runtime::Handle::try_current() else {
        return;
    };
    let due = trim_clock().saturating_add(LATE_TRIM.as_millis() as u64);
    if LATE_TRIM_DUE.swap(due, Ordering::AcqRel) == 0 {
        rt.spawn(async {
            loop {
                let due = LATE_TRIM_DUE.load(Ordering::Acquire);
                let now = trim_clock();
                if now < due {
                    tokio::time::sleep(std::time::Duration::from_millis(due - now)).await;
                } else if LATE_TRIM_DUE
                    .compare_exchange(due, 0, Ordering::AcqRel, Ordering::Acquire)
                    .is_ok()
                {
                    break;
                }
            }
            let _ = tokio::task::spawn_blocking(trim_heap).await;
        });
    }
    if TRIM_PENDING.swap(true, Ordering::AcqRel) {
        return;
    }
    rt.spawn(async {
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        TRIM_PENDING.store(false, Ordering::Release);
        let _ = tokio::task::spawn_blocking(trim_heap).await;
    });
}

/// A new anonymous memory file (`memfd_create`, close-on-exec), for a reload's hand-off.
pub fn memfd(name: &str) -> io::Result<std::fs::File> {
    let name = std::ffi::CString::new(name).map_err(|_| io::Error::other("NUL in name"))?;
    // SAFETY: memfd_create takes a NUL-terminated name and flags and returns a new descriptor
    // or -1; the name outlives the call.
    let fd = unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a new descriptor nobody else owns.
    Ok(unsafe { std::fs::File::from_raw_fd(fd) })
}

/// Sends `sig` to `pid` with `value` as the signal's value (`sigqueue(3)`): a reload's waiter
/// names its answer socket this way, and the init forwards it unchanged.
pub fn sigqueue(pid: i32, sig: nix::sys::signal::Signal, value: u64) -> io::Result<()> {
    let v = libc::sigval {
        sival_ptr: value as usize as *mut libc::c_void,
    };
    // SAFETY: sigqueue takes a pid, a signal number and a value passed by copy; no pointer is
    // dereferenced (the value is an opaque word for the receiver).
    let r = unsafe { libc::sigqueue(pid, sig as libc::c_int, v) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Takes ownership of descriptor `n`, which a previous image of this process kept open across
/// its exec for us (a reload's hand-off). The caller makes sure each number is taken once.
pub fn inherited_fd(n: RawFd) -> io::Result<std::os::fd::OwnedFd> {
    if n < 3 {
        return Err(io::Error::from_raw_os_error(libc::EBADF));
    }
    // Open at all? (F_GETFD fails with EBADF otherwise.)
    // SAFETY: fcntl(F_GETFD) on any number only reads the descriptor table.
    if unsafe { libc::fcntl(n, libc::F_GETFD) } < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: open (checked above), inherited for us, and taken once by the caller.
    Ok(unsafe { std::os::fd::OwnedFd::from_raw_fd(n) })
}

/// Removes a variable from the process's environment. Only while the process has one thread
/// (the top of `main`).
pub fn remove_env_single_threaded(name: &str) {
    // SAFETY: the caller runs before any other thread exists, so nothing reads the environment
    // concurrently.
    unsafe { std::env::remove_var(name) };
}

/// Bytes as lower-case hex (digests).
pub fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write as _;
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        let _ = write!(s, "{b:02x}");
    }
    s
}

#[cfg(test)]
mod tests {
    #[test]
    fn an_operators_arena_cap_is_left_alone() {
        use super::operator_capped_arenas as capped;
        assert!(capped(true, None));
        assert!(capped(false, Some("glibc.malloc.arena_max=4")));
        assert!(capped(
            false,
            Some("glibc.malloc.tcache_count=0:glibc.malloc.arena_max=1")
        ));
        assert!(!capped(false, None));
        assert!(!capped(false, Some("glibc.malloc.tcache_count=0")));
        assert!(!capped(false, Some("glibc.malloc.arena_test=2")));
    }
}
