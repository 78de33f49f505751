//! Network volumes on sea-orm. Values enter through `parse()` constructors, so a
//! `VolumeName` or `VolumeSize` that exists is valid; the service only stores them.
mod cache;
mod entity;
mod model;
mod service;

pub use model::{NetworkVolume, NewVolume, VolumeName, VolumeSize, VolumeUpdate};
pub use service::{VolumeError, VolumeService};
