//! Directory-scoped MCP and skills configuration behind /v1/config.

use std::sync::Arc;

use crate::files::FileService;

pub struct ConfigStore {
    #[allow(dead_code)]
    files: Arc<FileService>,
}

impl ConfigStore {
    pub fn new(files: Arc<FileService>) -> Self {
        ConfigStore { files }
    }
}
