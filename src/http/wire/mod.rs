//! The API's wire types: every request and answer body that the services produce or take, with
//! its `serde` shape and its OpenAPI schema (`utoipa::ToSchema`). The services keep plain types;
//! the handlers convert at the edge with the `From` impls here (one file per area). The schema
//! names, field order and doc comments here are the document: `docs/openapi.json` is generated
//! from them.

pub mod acp;
pub mod agents;
pub mod config;
pub mod desktop;
pub mod files;
pub mod processes;
pub mod supervisor;
pub mod watch;
