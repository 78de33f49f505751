//! Users, API keys and scopes.
//!
//! A key is `gk_` + 32 base62 characters (~190 random bits) + a 6-character
//! CRC32 checksum, so a mistyped key is rejected before any lookup. Only the
//! SHA-256 of a key is stored. Verification reads through a short-lived cache
//! and writes only when a key was last used (once a minute at most).
//! Console users sign in with a password (argon2id) to a server-side session.
mod console;
mod entity;
mod key;
mod scope;
mod service;
mod time;

pub use console::{ConsoleSession, PASSWORD_LENGTH, Role, SignInError, StartedSession};
pub use key::{ApiKey, KeyFormatError};
pub use scope::{Scope, ScopeParseError, ScopeSet};
pub use service::{AuthError, AuthService, IssuedKey, KeyInfo, Principal, User, UserLimits, VerifyError};
pub use time::{parse_duration, unix_now};
