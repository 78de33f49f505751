//! The catalog: data centers (with their network volume tiers, compliance and
//! resource availability). It comes from configuration, with a built-in default set.
mod datacenter;
mod defaults;
mod hardware;
mod hold;
mod models;

pub use datacenter::{
    AvailabilityLevel, Catalog, Compliance, DataCenter, DataCenterFilter, DataCenterInclude, DataCenterRegion,
    DataCenterView, ResourceAvailability, TierError, VolumeType,
};
pub use hardware::{
    CpuPrice, CpuType, GpuManufacturer, GpuMaxCount, GpuPrice, GpuType, VcpuRange, availability_of, default_cpus,
    default_gpus,
};
pub use hold::Hold;
pub use models::{
    ENDPOINT_PREFIX, MAX_AUDIO_SECONDS, MAX_EMBEDDING_TOKENS, ModelCatalog, ModelKind, ModelSpec, Price, is_endpoint_id,
};
