use std::collections::HashMap;
use std::sync::RwLock;
use std::time::{Duration, Instant};

use rand::RngExt;
use sea_orm::{
    ActiveValue::Set, ColumnTrait, DatabaseConnection, DbErr, EntityTrait, PaginatorTrait, QueryFilter, QueryOrder,
    SqlErr,
};

use crate::entity::{api_key, user};
use crate::key::{ApiKey, KeyFormatError};
use crate::scope::{Scope, ScopeSet};
use crate::time::unix_now;

/// Who is calling: the user a verified key belongs to, and what the key may do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Principal {
    pub user_id: String,
    pub key_id: String,
    pub scopes: ScopeSet,
    pub limits: UserLimits,
}

/// A user's rate limit overrides (`None`: the configured default) and exemption.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct UserLimits {
    pub minute: Option<u64>,
    pub hour: Option<u64>,
    pub day: Option<u64>,
    pub exempt: bool,
}

impl Principal {
    pub fn has(&self, scope: Scope) -> bool {
        self.scopes.contains(scope)
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct User {
    pub id: String,
    pub email: String,
    pub created_at: i64,
    pub limits: UserLimits,
    pub role: crate::console::Role,
    /// Whether the user can sign in to the console.
    pub has_password: bool,
}

/// A key as listed: never the secret, only enough to recognise it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyInfo {
    pub id: String,
    pub name: Option<String>,
    pub prefix: String,
    pub last_four: String,
    pub scopes: ScopeSet,
    pub created_at: i64,
    pub expires_at: Option<i64>,
    pub revoked_at: Option<i64>,
    /// Unix seconds, to the minute.
    pub last_used_at: Option<i64>,
}

/// A freshly issued key; the only time the secret exists outside the caller.
#[derive(Debug)]
pub struct IssuedKey {
    pub key: ApiKey,
    pub info: KeyInfo,
}

/// Why a request's credentials were refused (all of these are 401).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum VerifyError {
    #[error("missing bearer token")]
    Missing,
    #[error("the Authorization header must be 'Bearer <api key>'")]
    NotBearer,
    #[error("{0}")]
    Format(#[from] KeyFormatError),
    #[error("API key is not recognised")]
    Unknown,
    #[error("API key has been revoked")]
    Revoked,
    #[error("API key has expired")]
    Expired,
    #[error("credentials could not be checked right now")]
    Unavailable,
}

#[derive(Debug, thiserror::Error)]
pub enum AuthError {
    #[error("invalid email address '{0}'")]
    InvalidEmail(String),
    #[error("a user with email '{0}' already exists")]
    DuplicateEmail(String),
    #[error("no user with email '{0}'")]
    NoSuchUser(String),
    #[error("no API key with id '{0}'")]
    NoSuchKey(String),
    #[error("a key needs at least one scope")]
    NoScopes,
    #[error("{0}")]
    WeakPassword(String),
    #[error("password hashing failed: {0}")]
    Password(String),
    #[error(transparent)]
    Database(#[from] DbErr),
}

#[derive(Clone)]
enum Cached {
    Valid {
        principal: Principal,
        expires_at: Option<i64>,
    },
    Revoked,
    Unknown,
}

/// Issues and verifies keys. Clone-free: share it behind an `Arc`.
pub struct AuthService {
    db: DatabaseConnection,
    cache: RwLock<HashMap<[u8; 32], (Cached, Instant)>>,
    cache_ttl: Duration,
}

const CACHE_CAPACITY: usize = 100_000;

impl AuthService {
    /// `cache_ttl` bounds how long a revocation made by another process takes to be seen.
    pub fn new(db: DatabaseConnection, cache_ttl: Duration) -> Self {
        Self {
            db,
            cache: RwLock::new(HashMap::new()),
            cache_ttl,
        }
    }

    pub async fn create_user(&self, email: &str) -> Result<User, AuthError> {
        let email = normalise_email(email)?;
        let model = user::Model {
            id: new_id("usr_"),
            email: email.clone(),
            created_at: unix_now(),
            rate_minute: None,
            rate_hour: None,
            rate_day: None,
            rate_exempt: false,
            password_hash: None,
            role: "user".into(),
        };
        let active = user::ActiveModel {
            id: Set(model.id.clone()),
            email: Set(model.email.clone()),
            created_at: Set(model.created_at),
            rate_minute: Set(None),
            rate_hour: Set(None),
            rate_day: Set(None),
            rate_exempt: Set(false),
            password_hash: Set(None),
            role: Set("user".into()),
        };
        match user::Entity::insert(active).exec_without_returning(&self.db).await {
            Ok(_) => Ok(user_from(model)),
            Err(err) if matches!(err.sql_err(), Some(SqlErr::UniqueConstraintViolation(_))) => {
                Err(AuthError::DuplicateEmail(email))
            }
            Err(err) => Err(err.into()),
        }
    }

    pub async fn user_count(&self) -> Result<u64, AuthError> {
        Ok(user::Entity::find().count(&self.db).await?)
    }

    pub async fn find_user(&self, email: &str) -> Result<User, AuthError> {
        let email = normalise_email(email)?;
        self.find_user_row(&email)
            .await?
            .map(user_from)
            .ok_or(AuthError::NoSuchUser(email))
    }

    pub(crate) async fn find_user_row(&self, email: &str) -> Result<Option<user::Model>, AuthError> {
        let email = normalise_email(email)?;
        Ok(user::Entity::find()
            .filter(user::Column::Email.eq(email.as_str()))
            .one(&self.db)
            .await?)
    }

    pub async fn user_by_id(&self, id: &str) -> Result<Option<User>, AuthError> {
        Ok(user::Entity::find_by_id(id.to_owned())
            .one(&self.db)
            .await?
            .map(user_from))
    }

    pub(crate) fn db(&self) -> &DatabaseConnection {
        &self.db
    }

    /// Revokes one of `user`'s keys; another user's key is as unknown as a missing one.
    pub async fn revoke_own_key(&self, user: &User, key_id: &str) -> Result<KeyInfo, AuthError> {
        let owned = api_key::Entity::find_by_id(key_id.to_string())
            .filter(api_key::Column::UserId.eq(user.id.as_str()))
            .one(&self.db)
            .await?
            .is_some();
        if !owned {
            return Err(AuthError::NoSuchKey(key_id.to_string()));
        }
        self.revoke_key(key_id).await
    }

    /// Stores a user's rate limit overrides; other processes see them within the cache TTL.
    pub async fn set_limits(&self, email: &str, limits: UserLimits) -> Result<User, AuthError> {
        let mut user = self.find_user(email).await?;
        let as_i64 = |v: Option<u64>| v.map(|n| n.min(i64::MAX as u64) as i64);
        let active = user::ActiveModel {
            id: Set(user.id.clone()),
            rate_minute: Set(as_i64(limits.minute)),
            rate_hour: Set(as_i64(limits.hour)),
            rate_day: Set(as_i64(limits.day)),
            rate_exempt: Set(limits.exempt),
            ..Default::default()
        };
        user::Entity::update(active).exec(&self.db).await?;
        if let Ok(mut cache) = self.cache.write() {
            cache.clear();
        }
        user.limits = limits;
        Ok(user)
    }

    pub async fn issue_key(
        &self,
        user: &User,
        scopes: ScopeSet,
        expires_in: Option<Duration>,
        name: Option<String>,
    ) -> Result<IssuedKey, AuthError> {
        if scopes.is_empty() {
            return Err(AuthError::NoScopes);
        }
        let key = ApiKey::generate();
        let now = unix_now();
        let info = KeyInfo {
            id: new_id("key_"),
            name,
            prefix: key.display_prefix().to_string(),
            last_four: key.last_four().to_string(),
            scopes,
            created_at: now,
            expires_at: expires_in.map(|d| now.saturating_add(d.as_secs() as i64)),
            revoked_at: None,
            last_used_at: None,
        };
        let active = api_key::ActiveModel {
            id: Set(info.id.clone()),
            user_id: Set(user.id.clone()),
            name: Set(info.name.clone()),
            prefix: Set(info.prefix.clone()),
            last_four: Set(info.last_four.clone()),
            key_hash: Set(key.hash_hex()),
            scopes: Set(scopes.to_storage()),
            expires_at: Set(info.expires_at),
            revoked_at: Set(None),
            created_at: Set(now),
            last_used_at: Set(None),
        };
        api_key::Entity::insert(active).exec_without_returning(&self.db).await?;
        Ok(IssuedKey { key, info })
    }

    pub async fn list_keys(&self, user: &User) -> Result<Vec<KeyInfo>, AuthError> {
        let rows = api_key::Entity::find()
            .filter(api_key::Column::UserId.eq(user.id.as_str()))
            .order_by_asc(api_key::Column::CreatedAt)
            .order_by_asc(api_key::Column::Id)
            .all(&self.db)
            .await?;
        Ok(rows.into_iter().map(key_info_from).collect())
    }

    /// Revokes a key. Idempotent: revoking a revoked key keeps the first time.
    pub async fn revoke_key(&self, key_id: &str) -> Result<KeyInfo, AuthError> {
        let row = api_key::Entity::find_by_id(key_id.to_string())
            .one(&self.db)
            .await?
            .ok_or_else(|| AuthError::NoSuchKey(key_id.to_string()))?;
        if row.revoked_at.is_some() {
            return Ok(key_info_from(row));
        }
        let now = unix_now();
        api_key::Entity::update_many()
            .col_expr(api_key::Column::RevokedAt, sea_orm::sea_query::Expr::value(now))
            .filter(api_key::Column::Id.eq(key_id))
            .filter(api_key::Column::RevokedAt.is_null())
            .exec(&self.db)
            .await?;
        // This process sees the revocation at once; others within the cache TTL.
        if let Ok(mut cache) = self.cache.write() {
            cache.retain(|_, (entry, _)| match entry {
                Cached::Valid { principal, .. } => principal.key_id != key_id,
                _ => true,
            });
        }
        Ok(KeyInfo {
            revoked_at: Some(now),
            ..key_info_from(row)
        })
    }

    /// Verifies an `Authorization` header value (see `verify`).
    pub async fn verify_header(&self, header: Option<&str>) -> Result<Principal, VerifyError> {
        let header = header.ok_or(VerifyError::Missing)?;
        let (scheme, token) = header.trim().split_once(' ').ok_or(VerifyError::NotBearer)?;
        if !scheme.eq_ignore_ascii_case("bearer") {
            return Err(VerifyError::NotBearer);
        }
        let key = ApiKey::parse(token.trim())?;
        self.verify(&key).await
    }

    pub async fn verify(&self, key: &ApiKey) -> Result<Principal, VerifyError> {
        let hash = key.hash();
        let cached = self.cache.read().ok().and_then(|c| {
            c.get(&hash)
                .filter(|(_, at)| at.elapsed() < self.cache_ttl)
                .map(|(e, _)| e.clone())
        });
        let entry = match cached {
            Some(entry) => entry,
            None => {
                let entry = self.load(key).await?;
                if let Ok(mut cache) = self.cache.write() {
                    if cache.len() >= CACHE_CAPACITY {
                        cache.clear();
                    }
                    cache.insert(hash, (entry.clone(), Instant::now()));
                }
                entry
            }
        };
        match entry {
            Cached::Valid { principal, expires_at } => match expires_at {
                Some(at) if at <= unix_now() => Err(VerifyError::Expired),
                _ => Ok(principal),
            },
            Cached::Revoked => Err(VerifyError::Revoked),
            Cached::Unknown => Err(VerifyError::Unknown),
        }
    }

    async fn load(&self, key: &ApiKey) -> Result<Cached, VerifyError> {
        let row = api_key::Entity::find()
            .filter(api_key::Column::KeyHash.eq(key.hash_hex()))
            .one(&self.db)
            .await
            .map_err(|err| {
                tracing::error!(error = %err, "API key lookup failed");
                VerifyError::Unavailable
            })?;
        Ok(match row {
            None => Cached::Unknown,
            Some(row) if row.revoked_at.is_some() => Cached::Revoked,
            Some(row) => {
                let owner = user::Entity::find_by_id(row.user_id.clone())
                    .one(&self.db)
                    .await
                    .map_err(|err| {
                        tracing::error!(error = %err, "user lookup failed");
                        VerifyError::Unavailable
                    })?;
                // When the key was last used, to the minute: one write per
                // key per minute at most, and only when the cache misses.
                let now = unix_now();
                if owner.is_some() && row.last_used_at.is_none_or(|at| at <= now - 60) {
                    let stamped = api_key::Entity::update_many()
                        .col_expr(api_key::Column::LastUsedAt, sea_orm::sea_query::Expr::value(now))
                        .filter(api_key::Column::Id.eq(row.id.as_str()))
                        .exec(&self.db)
                        .await;
                    if let Err(error) = stamped {
                        tracing::warn!(%error, "a key's last use could not be recorded");
                    }
                }
                match owner {
                    // The user was deleted; their keys die with them.
                    None => Cached::Unknown,
                    Some(owner) => Cached::Valid {
                        expires_at: row.expires_at,
                        principal: Principal {
                            scopes: ScopeSet::parse(&row.scopes).unwrap_or_default(),
                            user_id: row.user_id,
                            key_id: row.id,
                            limits: limits_of(&owner),
                        },
                    },
                }
            }
        })
    }
}

fn normalise_email(email: &str) -> Result<String, AuthError> {
    let email = email.trim().to_ascii_lowercase();
    let valid = email.len() <= 254
        && email
            .split_once('@')
            .is_some_and(|(local, domain)| !local.is_empty() && !domain.is_empty() && !domain.contains('@'))
        && !email.chars().any(char::is_whitespace);
    if valid {
        Ok(email)
    } else {
        Err(AuthError::InvalidEmail(email))
    }
}

fn new_id(prefix: &str) -> String {
    const ALPHABET: &[u8] = b"0123456789abcdefghijklmnopqrstuvwxyz";
    let mut rng = rand::rng();
    let tail: String = (0..16)
        .map(|_| ALPHABET[rng.random_range(0..ALPHABET.len())] as char)
        .collect();
    format!("{prefix}{tail}")
}

fn limits_of(model: &user::Model) -> UserLimits {
    let as_u64 = |v: Option<i64>| v.map(|n| n.max(0) as u64);
    UserLimits {
        minute: as_u64(model.rate_minute),
        hour: as_u64(model.rate_hour),
        day: as_u64(model.rate_day),
        exempt: model.rate_exempt,
    }
}

pub(crate) fn user_from(model: user::Model) -> User {
    User {
        limits: limits_of(&model),
        role: crate::console::Role::parse(&model.role).unwrap_or_default(),
        has_password: model.password_hash.is_some(),
        id: model.id,
        email: model.email,
        created_at: model.created_at,
    }
}

fn key_info_from(row: api_key::Model) -> KeyInfo {
    KeyInfo {
        scopes: ScopeSet::parse(&row.scopes).unwrap_or_default(),
        id: row.id,
        name: row.name,
        prefix: row.prefix,
        last_four: row.last_four,
        created_at: row.created_at,
        expires_at: row.expires_at,
        revoked_at: row.revoked_at,
        last_used_at: row.last_used_at,
    }
}
