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

/// Fetches and parses the registry. `file://` URLs are read from disk (air-gapped images).
pub async fn fetch(client: &reqwest::Client, url: &str) -> Result<Registry, String> {
    let bytes = if let Some(path) = url.strip_prefix("file://") {
        tokio::fs::read(path)
            .await
            .map_err(|e| format!("cannot read {path}: {e}"))?
    } else {
        let resp = client
            .get(url)
            .timeout(Duration::from_secs(30))
            .send()
            .await
            .map_err(|e| format!("cannot reach {url}: {}", error_chain(&e)))?;
        if !resp.status().is_success() {
            return Err(format!("{url} answered {}", resp.status()));
        }
        resp.bytes()
            .await
            .map_err(|e| format!("cannot read {url}: {}", error_chain(&e)))?
            .to_vec()
    };
    serde_json::from_slice(&bytes).map_err(|e| format!("{url} is not a valid ACP registry: {e}"))
}

/// Splits `name@version` (keeping a leading `@scope`). No version → `None`.
pub fn split_package(spec: &str) -> (&str, Option<&str>) {
    match spec[1.min(spec.len())..].rfind('@') {
        Some(i) => (&spec[..i + 1], Some(&spec[i + 2..])),
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
