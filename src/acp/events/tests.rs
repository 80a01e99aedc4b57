use super::*;

fn log(max_events: usize, max_bytes: usize) -> Arc<EventLog> {
    Arc::new(EventLog::new(LogLimits {
        max_events,
        max_bytes,
    }))
}

#[test]
fn a_frame_is_built_in_a_buffer_of_exactly_its_size() {
    // The debug assertion in `message_frame` checks the size; the text is checked here for
    // every number of digits.
    for id in [0, 1, 9, 10, 99, 100, 12_345, u64::MAX] {
        let f = message_frame(id, br#"{"a":1}"#);
        assert_eq!(
            &f[..],
            format!("event: message\nid: {id}\ndata: {{\"a\":1}}\n\n").as_bytes()
        );
    }
}

async fn drain(sub: &Subscription) -> String {
    let mut out = String::new();
    loop {
        match sub.next().await {
            Next::Frames(b) => out.push_str(std::str::from_utf8(&b).unwrap()),
            Next::End => return out,
            Next::CutOff => return out + "<cut>",
        }
    }
}

fn check(after: u64, pushed: &[&str], limits: (usize, usize), expected: &str) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let l = log(limits.0, limits.1);
    for p in pushed {
        l.push(p.as_bytes());
    }
    l.close();
    let got = match l.subscribe(after, usize::MAX) {
        Subscribe::Live(s) => rt.block_on(drain(&s)),
        Subscribe::NothingLeft => "<nothing>".to_string(),
        Subscribe::Ahead { last } => format!("<ahead of {last}>"),
        Subscribe::Full => "<full>".to_string(),
    };
    assert_eq!(got, expected);
}

/// Everything a reader from `after` is sent, and the log's last id.
fn replayed(l: &Arc<EventLog>, after: u64) -> (String, u64) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let got = match l.subscribe(after, usize::MAX) {
        Subscribe::Live(s) => {
            l.close();
            rt.block_on(drain(&s))
        }
        Subscribe::NothingLeft => "<nothing>".to_string(),
        Subscribe::Ahead { last } => format!("<ahead of {last}>"),
        Subscribe::Full => "<full>".to_string(),
    };
    (got, l.last_id())
}

#[test]
fn a_hand_off_carries_the_last_id_the_evictions_and_the_lost_ids() {
    let limits = LogLimits {
        max_events: 3,
        max_bytes: usize::MAX,
    };
    // A log recovered after a restart: events 1..=5 kept on disk (3 retained), ids 6..=9
    // lost by the run before, the numbering past the restart's skip.
    let events: Vec<(u64, Bytes)> = (1..=5)
        .map(|i| (i, Bytes::from(format!("{{\"n\":{i}}}"))))
        .collect();
    let mk = || {
        Arc::new(EventLog::recovered(
            limits,
            events.clone(),
            20_000,
            Some((6, 9)),
        ))
    };
    let before = mk();
    let carried = mk().export();
    let after = Arc::new(EventLog::new(limits));
    after.restore(&carried);
    for from in [0, 2, 5, 7] {
        assert_eq!(replayed(&after, from), replayed(&mk(), from), "from {from}");
    }
    assert_eq!(after.last_id(), 5);
    // An empty log past a restart's skip: its last id is 0, not the skipped floor.
    let empty = EventLog::recovered(limits, Vec::new(), 16_386, None);
    let carried = empty.export();
    let after = EventLog::new(limits);
    after.restore(&carried);
    assert_eq!(after.last_id(), 0);
    drop(before);
}

#[test]
fn the_ring_never_holds_more_than_its_bound() {
    let l = log(64, usize::MAX);
    for i in 0..1000 {
        l.push(format!("{{\"n\":{i}}}").as_bytes());
        let st = l.lock();
        assert!(st.ring.len() <= 64, "{} events held", st.ring.len());
    }
    let st = l.lock();
    assert_eq!((st.ring.front_id().unwrap(), st.evicted), (937, 936));
}

#[test]
fn replay_and_gap() {
    check(0, &[], (10, 1000), "<nothing>");
    check(
        0,
        &["{}", "{\"a\":1}"],
        (10, 1000),
        "event: message\nid: 1\ndata: {}\n\nevent: message\nid: 2\ndata: {\"a\":1}\n\n",
    );
    check(
        1,
        &["{}", "{}"],
        (10, 1000),
        "event: message\nid: 2\ndata: {}\n\n",
    );
    check(2, &["{}", "{}"], (10, 1000), "<nothing>");
    check(3, &["{}", "{}"], (10, 1000), "<ahead of 2>");
    check(u64::MAX, &["{}"], (10, 1000), "<ahead of 1>");
    check(u64::MAX, &[], (10, 1000), "<ahead of 0>");
    check(
        0,
        &["{}", "{}", "{}"],
        (1, 1000),
        "event: gap\ndata: {\"from\":1,\"to\":2}\n\nevent: message\nid: 3\ndata: {}\n\n",
    );
    check(
        1,
        &["{}", "{}", "{}"],
        (1, 1000),
        "event: gap\ndata: {\"from\":2,\"to\":2}\n\nevent: message\nid: 3\ndata: {}\n\n",
    );
    // The byte bound evicts too, but always keeps the newest event.
    check(
        0,
        &["{\"long\":\"xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx\"}", "{}"],
        (10, 10),
        "event: gap\ndata: {\"from\":1,\"to\":1}\n\nevent: message\nid: 2\ndata: {}\n\n",
    );
}

#[test]
fn slow_subscriber_is_cut_off_others_continue() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    let l = log(4, 1 << 20);
    let (Subscribe::Live(slow), Subscribe::Live(fast)) = (l.subscribe(0, 2), l.subscribe(0, 2))
    else {
        panic!("open log")
    };
    assert!(matches!(l.subscribe(0, 2), Subscribe::Full));
    for i in 0..10 {
        l.push(b"{}");
        l.wake();
        if i < 9 {
            assert!(matches!(rt.block_on(fast.next()), Next::Frames(_)));
        }
    }
    assert!(matches!(rt.block_on(slow.next()), Next::CutOff));
    assert_eq!(l.subscriber_count(), 1);
    l.close();
    let rest = rt.block_on(drain(&fast));
    assert_eq!(rest, "event: message\nid: 10\ndata: {}\n\n");
}
