//! Gantry's job layer: the job model and its durable store.
//!
//! Jobs live in the database (SQLite embedded, PostgreSQL distributed):
//! `IN_QUEUE -> IN_PROGRESS -> COMPLETED | FAILED | CANCELLED | TIMED_OUT`.
//!
//! [`JobStore`] is all an API process needs: submit, get, wait, cancel,
//! retry, follow a stream, purge a queue, health counts. The running half,
//! which claims, assigns, settles and sweeps, is `gantry-scheduler`; the
//! webhook outbox is `gantry-webhooks`. Any number of schedulers may share one
//! PostgreSQL database. See `docs/scheduler.md` for the lifecycle, leases and
//! billing rules.
// Every module is public: `gantry-scheduler` (the loop) and `gantry-webhooks`
// (the outbox) work on the store's tables and plans directly, and the loop
// gets the parts it shares with the store as `store::SchedulerParts`. API
// processes need only the re-exports below.
pub mod config;
pub mod credit;
pub mod db;
pub mod engine;
pub mod entity;
pub mod files;
pub mod follow;
pub mod lane;
pub mod live;
pub mod metrics;
pub mod plan;
pub mod signals;
pub mod signing;
pub mod store;
pub mod types;
pub mod waiters;
pub mod wakeups;
pub mod writes;

pub use config::SchedulerConfig;
pub use follow::{Follow, Frame};
pub use gantry_net::{AddressPolicy, IpRange};
pub use live::{Cursor, LiveStream, Taken};
pub use signing::webhook_secret;
pub use store::JobStore;
pub use types::{JobCounts, JobError, JobPolicy, JobStatus, JobView, Mode, NewJob, SchedulerError, StreamView};
