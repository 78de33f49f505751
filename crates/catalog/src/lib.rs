//! The catalog: data centers (with their network volume tiers, compliance and
//! resource availability). It comes from configuration, with a built-in default set.
mod datacenter;
mod defaults;

pub use datacenter::{
    AvailabilityLevel, Catalog, Compliance, DataCenter, DataCenterFilter, DataCenterInclude, DataCenterRegion,
    DataCenterView, ResourceAvailability, TierError, VolumeType,
};
