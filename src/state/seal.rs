//! Secrets in the state dir: the values of `mcpServers[].env` and `headers` a client passed are
//! needed again after a restart (the restore's `session/load` passes them to the agent), but
//! must not lie on disk in clear. They are sealed with ChaCha20-Poly1305 under a key kept in the
//! data dir (`DATA/state-secrets.key`, 0600), never in the state dir: a copy, snapshot or backup
//! of the state dir alone reveals none of them. Without a usable key (the data dir inside the
//! state dir, or the key file unreadable), the values are not stored at all, and the sessions
//! that needed them are reported as not restored.

use std::io::{Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use base64::Engine as _;
use ring::aead::{Aad, CHACHA20_POLY1305, LessSafeKey, NONCE_LEN, Nonce, UnboundKey};
use ring::rand::{SecureRandom, SystemRandom};

/// The key file's name in the data dir.
pub const KEY_FILE: &str = "state-secrets.key";
const KEY_LEN: usize = 32;

pub struct Sealer {
    key: LessSafeKey,
    rng: SystemRandom,
}

impl Sealer {
    /// The sealer for a state dir, with its key in `data_dir` (made on first use). `None` when
    /// the key would lie inside the state dir, or cannot be read or made (a WARN says why).
    pub fn for_state(data_dir: &Path, state_dir: &Path) -> Option<Sealer> {
        let canon = |p: &Path| std::fs::canonicalize(p).unwrap_or_else(|_| p.to_path_buf());
        if canon(data_dir).starts_with(canon(state_dir)) {
            tracing::warn!(data_dir = %data_dir.display(), state_dir = %state_dir.display(),
                "the data dir is inside the state dir: MCP credentials of sessions are not kept across restarts");
            return None;
        }
        let path = data_dir.join(KEY_FILE);
        match load_or_make(&path) {
            Ok(bytes) => {
                let key = UnboundKey::new(&CHACHA20_POLY1305, &bytes).ok()?;
                Some(Sealer {
                    key: LessSafeKey::new(key),
                    rng: SystemRandom::new(),
                })
            }
            Err(e) => {
                tracing::warn!(path = %path.display(), error = %e,
                    "no key to seal secrets with: MCP credentials of sessions are not kept across restarts");
                None
            }
        }
    }

    /// `plain` sealed: base64 of nonce, ciphertext and tag.
    pub fn seal(&self, plain: &[u8]) -> Option<String> {
        let mut nonce = [0u8; NONCE_LEN];
        self.rng.fill(&mut nonce).ok()?;
        let mut buf = plain.to_vec();
        self.key
            .seal_in_place_append_tag(Nonce::assume_unique_for_key(nonce), Aad::empty(), &mut buf)
            .ok()?;
        let mut out = nonce.to_vec();
        out.extend_from_slice(&buf);
        Some(base64::engine::general_purpose::STANDARD.encode(out))
    }

    /// What `seal` sealed, or `None` (another key, or tampered with).
    pub fn open(&self, sealed: &str) -> Option<Vec<u8>> {
        let raw = base64::engine::general_purpose::STANDARD
            .decode(sealed)
            .ok()?;
        if raw.len() < NONCE_LEN {
            return None;
        }
        let (nonce, rest) = raw.split_at(NONCE_LEN);
        let nonce = Nonce::try_assume_unique_for_key(nonce).ok()?;
        let mut buf = rest.to_vec();
        let plain = self.key.open_in_place(nonce, Aad::empty(), &mut buf).ok()?;
        Some(plain.to_vec())
    }
}

fn load_or_make(path: &Path) -> std::io::Result<Vec<u8>> {
    match std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
    {
        Ok(mut f) => {
            let mut key = vec![0u8; KEY_LEN];
            SystemRandom::new()
                .fill(&mut key)
                .map_err(|_| std::io::Error::other("no random bytes"))?;
            f.write_all(&key)?;
            f.sync_all()?;
            Ok(key)
        }
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            let mut key = Vec::new();
            std::fs::OpenOptions::new()
                .read(true)
                .custom_flags(libc::O_NOFOLLOW)
                .open(path)?
                .take(KEY_LEN as u64 + 1)
                .read_to_end(&mut key)?;
            if key.len() != KEY_LEN {
                return Err(std::io::Error::other("the key file is not 32 bytes"));
            }
            Ok(key)
        }
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sealed_values_open_with_the_same_key_only() {
        let tmp = tempfile::tempdir().unwrap();
        let (data, state) = (tmp.path().join("data"), tmp.path().join("state"));
        std::fs::create_dir_all(&data).unwrap();
        let s = Sealer::for_state(&data, &state).unwrap();
        let sealed = s.seal(b"ghp_secret").unwrap();
        assert!(!sealed.contains("ghp_secret"));
        let again = Sealer::for_state(&data, &state).unwrap();
        assert_eq!(again.open(&sealed).unwrap(), b"ghp_secret");
        std::fs::remove_file(data.join(KEY_FILE)).unwrap();
        let other = Sealer::for_state(&data, &state).unwrap();
        assert!(other.open(&sealed).is_none());
        // A data dir inside the state dir keeps no key.
        assert!(Sealer::for_state(&state.join("data"), &state).is_none());
    }
}
