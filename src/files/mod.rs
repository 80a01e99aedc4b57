//! The host filesystem service behind /v1/fs.

use crate::config::Config;

pub struct FileService {}

impl FileService {
    pub fn new(_config: &Config) -> Self {
        FileService {}
    }
}
