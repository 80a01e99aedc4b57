//! What can run (the catalog of known agents plus the operator's agents file) and getting it onto
//! the machine (the installer).

pub mod cli;
pub mod mock;

use std::sync::Arc;

use crate::config::Config;

pub struct Agents {
    #[allow(dead_code)]
    config: Arc<Config>,
}

impl Agents {
    pub fn new(config: Arc<Config>) -> anyhow::Result<Self> {
        Ok(Agents { config })
    }
}
