//! HMAC-SHA256 signatures of the local backend's URLs.

use std::path::Path;

use hmac::{KeyInit, Mac};
use rand::RngExt;
use sha2::Sha256;

type HmacSha256 = hmac::Hmac<Sha256>;

/// Why a file URL is refused (403).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Denied {
    #[error("the URL's signature does not match")]
    BadSignature,
    #[error("the URL has expired")]
    Expired,
}

pub(crate) struct Key(Vec<u8>);

impl Key {
    /// The configured secret, else the key kept in `<data_dir>/files.key`
    /// (created with 32 random bytes on first use).
    pub(crate) fn load_or_create(configured: Option<&str>, data_dir: &Path) -> std::io::Result<Self> {
        if let Some(secret) = configured.filter(|s| !s.is_empty()) {
            return Ok(Self(secret.as_bytes().to_vec()));
        }
        let path = data_dir.join("files.key");
        if let Ok(text) = std::fs::read_to_string(&path)
            && let Ok(key) = hex::decode(text.trim())
            && key.len() >= 32
        {
            return Ok(Self(key));
        }
        std::fs::create_dir_all(data_dir)?;
        let key: [u8; 32] = rand::rng().random();
        // Written aside and renamed, so two processes starting together
        // both end up with the one that won.
        let aside = data_dir.join(format!("files.key.{}", std::process::id()));
        std::fs::write(&aside, hex::encode(key))?;
        restrict(&aside);
        if std::fs::hard_link(&aside, &path).is_err() {
            // Someone else created it first: use theirs.
            let _ = std::fs::remove_file(&aside);
            let text = std::fs::read_to_string(&path)?;
            let key = hex::decode(text.trim()).map_err(|e| {
                std::io::Error::new(std::io::ErrorKind::InvalidData, format!("{}: {e}", path.display()))
            })?;
            return Ok(Self(key));
        }
        let _ = std::fs::remove_file(&aside);
        Ok(Self(key.to_vec()))
    }

    fn mac(&self, key: &str, media_type: &str, expires: i64) -> HmacSha256 {
        let mut mac = <HmacSha256 as KeyInit>::new_from_slice(&self.0)
            .unwrap_or_else(|_| unreachable!("HMAC takes any key length"));
        // Length-prefixed fields: no two different triples sign the same bytes.
        for part in [key.as_bytes(), media_type.as_bytes(), expires.to_string().as_bytes()] {
            mac.update(&(part.len() as u64).to_be_bytes());
            mac.update(part);
        }
        mac
    }

    pub(crate) fn sign(&self, key: &str, media_type: &str, expires: i64) -> String {
        hex::encode(self.mac(key, media_type, expires).finalize().into_bytes())
    }

    /// Constant-time check of `sig`, then of the expiry (`now` and
    /// `expires` in Unix seconds; the URL works while `now < expires`).
    pub(crate) fn verify(&self, key: &str, media_type: &str, expires: i64, sig: &str, now: i64) -> Result<(), Denied> {
        let sig = hex::decode(sig).map_err(|_| Denied::BadSignature)?;
        self.mac(key, media_type, expires)
            .verify_slice(&sig)
            .map_err(|_| Denied::BadSignature)?;
        if now >= expires {
            return Err(Denied::Expired);
        }
        Ok(())
    }
}

#[cfg(unix)]
fn restrict(path: &Path) {
    use std::os::unix::fs::PermissionsExt;
    let _ = std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600));
}

#[cfg(not(unix))]
fn restrict(_: &Path) {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signatures_bind_every_field_and_expire() {
        let key = Key(b"secret".to_vec());
        let sig = key.sign("jobs/a/1/0.png", "image/png", 1000);
        assert_eq!(key.verify("jobs/a/1/0.png", "image/png", 1000, &sig, 999), Ok(()));
        assert_eq!(
            key.verify("jobs/a/1/0.png", "image/png", 1000, &sig, 1000),
            Err(Denied::Expired)
        );
        assert_eq!(
            key.verify("jobs/a/1/1.png", "image/png", 1000, &sig, 0),
            Err(Denied::BadSignature)
        );
        assert_eq!(
            key.verify("jobs/a/1/0.png", "text/html", 1000, &sig, 0),
            Err(Denied::BadSignature)
        );
        assert_eq!(
            key.verify("jobs/a/1/0.png", "image/png", 2000, &sig, 0),
            Err(Denied::BadSignature)
        );
        assert_eq!(
            key.verify("jobs/a/1/0.png", "image/png", 1000, "zz", 0),
            Err(Denied::BadSignature)
        );
        let other = Key(b"other".to_vec());
        assert_eq!(
            other.verify("jobs/a/1/0.png", "image/png", 1000, &sig, 0),
            Err(Denied::BadSignature)
        );
    }

    #[test]
    fn the_generated_key_is_kept() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let a = Key::load_or_create(None, dir.path()).unwrap_or_else(|e| panic!("{e}"));
        let b = Key::load_or_create(None, dir.path()).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(a.0, b.0);
        assert_eq!(a.0.len(), 32);
    }
}
