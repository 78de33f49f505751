//! Registry credentials at rest: sealed with AES-256-GCM under a key from
//! the settings, never stored or logged in the clear.
//!
//! A sealed value is `v1:<key id>:<base64 of nonce ‖ ciphertext ‖ tag>`; the
//! key id (the first 8 hex digits of the key's SHA-256) says which key opens
//! it, so keys can be rotated: the new key seals, the old ones listed after
//! it still open what they sealed (a credential created again after the
//! rotation is sealed with the new key). The credential's owner and id
//! are the additional authenticated data, so a sealed value copied onto
//! another row does not open.

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use ring::aead::{AES_256_GCM, Aad, LessSafeKey, NONCE_LEN, Nonce, UnboundKey};
use ring::rand::{SecureRandom, SystemRandom};
use sha2::{Digest, Sha256};

/// Why a value could not be sealed or opened.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SecretError {
    #[error("sealed with key {0}, which is not configured")]
    UnknownKey(String),
    #[error("the sealed value is malformed or was tampered with")]
    Corrupt,
    #[error("no randomness available")]
    Random,
}

/// The keys that seal and open credentials: the first seals, all open.
pub struct SecretBox {
    keys: Vec<(String, LessSafeKey)>,
    random: SystemRandom,
}

impl std::fmt::Debug for SecretBox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let ids: Vec<&str> = self.keys.iter().map(|(id, _)| id.as_str()).collect();
        f.debug_struct("SecretBox").field("key_ids", &ids).finish()
    }
}

impl SecretBox {
    /// `current` seals; `previous` only open.
    pub fn new(current: [u8; 32], previous: &[[u8; 32]]) -> Self {
        let keys = std::iter::once(&current)
            .chain(previous)
            .filter_map(|key| {
                let id = key_id(key);
                UnboundKey::new(&AES_256_GCM, key)
                    .ok()
                    .map(|k| (id, LessSafeKey::new(k)))
            })
            .collect();
        Self {
            keys,
            random: SystemRandom::new(),
        }
    }

    /// A 32-byte key from a passphrase of the settings (its SHA-256 under a
    /// purpose label, so the same secret used elsewhere gives another key).
    pub fn derive(passphrase: &str) -> [u8; 32] {
        let mut hasher = Sha256::new();
        hasher.update(b"gantry registry credentials v1\0");
        hasher.update(passphrase.as_bytes());
        hasher.finalize().into()
    }

    /// The id of the key that seals.
    pub fn current_key_id(&self) -> &str {
        self.keys.first().map_or("", |(id, _)| id.as_str())
    }

    pub fn seal(&self, plaintext: &str, context: &str) -> Result<String, SecretError> {
        let (id, key) = self.keys.first().ok_or(SecretError::UnknownKey(String::new()))?;
        let mut nonce = [0u8; NONCE_LEN];
        self.random.fill(&mut nonce).map_err(|_| SecretError::Random)?;
        let mut data = plaintext.as_bytes().to_vec();
        key.seal_in_place_append_tag(
            Nonce::assume_unique_for_key(nonce),
            Aad::from(context.as_bytes()),
            &mut data,
        )
        .map_err(|_| SecretError::Corrupt)?;
        let mut out = nonce.to_vec();
        out.extend_from_slice(&data);
        Ok(format!("v1:{id}:{}", STANDARD.encode(out)))
    }

    pub fn open(&self, sealed: &str, context: &str) -> Result<String, SecretError> {
        let mut parts = sealed.splitn(3, ':');
        let (Some("v1"), Some(id), Some(body)) = (parts.next(), parts.next(), parts.next()) else {
            return Err(SecretError::Corrupt);
        };
        let key = self
            .keys
            .iter()
            .find(|(k, _)| k == id)
            .map(|(_, key)| key)
            .ok_or_else(|| SecretError::UnknownKey(id.to_owned()))?;
        let raw = STANDARD.decode(body).map_err(|_| SecretError::Corrupt)?;
        if raw.len() < NONCE_LEN {
            return Err(SecretError::Corrupt);
        }
        let (nonce, rest) = raw.split_at(NONCE_LEN);
        let nonce = Nonce::try_assume_unique_for_key(nonce).map_err(|_| SecretError::Corrupt)?;
        let mut data = rest.to_vec();
        let plain = key
            .open_in_place(nonce, Aad::from(context.as_bytes()), &mut data)
            .map_err(|_| SecretError::Corrupt)?;
        String::from_utf8(plain.to_vec()).map_err(|_| SecretError::Corrupt)
    }
}

fn key_id(key: &[u8; 32]) -> String {
    let digest = Sha256::digest(key);
    digest.iter().take(4).map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seals_opens_and_rotates() {
        let old = SecretBox::derive("old");
        let new = SecretBox::derive("new");
        let before = SecretBox::new(old, &[]);
        let sealed = before.seal("hunter2", "u1/reg1").unwrap_or_default();
        assert!(!sealed.contains("hunter2"));
        assert_eq!(before.open(&sealed, "u1/reg1").ok().as_deref(), Some("hunter2"));
        // Another row's context does not open it.
        assert_eq!(before.open(&sealed, "u2/reg1"), Err(SecretError::Corrupt));
        // After rotation the old key still opens; new values use the new key.
        let after = SecretBox::new(new, &[old]);
        assert_eq!(after.open(&sealed, "u1/reg1").ok().as_deref(), Some("hunter2"));
        let resealed = after.seal("hunter2", "u1/reg1").unwrap_or_default();
        assert!(resealed.starts_with(&format!("v1:{}:", after.current_key_id())));
        // Without the old key the old value says which key it needs.
        let only_new = SecretBox::new(new, &[]);
        assert!(matches!(
            only_new.open(&sealed, "u1/reg1"),
            Err(SecretError::UnknownKey(_))
        ));
        // Tampering is detected.
        let mut bytes = sealed.into_bytes();
        let last = bytes.len() - 2;
        bytes[last] = if bytes[last] == b'A' { b'B' } else { b'A' };
        let tampered = String::from_utf8(bytes).unwrap_or_default();
        assert!(before.open(&tampered, "u1/reg1").is_err());
    }
}
