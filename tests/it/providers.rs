//! The TypeScript SDK's sandbox providers against real engines. Builds our image once
//! (tests/system/build-image.sh: tagged by its inputs, so later runs reuse it), starts
//! `podman system service` on a private socket, and runs the provider suites with node:
//! - `sdks/typescript/test/providers/docker.test.mjs`: our SDK's `docker` provider (start, mock
//!   session with streamed updates and a permission, files, a process, pause, reconnect by id,
//!   destroy; the typed errors of a bad image, a daemon never healthy, a wrong token);
//! - `tests/compat/docker-provider.test.mjs`: the published `sandbox-agent` 0.4.2 SDK's own
//!   `docker` provider, unchanged, against our image (in a private mount namespace where
//!   `/var/run/docker.sock`, the only socket it knows, is Podman's);
//!
//! and after each checks on the engine that nothing is left: no container of the image, no new
//! volume, no new network. The Kubernetes suite runs only when KUBECONFIG is set at build time
//! (`cfg(kubeconfig)`, from build.rs); otherwise the test is ignored, which the summary reports
//! as not run. Skips (strict in CI) without root, podman, node or the npm packages
//! (`.ci/install-providers.sh`).

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use crate::support::{BIN, is_root, on_path, skip};

const REPO: &str = env!("CARGO_MANIFEST_DIR");
/// Bound on one node suite (the docker suite takes about a minute here).
const SUITE_TIMEOUT: Duration = Duration::from_secs(600);

/// The docker suites share one image and are checked for leftovers by image: one at a time.
static ENGINE: Mutex<()> = Mutex::new(());

fn sdk_dir() -> PathBuf {
    Path::new(REPO).join("sdks/typescript")
}

/// Checks what every docker suite needs; says what is missing as a skip.
fn ready_for_podman() -> bool {
    if !is_root() {
        skip("podman (rootful, as in CI): needs root");
        return false;
    }
    for tool in [
        "podman",
        "runc",
        "debootstrap",
        "node",
        "npm",
        "unshare",
        "flock",
    ] {
        if !on_path(tool) {
            skip(&format!(
                "`{tool}` is not installed (.ci/install-providers.sh)"
            ));
            return false;
        }
    }
    for (dir, what) in [
        (sdk_dir().join("node_modules/typescript"), "sdks/typescript"),
        (
            Path::new(REPO).join("tests/compat/node_modules/sandbox-agent"),
            "tests/compat",
        ),
    ] {
        if !dir.is_dir() {
            skip(&format!(
                "{what} has no node_modules (.ci/install-providers.sh runs npm ci)"
            ));
            return false;
        }
    }
    true
}

/// Our image, built once per set of inputs (binary, Dockerfile, base tree).
pub(crate) fn image() -> String {
    static IMAGE: OnceLock<String> = OnceLock::new();
    IMAGE
        .get_or_init(|| {
            let target = Path::new(BIN).parent().unwrap().parent().unwrap();
            let root = target.join("system/rootfs");
            let out = Command::new(format!("{REPO}/tests/system/rootfs.sh"))
                .arg(&root)
                .output()
                .expect("run rootfs.sh");
            assert!(
                out.status.success(),
                "debootstrap failed:\n{}",
                String::from_utf8_lossy(&out.stderr)
            );
            let out = Command::new(format!("{REPO}/tests/system/build-image.sh"))
                .arg(&root)
                .arg(BIN)
                .output()
                .expect("run build-image.sh");
            assert!(
                out.status.success(),
                "image build failed:\n{}",
                String::from_utf8_lossy(&out.stderr)
            );
            String::from_utf8(out.stdout).unwrap().trim().to_string()
        })
        .clone()
}

/// The SDK's `dist/`, built once (`tsc -b`; the SDK suite builds it too, under the same lock).
fn build_sdk() {
    static BUILT: OnceLock<()> = OnceLock::new();
    BUILT.get_or_init(|| {
        let _lock = crate::support::SDK_BUILD
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        let out = Command::new("npm")
            .args(["run", "build"])
            .current_dir(sdk_dir())
            .output()
            .expect("npm run build");
        assert!(
            out.status.success(),
            "SDK build failed:\n{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    });
}

/// `podman system service` on a socket in a private directory of /run, with the runtime and
/// ulimits this kind of machine needs (runc; explicit nofile/nproc), ended on drop.
struct PodmanService {
    child: Child,
    dir: PathBuf,
    socket: PathBuf,
}

impl PodmanService {
    fn start() -> PodmanService {
        let dir = PathBuf::from(format!(
            "/run/sandbox-agent-test-podman-{}-{}",
            std::process::id(),
            rand_suffix()
        ));
        std::fs::create_dir_all(&dir).expect("private socket dir");
        std::fs::set_permissions(&dir, std::os::unix::fs::PermissionsExt::from_mode(0o700))
            .unwrap();
        let conf = dir.join("containers.conf");
        std::fs::write(
            &conf,
            "[containers]\ndefault_ulimits = [\"nofile=20000:20000\", \"nproc=32768:32768\"]\n\
             [engine]\nruntime = \"runc\"\n",
        )
        .unwrap();
        let socket = dir.join("podman.sock");
        let log = std::fs::File::create(dir.join("service.log")).unwrap();
        let child = Command::new("podman")
            .args(["system", "service", "--time=0"])
            .arg(format!("unix://{}", socket.display()))
            .env("CONTAINERS_CONF", &conf)
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .process_group(0)
            .spawn()
            .expect("podman system service starts");
        let service = PodmanService { child, dir, socket };
        // Ready once the socket answers /_ping (curl-free: a raw HTTP request on the socket).
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if ping(&service.socket) {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "podman system service did not answer within 30 s:\n{}",
                std::fs::read_to_string(service.dir.join("service.log")).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        service
    }
}

impl Drop for PodmanService {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .args(["-TERM", "--", &format!("-{}", self.child.id())])
            .status();
        let deadline = Instant::now() + Duration::from_secs(10);
        while self.child.try_wait().ok().flatten().is_none() {
            if Instant::now() > deadline {
                let _ = Command::new("kill")
                    .args(["-KILL", "--", &format!("-{}", self.child.id())])
                    .status();
                let _ = self.child.wait();
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn ping(socket: &Path) -> bool {
    use std::io::{Read, Write};
    let Ok(mut s) = std::os::unix::net::UnixStream::connect(socket) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
    if s.write_all(b"GET /_ping HTTP/1.1\r\nHost: d\r\nConnection: close\r\n\r\n")
        .is_err()
    {
        return false;
    }
    let mut buf = String::new();
    let _ = s.read_to_string(&mut buf);
    buf.starts_with("HTTP/1.1 200")
}

fn rand_suffix() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos() as u64
}

/// One line per object, from a `podman … -q` listing.
fn podman_list(args: &[&str]) -> Vec<String> {
    let out = Command::new("podman")
        .args(["--runtime", "runc"])
        .args(args)
        .output()
        .expect("podman list");
    assert!(out.status.success(), "podman {args:?} failed");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_string)
        .filter(|l| !l.is_empty())
        .collect()
}

/// What a suite could leave behind: containers of the image, volumes, networks.
fn engine_state(image: &str) -> (Vec<String>, Vec<String>, Vec<String>) {
    (
        podman_list(&["ps", "-a", "-q", "--filter", &format!("ancestor={image}")]),
        podman_list(&["volume", "ls", "-q"]),
        podman_list(&["network", "ls", "-q"]),
    )
}

/// Runs a node test suite (its process group is killed at the deadline); returns its output
/// after checking it passed `expected` tests and skipped none.
fn node_suite(mut cmd: Command, expected: usize) -> String {
    let log = std::env::temp_dir().join(format!(
        "provider-suite-{}-{}.log",
        std::process::id(),
        rand_suffix()
    ));
    let out = std::fs::File::create(&log).unwrap();
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(out.try_clone().unwrap())
        .stderr(out)
        .process_group(0)
        .spawn()
        .expect("node starts");
    let deadline = Instant::now() + SUITE_TIMEOUT;
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break Some(s);
        }
        if Instant::now() > deadline {
            let _ = Command::new("kill")
                .args(["-KILL", "--", &format!("-{}", child.id())])
                .status();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    let output = std::fs::read_to_string(&log).unwrap_or_default();
    let _ = std::fs::remove_file(&log);
    eprintln!("{output}");
    match status {
        Some(s) if s.success() => {}
        Some(s) => panic!("node suite failed ({s})"),
        None => panic!("node suite did not finish within {SUITE_TIMEOUT:?}"),
    }
    assert!(
        output.contains(&format!("# pass {expected}\n"))
            && output.contains("# fail 0")
            && output.contains("# skipped 0"),
        "expected {expected} passed tests, no failure, no skip"
    );
    output
}

fn check_nothing_left(image: &str, before: &(Vec<String>, Vec<String>, Vec<String>)) {
    let after = engine_state(image);
    assert!(
        after.0.is_empty(),
        "containers of {image} left: {:?}",
        after.0
    );
    let new = |b: &[String], a: &[String]| -> Vec<String> {
        a.iter().filter(|x| !b.contains(x)).cloned().collect()
    };
    assert!(
        new(&before.1, &after.1).is_empty(),
        "volumes left: {:?}",
        new(&before.1, &after.1)
    );
    assert!(
        new(&before.2, &after.2).is_empty(),
        "networks left: {:?}",
        new(&before.2, &after.2)
    );
}

#[test]
fn docker_provider_drives_our_image_under_podman() {
    if !ready_for_podman() {
        return;
    }
    let _one = ENGINE.lock().unwrap_or_else(|e| e.into_inner());
    let image = image();
    build_sdk();
    let service = PodmanService::start();
    let before = engine_state(&image);
    assert!(
        before.0.is_empty(),
        "containers of {image} before: {:?}",
        before.0
    );
    let mut cmd = Command::new("node");
    cmd.args([
        "--test",
        "--test-concurrency=1",
        "--test-timeout=300000",
        "test/providers/docker.test.mjs",
    ])
    .current_dir(sdk_dir())
    .env("SANDBOX_AGENT_TEST_DOCKER_SOCKET", &service.socket)
    .env("SANDBOX_AGENT_TEST_IMAGE", &image);
    node_suite(cmd, 7);
    check_nothing_left(&image, &before);
}

#[test]
fn published_sdk_docker_provider_drives_our_image_under_podman() {
    if !ready_for_podman() {
        return;
    }
    let _one = ENGINE.lock().unwrap_or_else(|e| e.into_inner());
    let image = image();
    build_sdk();
    let service = PodmanService::start();
    let before = engine_state(&image);
    // The published provider knows only /var/run/docker.sock: in a private mount namespace, a
    // tmpfs over /run (= /var/run) holds a link to our socket, bound first to a path outside /run.
    let view = tempfile::tempdir().unwrap();
    let script = format!(
        "mount --bind {dir} {view} && mount -t tmpfs tmpfs /run && \
         ln -s {view}/podman.sock /run/docker.sock && \
         exec node --test --test-concurrency=1 --test-timeout=300000 docker-provider.test.mjs",
        dir = service.dir.display(),
        view = view.path().display(),
    );
    let mut cmd = Command::new("unshare");
    cmd.args(["-m", "--propagation", "private", "sh", "-c", &script])
        .current_dir(Path::new(REPO).join("tests/compat"))
        .env("SANDBOX_AGENT_TEST_IMAGE", &image);
    node_suite(cmd, 2);
    check_nothing_left(&image, &before);
}

/// Against the cluster KUBECONFIG names (set when the tests were built). The image
/// (SANDBOX_AGENT_TEST_K8S_IMAGE, default `sandbox-agent:latest`) must be pullable by its nodes.
#[test]
#[cfg_attr(
    not(kubeconfig),
    ignore = "NOT RUN: no KUBECONFIG when the tests were built (no cluster to test against)"
)]
fn kubernetes_provider_against_a_real_cluster() {
    assert!(
        std::env::var_os("KUBECONFIG").is_some(),
        "built with KUBECONFIG but run without it"
    );
    build_sdk();
    let mut cmd = Command::new("node");
    cmd.args([
        "--test",
        "--test-concurrency=1",
        "--test-timeout=400000",
        "test/providers/kubernetes.test.mjs",
    ])
    .current_dir(sdk_dir());
    node_suite(cmd, 2);
}
