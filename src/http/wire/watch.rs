//! `GET /v1/fs/watch`: the events of a watch stream, on the wire.

use serde::Serialize;

use super::files::EntryType;
use crate::files::watch as svc;

/// What happened to an entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum ChangeKind {
    Create,
    Modify,
    Remove,
    Rename,
}

impl From<svc::ChangeKind> for ChangeKind {
    fn from(k: svc::ChangeKind) -> Self {
        match k {
            svc::ChangeKind::Create => Self::Create,
            svc::ChangeKind::Modify => Self::Modify,
            svc::ChangeKind::Remove => Self::Remove,
            svc::ChangeKind::Rename => Self::Rename,
        }
    }
}

/// One change beneath the watched directory (`event: change`).
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct WatchChange {
    pub kind: ChangeKind,
    /// The entry's absolute path (for `rename`, its new path).
    pub path: String,
    pub entry_type: EntryType,
    /// Only for `rename`: the entry's absolute path before.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub old_path: Option<String>,
}

impl From<svc::WatchChange> for WatchChange {
    fn from(c: svc::WatchChange) -> Self {
        Self {
            kind: c.kind.into(),
            path: c.path,
            entry_type: c.entry_type.into(),
            old_path: c.old_path,
        }
    }
}

/// Why changes were lost (`event: overflow`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum OverflowReason {
    Kernel,
    Reader,
    Scan,
}

impl From<svc::OverflowReason> for OverflowReason {
    fn from(r: svc::OverflowReason) -> Self {
        match r {
            svc::OverflowReason::Kernel => Self::Kernel,
            svc::OverflowReason::Reader => Self::Reader,
            svc::OverflowReason::Scan => Self::Scan,
        }
    }
}
