use rand::RngExt;
use sha2::{Digest, Sha256};

const PREFIX: &str = "gk_";
const SECRET_LEN: usize = 32;
const CHECKSUM_LEN: usize = 6;
const ALPHABET: &[u8; 62] = b"0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";

/// Why a presented string is not an API key at all (no lookup was made).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum KeyFormatError {
    #[error("malformed API key")]
    Malformed,
    #[error("API key checksum mismatch (mistyped key?)")]
    BadChecksum,
}

/// A syntactically valid API key whose checksum matches.
#[derive(Clone, PartialEq, Eq)]
pub struct ApiKey(String);

impl std::fmt::Debug for ApiKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ApiKey({}…{})", self.display_prefix(), self.last_four())
    }
}

impl ApiKey {
    pub fn generate() -> Self {
        let mut rng = rand::rng();
        let secret: String = (0..SECRET_LEN)
            .map(|_| ALPHABET[rng.random_range(0..ALPHABET.len())] as char)
            .collect();
        let checksum = checksum(&secret);
        ApiKey(format!("{PREFIX}{secret}{checksum}"))
    }

    pub fn parse(text: &str) -> Result<Self, KeyFormatError> {
        let body = text.strip_prefix(PREFIX).ok_or(KeyFormatError::Malformed)?;
        if body.len() != SECRET_LEN + CHECKSUM_LEN || !body.bytes().all(|b| b.is_ascii_alphanumeric()) {
            return Err(KeyFormatError::Malformed);
        }
        let (secret, sum) = body.split_at(SECRET_LEN);
        if checksum(secret) != sum {
            return Err(KeyFormatError::BadChecksum);
        }
        Ok(ApiKey(text.to_string()))
    }

    pub fn expose(&self) -> &str {
        &self.0
    }

    /// The SHA-256 of the whole key: the only form that is stored.
    pub fn hash(&self) -> [u8; 32] {
        Sha256::digest(self.0.as_bytes()).into()
    }

    pub fn hash_hex(&self) -> String {
        hex(&self.hash())
    }

    /// `gk_` and the first four secret characters: enough to recognise a key in a list.
    pub fn display_prefix(&self) -> &str {
        &self.0[..PREFIX.len() + 4]
    }

    pub fn last_four(&self) -> &str {
        &self.0[self.0.len() - 4..]
    }
}

fn checksum(secret: &str) -> String {
    let mut n = crc32fast::hash(secret.as_bytes()) as u64;
    let mut out = [b'0'; CHECKSUM_LEN];
    for slot in out.iter_mut().rev() {
        *slot = ALPHABET[(n % 62) as usize];
        n /= 62;
    }
    out.iter().map(|b| *b as char).collect()
}

pub(crate) fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_keys_round_trip_and_typos_are_caught() {
        let key = ApiKey::generate();
        assert_eq!(key.expose().len(), 3 + 32 + 6);
        assert_eq!(ApiKey::parse(key.expose()), Ok(key.clone()));
        let mut typo = key.expose().to_string().into_bytes();
        typo[10] = if typo[10] == b'a' { b'b' } else { b'a' };
        let typo = String::from_utf8(typo).unwrap_or_default();
        assert_eq!(ApiKey::parse(&typo), Err(KeyFormatError::BadChecksum));
        assert_eq!(ApiKey::parse("gk_short"), Err(KeyFormatError::Malformed));
        assert_eq!(ApiKey::parse(&key.expose()[3..]), Err(KeyFormatError::Malformed));
        assert_ne!(ApiKey::generate(), key);
    }
}
