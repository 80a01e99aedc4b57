//! The one integration-test binary: every module starts the real daemon through `support` and
//! talks HTTP to it on loopback.

mod acp;
mod agents;
mod client;
mod config;
mod durable;
mod edge;
mod files;
mod first_hour;
mod hostile_agents;
mod hostile_files;
mod inspector;
mod lifecycle;
mod metrics;
mod mock_agent;
mod openapi;
mod opencode;
mod packaging;
mod processes;
mod providers;
mod real_agents;
mod reload;
mod reload_processes;
mod sdk;
mod second_round;
mod supervisor;
mod support;
mod traces;
mod transports;
mod warm_spawns;
mod watch;
