//! A pseudo-terminal for a tty process: `openpty`, the master side made non-blocking and driven by
//! the reactor (no thread per terminal), the slave side handed to the supervisor as the child's
//! stdin/stdout/stderr and controlling terminal.
//!
//! **Invariant:** the daemon keeps only the master open after the spawn, so a read of the master
//! ends (EIO) exactly when every process holding the terminal is gone.

use std::io;
use std::os::fd::{AsFd, OwnedFd};

use nix::fcntl::{FcntlArg, FdFlag, OFlag, fcntl};
use tokio::io::unix::AsyncFd;

pub struct Pty {
    master: AsyncFd<OwnedFd>,
}

/// Opens a terminal of `cols`×`rows`; returns the master and the slave for the child.
pub fn open(cols: u16, rows: u16) -> io::Result<(Pty, OwnedFd)> {
    let size = nix::pty::Winsize {
        ws_row: rows,
        ws_col: cols,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    let pair = nix::pty::openpty(&size, None).map_err(io::Error::from)?;
    // Neither side may leak into other children (the slave reaches its child through dup2,
    // which clears the flag on the copy).
    for fd in [&pair.master, &pair.slave] {
        fcntl(fd, FcntlArg::F_SETFD(FdFlag::FD_CLOEXEC)).map_err(io::Error::from)?;
    }
    let flags = fcntl(&pair.master, FcntlArg::F_GETFL).map_err(io::Error::from)?;
    fcntl(
        &pair.master,
        FcntlArg::F_SETFL(OFlag::from_bits_truncate(flags) | OFlag::O_NONBLOCK),
    )
    .map_err(io::Error::from)?;
    let master = crate::sys::async_fd(pair.master)?;
    Ok((Pty { master }, pair.slave))
}

impl Pty {
    /// The master side (for a reload's hand-off).
    pub fn fd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.master.get_ref().as_fd()
    }

    /// A terminal whose master was handed over by the previous image (already non-blocking and
    /// close-on-exec is set again by the hand-off).
    pub fn from_master(master: OwnedFd) -> io::Result<Pty> {
        Ok(Pty {
            master: crate::sys::async_fd(master)?,
        })
    }

    /// Reads what the terminal wrote; `Ok(0)` once every holder of the slave side is gone.
    pub async fn read(&self, buf: &mut [u8]) -> io::Result<usize> {
        loop {
            let mut guard = self.master.readable().await?;
            match guard
                .try_io(|fd| nix::unistd::read(fd.get_ref().as_fd(), buf).map_err(io::Error::from))
            {
                Ok(Ok(n)) => return Ok(n),
                // Linux answers EIO on the master once the slave side is closed everywhere.
                Ok(Err(e)) if e.raw_os_error() == Some(libc::EIO) => return Ok(0),
                Ok(Err(e)) if e.kind() == io::ErrorKind::Interrupted => continue,
                Ok(Err(e)) => return Err(e),
                Err(_would_block) => continue,
            }
        }
    }

    /// Writes all of `data` to the terminal (the child's input).
    pub async fn write_all(&self, mut data: &[u8]) -> io::Result<()> {
        while !data.is_empty() {
            let mut guard = self.master.writable().await?;
            match guard.try_io(|fd| nix::unistd::write(fd.get_ref(), data).map_err(io::Error::from))
            {
                Ok(Ok(n)) => data = &data[n..],
                Ok(Err(e)) if e.kind() == io::ErrorKind::Interrupted => continue,
                Ok(Err(e)) => return Err(e),
                Err(_would_block) => continue,
            }
        }
        Ok(())
    }

    /// TIOCSWINSZ; the kernel signals SIGWINCH to the terminal's foreground process group.
    pub fn resize(&self, cols: u16, rows: u16) -> io::Result<()> {
        crate::sys::set_window_size(self.master.get_ref().as_fd(), cols, rows)
    }
}
