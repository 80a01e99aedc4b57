//! `/v1/config/{mcp,skills}`: the schema of an entry. `ConfigStore` validates a body against its
//! own serde shapes (on the blocking pool, keeping the original JSON), so these types are the
//! document's statement of those shapes and are never built; the test below holds them to the
//! same bodies the store accepts and refuses.

// Only the schema and the test read these types: a body is validated and stored by the store.
#![allow(dead_code)]

use std::collections::BTreeMap;

use serde::Deserialize;
use serde_json::Value;

#[derive(Deserialize, utoipa::ToSchema)]
#[serde(untagged)]
pub enum McpCommand {
    One(String),
    Many(Vec<String>),
}

/// One MCP server entry: a local (stdio) command or a remote (HTTP/SSE) server.
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(tag = "type", rename_all = "lowercase", deny_unknown_fields)]
pub enum McpEntry {
    Local {
        command: McpCommand,
        args: Option<Vec<String>>,
        env: Option<BTreeMap<String, String>>,
        enabled: Option<bool>,
        #[serde(rename = "timeoutMs")]
        timeout_ms: Option<u64>,
        cwd: Option<String>,
    },
    Remote {
        url: String,
        headers: Option<BTreeMap<String, String>>,
        #[serde(rename = "bearerTokenEnvVar")]
        bearer_token_env_var: Option<String>,
        #[serde(rename = "envHeaders")]
        env_headers: Option<BTreeMap<String, String>>,
        oauth: Option<Value>,
        enabled: Option<bool>,
        #[serde(rename = "timeoutMs")]
        timeout_ms: Option<u64>,
        transport: Option<McpTransport>,
    },
}

#[derive(Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum McpTransport {
    Http,
    Sse,
}

/// One skills entry: where its skills come from.
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SkillsEntry {
    sources: Vec<SkillSource>,
}

#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SkillSource {
    #[serde(rename = "type")]
    kind: String,
    source: String,
    skills: Option<Vec<String>>,
    #[serde(rename = "ref")]
    git_ref: Option<String>,
    subpath: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config_store::{ConfigKind, validate};

    /// Every body the store accepts fits the schema, and every body that does not fit the schema
    /// is refused by the store: the document never promises less than is checked, nor more.
    #[test]
    fn the_schema_accepts_what_the_store_accepts_and_refuses_what_it_cannot_parse() {
        let mcp = [
            r#"{"type":"local","command":"npx","args":["x"]}"#,
            r#"{"type":"local","command":["npx","x"],"env":{"A":"b"},"timeoutMs":5,"cwd":"/"}"#,
            r#"{"type":"remote","url":"https://x","transport":"sse","oauth":{},"enabled":true}"#,
            r#"{"type":"remote","url":"http://x","headers":{"a":"b"},"envHeaders":{"c":"D"},"bearerTokenEnvVar":"T","timeoutMs":1}"#,
            r#"{"type":"local","command":""}"#,
            r#"{"type":"remote","url":"ftp://x"}"#,
            r#"{"type":"local"}"#,
            r#"{"type":"local","command":"x","extra":1}"#,
            r#"{"type":"remote","url":"https://x","transport":"ws"}"#,
            r#"{"type":"other","command":"x"}"#,
            r#"{"command":"x"}"#,
            r#"{"type":"local","command":5}"#,
        ];
        let skills = [
            r#"{"sources":[{"type":"github","source":"o/r","skills":["a"],"ref":"main","subpath":"s"}]}"#,
            r#"{"sources":[]}"#,
            r#"{"sources":[{"type":"","source":"o/r"}]}"#,
            r#"{"sources":[{"type":"github"}]}"#,
            r#"{"sources":[{"type":"github","source":"o/r","x":1}]}"#,
            r#"{"sources":[],"more":1}"#,
            r#"{}"#,
        ];
        let mut refused_by_both = 0;
        let cases = mcp.iter().map(|b| (ConfigKind::Mcp, *b));
        for (kind, body) in cases.chain(skills.iter().map(|b| (ConfigKind::Skills, *b))) {
            let stored = validate(kind, body.as_bytes()).is_ok();
            let fits = match kind {
                ConfigKind::Mcp => serde_json::from_str::<McpEntry>(body).is_ok(),
                ConfigKind::Skills => serde_json::from_str::<SkillsEntry>(body).is_ok(),
            };
            assert!(!stored || fits, "stored but outside the schema: {body}");
            refused_by_both += usize::from(!fits && !stored);
        }
        // The shape errors above (missing, unknown and mistyped members) are all refused.
        assert_eq!(refused_by_both, 10);
    }
}
