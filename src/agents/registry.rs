//! The ACP registry (`registry.json`): fetching it and choosing the distribution of one agent
//! for this machine. Only the fields the installer uses are read; unknown fields are ignored so a
//! newer registry keeps working.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::Deserialize;

#[derive(Debug, Deserialize)]
pub struct Registry {
    #[serde(default)]
    pub agents: Vec<RegistryAgent>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct RegistryAgent {
    pub id: String,
    #[serde(default)]
    pub version: Option<String>,
    #[serde(default)]
    pub distribution: Distribution,
}

#[derive(Debug, Clone, Default, Deserialize)]
pub struct Distribution {
    #[serde(default)]
    pub binary: Option<BTreeMap<String, BinaryTarget>>,
    #[serde(default)]
    pub npx: Option<PackageDist>,
    #[serde(default)]
    pub uvx: Option<PackageDist>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct BinaryTarget {
    pub archive: String,
    pub cmd: String,
    #[serde(default)]
    pub args: Vec<String>,
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    #[serde(default)]
    pub sha256: Option<String>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct PackageDist {
    /// `name@version` (npm scoped names start with `@`).
    pub package: String,
    #[serde(default)]
    pub cmd: Option<String>,
    #[serde(default)]
    pub args: Vec<String>,
    #[serde(default)]
    pub env: BTreeMap<String, String>,
}

/// This machine's key in `distribution.binary` (`linux-x86_64`, `linux-aarch64`, …).
pub fn platform_key() -> String {
    format!("{}-{}", std::env::consts::OS, std::env::consts::ARCH)
}

/// Why the ACP registry could not be used (an install then tries the agent's pinned fallback,
/// and says why in its note).
#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    #[error("{url} is larger than the registry limit of {max} bytes (--registry-max-bytes)")]
    TooLarge { url: String, max: u64 },
    #[error("cannot read {path}: {source}")]
    Read {
        path: String,
        #[source]
        source: std::io::Error,
    },
    /// `reason` is the whole chain of the client's error (reqwest hides it behind "error
    /// sending request").
    #[error("cannot reach {url}: {reason}")]
    Unreachable { url: String, reason: String },
    #[error("cannot read {url}: {reason}")]
    Cut { url: String, reason: String },
    #[error("{url} answered {status}")]
    Status {
        url: String,
        status: reqwest::StatusCode,
    },
    #[error("{url} is not a valid ACP registry: {source}")]
    Invalid {
        url: String,
        #[source]
        source: serde_json::Error,
    },
    /// The HTTP client could not be built (e.g. no CA certificates).
    #[error("{0}")]
    Client(String),
    #[error("reading the registry was cut short: {0}")]
    Task(#[from] tokio::task::JoinError),
}

/// Fetches and parses the registry, reading at most `max` bytes (streamed: a document over the
/// cap is refused as soon as it passes it, never held whole). `file://` URLs are read from disk
/// (air-gapped images) on the blocking pool.
pub async fn fetch(
    client: &reqwest::Client,
    url: &str,
    max: u64,
) -> Result<Registry, RegistryError> {
    let too_big = || RegistryError::TooLarge {
        url: url.to_string(),
        max,
    };
    let bytes = if let Some(path) = url.strip_prefix("file://") {
        let path = path.to_string();
        let read = tokio::task::spawn_blocking(move || {
            use std::io::Read;
            let failed = |source| RegistryError::Read {
                path: path.clone(),
                source,
            };
            let f = std::fs::File::open(&path).map_err(failed)?;
            let mut out = Vec::new();
            f.take(max.saturating_add(1))
                .read_to_end(&mut out)
                .map_err(failed)?;
            Ok::<_, RegistryError>(out)
        })
        .await??;
        if read.len() as u64 > max {
            return Err(too_big());
        }
        read
    } else {
        use futures_util::StreamExt;
        let resp = client
            .get(url)
            .timeout(Duration::from_secs(30))
            .send()
            .await
            .map_err(|e| RegistryError::Unreachable {
                url: url.to_string(),
                reason: error_chain(&e),
            })?;
        if !resp.status().is_success() {
            return Err(RegistryError::Status {
                url: url.to_string(),
                status: resp.status(),
            });
        }
        if resp.content_length().is_some_and(|n| n > max) {
            return Err(too_big());
        }
        let mut out = Vec::new();
        let mut stream = resp.bytes_stream();
        while let Some(chunk) = stream.next().await {
            let chunk = chunk.map_err(|e| RegistryError::Cut {
                url: url.to_string(),
                reason: error_chain(&e),
            })?;
            if (out.len() + chunk.len()) as u64 > max {
                return Err(too_big());
            }
            out.extend_from_slice(&chunk);
        }
        out
    };
    // Parsing up to 16 MiB is CPU work: off the runtime thread.
    let url = url.to_string();
    tokio::task::spawn_blocking(move || {
        serde_json::from_slice(&bytes).map_err(|source| RegistryError::Invalid { url, source })
    })
    .await?
}

/// Splits `name@version` (keeping a leading `@scope`). No version → `None`. The spec comes from
/// the registry document, so it is sliced only at char boundaries found by searching (a leading
/// non-ASCII character must not panic).
pub fn split_package(spec: &str) -> (&str, Option<&str>) {
    let first = spec.chars().next().map_or(0, char::len_utf8);
    match spec.get(first..).and_then(|rest| rest.rfind('@')) {
        Some(i) => {
            let at = first + i;
            (&spec[..at], spec.get(at + 1..))
        }
        None => (spec, None),
    }
}

/// The error and its sources, which reqwest hides behind "error sending request".
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn package_specs_split_on_the_version_at() {
        assert_eq!(split_package("@a/b@1.2.3"), ("@a/b", Some("1.2.3")));
        assert_eq!(split_package("pkg@0.1"), ("pkg", Some("0.1")));
        assert_eq!(split_package("@a/b"), ("@a/b", None));
        assert_eq!(split_package("pkg"), ("pkg", None));
        assert_eq!(split_package(""), ("", None));
        assert_eq!(split_package("@"), ("@", None));
        assert_eq!(split_package("é"), ("é", None));
        assert_eq!(split_package("éa@1"), ("éa", Some("1")));
        assert_eq!(split_package("€@€"), ("€", Some("€")));
        assert_eq!(split_package("a@"), ("a", Some("")));
    }

    #[test]
    fn registry_parses_the_public_shape() {
        let r: Registry = serde_json::from_str(
            r#"{"version":"1.0.0","agents":[{"id":"gemini","name":"G","version":"0.37.0",
            "description":"d","extra":1,"distribution":{"npx":{"package":"@google/gemini-cli@0.37.1",
            "args":["--acp"]}}},{"id":"amp-acp","distribution":{"binary":{"linux-x86_64":
            {"archive":"https://x/a.tar.gz","cmd":"./amp-acp","sha256":"00"}}}}]}"#,
        )
        .unwrap();
        assert_eq!(r.agents.len(), 2);
        assert_eq!(
            r.agents[0].distribution.npx.as_ref().unwrap().args,
            ["--acp"]
        );
        assert!(
            r.agents[1]
                .distribution
                .binary
                .as_ref()
                .unwrap()
                .contains_key("linux-x86_64")
        );
    }
}
