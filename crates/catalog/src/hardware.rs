//! GPU types and CPU flavors: what the catalog lists, with list prices, and
//! how available each is now, judged from the workers connected to the
//! schedulers (what they report in their hello).

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::AvailabilityLevel;

/// Canonical GPU manufacturer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum GpuManufacturer {
    #[serde(rename = "NVIDIA")]
    Nvidia,
    #[serde(rename = "AMD")]
    Amd,
    #[serde(rename = "UNKNOWN")]
    Unknown,
}

/// USD per hour for one GPU.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct GpuPrice {
    pub secure: f64,
    pub community: f64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub serverless: Option<f64>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct GpuMaxCount {
    pub secure: u32,
    pub community: u32,
}

/// A GPU type of the catalog (`[[catalog.gpus]]`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct GpuType {
    /// The device name as the driver reports it (`nvidia-smi --query-gpu=name`);
    /// a worker reporting this name counts toward its availability.
    pub id: String,
    pub name: String,
    pub pool: Option<String>,
    pub manufacturer: GpuManufacturer,
    /// VRAM in GB.
    pub memory: u32,
    pub secure: bool,
    pub community: bool,
    pub price: GpuPrice,
    pub max_count: GpuMaxCount,
}

/// The vCPU range of a CPU flavor.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct VcpuRange {
    pub min: u32,
    pub max: u32,
}

/// USD per hour per vCPU.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct CpuPrice {
    pub secure_per_vcpu: f64,
    pub serverless_per_vcpu: f64,
}

/// A CPU flavor of the catalog (`[[catalog.cpus]]`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct CpuType {
    pub id: String,
    pub name: String,
    pub group: String,
    pub vcpu: VcpuRange,
    pub ram_gb_per_vcpu: f64,
    pub price: CpuPrice,
}

/// Availability from a count of workers: none, 1 (low), 2–3 (medium), 4 or
/// more (high).
pub fn availability_of(workers: u64) -> AvailabilityLevel {
    match workers {
        0 => AvailabilityLevel::None,
        1 => AvailabilityLevel::Low,
        2..=3 => AvailabilityLevel::Medium,
        _ => AvailabilityLevel::High,
    }
}

/// The built-in GPU types (list prices in USD per GPU-hour).
pub fn default_gpus() -> Vec<GpuType> {
    let gpu = |id: &str,
               name: &str,
               pool: Option<&str>,
               memory: u32,
               secure: f64,
               community: f64,
               serverless: Option<f64>,
               max: (u32, u32)| GpuType {
        id: id.into(),
        name: name.into(),
        pool: pool.map(Into::into),
        manufacturer: if id.starts_with("AMD") {
            GpuManufacturer::Amd
        } else {
            GpuManufacturer::Nvidia
        },
        memory,
        secure: max.0 > 0,
        community: max.1 > 0,
        price: GpuPrice {
            secure,
            community,
            serverless,
        },
        max_count: GpuMaxCount {
            secure: max.0,
            community: max.1,
        },
    };
    vec![
        gpu(
            "NVIDIA H200",
            "H200 SXM",
            Some("HOPPER_141"),
            141,
            3.99,
            3.59,
            Some(4.46),
            (8, 0),
        ),
        gpu(
            "NVIDIA H100 80GB HBM3",
            "H100 SXM",
            Some("HOPPER_80"),
            80,
            2.99,
            2.69,
            Some(4.18),
            (8, 8),
        ),
        gpu(
            "NVIDIA H100 PCIe",
            "H100 PCIe",
            Some("HOPPER_80"),
            80,
            2.39,
            1.99,
            Some(4.18),
            (8, 4),
        ),
        gpu(
            "NVIDIA A100 80GB PCIe",
            "A100 PCIe",
            Some("AMPERE_80"),
            80,
            1.64,
            1.19,
            Some(2.72),
            (8, 4),
        ),
        gpu(
            "NVIDIA L40S",
            "L40S",
            Some("ADA_48_PRO"),
            48,
            0.86,
            0.79,
            Some(1.90),
            (8, 4),
        ),
        gpu(
            "NVIDIA RTX A6000",
            "RTX A6000",
            Some("AMPERE_48"),
            48,
            0.49,
            0.33,
            Some(1.22),
            (8, 8),
        ),
        gpu(
            "NVIDIA GeForce RTX 4090",
            "RTX 4090",
            Some("ADA_24"),
            24,
            0.69,
            0.34,
            Some(1.10),
            (8, 8),
        ),
        gpu("NVIDIA L4", "L4", Some("ADA_24"), 24, 0.43, 0.0, Some(0.69), (8, 0)),
        gpu(
            "NVIDIA RTX A4000",
            "RTX A4000",
            Some("AMPERE_16"),
            16,
            0.25,
            0.17,
            Some(0.58),
            (8, 8),
        ),
        gpu("AMD Instinct MI300X OAM", "MI300X", None, 192, 2.49, 0.0, None, (8, 0)),
    ]
}

/// The built-in CPU flavors.
pub fn default_cpus() -> Vec<CpuType> {
    let cpu = |id: &str, name: &str, group: &str, max: u32, ram: f64, secure: f64, serverless: f64| CpuType {
        id: id.into(),
        name: name.into(),
        group: group.into(),
        vcpu: VcpuRange { min: 2, max },
        ram_gb_per_vcpu: ram,
        price: CpuPrice {
            secure_per_vcpu: secure,
            serverless_per_vcpu: serverless,
        },
    };
    vec![
        cpu("cpu3c", "Compute-Optimized", "Gen 3", 32, 2.0, 0.03, 0.04),
        cpu("cpu3g", "General Purpose", "Gen 3", 32, 4.0, 0.04, 0.05),
        cpu("cpu3m", "Memory-Optimized", "Gen 3", 16, 8.0, 0.06, 0.07),
        cpu("cpu5c", "Compute-Optimized", "Gen 5", 32, 2.0, 0.04, 0.05),
        cpu("cpu5g", "General Purpose", "Gen 5", 32, 4.0, 0.05, 0.06),
        cpu("cpu5m", "Memory-Optimized", "Gen 5", 16, 8.0, 0.07, 0.08),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_unique_and_levels_follow_counts() {
        let gpus = default_gpus();
        let mut ids: Vec<&str> = gpus.iter().map(|g| g.id.as_str()).collect();
        ids.sort_unstable();
        ids.dedup();
        assert_eq!(ids.len(), gpus.len());
        assert_eq!(availability_of(0), AvailabilityLevel::None);
        assert_eq!(availability_of(1), AvailabilityLevel::Low);
        assert_eq!(availability_of(3), AvailabilityLevel::Medium);
        assert_eq!(availability_of(9), AvailabilityLevel::High);
    }
}
