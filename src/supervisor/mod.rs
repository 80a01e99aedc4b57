//! Every child process the daemon owns: spawning agents in their own process group and cgroup,
//! keeping their stderr apart, stopping whole process trees, reaping. Knows nothing of ACP.

use crate::config::Config;

/// Owns the cgroup parent and the set of live agent process groups.
pub struct Supervisor {}

impl Supervisor {
    pub fn new(_config: &Config) -> Self {
        Supervisor {}
    }
}

/// Kills every live agent process group at once (used when a second stop signal arrives and the
/// process is about to exit without a graceful stop).
pub fn emergency_kill_all() {}
