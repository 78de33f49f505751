use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// Network volume storage tier.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum VolumeType {
    Standard,
    HighPerformance,
}

impl VolumeType {
    pub const ALL: [VolumeType; 2] = [VolumeType::Standard, VolumeType::HighPerformance];

    pub fn as_str(self) -> &'static str {
        match self {
            VolumeType::Standard => "STANDARD",
            VolumeType::HighPerformance => "HIGH_PERFORMANCE",
        }
    }

    pub fn parse(text: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|t| t.as_str() == text)
    }
}

/// Continental region containing a data center.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum DataCenterRegion {
    NorthAmerica,
    SouthAmerica,
    Europe,
    Asia,
    MiddleEast,
    Africa,
    Oceania,
    Antarctica,
    Unknown,
}

/// Compliance certifications a data center holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[allow(non_camel_case_types)]
pub enum Compliance {
    GDPR,
    ISO_IEC_27001,
    ISO_14001,
    PCI_DSS,
    HITRUST,
    SOC_1_TYPE_2,
    SOC_2_TYPE_2,
    SOC_3_TYPE_2,
    ITAR,
    FISMA_HIGH,
    HIPAA,
    RENEWABLE,
}

/// Stock availability level of a catalog resource.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum AvailabilityLevel {
    None,
    Low,
    Medium,
    High,
}

/// Optional expansions of a data center view.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum DataCenterInclude {
    GpuAvailability,
    CpuAvailability,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ResourceAvailability {
    pub id: String,
    pub name: String,
    pub availability: AvailabilityLevel,
}

/// A data center as configured. `network_volume_types[0]` is its default tier.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DataCenter {
    pub id: String,
    pub name: String,
    pub region: DataCenterRegion,
    #[serde(default)]
    pub global_network: bool,
    #[serde(default)]
    pub network_volume_types: Vec<VolumeType>,
    #[serde(default)]
    pub compliance: Vec<Compliance>,
    #[serde(default)]
    pub gpus: Vec<ResourceAvailability>,
    #[serde(default)]
    pub cpus: Vec<ResourceAvailability>,
}

/// A data center as the API shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
#[schema(as = DataCenter)]
pub struct DataCenterView {
    pub id: String,
    pub name: String,
    pub region: DataCenterRegion,
    pub global_network: bool,
    pub network_volume_types: Vec<VolumeType>,
    pub compliance: Vec<Compliance>,
    /// Present only with include=GPU_AVAILABILITY, and omitted when the data center has no GPUs.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gpu_availability: Option<Vec<ResourceAvailability>>,
    /// Present only with include=CPU_AVAILABILITY, and omitted when the data center has no CPU flavors.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cpu_availability: Option<Vec<ResourceAvailability>>,
}

/// List filters; each family combines with the others by AND.
#[derive(Debug, Clone, Default)]
pub struct DataCenterFilter {
    /// Any of these regions (OR).
    pub regions: Vec<DataCenterRegion>,
    /// All of these tiers (AND).
    pub network_volume_types: Vec<VolumeType>,
    /// All of these certifications (AND).
    pub compliance: Vec<Compliance>,
    pub global_network: Option<bool>,
}

/// Why a volume cannot be placed in a data center.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TierError {
    UnknownDataCenter,
    NoVolumes,
    TierNotOffered { offered: Vec<VolumeType> },
}

impl std::fmt::Display for TierError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TierError::UnknownDataCenter => f.write_str("unknown data center"),
            TierError::NoVolumes => f.write_str("data center does not offer network volumes"),
            TierError::TierNotOffered { offered } => write!(
                f,
                "tier not offered by this data center (offered: {})",
                offered.iter().map(|t| t.as_str()).collect::<Vec<_>>().join(", ")
            ),
        }
    }
}

#[derive(Debug, Clone)]
pub struct Catalog {
    data_centers: Vec<DataCenter>,
}

impl Default for Catalog {
    fn default() -> Self {
        Self::new(crate::defaults::data_centers())
    }
}

impl Catalog {
    pub fn new(data_centers: Vec<DataCenter>) -> Self {
        Self { data_centers }
    }

    pub fn data_center(&self, id: &str) -> Option<&DataCenter> {
        self.data_centers.iter().find(|dc| dc.id == id)
    }

    /// The data center this platform's own machines are listed as (the first).
    pub fn home(&self) -> Option<&DataCenter> {
        self.data_centers.first()
    }

    pub fn list(&self, filter: &DataCenterFilter) -> impl Iterator<Item = &DataCenter> {
        self.data_centers.iter().filter(move |dc| {
            (filter.regions.is_empty() || filter.regions.contains(&dc.region))
                && filter
                    .network_volume_types
                    .iter()
                    .all(|t| dc.network_volume_types.contains(t))
                && filter.compliance.iter().all(|c| dc.compliance.contains(c))
                && filter.global_network.is_none_or(|g| dc.global_network == g)
        })
    }

    /// The tier a new volume gets: the requested one if offered, else the data center's default.
    pub fn volume_tier(&self, dc: &str, requested: Option<VolumeType>) -> Result<VolumeType, TierError> {
        let dc = self.data_center(dc).ok_or(TierError::UnknownDataCenter)?;
        let default = *dc.network_volume_types.first().ok_or(TierError::NoVolumes)?;
        match requested {
            None => Ok(default),
            Some(t) if dc.network_volume_types.contains(&t) => Ok(t),
            Some(_) => Err(TierError::TierNotOffered {
                offered: dc.network_volume_types.clone(),
            }),
        }
    }

    /// Checks a configured catalog: unique ids, no duplicate tiers.
    pub fn validate(&self) -> Result<(), String> {
        let mut seen = std::collections::HashSet::new();
        for dc in &self.data_centers {
            if dc.id.trim().is_empty() {
                return Err("a data center has an empty id".into());
            }
            if !seen.insert(dc.id.as_str()) {
                return Err(format!("data center '{}' is configured twice", dc.id));
            }
            let tiers: std::collections::HashSet<_> = dc.network_volume_types.iter().collect();
            if tiers.len() != dc.network_volume_types.len() {
                return Err(format!("data center '{}' lists a volume tier twice", dc.id));
            }
        }
        Ok(())
    }
}

impl DataCenter {
    pub fn view(&self, include: &[DataCenterInclude]) -> DataCenterView {
        let expand = |what: DataCenterInclude, list: &Vec<ResourceAvailability>| {
            (include.contains(&what) && !list.is_empty()).then(|| list.clone())
        };
        DataCenterView {
            id: self.id.clone(),
            name: self.name.clone(),
            region: self.region,
            global_network: self.global_network,
            network_volume_types: self.network_volume_types.clone(),
            compliance: self.compliance.clone(),
            gpu_availability: expand(DataCenterInclude::GpuAvailability, &self.gpus),
            cpu_availability: expand(DataCenterInclude::CpuAvailability, &self.cpus),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_tier_is_the_first_offered() {
        let catalog = Catalog::default();
        assert!(catalog.validate().is_ok());
        let dc = catalog
            .list(&DataCenterFilter::default())
            .find(|dc| dc.network_volume_types.len() == 2);
        let dc = dc.map(|d| d.id.clone()).unwrap_or_default();
        let first = catalog.data_center(&dc).map(|d| d.network_volume_types[0]);
        assert_eq!(catalog.volume_tier(&dc, None).ok(), first);
        assert_eq!(catalog.volume_tier("NOPE-1", None), Err(TierError::UnknownDataCenter));
    }

    #[test]
    fn filters_combine_families_with_and() {
        let catalog = Catalog::default();
        let filter = DataCenterFilter {
            regions: vec![DataCenterRegion::Europe],
            network_volume_types: vec![VolumeType::Standard, VolumeType::HighPerformance],
            ..Default::default()
        };
        for dc in catalog.list(&filter) {
            assert_eq!(dc.region, DataCenterRegion::Europe);
            assert_eq!(dc.network_volume_types.len(), 2);
        }
    }
}
