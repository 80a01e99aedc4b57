//! `/v1/ports`: the TCP listeners inside the sandbox, read from `/proc/net/tcp{,6}` (state
//! LISTEN) and tied to their pids through the socket inodes in `/proc/<pid>/fd`. Invariants: a
//! scan is blocking work (on the blocking pool) bounded by [`MAX_FDS_PER_SCAN`] descriptors;
//! inode owners are cached, so `/proc/*/fd` is walked only when an unknown listener appears; the
//! daemon's own listeners are never reported; the change feed is one shared task that polls
//! every [`POLL`] and exists only while someone subscribes.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::broadcast;
use tokio_util::sync::CancellationToken;

/// How often the change feed looks.
pub const POLL: Duration = Duration::from_secs(1);
/// At most this many descriptors are looked at in one walk of `/proc/*/fd`.
pub const MAX_FDS_PER_SCAN: usize = 200_000;
/// The longest command line reported.
const COMMAND_CAP: usize = 512;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listener {
    pub port: u16,
    pub address: String,
    pub pid: Option<u32>,
    pub command: Option<String>,
    pub process_id: Option<String>,
    pub server_id: Option<String>,
}

#[derive(Debug, Clone)]
pub enum PortEvent {
    Open(Listener),
    Close(Listener),
}

/// One LISTEN line of `/proc/net/tcp{,6}`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RawListener {
    pub port: u16,
    pub address: String,
    pub inode: u64,
}

/// Parses `/proc/net/tcp` or `tcp6` text: the LISTEN (`0A`) entries.
pub fn parse_proc_net(text: &str, v6: bool) -> Vec<RawListener> {
    let mut out = Vec::new();
    for line in text.lines().skip(1) {
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.len() < 10 || f[3] != "0A" {
            continue;
        }
        let Some((addr, port)) = f[1].split_once(':') else {
            continue;
        };
        let Ok(port) = u16::from_str_radix(port, 16) else {
            continue;
        };
        let Ok(inode) = f[9].parse::<u64>() else {
            continue;
        };
        let Some(address) = parse_addr(addr, v6) else {
            continue;
        };
        out.push(RawListener {
            port,
            address,
            inode,
        });
    }
    out
}

/// The kernel prints addresses as 32-bit words in host (little-endian here) order.
fn parse_addr(hex: &str, v6: bool) -> Option<String> {
    let words: Vec<u32> = (0..hex.len() / 8)
        .map(|i| u32::from_str_radix(&hex[i * 8..i * 8 + 8], 16).map(u32::from_be))
        .collect::<Result<_, _>>()
        .ok()?;
    if !v6 && words.len() == 1 {
        let b = words[0].to_be_bytes();
        return Some(std::net::Ipv4Addr::new(b[0], b[1], b[2], b[3]).to_string());
    }
    if v6 && words.len() == 4 {
        let mut bytes = [0u8; 16];
        for (i, w) in words.iter().enumerate() {
            bytes[i * 4..i * 4 + 4].copy_from_slice(&w.to_be_bytes());
        }
        return Some(std::net::Ipv6Addr::from(bytes).to_string());
    }
    None
}

/// Socket inode → pid, kept between scans.
#[derive(Default)]
pub struct InodeOwners {
    owners: HashMap<u64, u32>,
}

fn socket_inodes(pid: &str, budget: &mut usize, mut found: impl FnMut(u64)) {
    let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
        return;
    };
    for e in dir.flatten() {
        if *budget == 0 {
            return;
        }
        *budget -= 1;
        if let Ok(target) = std::fs::read_link(e.path())
            && let Some(rest) = target.to_str().and_then(|t| t.strip_prefix("socket:["))
            && let Ok(inode) = rest.trim_end_matches(']').parse::<u64>()
        {
            found(inode);
        }
    }
}

impl InodeOwners {
    /// The listeners now, without the daemon's own, each with its pid when found.
    pub fn scan(&mut self) -> Vec<(RawListener, Option<u32>)> {
        let mut raw = Vec::new();
        for (file, v6) in [("/proc/net/tcp", false), ("/proc/net/tcp6", true)] {
            if let Ok(t) = std::fs::read_to_string(file) {
                raw.extend(parse_proc_net(&t, v6));
            }
        }
        let mut own = HashSet::new();
        let mut budget = MAX_FDS_PER_SCAN;
        socket_inodes("self", &mut budget, |i| {
            own.insert(i);
        });
        raw.retain(|l| !own.contains(&l.inode));
        // A cached owner that has gone (or reused its fd) is looked up again.
        self.owners.retain(|inode, pid| {
            raw.iter().any(|l| l.inode == *inode)
                && std::path::Path::new(&format!("/proc/{pid}")).exists()
        });
        let unknown: HashSet<u64> = raw
            .iter()
            .map(|l| l.inode)
            .filter(|i| !self.owners.contains_key(i))
            .collect();
        if !unknown.is_empty()
            && let Ok(procs) = std::fs::read_dir("/proc")
        {
            let mut left = unknown.len();
            let me = std::process::id();
            for p in procs.flatten() {
                let name = p.file_name();
                let Some(pid) = name.to_str().and_then(|n| n.parse::<u32>().ok()) else {
                    continue;
                };
                if pid == me || budget == 0 || left == 0 {
                    continue;
                }
                socket_inodes(&pid.to_string(), &mut budget, |i| {
                    if unknown.contains(&i) && !self.owners.contains_key(&i) {
                        self.owners.insert(i, pid);
                        left = left.saturating_sub(1);
                    }
                });
            }
        }
        raw.into_iter()
            .map(|l| {
                let pid = self.owners.get(&l.inode).copied();
                (l, pid)
            })
            .collect()
    }
}

pub fn command_of(pid: u32) -> Option<String> {
    let raw = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    let mut s: String = raw
        .split(|b| *b == 0)
        .filter(|a| !a.is_empty())
        .map(|a| String::from_utf8_lossy(a).into_owned())
        .collect::<Vec<_>>()
        .join(" ");
    if s.is_empty() {
        s = std::fs::read_to_string(format!("/proc/{pid}/comm"))
            .ok()?
            .trim()
            .to_string();
    }
    if s.len() > COMMAND_CAP {
        let mut cut = COMMAND_CAP;
        while !s.is_char_boundary(cut) {
            cut -= 1;
        }
        s.truncate(cut);
    }
    Some(s)
}

/// `pid` and its ancestors (at most 64), nearest first.
pub fn ancestry(pid: u32) -> Vec<u32> {
    let mut chain = vec![pid];
    let mut cur = pid;
    for _ in 0..64 {
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{cur}/stat")) else {
            break;
        };
        let Some((_, rest)) = stat.rsplit_once(") ") else {
            break;
        };
        let Some(ppid) = rest.split(' ').nth(1).and_then(|p| p.parse::<u32>().ok()) else {
            break;
        };
        if ppid <= 1 {
            break;
        }
        chain.push(ppid);
        cur = ppid;
    }
    chain
}

/// The listeners and their change feed.
pub struct Ports {
    owners: Arc<std::sync::Mutex<InodeOwners>>,
    processes: Arc<crate::processes::ProcessService>,
    acp: Arc<crate::acp::AcpService>,
    tx: broadcast::Sender<PortEvent>,
    watch: tokio::sync::Mutex<WatchState>,
    shutdown: CancellationToken,
}

#[derive(Default)]
struct WatchState {
    running: bool,
    current: Vec<Listener>,
}

impl Ports {
    pub fn new(
        processes: Arc<crate::processes::ProcessService>,
        acp: Arc<crate::acp::AcpService>,
        shutdown: CancellationToken,
    ) -> Self {
        let (tx, _) = broadcast::channel(1024);
        Ports {
            owners: Arc::default(),
            processes,
            acp,
            tx,
            watch: tokio::sync::Mutex::new(WatchState::default()),
            shutdown,
        }
    }

    /// The listeners now, sorted by port then address, each with its process or agent when its
    /// pid (or an ancestor's) is one of ours.
    pub async fn list(&self) -> Vec<Listener> {
        let owners = self.owners.clone();
        let found = tokio::task::spawn_blocking(move || {
            let found = crate::sys::lock(&owners).scan();
            found
                .into_iter()
                .map(|(l, pid)| {
                    let (command, chain) = match pid {
                        Some(p) => (command_of(p), ancestry(p)),
                        None => (None, Vec::new()),
                    };
                    (l, pid, command, chain)
                })
                .collect::<Vec<_>>()
        })
        .await
        .unwrap_or_default();
        let need_owner = found.iter().any(|f| f.1.is_some());
        let (procs, servers) = if need_owner {
            (self.processes.list().await, self.acp.list().await)
        } else {
            (Vec::new(), Vec::new())
        };
        let mut out: Vec<Listener> = found
            .into_iter()
            .map(|(l, pid, command, chain)| {
                let mut process_id = None;
                let mut server_id = None;
                for p in &chain {
                    if let Some(x) = procs.iter().find(|x| x.pid == Some(*p)) {
                        process_id = Some(x.id.clone());
                        break;
                    }
                    if let Some(s) = servers.iter().find(|s| s.pid == Some(*p)) {
                        server_id = Some(s.server_id.clone());
                        break;
                    }
                }
                Listener {
                    port: l.port,
                    address: l.address,
                    pid,
                    command,
                    process_id,
                    server_id,
                }
            })
            .collect();
        out.sort_by(|a, b| a.port.cmp(&b.port).then(a.address.cmp(&b.address)));
        out.dedup_by(|a, b| a.port == b.port && a.address == b.address);
        out
    }

    /// Whether something listens on `port` (any address), for the proxy's 502.
    pub async fn is_listening(&self, port: u16) -> bool {
        self.list().await.iter().any(|l| l.port == port)
    }

    /// The listeners now and a feed of the changes after them. The first subscriber starts the
    /// poller; it ends by itself once nobody subscribes.
    pub async fn subscribe(self: &Arc<Self>) -> (Vec<Listener>, broadcast::Receiver<PortEvent>) {
        let mut w = self.watch.lock().await;
        let rx = self.tx.subscribe();
        if !w.running {
            w.current = self.list().await;
            w.running = true;
            let me = self.clone();
            tokio::spawn(async move { me.poll().await });
        }
        (w.current.clone(), rx)
    }

    async fn poll(self: Arc<Self>) {
        loop {
            tokio::select! {
                _ = tokio::time::sleep(POLL) => {}
                _ = self.shutdown.cancelled() => {
                    self.watch.lock().await.running = false;
                    return;
                }
            }
            if self.tx.receiver_count() == 0 {
                let mut w = self.watch.lock().await;
                if self.tx.receiver_count() == 0 {
                    w.running = false;
                    return;
                }
            }
            let now = self.list().await;
            let mut w = self.watch.lock().await;
            let key = |l: &Listener| (l.port, l.address.clone());
            let before: HashSet<_> = w.current.iter().map(key).collect();
            let after: HashSet<_> = now.iter().map(key).collect();
            for l in &w.current {
                if !after.contains(&key(l)) {
                    let _ = self.tx.send(PortEvent::Close(l.clone()));
                }
            }
            for l in &now {
                if !before.contains(&key(l)) {
                    let _ = self.tx.send(PortEvent::Open(l.clone()));
                }
            }
            w.current = now;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listen_lines_of_both_families_are_read() {
        let v4 = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n   \
0: 0100007F:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 12345 1 0 100 0 0 10 0\n   \
1: 0100007F:1F91 0100007F:C350 01 00000000:00000000 00:00000000 00000000     0        0 12346 1 0 100 0 0 10 0\n";
        assert_eq!(
            parse_proc_net(v4, false),
            vec![RawListener {
                port: 8080,
                address: "127.0.0.1".into(),
                inode: 12345
            }]
        );
        let v6 = "  sl  local_address                         remote_address                        st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n   \
0: 00000000000000000000000001000000:0016 00000000000000000000000000000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 777 1 0 100 0 0 10 0\n";
        assert_eq!(
            parse_proc_net(v6, true),
            vec![RawListener {
                port: 22,
                address: "::1".into(),
                inode: 777
            }]
        );
    }
}
