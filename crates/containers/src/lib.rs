//! Users' own containers: reusable templates, registry credentials and
//! serverless endpoints, as desired state in the database.
//!
//! This crate knows nothing of HTTP or of container engines: the API
//! validates requests into the types of [`spec`] and calls
//! [`ContainerService`]; the reconciler (`crates/gantry`) reads the
//! endpoints and drives a runtime (`crates/runtime`) towards them. Every
//! query is scoped to its owner, so another user's object is answered
//! exactly like a missing one.

pub mod clusters;
pub mod entity;
pub mod fleet;
pub mod gpus;
pub mod pod_fleet;
pub mod pods;
pub mod secret;
pub mod service;
pub mod spec;

pub use fleet::{Fleet, FleetConfig, WorkerView};
pub use gantry_catalog::{ENDPOINT_PREFIX, is_endpoint_id};
pub use pods::{PodAction, PodRecord, PodSpec, PodStatus};
pub use secret::{SecretBox, SecretError};
pub use service::{ContainerError, ContainerService, EndpointRecord, ReleaseRecord, WorkerRecord};
pub use spec::*;
