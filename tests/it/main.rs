//! The one integration-test binary: every module starts the real daemon through `support` and
//! talks HTTP to it on loopback.

mod acp;
mod lifecycle;
mod mock_agent;
mod supervisor;
mod support;
