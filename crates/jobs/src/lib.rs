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
// Every write of `jobs` is a transition in `transition/`, run by a
// [`JobWriter`]: the scheduler (the loop) and `gantry-webhooks` (the outbox)
// submit transitions and settlement plans to the writer they get with
// `store::SchedulerParts`, and read the tables directly. API processes need
// only the re-exports below.
mod census;
pub mod config;
mod credit;
pub mod db;
pub mod entity;
mod follow;
pub mod lane;
mod live;
pub mod metrics;
pub mod signals;
pub mod store;
pub mod transition;
pub mod types;
mod waiters;
pub mod wakeups;

pub use census::Census;
pub use config::SchedulerConfig;
pub use follow::{Follow, Frame};
pub use gantry_net::{AddressPolicy, IpRange};
pub use live::{Cursor, LiveStream, Taken};
pub use store::JobStore;
pub use transition::{JobWriter, Retention, WriteTurn};
pub use types::{
    JobCounts, JobError, JobPolicy, JobStatus, JobView, Mode, NewJob, SchedulerError, StreamView, WorkerTimings,
};
