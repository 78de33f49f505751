//! End-to-end tests over real gRPC on loopback: the dispatch service served
//! by tonic, real SDK workers running real models. No mocks.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod auth;
mod files;
mod harness;
mod jobs;
mod lifecycle;
