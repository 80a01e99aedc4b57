//! The hand-off written and read back, the launch path and the refusal texts.
use super::*;
use crate::acp::AcpState;
use crate::processes::ProcessesState;

fn sample() -> Handoff {
    Handoff {
        version: STATE_VERSION,
        token: Some("t0ken".into()),
        listener_fd: 7,
        stop_requested: false,
        cgroups: CgroupsState::default(),
        acp: AcpState::default(),
        connections: Vec::new(),
        processes: ProcessesState::default(),
        fds: vec![7, 8, 9],
        waiters: vec![42],
        payloads: 0,
    }
}

/// A sample with payloads of every kind a version-3 hand-off streams: text frames, bytes
/// that are not UTF-8, an empty one, a large one.
fn with_payloads() -> Handoff {
    let mut h = sample();
    let frames = vec![
        (1, Payload::new(&b"event: message\nid: 1\ndata: {}\n\n"[..])),
        (2, Payload::new(vec![0xff, 0x00, 0xfe])),
        (3, Payload::new(vec![b'x'; 3 << 20])),
    ];
    h.acp.exited.push(crate::acp::instance::ExitedState {
        server_id: "s1".into(),
        agent: "mock".into(),
        created_at_ms: 1,
        exit: None,
        stderr_tail: String::new(),
        detail: "ended".into(),
        events: crate::acp::events::EventsState {
            next_id: 4,
            frames,
            ..Default::default()
        },
        invalid_lines: 0,
    });
    h.connections.push(crate::acp::connection::ConnectionState {
        id: "c1".into(),
        connection: crate::acp::connection::OutboxState {
            frames: vec![(5, Payload::new(Vec::new()))],
            lost: None,
        },
        ..Default::default()
    });
    h
}

/// Writes `h` into a memfd and reads it back as the new image would.
fn through_a_memfd(mut h: Handoff) -> Result<Handoff, HandoffError> {
    let f = memfd().unwrap();
    wire::write(&mut h, &f)?;
    let n = f.as_raw_fd();
    std::mem::forget(f); // `receive` owns (and closes) the descriptor it reads
    let mut r = receive(&n.to_string())?;
    r.open.clear(); // the sample's descriptors are not really ours
    Ok(r.handoff)
}

#[test]
fn the_hand_off_round_trips_through_its_memfd() {
    let h = with_payloads();
    let mut back = through_a_memfd(h.clone()).unwrap();
    assert_eq!(back.payloads, 4);
    back.payloads = 0;
    assert_eq!(back, h);
}

#[test]
fn a_payload_left_in_the_head_fails_the_write_not_the_exec() {
    let h = with_payloads();
    assert!(
        serde_json::to_vec(&h).is_err(),
        "a payload must never go into the head"
    );
    let f = memfd().unwrap();
    let written = wire::write(&mut h.clone(), &f).unwrap();
    // The head rewritten with a payload put back is refused before anything is exec'd.
    let err = wire::write_head(&h, &f, &written).unwrap_err();
    assert!(matches!(err, HandoffError::Serialize(_)), "{err}");
}

#[test]
fn a_damaged_hand_off_is_an_error_never_a_partial_state() {
    let mut h = with_payloads();
    let f = memfd().unwrap();
    wire::write(&mut h, &f).unwrap();
    let full = std::fs::read(format!("/proc/self/fd/{}", f.as_raw_fd())).unwrap();
    // A record whose length runs past the head, and a file cut short.
    for bad in [
        {
            let mut b = full.clone();
            b[24..32].copy_from_slice(&u64::MAX.to_le_bytes());
            b
        },
        full[..full.len() - 10].to_vec(),
    ] {
        let g = memfd().unwrap();
        std::io::Write::write_all(&mut &g, &bad).unwrap();
        assert!(wire::read(g).is_err());
    }
    // Version 1/2 hex that is not hex is refused, not skipped.
    let json = include_str!("../testdata/handoff-v2.json");
    let mut v: serde_json::Value = serde_json::from_str(json).unwrap();
    v["acp"]["instances"][0]["stdout_carry"] = "0a0zz1".into();
    let broken = serde_json::to_string(&v).unwrap();
    v["acp"]["instances"][0]["stdout_carry"] = "0a0b".into();
    let fine = serde_json::to_string(&v).unwrap();
    let h = Handoff::from_json(fine.as_bytes()).unwrap();
    assert_eq!(h.acp.instances[0].stdout_carry.0.as_ref(), b"\x0a\x0b");
    assert!(Handoff::from_json(broken.as_bytes()).is_err());
}

#[test]
fn versions_outside_the_accepted_range_are_refused() {
    for v in [0, STATE_VERSION + 1] {
        let mut h = sample();
        h.version = v;
        let err = Handoff::from_json(&serde_json::to_vec(&h).unwrap()).unwrap_err();
        assert!(
            err.to_string().contains("is not one this binary reads"),
            "{err}"
        );
    }
    assert!(accepts(STATE_VERSION) && accepts(OLDEST_ACCEPTED));
}

/// Hand-offs written by real daemons (an agent instance, an RFD connection with a session
/// and queued messages, a running process; from version 2 also an exited instance and an
/// exited process record), one per state version this binary must read:
/// `handoff-v1.json` and `-v2.json` are what earlier releases write, `handoff-v3.bin` this
/// one (captured from a real daemon during a reload, `SANDBOX_AGENT_TEST_RELOAD_PAUSE_MS`,
/// by copying `/proc/PID/fd/N` of its `sandbox-agent-handoff` memfd). A change that stops an older
/// hand-off from parsing fails here, before an upgrade's reload would be refused.
#[test]
fn hand_offs_of_every_accepted_version_are_read() {
    let fixtures: [(u32, &[u8]); 3] = [
        (1, include_bytes!("../testdata/handoff-v1.json")),
        (2, include_bytes!("../testdata/handoff-v2.json")),
        (3, include_bytes!("../testdata/handoff-v3.bin")),
    ];
    assert_eq!(
        fixtures.iter().map(|f| f.0).collect::<Vec<_>>(),
        (OLDEST_ACCEPTED..=STATE_VERSION).collect::<Vec<_>>(),
        "one fixture per accepted version (capture one when STATE_VERSION changes)"
    );
    for (v, bytes) in fixtures {
        // As the new image reads it: from a memfd.
        let f = memfd().unwrap();
        std::io::Write::write_all(&mut &f, bytes).unwrap();
        let h = wire::read(f).unwrap_or_else(|e| panic!("version {v}: {e}"));
        assert_eq!(h.version, v);
        assert_eq!(h.acp.instances.len(), 2, "version {v}");
        assert_eq!(h.processes.processes.len(), 1, "version {v}");
        let frames: usize = h.acp.instances.iter().map(|i| i.events.frames.len()).sum();
        assert!(frames >= 4, "version {v}: the event logs came through");
        // Version 1 carried no RFD connection; from 2 on it is there with its session.
        let expected = if v == 1 { 0 } else { 1 };
        assert_eq!(h.connections.len(), expected, "version {v}");
        if let Some(c) = h.connections.first() {
            assert_eq!(c.sessions.len(), 1);
            assert!(c.routed && c.routed_to >= 3);
        }
        // From 2 on, ended instances and exited process records come along too.
        let ended = usize::from(v >= 2);
        assert_eq!(h.acp.exited.len(), ended, "version {v}");
        assert_eq!(h.processes.exited.len(), ended, "version {v}");
        if v >= 3 {
            // Bytes that are not UTF-8 travel raw.
            let out: Vec<u8> = h.processes.exited[0]
                .log
                .chunks
                .iter()
                .flat_map(|c| c.3.0.to_vec())
                .collect();
            assert!(out.windows(2).any(|w| w == [0xff, 0x00]), "{out:?}");
        }
    }
}

#[test]
fn a_refusal_quotes_setting_names_and_never_values() {
    let check = |msg: &str, want: &str| assert_eq!(redact_values(msg), want);
    check(
        "config file /c.toml: unknown key `tokn`; did you mean `token`?",
        "config file /c.toml: unknown key `…`; did you mean `token`?",
    );
    check(
        "--port: `s3cr3t` is not a port",
        "--port: `…` is not a port",
    );
    check("a `--max-agents` b", "a `--max-agents` b");
    check("line one\ntoken = \"x", "line one token = \"x");
    check("unpaired `s3cr3t", "unpaired ");
}

#[test]
fn the_token_is_stripped_from_the_arguments() {
    let argv: Vec<OsString> = ["sa", "--port", "1", "--token", "s3", "--token=s4", "--x"]
        .iter()
        .map(OsString::from)
        .collect();
    let got = strip_token(argv);
    assert_eq!(
        got,
        ["sa", "--port", "1", "--x"].map(OsString::from).to_vec()
    );
}

#[test]
fn a_memfd_hand_off_is_read_back_with_its_descriptors() {
    let f = memfd().unwrap();
    let mut h = sample();
    wire::write(&mut h, &f).unwrap();
    let n = f.as_raw_fd();
    // `receive` owns (and closes) the descriptor it reads.
    std::mem::forget(f);
    let mut r = receive(&n.to_string()).unwrap();
    assert_eq!(r.handoff, h);
    assert!(
        r.take(5).is_err(),
        "a descriptor not in the hand-off is refused"
    );
    r.open.clear(); // 7, 8, 9 are not really ours in this test
}
