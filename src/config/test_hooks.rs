//! Hooks for the daemon's own integration tests, which start the real binary and so cannot use
//! `cfg(test)`. Each is a `SANDBOX_AGENT_TEST_*` variable that only debug builds read (a
//! release build never looks at them), read here and nowhere else, and kept out of `Config`.
//! They are for tests only; docs/testing.md lists them.

use std::sync::OnceLock;
use std::time::Duration;

struct Hooks {
    wedge_on_stop: bool,
    reload_pause: Option<Duration>,
    pump_delay: Option<Duration>,
    fail_adoption: Option<(String, bool)>,
}

fn hooks() -> &'static Hooks {
    static HOOKS: OnceLock<Hooks> = OnceLock::new();
    HOOKS.get_or_init(|| {
        let var = |name: &str| {
            cfg!(debug_assertions)
                .then(|| std::env::var(name).ok())
                .flatten()
        };
        Hooks {
            wedge_on_stop: var("SANDBOX_AGENT_TEST_WEDGE_ON_STOP").is_some_and(|v| v == "1"),
            reload_pause: var("SANDBOX_AGENT_TEST_RELOAD_PAUSE_MS")
                .and_then(|v| v.parse::<u64>().ok())
                .map(|ms| Duration::from_millis(ms.min(10_000))),
            pump_delay: var("SANDBOX_AGENT_TEST_PUMP_DELAY_MS")
                .and_then(|v| v.parse::<u64>().ok())
                .map(|ms| Duration::from_millis(ms.min(1_000))),
            fail_adoption: var("SANDBOX_AGENT_TEST_FAIL_ADOPTION").map(|v| {
                match v.strip_suffix(":late") {
                    Some(id) => (id.to_string(), true),
                    None => (v, false),
                }
            }),
        }
    })
}

/// `SANDBOX_AGENT_TEST_WEDGE_ON_STOP=1`, for the emergency stop's test: after the first stop
/// signal, every runtime worker is blocked.
pub fn wedge_on_stop() -> bool {
    hooks().wedge_on_stop
}

/// `SANDBOX_AGENT_TEST_RELOAD_PAUSE_MS`, for the reload's signal test: a reload sleeps this
/// long just before its exec, with the signals held (at most 10 s).
pub fn reload_pause() -> Option<Duration> {
    hooks().reload_pause
}

/// `SANDBOX_AGENT_TEST_PUMP_DELAY_MS`, for the process hand-off's barrier test: a process's
/// output pump sleeps this long between a read and its append (at most 1 s), as a pump caught in
/// the middle of an append on another worker would be.
pub fn pump_delay() -> Option<Duration> {
    hooks().pump_delay
}

/// `SANDBOX_AGENT_TEST_FAIL_ADOPTION=<serverId>[:late]`, for the failed adoption's test: a
/// reload's new image fails to take over that serverId's agent, before the supervisor adopts it
/// or (`:late`) after.
pub fn fail_adoption(server_id: &str) -> Option<bool> {
    hooks()
        .fail_adoption
        .as_ref()
        .filter(|(id, _)| id == server_id)
        .map(|(_, late)| *late)
}
