//! The one integration-test binary: every module starts the real daemon through `support` and
//! talks HTTP to it on loopback.

mod acp;
mod agent_user_isolation;
mod agents;
mod browser;
mod client;
mod config;
mod desktop;
mod docs_check;
mod durable;
mod edge;
mod files;
mod hostile_agents;
mod hostile_files;
mod image_cli;
mod inspector;
mod lifecycle;
mod list_paging;
mod metrics;
mod mock_agent;
mod openapi;
mod opencode;
mod operator_messages;
mod packaging;
mod processes;
mod providers;
mod python_sdk;
mod real_agent_bundles;
mod real_agents;
mod reload;
mod reload_processes;
mod sdk;
mod session_bundles;
mod sessions;
mod slow_clients;
mod supervisor;
mod support;
// The in-process tier: the real router without a socket (support/app.rs).
mod routes;
mod traces;
mod transports;
mod warm_spawns;
mod watch;
mod workspace;
