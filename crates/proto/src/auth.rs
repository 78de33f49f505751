//! Worker authentication: an HS256 JWT sent as `authorization: Bearer <jwt>`
//! metadata on the `Connect` call.
//!
//! The token names the worker (`sub`) and the models it may serve (`models`).
//! Tokens are meant to be short-lived: they are checked once, when the stream
//! opens, and a reconnecting worker mints a fresh one.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use jsonwebtoken::{Algorithm, DecodingKey, EncodingKey, Header, Validation};
use serde::{Deserialize, Serialize};

/// Metadata key carrying the token.
pub const AUTHORIZATION: &str = "authorization";

/// Claims of a worker token.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorkerClaims {
    /// Worker id; the worker's Hello must carry the same id.
    pub sub: String,
    /// Model ids the worker may serve.
    pub models: Vec<String>,
    /// Expiry, seconds since the Unix epoch.
    pub exp: u64,
    /// Issue time, seconds since the Unix epoch.
    #[serde(default)]
    pub iat: u64,
}

impl WorkerClaims {
    /// Claims for `worker_id` serving `models`, valid for `ttl` from now.
    pub fn new(worker_id: impl Into<String>, models: Vec<String>, ttl: Duration) -> Self {
        let now = unix_secs();
        Self {
            sub: worker_id.into(),
            models,
            exp: now.saturating_add(ttl.as_secs().max(1)),
            iat: now,
        }
    }
}

/// Why a token could not be minted or was refused.
#[derive(Debug, thiserror::Error)]
pub enum AuthError {
    /// No `authorization` metadata, or not of the form `Bearer <jwt>`.
    #[error("missing bearer token")]
    Missing,
    /// The token is malformed, badly signed or expired.
    #[error("invalid worker token: {0}")]
    Invalid(#[from] jsonwebtoken::errors::Error),
}

/// Signs `claims` with the shared `secret` (HS256).
pub fn mint(claims: &WorkerClaims, secret: &[u8]) -> Result<String, AuthError> {
    Ok(jsonwebtoken::encode(
        &Header::new(Algorithm::HS256),
        claims,
        &EncodingKey::from_secret(secret),
    )?)
}

/// Checks the signature and expiry of `token` and returns its claims.
pub fn verify(token: &str, secret: &[u8]) -> Result<WorkerClaims, AuthError> {
    let mut validation = Validation::new(Algorithm::HS256);
    validation.set_required_spec_claims(&["exp", "sub"]);
    validation.leeway = 5;
    let data = jsonwebtoken::decode::<WorkerClaims>(token, &DecodingKey::from_secret(secret), &validation)?;
    Ok(data.claims)
}

/// Extracts the token from `Bearer <jwt>` metadata and verifies it.
pub fn verify_metadata(metadata: &tonic::metadata::MetadataMap, secret: &[u8]) -> Result<WorkerClaims, AuthError> {
    let value = metadata
        .get(AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .ok_or(AuthError::Missing)?;
    let token = value
        .strip_prefix("Bearer ")
        .or_else(|| value.strip_prefix("bearer "))
        .map(str::trim)
        .filter(|t| !t.is_empty())
        .ok_or(AuthError::Missing)?;
    verify(token, secret)
}

fn unix_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_wrong_secret() {
        let claims = WorkerClaims::new("w1", vec!["m".into()], Duration::from_secs(60));
        let token = mint(&claims, b"s3cret").unwrap();
        assert_eq!(verify(&token, b"s3cret").unwrap(), claims);
        assert!(matches!(verify(&token, b"other"), Err(AuthError::Invalid(_))));
    }

    #[test]
    fn expired_token_is_refused() {
        let mut claims = WorkerClaims::new("w1", vec![], Duration::from_secs(60));
        claims.exp = unix_secs() - 3600;
        let token = mint(&claims, b"k").unwrap();
        assert!(verify(&token, b"k").is_err());
    }

    #[test]
    fn metadata_needs_bearer_prefix() {
        let mut md = tonic::metadata::MetadataMap::new();
        assert!(matches!(verify_metadata(&md, b"k"), Err(AuthError::Missing)));
        let claims = WorkerClaims::new("w1", vec![], Duration::from_secs(60));
        let token = mint(&claims, b"k").unwrap();
        md.insert(AUTHORIZATION, token.parse().unwrap());
        assert!(matches!(verify_metadata(&md, b"k"), Err(AuthError::Missing)));
        md.insert(AUTHORIZATION, format!("Bearer {token}").parse().unwrap());
        assert_eq!(verify_metadata(&md, b"k").unwrap().sub, "w1");
    }
}
