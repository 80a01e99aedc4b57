use super::*;

const MOUNTINFO: &str = "\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu,cpuacct rw,relatime - cgroup cgroup rw,cpu,cpuacct
35 31 0:32 /docker/abc /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
39 31 0:36 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
50 23 0:40 / /mnt/with\\040space rw - ext4 /dev/sda rw
";

#[test]
fn a_hierarchy_mounted_twice_is_used_once_through_the_mount_that_shows_our_group() {
    let text = "\
32 31 0:29 / /sys/fs/cgroup/cpu,cpuacct rw - cgroup cgroup rw,cpu,cpuacct
35 31 0:32 /other /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory
39 31 0:36 / /sys/fs/cgroup/pids rw - cgroup cgroup rw,pids
90 80 0:29 / /var/tmp/room/sys/fs/cgroup/cpu,cpuacct rw - cgroup cgroup rw,cpu,cpuacct
91 80 0:32 / /var/tmp/room/sys/fs/cgroup/memory rw - cgroup cgroup rw,memory
92 80 0:36 / /var/tmp/room/sys/fs/cgroup/pids rw - cgroup cgroup rw,pids
";
    let mounts = parse_mountinfo(text);
    let v1: Vec<&Mount> = mounts.iter().collect();
    let own = "5:pids:/a\n4:memory:/a\n3:cpu,cpuacct:/a\n";
    let picked = distinct_v1(&v1, own);
    let points: Vec<String> = picked
        .iter()
        .map(|(m, _, _)| m.point.display().to_string())
        .collect();
    // cpu and pids: the first mount; memory: the first one mounts /other, which does not show
    // our group /a, so the bind mount of the whole hierarchy is used.
    assert_eq!(
        points,
        [
            "/sys/fs/cgroup/cpu,cpuacct",
            "/var/tmp/room/sys/fs/cgroup/memory",
            "/sys/fs/cgroup/pids"
        ]
    );
    assert!(picked.iter().all(|(_, _, p)| p == "/a"));
}

#[test]
fn mountinfo_keeps_cgroup_mounts_with_their_controllers() {
    let m = parse_mountinfo(MOUNTINFO);
    assert_eq!(m.len(), 4);
    assert_eq!(m[0].point, PathBuf::from("/sys/fs/cgroup/cpu,cpuacct"));
    assert!(m[0].options.iter().any(|o| o == "cpuacct"));
    assert_eq!(m[1].root, "/docker/abc");
    assert_eq!(m[3].version, Version::V2);
}

#[test]
fn mountinfo_unescapes_octal() {
    assert_eq!(unescape("/mnt/with\\040space"), "/mnt/with space");
    assert_eq!(unescape("/plain"), "/plain");
}

#[test]
fn own_path_per_version_and_controller() {
    let text = "9:name=systemd:/\n8:pids:/user.slice\n2:cpu,cpuacct:/x\n4:memory:/process_api/07b9\n0::/system.slice/sa.service\n";
    assert_eq!(
        own_path(text, Version::V1, "memory").as_deref(),
        Some("/process_api/07b9")
    );
    assert_eq!(own_path(text, Version::V1, "cpu").as_deref(), Some("/x"));
    assert_eq!(
        own_path(text, Version::V1, "cpuacct").as_deref(),
        Some("/x")
    );
    assert_eq!(
        own_path(text, Version::V2, "").as_deref(),
        Some("/system.slice/sa.service")
    );
    assert_eq!(own_path("4:memory:/a\n", Version::V2, ""), None);
}

#[test]
fn own_dir_strips_the_mount_root_of_a_bind_mounted_hierarchy() {
    let m = parse_mountinfo(MOUNTINFO);
    assert_eq!(
        own_dir(&m[1], "/docker/abc/inner"),
        PathBuf::from("/sys/fs/cgroup/memory/inner")
    );
    assert_eq!(own_dir(&m[2], "/"), PathBuf::from("/sys/fs/cgroup/pids"));
    assert_eq!(
        own_dir(&m[2], "/a/b"),
        PathBuf::from("/sys/fs/cgroup/pids/a/b")
    );
}

#[test]
fn keyed_files() {
    let v1 = "oom_kill_disable 0\nunder_oom 0\noom_kill 3\n";
    assert_eq!(parse_keyed(v1, "oom_kill"), Some(3));
    let v2 = "low 0\nhigh 0\nmax 12\noom 2\noom_kill 1\noom_group_kill 0\n";
    assert_eq!(parse_keyed(v2, "oom_kill"), Some(1));
    assert_eq!(parse_keyed(v2, "absent"), None);
}

#[test]
fn daemons_starting_and_stopping_side_by_side_never_trip_over_each_other() {
    if Cgroups::setup(Mode::Auto).hierarchies.is_empty() {
        eprintln!("SKIPPED: cgroups are not writable here");
        return;
    }
    let limits = Limits {
        memory_max: Some(64 << 20),
        pids_max: Some(10),
        cpu_max: None,
    };
    let workers: Vec<_> = (0..8)
        .map(|i| {
            std::thread::spawn(move || {
                for round in 0..5 {
                    let cg = Cgroups::setup(Mode::Auto);
                    assert!(cg.enabled(), "worker {i} round {round}");
                    let (agent, applied) =
                        cg.create(&format!("w{i}"), &limits).expect("agent cgroup");
                    assert!(applied.pids);
                    assert!(agent.path().is_some_and(Path::exists));
                    assert!(agent.remove_dirs());
                    cg.remove_own();
                }
            })
        })
        .collect();
    for w in workers {
        w.join().expect("worker");
    }
}
