//! `/v1/fs/*`: what the file service answers, on the wire.

use serde::Serialize;

use crate::files as svc;

#[derive(Debug, Clone, Copy, Serialize, PartialEq, Eq, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum EntryType {
    File,
    Directory,
}

impl From<svc::EntryType> for EntryType {
    fn from(t: svc::EntryType) -> Self {
        match t {
            svc::EntryType::File => Self::File,
            svc::EntryType::Directory => Self::Directory,
        }
    }
}

#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct FsEntry {
    pub name: String,
    pub path: String,
    pub entry_type: EntryType,
    pub size: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub modified: Option<String>,
}

impl From<svc::FsEntry> for FsEntry {
    fn from(e: svc::FsEntry) -> Self {
        Self {
            name: e.name,
            path: e.path,
            entry_type: e.entry_type.into(),
            size: e.size,
            modified: e.modified,
        }
    }
}

#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct FsStat {
    pub path: String,
    pub entry_type: EntryType,
    pub size: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub modified: Option<String>,
}

impl From<svc::FsStat> for FsStat {
    fn from(s: svc::FsStat) -> Self {
        Self {
            path: s.path,
            entry_type: s.entry_type.into(),
            size: s.size,
            modified: s.modified,
        }
    }
}

#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct WriteOutcome {
    pub path: String,
    pub bytes_written: u64,
}

impl From<svc::WriteOutcome> for WriteOutcome {
    fn from(w: svc::WriteOutcome) -> Self {
        Self {
            path: w.path,
            bytes_written: w.bytes_written,
        }
    }
}

#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct UploadOutcome {
    pub paths: Vec<String>,
    pub truncated: bool,
}

impl From<svc::UploadOutcome> for UploadOutcome {
    fn from(u: svc::UploadOutcome) -> Self {
        Self {
            paths: u.paths,
            truncated: u.truncated,
        }
    }
}
