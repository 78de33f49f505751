//! What the web console signs in with: passwords (argon2id), roles, and
//! server-side sessions.
//!
//! A session's cookie carries a random token; only its SHA-256 is stored, so
//! a copy of the database signs no one in. Every request reads the session
//! row (no cache), so signing out, here or everywhere, takes effect at once.
use std::time::Duration;

use argon2::password_hash::{PasswordHash, PasswordHasher, PasswordVerifier, SaltString};
use argon2::{Argon2, Params};
use rand::RngExt;
use sea_orm::{ActiveValue::Set, ColumnTrait, EntityTrait, QueryFilter, QueryOrder};
use sha2::{Digest, Sha256};

use crate::entity::{console_session, user};
use crate::service::{AuthError, AuthService, User, user_from};

/// Shortest and longest password accepted.
pub const PASSWORD_LENGTH: std::ops::RangeInclusive<usize> = 10..=1024;

/// What a user may do in the console beyond their own account.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Role {
    #[default]
    User,
    /// The operator pages: users, credit, limits, workers and queues.
    Admin,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::User => "user",
            Role::Admin => "admin",
        }
    }

    pub fn parse(text: &str) -> Result<Self, String> {
        match text {
            "user" => Ok(Role::User),
            "admin" => Ok(Role::Admin),
            other => Err(format!("unknown role '{other}': use user or admin")),
        }
    }
}

/// A signed-in console session, as a request finds it.
#[derive(Debug, Clone)]
pub struct ConsoleSession {
    pub user: User,
    /// The stored id (SHA-256 of the token), safe to log.
    pub id: String,
    /// The token every state-changing request must echo (`X-CSRF-Token` or a form field).
    pub csrf: String,
    /// Unix milliseconds.
    pub expires_at_ms: i64,
}

/// A session just started: the token goes into the cookie and nowhere else.
#[derive(Debug)]
pub struct StartedSession {
    pub token: String,
    pub csrf: String,
    pub expires_at_ms: i64,
}

/// Why a sign-in was refused. One answer for an unknown email and a wrong
/// password, so the form tells no one which emails have accounts.
#[derive(Debug, thiserror::Error)]
pub enum SignInError {
    #[error("wrong email or password")]
    Refused,
    #[error(transparent)]
    Auth(#[from] AuthError),
}

fn hasher() -> Argon2<'static> {
    // argon2id, 19 MiB, 2 passes, 1 lane: OWASP's first recommended setting.
    let params = Params::new(19 * 1024, 2, 1, None).unwrap_or_default();
    Argon2::new(argon2::Algorithm::Argon2id, argon2::Version::V0x13, params)
}

fn hash_password(password: &str) -> Result<String, AuthError> {
    let mut salt = [0u8; 16];
    rand::rng().fill(&mut salt);
    let salt = SaltString::encode_b64(&salt).map_err(|e| AuthError::Password(e.to_string()))?;
    hasher()
        .hash_password(password.as_bytes(), &salt)
        .map(|hash| hash.to_string())
        .map_err(|e| AuthError::Password(e.to_string()))
}

fn password_matches(password: &str, phc: &str) -> bool {
    PasswordHash::new(phc).is_ok_and(|hash| hasher().verify_password(password.as_bytes(), &hash).is_ok())
}

/// A hash no password matches, verified when the email is unknown so that
/// an unknown email takes as long to refuse as a wrong password.
const DECOY_HASH: &str =
    "$argon2id$v=19$m=19456,t=2,p=1$c29tZXNhbHRzb21lc2FsdA$yH0bN3S4q3l7xvNnSj0l0ZbJQ2bpYw6hKqkF5eJ3w1c";

async fn blocking<T: Send + 'static>(work: impl FnOnce() -> T + Send + 'static) -> Result<T, AuthError> {
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|e| AuthError::Password(e.to_string()))
}

fn random_hex(bytes: usize) -> String {
    let mut raw = vec![0u8; bytes];
    rand::rng().fill(raw.as_mut_slice());
    raw.iter().map(|b| format!("{b:02x}")).collect()
}

fn token_id(token: &str) -> String {
    Sha256::digest(token.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

impl AuthService {
    /// Sets (or replaces) a user's console password and ends their sessions.
    pub async fn set_password(&self, email: &str, password: &str) -> Result<User, AuthError> {
        let length = password.chars().count();
        if !PASSWORD_LENGTH.contains(&length) {
            return Err(AuthError::WeakPassword(format!(
                "a password needs {} to {} characters (this one has {length})",
                PASSWORD_LENGTH.start(),
                PASSWORD_LENGTH.end()
            )));
        }
        let user = self.find_user(email).await?;
        let password = password.to_owned();
        let phc = blocking(move || hash_password(&password)).await??;
        user::Entity::update(user::ActiveModel {
            id: Set(user.id.clone()),
            password_hash: Set(Some(phc)),
            ..Default::default()
        })
        .exec(self.db())
        .await?;
        self.end_all_sessions(&user.id).await?;
        Ok(user)
    }

    /// Makes a user an operator (`admin`) or not (`user`).
    pub async fn set_role(&self, email: &str, role: Role) -> Result<User, AuthError> {
        let mut user = self.find_user(email).await?;
        user::Entity::update(user::ActiveModel {
            id: Set(user.id.clone()),
            role: Set(role.as_str().to_owned()),
            ..Default::default()
        })
        .exec(self.db())
        .await?;
        user.role = role;
        Ok(user)
    }

    /// The user with this email and password; the same refusal for an
    /// unknown email, a user without a password and a wrong password.
    pub async fn check_password(&self, email: &str, password: &str) -> Result<User, SignInError> {
        let row = match self.find_user_row(email).await {
            Ok(row) => row,
            Err(AuthError::InvalidEmail(_)) => None,
            Err(err) => return Err(err.into()),
        };
        let phc = row
            .as_ref()
            .and_then(|r| r.password_hash.clone())
            .unwrap_or_else(|| DECOY_HASH.to_owned());
        let password = password.to_owned();
        let matched = blocking(move || password_matches(&password, &phc)).await?;
        match row {
            Some(row) if matched && row.password_hash.is_some() => Ok(user_from(row)),
            _ => Err(SignInError::Refused),
        }
    }

    /// Starts a session of `ttl` for `user`.
    pub async fn start_session(&self, user: &User, ttl: Duration) -> Result<StartedSession, AuthError> {
        let token = random_hex(32);
        let csrf = random_hex(32);
        let now = now_ms();
        let expires_at_ms = now.saturating_add(i64::try_from(ttl.as_millis()).unwrap_or(i64::MAX));
        console_session::Entity::insert(console_session::ActiveModel {
            id: Set(token_id(&token)),
            user_id: Set(user.id.clone()),
            csrf_token: Set(csrf.clone()),
            created_at: Set(now),
            expires_at: Set(expires_at_ms),
            ended_at: Set(None),
        })
        .exec_without_returning(self.db())
        .await?;
        Ok(StartedSession {
            token,
            csrf,
            expires_at_ms,
        })
    }

    /// The live session of a cookie's token: `None` when it is unknown,
    /// ended or expired, or its user is gone.
    pub async fn session(&self, token: &str) -> Result<Option<ConsoleSession>, AuthError> {
        if token.len() != 64 || !token.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Ok(None);
        }
        let Some(row) = console_session::Entity::find_by_id(token_id(token))
            .one(self.db())
            .await?
        else {
            return Ok(None);
        };
        if row.ended_at.is_some() || row.expires_at <= now_ms() {
            return Ok(None);
        }
        let Some(owner) = user::Entity::find_by_id(row.user_id.clone()).one(self.db()).await? else {
            return Ok(None);
        };
        Ok(Some(ConsoleSession {
            user: user_from(owner),
            id: row.id,
            csrf: row.csrf_token,
            expires_at_ms: row.expires_at,
        }))
    }

    /// Ends the session of a cookie's token (signing out); idempotent.
    pub async fn end_session(&self, token: &str) -> Result<(), AuthError> {
        console_session::Entity::update_many()
            .col_expr(
                console_session::Column::EndedAt,
                sea_orm::sea_query::Expr::value(now_ms()),
            )
            .filter(console_session::Column::Id.eq(token_id(token)))
            .filter(console_session::Column::EndedAt.is_null())
            .exec(self.db())
            .await?;
        Ok(())
    }

    /// Ends every session of a user (signing out everywhere); how many were live.
    pub async fn end_all_sessions(&self, user_id: &str) -> Result<u64, AuthError> {
        let result = console_session::Entity::update_many()
            .col_expr(
                console_session::Column::EndedAt,
                sea_orm::sea_query::Expr::value(now_ms()),
            )
            .filter(console_session::Column::UserId.eq(user_id))
            .filter(console_session::Column::EndedAt.is_null())
            .exec(self.db())
            .await?;
        Ok(result.rows_affected)
    }

    /// Every user, oldest first (the operator pages).
    pub async fn list_users(&self) -> Result<Vec<User>, AuthError> {
        let rows = user::Entity::find()
            .order_by_asc(user::Column::CreatedAt)
            .order_by_asc(user::Column::Id)
            .all(self.db())
            .await?;
        Ok(rows.into_iter().map(user_from).collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_hash_to_argon2id_and_verify() {
        let phc = hash_password("correct horse battery").unwrap_or_default();
        assert!(phc.starts_with("$argon2id$v=19$m=19456,t=2,p=1$"), "{phc}");
        assert!(password_matches("correct horse battery", &phc));
        assert!(!password_matches("correct horse batterY", &phc));
        // Two hashes of one password differ (a fresh salt each time).
        assert_ne!(hash_password("correct horse battery").unwrap_or_default(), phc);
    }

    #[test]
    fn the_decoy_hash_is_a_real_hash_no_password_matches() {
        // It must parse, or an unknown email would be refused faster than a wrong password.
        assert!(PasswordHash::new(DECOY_HASH).is_ok());
        assert!(!password_matches("", DECOY_HASH));
        assert!(!password_matches("somesaltsomesalt", DECOY_HASH));
    }

    #[test]
    fn roles_parse() {
        assert_eq!(Role::parse("admin"), Ok(Role::Admin));
        assert_eq!(Role::parse("user"), Ok(Role::User));
        assert!(Role::parse("root").is_err());
    }
}
