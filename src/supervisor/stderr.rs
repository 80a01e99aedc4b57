//! An agent's stderr: read apart from the protocol channel, each line logged with the agent's
//! fields (journald fields under systemd), and the last 64 KiB kept in memory for error bodies and
//! the listing. Memory stays bounded whatever the agent writes (long lines are cut).
//! **Invariant:** the pipe is always read (within budget an agent never blocks on its stderr),
//! every byte reaches the tail, but only a budget of lines and bytes per second reaches the log
//! (`--agent-stderr-lines`, `--agent-stderr-bytes`); what is over it is counted and the count is
//! logged, so an agent writing in a loop cannot flood the log or hold the runtime thread (over
//! budget the pipe is read at a bounded rate).

use std::sync::{Arc, Mutex};

use tokio::io::AsyncReadExt;
use tokio::process::ChildStderr;

use crate::logging::RateLimit;

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

/// Reads stderr to EOF: every byte to the tail, lines to the log within `budget`.
pub async fn forward(
    mut stderr: ChildStderr,
    tail: Arc<Mutex<Tail>>,
    fields: Fields,
    mut budget: RateLimit,
) {
    let mut pending: Vec<u8> = Vec::new();
    // Small until the agent writes a full one: most agents write little or nothing to stderr,
    // and this buffer is held for as long as the agent runs (64 KiB zeroed per idle agent was
    // most of what an idle instance cost; docs/performance.md, "Density").
    let mut chunk = vec![0u8; 1024];
    loop {
        let n = match stderr.read(&mut chunk).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        if n == chunk.len() && chunk.len() < 64 * 1024 {
            chunk.resize(64 * 1024, 0);
        }
        let data = &chunk[..n];
        crate::sys::lock(&tail).push(data);
        let mut start = 0;
        for pos in memchr::memchr_iter(b'\n', data) {
            let piece = &data[start..pos];
            start = pos + 1;
            if pending.is_empty() {
                offer(&fields, &mut budget, piece);
            } else {
                pending.extend_from_slice(piece);
                offer(&fields, &mut budget, &pending);
                pending.clear();
            }
        }
        pending.extend_from_slice(&data[start..]);
        while pending.len() >= MAX_LOG_LINE {
            offer(&fields, &mut budget, &pending[..MAX_LOG_LINE]);
            pending.drain(..MAX_LOG_LINE);
        }
        report(&fields, &mut budget, false);
        if budget.exhausted() {
            // Over budget the pipe is read at most 64 KiB per 10 ms (6.4 MB/s): what an agent
            // writes faster than that waits in its pipe, so a write loop costs the daemon a
            // bounded share of its one runtime thread.
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
    }
    if !pending.is_empty() {
        offer(&fields, &mut budget, &pending);
    }
    report(&fields, &mut budget, true);
}

/// Logs the line (in pieces of at most `MAX_LOG_LINE`) when the budget allows, else counts it.
fn offer(f: &Fields, budget: &mut RateLimit, line: &[u8]) {
    for piece in line.chunks(MAX_LOG_LINE) {
        if budget.admit(piece.len()) {
            log_line(f, piece);
        }
    }
}

/// Logs how much was held back (at most once a second, and once more at the end).
fn report(f: &Fields, budget: &mut RateLimit, force: bool) {
    if let Some((lines, bytes)) = budget.take_report(force) {
        tracing::warn!(
            target: "sandbox_agent::agent_stderr",
            server_id = f.server_id.as_str(),
            agent = f.agent.as_str(),
            pid = f.pid,
            dropped_lines = lines,
            dropped_bytes = bytes,
            "agent stderr over its log budget: {lines} lines not logged (all kept in the stderr tail's last 64 KiB)"
        );
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
