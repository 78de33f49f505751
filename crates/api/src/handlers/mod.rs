pub mod catalog;
pub mod meta;
pub mod volumes;
