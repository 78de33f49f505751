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
// `SchedulerParts`, and read the tables directly (`entity`). Only `entity`
// and `transition` (the settlement plans the scheduler builds) are public
// modules; everything else a caller uses is re-exported below, so the
// crate's surface is this list.
mod census;
mod config;
mod credit;
mod db;
pub mod entity;
mod follow;
mod lane;
mod live;
mod metrics;
mod signals;
mod store;
pub mod transition;
mod types;
mod waiters;
mod wakeups;

pub use census::Census;
pub use config::{SchedulerConfig, millis};
pub use db::now_ms;
pub use follow::{Follow, Frame};
pub use gantry_net::{AddressPolicy, IpRange};
pub use lane::{FastLane, Handed};
pub use live::{Cursor, LiveStream, Taken};
pub use metrics::render as render_metrics;
pub use signals::Signal;
pub use store::{JobStore, Outcomes, SchedulerParts};
pub use transition::{JobWriter, Refused, Retention, WriteTurn};
pub use types::{
    JobCounts, JobError, JobPolicy, JobStatus, JobView, Mode, NewJob, SchedulerError, StreamView, WorkerTimings,
};
pub use wakeups::Attached;
