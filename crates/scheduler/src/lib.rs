//! Gantry's job layer.
//!
//! Jobs live in the database (SQLite embedded, PostgreSQL distributed):
//! `IN_QUEUE -> IN_PROGRESS -> COMPLETED | FAILED | CANCELLED | TIMED_OUT`.
//!
//! * [`JobStore`] is the database half, all an API process needs: submit, get,
//!   wait, cancel, retry, read a stream, purge a queue, health counts.
//! * [`Scheduler`] is the running half: it claims queued jobs (a guarded
//!   batch `UPDATE … RETURNING`, `FOR UPDATE SKIP LOCKED` on PostgreSQL),
//!   assigns them through a [`gantry_dispatch::Dispatcher`], settles results
//!   (completion and ledger charge in one transaction), retries crashed
//!   attempts, and sweeps leases, timeouts and expired jobs.
//!
//! Any number of schedulers may share one PostgreSQL database. See
//! `docs/scheduler.md` for the lifecycle, leases and billing rules.
mod config;
mod credit;
mod db;
mod engine;
mod entity;
mod files;
mod follow;
mod lane;
mod live;
pub mod metrics;
mod plan;
mod scheduler;
mod signals;
mod signing;
mod store;
mod types;
mod waiters;
mod wakeups;
mod webhooks;
mod writes;

pub use config::SchedulerConfig;
pub use follow::{Follow, Frame};
pub use gantry_net::{AddressPolicy, IpRange};
pub use live::{Cursor, LiveStream, Taken};
pub use scheduler::Scheduler;
pub use signing::webhook_secret;
pub use store::JobStore;
pub use types::{JobCounts, JobError, JobPolicy, JobStatus, JobView, Mode, NewJob, SchedulerError, StreamView};
