#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Integration tests: the real application on port 0, driven over HTTP (and the
//! real `gantry` binary for the CLI), on SQLite and on PostgreSQL.
mod harness;

mod auth;
mod billing;
mod browser;
mod catalog;
mod cli;
mod clusters;
mod console;
mod credit;
mod diffusion;
mod embeddings;
mod errors;
mod files;
mod hibari;
mod images;
mod jobs;
mod kubernetes;
mod live;
mod metrics;
mod openapi;
mod pods;
mod probes;
mod processes;
mod ratelimits;
mod serverless;
mod speech;
mod text;
mod tracing;
mod transcription;
mod videos;
mod voices;
mod volumes;
mod webhooks;
