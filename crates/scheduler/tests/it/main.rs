//! The job layer end to end: a real dispatcher on loopback gRPC, real echo
//! workers, SQLite and PostgreSQL.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod batching;
mod bench;
mod fast_lane;
mod harness;
mod jobs;
mod migrations;
mod presence;
mod recovery;
mod runsync_unstored;
