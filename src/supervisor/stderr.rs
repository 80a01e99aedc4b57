//! An agent's stderr: read apart from the protocol channel, each line logged with the agent's
//! fields (journald fields under systemd), and the last 64 KiB kept in memory for error bodies and
//! the listing. Memory stays bounded whatever the agent writes (long lines are cut).

use std::sync::{Arc, Mutex};

use tokio::io::AsyncReadExt;
use tokio::process::ChildStderr;

/// How much of an agent's stderr is kept.
pub const TAIL_BYTES: usize = 64 * 1024;
/// Longer lines are logged in pieces of this size.
const MAX_LOG_LINE: usize = 16 * 1024;

/// The last bytes of a stream, bounded.
#[derive(Debug, Default)]
pub struct Tail {
    buf: Vec<u8>,
}

impl Tail {
    pub fn push(&mut self, bytes: &[u8]) {
        if bytes.len() >= TAIL_BYTES {
            self.buf.clear();
            self.buf
                .extend_from_slice(&bytes[bytes.len() - TAIL_BYTES..]);
            return;
        }
        self.buf.extend_from_slice(bytes);
        // Trim in batches so appending stays amortised O(1).
        if self.buf.len() > 2 * TAIL_BYTES {
            let cut = self.buf.len() - TAIL_BYTES;
            self.buf.drain(..cut);
        }
    }

    /// At most `max` bytes from the end, starting on a character boundary, lossy UTF-8.
    pub fn text(&self, max: usize) -> String {
        let max = max.min(TAIL_BYTES);
        let start = self.buf.len().saturating_sub(max);
        let mut s = &self.buf[start..];
        // Skip UTF-8 continuation bytes left from a cut character.
        while let Some((b, rest)) = s.split_first() {
            if b & 0xC0 != 0x80 {
                break;
            }
            s = rest;
        }
        String::from_utf8_lossy(s).into_owned()
    }
}

/// Labels of the agent's log lines.
#[derive(Debug, Clone)]
pub struct Fields {
    pub server_id: String,
    pub agent: String,
    pub pid: u32,
}

/// Reads stderr to EOF: lines to the log and to the tail.
pub async fn forward(mut stderr: ChildStderr, tail: Arc<Mutex<Tail>>, fields: Fields) {
    let mut pending: Vec<u8> = Vec::new();
    let mut chunk = vec![0u8; 8192];
    loop {
        let n = match stderr.read(&mut chunk).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        tail.lock().expect("stderr tail lock").push(&chunk[..n]);
        pending.extend_from_slice(&chunk[..n]);
        while let Some(pos) = pending.iter().position(|b| *b == b'\n') {
            log_line(&fields, &pending[..pos]);
            pending.drain(..=pos);
        }
        while pending.len() >= MAX_LOG_LINE {
            log_line(&fields, &pending[..MAX_LOG_LINE]);
            pending.drain(..MAX_LOG_LINE);
        }
    }
    if !pending.is_empty() {
        log_line(&fields, &pending);
    }
}

fn log_line(f: &Fields, line: &[u8]) {
    let line = String::from_utf8_lossy(line);
    let line = line.trim_end_matches('\r');
    // The line is the message itself, so `journalctl` and plain-text logs show it as is; the
    // target tells agent output from our own.
    tracing::info!(
        target: "sandbox_agent::agent_stderr",
        server_id = f.server_id.as_str(),
        agent = f.agent.as_str(),
        pid = f.pid,
        "{line}"
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tail_keeps_the_last_64_kib() {
        let mut t = Tail::default();
        for i in 0..10_000 {
            t.push(format!("line {i}\n").as_bytes());
        }
        let text = t.text(TAIL_BYTES);
        assert!(text.len() <= TAIL_BYTES);
        assert!(text.ends_with("line 9999\n"));
        assert!(!text.contains("line 10\n"));
        assert!(t.buf.len() <= 2 * TAIL_BYTES);
    }

    #[test]
    fn tail_of_one_huge_write_is_bounded() {
        let mut t = Tail::default();
        t.push(&vec![b'x'; 1 << 20]);
        assert_eq!(t.text(usize::MAX).len(), TAIL_BYTES);
    }

    #[test]
    fn tail_never_starts_inside_a_character() {
        let mut t = Tail::default();
        t.push("ééééé".as_bytes());
        let s = t.text(3);
        assert_eq!(s, "é");
    }
}
