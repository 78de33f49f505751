#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Integration tests for both limiters. Redis tests run against private redis-server children.

mod config;
mod memory;
mod redis_limiter;
mod sf;
mod support;
