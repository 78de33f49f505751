//! Fixtures for tests that need real servers. A missing server is a clear
//! failure with the command that starts it, never a silent skip.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod postgres;
mod redis;

pub use postgres::{PgDatabase, postgres_admin_url};
pub use redis::RedisServer;

/// The two databases every storage test runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Sqlite,
    Postgres,
}

/// One test per backend from an `async fn name(Backend)` in the calling module.
#[macro_export]
macro_rules! on_both_backends {
    ($($name:ident),* $(,)?) => {
        mod sqlite {
            $( #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
               async fn $name() { super::$name($crate::Backend::Sqlite).await } )*
        }
        mod postgres {
            $( #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
               async fn $name() { super::$name($crate::Backend::Postgres).await } )*
        }
    };
}

/// A process-unique number for naming test resources.
pub fn unique() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos() as u64)
        .unwrap_or(0);
    NEXT.fetch_add(1, Ordering::Relaxed) * 1_000_000_000 + nanos
}
