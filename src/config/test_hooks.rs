//! Hooks for the daemon's own integration tests, which start the real binary and so cannot use
//! `cfg(test)`. Each is a `SANDBOX_AGENT_TEST_*` variable that only debug builds read (a
//! release build never looks at them), read here and nowhere else, and kept out of `Config`.
//! They are for tests only; docs/testing.md lists them.

use std::sync::OnceLock;
use std::time::Duration;

struct Hooks {
    wedge_on_stop: bool,
    reload_pause: Option<Duration>,
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
