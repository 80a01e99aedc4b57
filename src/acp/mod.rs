//! The ACP-over-HTTP proxy (spec 002 §3): one agent process per serverId, created lazily by the
//! first POST, driven by JSON-RPC lines on its stdio. Knows nothing of HTTP; `http::acp`
//! translates. **Invariant:** a serverId maps to at most one instance, and every instance that
//! leaves the registry (DELETE, shutdown) is stopped to completion by a tracked task.

pub mod bundle;
pub mod caps;
pub mod connection;
pub mod durable;
pub mod events;
pub mod frames;
pub mod instance;
pub mod inventory;
pub mod jsonrpc;
pub(crate) mod registry;
#[cfg(test)]
pub(crate) mod tests;

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::agents::{AgentError, Agents};
use crate::config::Config;
use crate::supervisor::{ExitInfo, SpawnError, Supervisor};

pub use connection::{Connection, ConnectionError, Connections, StreamReader};
pub use events::{Batch, Next, Subscribe, Subscription};
pub use instance::{AcpInstance, Delivered, Status};
pub use jsonrpc::{Envelope, EnvelopeError, IdKey, Kind};
pub use registry::{AcpService, AcpState, Retirement, ServerInfo};

/// How an agent process ended, as POSTs that were waiting (and later ones) are told.
#[derive(Debug, Clone)]
pub struct Ended {
    pub exit: Option<ExitInfo>,
    /// The last few KiB of the agent's stderr.
    pub stderr_tail: String,
    /// One sentence for the problem's `detail`.
    pub detail: String,
}

#[derive(Debug, Clone, thiserror::Error)]
pub enum AcpError {
    #[error(
        "invalid serverId `{server_id}`: use 1-128 characters of A-Z a-z 0-9 . _ - (not `.` or `..`)"
    )]
    InvalidServerId { server_id: String },
    #[error(
        "serverId `{server_id}` does not exist; its first POST must name the agent (?agent=<id>)"
    )]
    MissingAgent { server_id: String },
    #[error("unknown agent `{agent}`")]
    UnknownAgent { agent: String },
    #[error("serverId `{server_id}` runs agent `{bound}`, not `{requested}`")]
    AgentMismatch {
        server_id: String,
        bound: String,
        requested: String,
    },
    #[error("no ACP server `{server_id}`")]
    NotFound { server_id: String },
    #[error("a request with id {id} is already in flight on `{server_id}`")]
    DuplicateId { server_id: String, id: String },
    #[error("{}", ended.detail)]
    AgentGone {
        server_id: String,
        agent: String,
        ended: Arc<Ended>,
    },
    #[error("the agent did not answer within {}", humantime::format_duration(*timeout))]
    Timeout {
        server_id: String,
        timeout: Duration,
    },
    #[error("cannot prepare agent `{agent}`: {source}")]
    Launch {
        server_id: String,
        agent: String,
        #[source]
        source: Arc<AgentError>,
    },
    #[error("cannot start agent `{agent}`: {source}")]
    Spawn {
        server_id: String,
        agent: String,
        #[source]
        source: Arc<SpawnError>,
    },
    #[error("the agent of `{server_id}` has exited and every event was delivered")]
    Gone { server_id: String },
    #[error("the daemon is shutting down")]
    ShuttingDown,
    #[error(
        "Last-Event-ID {last_event_id} was never issued by `{server_id}` (its last event id is {last_id})"
    )]
    EventIdAhead {
        server_id: String,
        last_event_id: u64,
        last_id: u64,
    },
    #[error("serverId `{server_id}` is being imported from a session bundle")]
    Importing { server_id: String },
    #[error("{what}: the limit of {limit} is reached")]
    Capacity {
        /// What is full, for the problem's title and the log.
        what: &'static str,
        limit: u64,
        server_id: Option<String>,
    },
    #[error(
        "session `{session_id}` of `{server_id}` was not restored after the daemon restarted: {reason}"
    )]
    SessionNotRestored {
        server_id: String,
        session_id: String,
        reason: String,
        /// The agent capability that is missing (`loadSession`), when that is why.
        missing_capability: Option<&'static str>,
    },
    #[error("{0}")]
    Envelope(#[from] EnvelopeError),
}

/// A serverId is 1–128 characters of `[A-Za-z0-9._-]`, other than `.` and `..` (which clients
/// that normalise URLs would turn into another path, so the instance could not be reached).
pub fn validate_server_id(id: &str) -> Result<(), AcpError> {
    let ok = !id.is_empty()
        && id != "."
        && id != ".."
        && id.len() <= 128
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
    if ok {
        Ok(())
    } else {
        Err(AcpError::InvalidServerId {
            server_id: id.chars().take(200).collect(),
        })
    }
}

/// Everything the proxy needs from the rest of the daemon.
pub(crate) struct Deps {
    pub config: Arc<Config>,
    pub supervisor: Arc<Supervisor>,
    pub agents: Arc<Agents>,
    pub shutdown: CancellationToken,
}
