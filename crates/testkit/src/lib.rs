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

/// With `GANTRY_TEST_TRACE=<file>` (and optionally `GANTRY_TEST_TRACE_FILTER`,
/// default `info`), what the tests run (platforms, schedulers, workers) logs
/// there: what to read when a test fails on a loaded machine and not on a
/// quiet one.
pub fn trace_to_file() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let Some(path) = std::env::var_os("GANTRY_TEST_TRACE") else {
            return;
        };
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .expect("GANTRY_TEST_TRACE names a writable file");
        let filter = std::env::var("GANTRY_TEST_TRACE_FILTER").unwrap_or_else(|_| "info".into());
        let _ = tracing_subscriber::fmt()
            .with_ansi(false)
            .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
            .with_writer(std::sync::Mutex::new(file))
            .try_init();
    });
}
