pub mod billing;
pub mod catalog;
pub mod clusters;
pub mod embeddings;
pub mod files;
pub mod jobs;
pub(crate) mod live;
pub mod meta;
pub mod models;
pub mod openai;
pub mod pods;
pub mod serverless;
mod text_request;

pub(crate) use text_request::written_schemas;
pub mod volumes;
pub mod worker_protocol;
