//! The one integration-test binary: every module starts the real daemon through `support` and
//! talks HTTP to it on loopback.

mod config;
mod files;
mod lifecycle;
mod support;
