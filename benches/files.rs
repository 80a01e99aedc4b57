//! Filesystem benchmark (not a test): the daemon's `/v1/fs` against what a user would use
//! instead, on the same data — GET of 1 GiB vs nginx with sendfile, PUT of 1 GiB vs
//! `dd conv=fsync`, upload-batch of a 10,000-file tar vs `tar -x` — with the daemon's peak RSS
//! growth during each. Prints figures and ratios; asserts nothing.
//!
//! Run: `cargo bench --bench files` (needs `nginx`, `dd`, `tar`; `apt-get install -y nginx`).
//! Knobs: `BENCH_RUNS` (alternating runs, default 3), `BENCH_ONLY=get,put,upload`,
//! `FILES_BENCH_MIB` (size of the GET/PUT file, default 1024), `FILES_BENCH_DIRS` (directories
//! of 100 files in the tar, default 100), `FILES_BENCH_DATA` (a directory where the file and the
//! tar are made once and reused by later runs), `SANDBOX_AGENT_BIN` (another daemon build, as
//! `benches/ab.sh` does), `BENCH_AB` (also print the figures for `benches/ab.sh`).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use futures_util::StreamExt;

mod common;
use common::{ab_figure, daemon_bin, free_port, knob};

const BIN: &str = env!("CARGO_BIN_EXE_sandbox-agent");
const RUNS: usize = 3;

fn wait_http(url: &str) {
    let deadline = Instant::now() + Duration::from_secs(20);
    let host = url
        .trim_start_matches("http://")
        .split('/')
        .next()
        .unwrap()
        .to_string();
    while std::net::TcpStream::connect(&host).is_err() {
        assert!(Instant::now() < deadline, "{url} never came up");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn status_kib(pid: u32, key: &str) -> u64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    s.lines()
        .find_map(|l| l.strip_prefix(key))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

/// Resets the peak-RSS counter and returns the current RSS (KiB).
fn rss_mark(pid: u32) -> u64 {
    let _ = std::fs::write(format!("/proc/{pid}/clear_refs"), "5");
    status_kib(pid, "VmRSS:")
}

/// Outcome of a [`duel`]: best wall time and mean CPU seconds per run of each side.
struct Duel {
    ours: Duration,
    theirs: Duration,
    ours_cpu: f64,
    theirs_cpu: f64,
}

/// Runs `ours` and `theirs` alternately (the machine is shared, so noise hits both alike),
/// keeping the best wall time of each and the mean CPU time (`*_cpu` read cumulative seconds of
/// whoever does the work: the daemon, nginx, or this process's children).
fn duel(
    mut ours: impl FnMut() -> Duration,
    ours_cpu: impl Fn() -> f64,
    mut theirs: impl FnMut() -> Duration,
    theirs_cpu: impl Fn() -> f64,
) -> Duel {
    let runs = std::env::var("BENCH_RUNS")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(RUNS);
    let mut d = Duel {
        ours: Duration::MAX,
        theirs: Duration::MAX,
        ours_cpu: 0.0,
        theirs_cpu: 0.0,
    };
    for _ in 0..runs {
        let c = ours_cpu();
        d.ours = d.ours.min(ours());
        d.ours_cpu += (ours_cpu() - c) / runs as f64;
        let c = theirs_cpu();
        d.theirs = d.theirs.min(theirs());
        d.theirs_cpu += (theirs_cpu() - c) / runs as f64;
    }
    d
}

/// Cumulative user+system CPU seconds of `pid`.
fn proc_cpu(pid: u32) -> f64 {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let rest: Vec<&str> = s
        .rsplit_once(") ")
        .map(|(_, r)| r.split(' ').collect())
        .unwrap_or_default();
    let ticks: f64 = [11, 12]
        .iter()
        .filter_map(|&i| rest.get(i)?.parse::<f64>().ok())
        .sum();
    let hz = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
        .ok()
        .flatten()
        .unwrap_or(100);
    ticks / hz as f64
}

/// Cumulative user+system CPU seconds of this process's waited-for children (dd, tar).
fn children_cpu() -> f64 {
    let u = nix::sys::resource::getrusage(nix::sys::resource::UsageWho::RUSAGE_CHILDREN).unwrap();
    let t = |tv: nix::sys::time::TimeVal| tv.tv_sec() as f64 + tv.tv_usec() as f64 / 1e6;
    t(u.user_time()) + t(u.system_time())
}

/// Lets writeback of earlier runs finish so it does not slow the next measurement.
fn settle() {
    let _ = Command::new("sync").status();
}

fn mib_s(bytes: u64, d: Duration) -> f64 {
    bytes as f64 / (1 << 20) as f64 / d.as_secs_f64()
}

fn write_pattern(path: &Path, len: u64) {
    let mut f = std::io::BufWriter::with_capacity(1 << 20, std::fs::File::create(path).unwrap());
    let mut x: u64 = 0x9E3779B97F4A7C15;
    let mut block = vec![0u8; 1 << 20];
    let mut left = len;
    while left > 0 {
        for c in block.chunks_mut(8) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            c.copy_from_slice(&x.to_le_bytes()[..c.len()]);
        }
        let n = left.min(block.len() as u64) as usize;
        f.write_all(&block[..n]).unwrap();
        left -= n as u64;
    }
    f.flush().unwrap();
}

struct Guard(Child);
impl Drop for Guard {
    fn drop(&mut self) {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.0.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        );
        let _ = self.0.wait();
    }
}

async fn download(client: &reqwest::Client, url: &str) -> (u64, Duration) {
    let t = Instant::now();
    let r = client.get(url).send().await.unwrap();
    assert!(r.status().is_success(), "{url}: {}", r.status());
    let mut s = r.bytes_stream();
    let mut n = 0u64;
    while let Some(c) = s.next().await {
        n += c.unwrap().len() as u64;
    }
    (n, t.elapsed())
}

async fn send_file(req: reqwest::RequestBuilder, path: &Path) -> Duration {
    let f = tokio::fs::File::open(path).await.unwrap();
    let len = f.metadata().await.unwrap().len();
    let stream = tokio_util::io::ReaderStream::with_capacity(f, 1 << 20);
    let t = Instant::now();
    let r = req
        .header("content-length", len)
        .body(reqwest::Body::wrap_stream(stream))
        .send()
        .await
        .unwrap();
    let status = r.status();
    let text = r.text().await.unwrap();
    assert!(status.is_success(), "{status}: {text}");
    t.elapsed()
}

fn run(cmd: &mut Command) -> Duration {
    let t = Instant::now();
    let s = cmd.status().unwrap();
    assert!(s.success(), "{cmd:?}");
    t.elapsed()
}

fn main() {
    sandbox_agent::install_crypto_provider();
    let base = std::env::var_os("BENCH_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_TARGET_TMPDIR")));
    let dir = tempfile::tempdir_in(&base).unwrap();
    let root = dir.path().to_path_buf();
    let size: u64 = knob("FILES_BENCH_MIB", 1024u64) << 20;
    let dirs: usize = knob("FILES_BENCH_DIRS", 100);
    let files = dirs * 100;
    // The data: made in the scratch directory, or once in `FILES_BENCH_DATA` and reused.
    let data = std::env::var_os("FILES_BENCH_DATA")
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join("data-in"));
    let www = data.join(format!("www-{}", size >> 20));
    std::fs::create_dir_all(&www).unwrap();
    let big = www.join("big.bin");
    if std::fs::metadata(&big).map(|m| m.len()).ok() != Some(size) {
        eprintln!("preparing a {} MiB file in {}", size >> 20, www.display());
        write_pattern(&big, size);
    }
    let tarball = data.join(format!("tree-{dirs}.tar"));
    if !tarball.exists() {
        eprintln!("preparing a {files}-file tar in {}", data.display());
        let tree = root.join("tree");
        for d in 0..dirs {
            let sub = tree.join(format!("d{d:03}"));
            std::fs::create_dir_all(&sub).unwrap();
            for f in 0..100 {
                let n = 512 + ((d * 100 + f) * 37) % 4096;
                std::fs::write(
                    sub.join(format!("f{f:03}.txt")),
                    vec![b'a' + (f % 26) as u8; n],
                )
                .unwrap();
            }
        }
        let partial = data.join(format!("tree-{dirs}.tar.part"));
        assert!(
            Command::new("tar")
                .arg("-cf")
                .arg(&partial)
                .arg("-C")
                .arg(&tree)
                .arg(".")
                .status()
                .unwrap()
                .success()
        );
        std::fs::rename(&partial, &tarball).unwrap();
        let _ = std::fs::remove_dir_all(&tree);
    }
    let tar_len = std::fs::metadata(&tarball).unwrap().len();
    let bin = daemon_bin(BIN);

    let port = free_port();
    let daemon = Guard(
        Command::new(&bin)
            .args([
                "server",
                "--host",
                "127.0.0.1",
                "--no-token",
                "--log-format",
                "json",
            ])
            .arg("--port")
            .arg(port.to_string())
            .arg("--work-dir")
            .arg(&root)
            .arg("--data-dir")
            .arg(root.join("data"))
            .env("RUST_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let pid = daemon.0.id();
    let api = format!("http://127.0.0.1:{port}");
    wait_http(&api);

    let nginx_port = free_port();
    let conf = root.join("nginx.conf");
    std::fs::write(
        &conf,
        format!(
            "daemon off; master_process off; worker_processes 1; pid {r}/nginx.pid;\n\
             error_log {r}/nginx-error.log;\n\
             events {{ worker_connections 64; }}\n\
             http {{ access_log off; sendfile on; tcp_nopush on;\n\
               client_body_temp_path {r}/nb; proxy_temp_path {r}/np; fastcgi_temp_path {r}/nf;\n\
               uwsgi_temp_path {r}/nu; scgi_temp_path {r}/ns;\n\
               server {{ listen 127.0.0.1:{nginx_port}; root {w}; }} }}\n",
            r = root.display(),
            w = www.display()
        ),
    )
    .unwrap();
    let nginx = Command::new("nginx")
        .arg("-c")
        .arg(&conf)
        .arg("-p")
        .arg(&root)
        .stderr(Stdio::null())
        .spawn()
        .ok()
        .map(Guard);
    if nginx.is_none() {
        eprintln!("nginx not found: apt-get install -y nginx (the GET comparison is skipped)");
    } else {
        wait_http(&format!("http://127.0.0.1:{nginx_port}"));
    }

    let rt = tokio::runtime::Runtime::new().unwrap();
    let client = reqwest::Client::builder().no_proxy().build().unwrap();
    let big_q = format!("{api}/v1/fs/file?path={}", big.display());
    println!(
        "# Filesystem benchmark (best of {} alternating runs; daemon {bin})",
        knob("BENCH_RUNS", RUNS)
    );
    println!(
        "| operation | sandbox-agent | alternative | ratio | CPU per run (ours / theirs) | daemon peak RSS growth (MiB) |"
    );
    println!("|---|---|---|---|---|---|");

    let only = std::env::var("BENCH_ONLY").unwrap_or_default();
    let want = |what: &str| only.is_empty() || only.split(',').any(|w| w == what);

    // GET
    if want("get") {
        let nginx_url = format!("http://127.0.0.1:{nginx_port}/big.bin");
        let get = |url: &str| {
            let (n, d) = rt.block_on(download(&client, url));
            assert_eq!(n, size);
            d
        };
        let base_rss = rss_mark(pid);
        let nginx_pid = nginx.as_ref().map(|n| n.0.id());
        let d = match nginx_pid {
            Some(np) => duel(
                || get(&big_q),
                || proc_cpu(pid),
                || get(&nginx_url),
                || proc_cpu(np),
            ),
            None => duel(|| get(&big_q), || proc_cpu(pid), || Duration::ZERO, || 0.0),
        };
        let rss = status_kib(pid, "VmHWM:").saturating_sub(base_rss);
        let theirs = nginx_pid.map(|_| mib_s(size, d.theirs));
        ab_figure(
            "files GET MiB/s",
            mib_s(size, d.ours),
            theirs.map(|t| ("nginx sendfile", t)),
        );
        print_row(
            &format!("GET {} MiB", size >> 20),
            "MiB/s",
            mib_s(size, d.ours),
            theirs,
            "nginx sendfile",
            &d,
            rss,
        );
    }

    // PUT
    if want("put") {
        let dst = root.join("put.bin");
        settle();
        let base_rss = rss_mark(pid);
        let d = duel(
            || {
                let _ = std::fs::remove_file(&dst);
                settle();
                let req = client
                    .put(format!("{api}/v1/fs/file?path={}", dst.display()))
                    .header("content-type", "application/octet-stream");
                let d = rt.block_on(send_file(req, &big));
                assert_eq!(std::fs::metadata(&dst).unwrap().len(), size);
                d
            },
            || proc_cpu(pid),
            || {
                let _ = std::fs::remove_file(&dst);
                settle();
                run(Command::new("dd")
                    .arg(format!("if={}", big.display()))
                    .arg(format!("of={}", dst.display()))
                    .args(["bs=1M", "conv=fsync", "status=none"]))
            },
            children_cpu,
        );
        let rss = status_kib(pid, "VmHWM:").saturating_sub(base_rss);
        let (ours, theirs) = (mib_s(size, d.ours), mib_s(size, d.theirs));
        ab_figure(
            "files PUT MiB/s",
            ours,
            Some(("dd bs=1M conv=fsync", theirs)),
        );
        print_row(
            &format!("PUT {} MiB", size >> 20),
            "MiB/s",
            ours,
            Some(theirs),
            "dd bs=1M conv=fsync",
            &d,
            rss,
        );
        let _ = std::fs::remove_file(&dst);
    }

    // upload-batch
    if want("upload") {
        let out = root.join("out");
        settle();
        let base_rss = rss_mark(pid);
        let d = duel(
            || {
                let _ = std::fs::remove_dir_all(&out);
                settle();
                let req = client
                    .post(format!("{api}/v1/fs/upload-batch?path={}", out.display()))
                    .header("content-type", "application/x-tar");
                let d = rt.block_on(send_file(req, &tarball));
                assert_eq!(
                    walk_count(&out),
                    files + dirs,
                    "every file and directory extracted"
                );
                d
            },
            || proc_cpu(pid),
            || {
                let _ = std::fs::remove_dir_all(&out);
                std::fs::create_dir_all(&out).unwrap();
                settle();
                run(Command::new("tar")
                    .arg("-xf")
                    .arg(&tarball)
                    .arg("-C")
                    .arg(&out))
            },
            children_cpu,
        );
        let rss = status_kib(pid, "VmHWM:").saturating_sub(base_rss);
        let files_s = |t: Duration| files as f64 / t.as_secs_f64();
        ab_figure(
            "files upload-batch files/s",
            files_s(d.ours),
            Some(("tar -x", files_s(d.theirs))),
        );
        let what = format!(
            "upload-batch {files} files ({:.1} MiB tar)",
            tar_len as f64 / (1 << 20) as f64
        );
        print_row(
            &what,
            "files/s",
            files_s(d.ours),
            Some(files_s(d.theirs)),
            "tar -x",
            &d,
            rss,
        );
    }
    drop(nginx);
    drop(daemon);
}

fn walk_count(dir: &Path) -> usize {
    std::fs::read_dir(dir)
        .map(|rd| {
            rd.flatten()
                .map(|e| {
                    1 + if e.file_type().unwrap().is_dir() {
                        walk_count(&e.path())
                    } else {
                        0
                    }
                })
                .sum()
        })
        .unwrap_or(0)
}

fn print_row(
    what: &str,
    unit: &str,
    ours: f64,
    theirs: Option<f64>,
    vs: &str,
    d: &Duel,
    rss_kib: u64,
) {
    let ratio = theirs
        .map(|t| format!("{:.2}x", ours / t))
        .unwrap_or_else(|| "-".into());
    let theirs = theirs
        .map(|t| format!("{t:.0} {unit}"))
        .unwrap_or_else(|| "skipped".into());
    println!(
        "| {what} | {ours:.0} {unit} | {theirs} ({vs}) | {ratio} | {:.2} s / {:.2} s | {:.1} |",
        d.ours_cpu,
        d.theirs_cpu,
        rss_kib as f64 / 1024.0
    );
}
