use super::*;

#[test]
fn launch_messages_round_trip_with_non_utf8_bytes() {
    let args = vec![OsString::from("-c"), OsString::from_vec(vec![0xff, b'x'])];
    let user = (
        nix::unistd::Uid::from_raw(65534),
        nix::unistd::Gid::from_raw(65534),
        vec![
            nix::unistd::Gid::from_raw(65534),
            nix::unistd::Gid::from_raw(7),
        ],
    );
    let w = Launch {
        program: std::path::Path::new("/bin/sh"),
        args: &args,
        env: vec![
            ("PATH".into(), "/usr/bin".into()),
            ("EMPTY".into(), "".into()),
        ],
        cwd: std::path::Path::new("/tmp"),
        user: Some(&user),
    };
    let msg = encode(&w);
    let len = u32::from_le_bytes(msg[..4].try_into().unwrap()) as usize;
    assert_eq!(len, msg.len() - 4);
    let d = decode(&msg[4..]).expect("decodes");
    assert_eq!(d.program, OsString::from("/bin/sh"));
    assert_eq!(d.cwd, OsString::from("/tmp"));
    assert_eq!(d.args, args);
    assert_eq!(d.env[1], ("EMPTY".into(), "".into()));
    assert_eq!(d.user, Some(user));
}

#[test]
fn malformed_launch_messages_are_refused_not_panicked_on() {
    let args = vec![OsString::from("a")];
    let w = Launch {
        program: std::path::Path::new("p"),
        args: &args,
        env: vec![],
        cwd: std::path::Path::new("/"),
        user: None,
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

/// A child of this test process that is a zombie once this returns.
fn wait_zombie(pid: u32) {
    use nix::sys::wait::{Id, WaitPidFlag, WaitStatus, waitid};
    let flags = WaitPidFlag::WEXITED | WaitPidFlag::WNOWAIT;
    let st = waitid(Id::Pid(nix::unistd::Pid::from_raw(pid as i32)), flags).unwrap();
    assert!(matches!(
        st,
        WaitStatus::Exited(..) | WaitStatus::Signaled(..)
    ));
}

#[test]
fn an_exec_is_told_from_a_death_before_exec_by_the_name() {
    let sh = |script: &str| {
        std::process::Command::new("/bin/sh")
            .args(["-c", script])
            .spawn()
            .unwrap()
    };
    // Named like a stub and killed before any exec: a death, never "the program ran".
    let mut dead = sh("printf sa-spawn-stub > /proc/self/comm; kill -9 $$");
    wait_zombie(dead.id());
    assert!(!exec_happened(dead.id()).unwrap());
    dead.wait().unwrap();
    // Named like a stub, then exec'd: an exec, even once the program has exited.
    let mut ran = sh("printf sa-spawn-stub > /proc/self/comm; exec /bin/true");
    assert!(exec_happened(ran.id()).unwrap());
    wait_zombie(ran.id());
    assert!(exec_happened(ran.id()).unwrap());
    ran.wait().unwrap();
    // Still waiting under the stub's name and alive: neither, within the bound.
    let mut waiting = std::process::Command::new("/bin/sh")
        .args(["-c", "printf sa-spawn-stub > /proc/self/comm; read x"])
        .stdin(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let named = || {
        std::fs::read(format!("/proc/{}/comm", waiting.id())).is_ok_and(|c| c == b"sa-spawn-stub\n")
    };
    let until = std::time::Instant::now() + Duration::from_secs(10);
    while !named() {
        assert!(std::time::Instant::now() < until, "never renamed itself");
        std::thread::sleep(Duration::from_millis(5));
    }
    let t = std::time::Instant::now();
    assert!(exec_happened(waiting.id()).is_err());
    assert!(t.elapsed() >= STUB_TIMEOUT);
    waiting.kill().unwrap();
    waiting.wait().unwrap();
}

#[test]
fn a_program_named_like_the_stub_never_takes_a_stub() {
    let w = |program: &'static str| Launch {
        program: std::path::Path::new(program),
        args: &[],
        env: vec![],
        cwd: std::path::Path::new("/"),
        user: None,
    };
    assert!(message(&w("/usr/bin/sa-spawn-stub")).is_none());
    // Its name after the exec is its first 15 bytes, not the stub's.
    assert!(message(&w("/usr/bin/sa-spawn-stub-and-more")).is_some());
    assert!(message(&w("/usr/bin/sa-spawn-stu")).is_some());
}

#[test]
fn the_back_off_doubles_up_to_its_cap() {
    assert_eq!(backoff(1), BACKOFF_MIN);
    assert_eq!(backoff(2), BACKOFF_MIN * 2);
    assert_eq!(backoff(3), BACKOFF_MIN * 4);
    assert_eq!(backoff(40), BACKOFF_MAX);
    assert_eq!(backoff(u32::MAX), BACKOFF_MAX);
}

#[tokio::test]
async fn a_pool_whose_stubs_failed_many_times_fills_again_once_they_can_start() {
    let dir = tempfile::tempdir().unwrap();
    let program = dir.path().join("stub");
    let pool = Pool::new(
        Recipe {
            cgroups: Arc::new(Cgroups::none()),
            limits: Limits {
                memory_max: None,
                pids_max: None,
                cpu_max: None,
            },
            program: program.clone(),
        },
        1,
    );
    pool.refill();
    let failures = || pool.state.lock().unwrap().failures;
    let until = std::time::Instant::now() + Duration::from_secs(10);
    while failures() < 5 {
        assert!(
            std::time::Instant::now() < until,
            "the pool stopped retrying"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // From now on a stub can start: it says it is ready on its control socket and waits.
    let script = dir.path().join("stub.tmp");
    std::fs::write(
        &script,
        "#!/usr/bin/perl\nopen(my $c, '>&=', $ARGV[1]) or exit 1;\nsyswrite($c, 'R');\nsleep 30;\n",
    )
    .unwrap();
    std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    std::fs::rename(&script, &program).unwrap();
    let until = std::time::Instant::now() + BACKOFF_MAX * 3;
    while pool.state.lock().unwrap().ready.is_empty() {
        assert!(
            std::time::Instant::now() < until,
            "the pool never filled again"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(failures(), 0);
    pool.close().await;
}
