pub mod catalog;
pub mod jobs;
pub mod meta;
pub mod volumes;
