pub mod catalog;
pub mod files;
pub mod jobs;
pub(crate) mod live;
pub mod meta;
pub mod models;
pub mod openai;
pub mod volumes;
