use gantry_catalog::VolumeType;
use serde::Serialize;
use utoipa::ToSchema;

/// A human-readable volume name: any non-empty string (names need not be unique).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VolumeName(String);

impl VolumeName {
    pub fn parse(text: &str) -> Result<Self, &'static str> {
        if text.is_empty() {
            Err("must not be empty")
        } else {
            Ok(Self(text.to_string()))
        }
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// Allocated storage in GB, from 10 to 4096.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct VolumeSize(u32);

impl VolumeSize {
    pub const MIN: i64 = 10;
    pub const MAX: i64 = 4096;

    pub fn parse(gb: i64) -> Result<Self, String> {
        if gb < Self::MIN {
            Err(format!("must be at least {}", Self::MIN))
        } else if gb > Self::MAX {
            Err(format!("must be at most {}", Self::MAX))
        } else {
            Ok(Self(gb as u32))
        }
    }

    pub fn gb(self) -> u32 {
        self.0
    }
}

/// A network volume as the API shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct NetworkVolume {
    /// Unique network volume identifier
    #[schema(example = "agv6w2qcg7")]
    pub id: String,
    /// Human-readable name (not required to be unique)
    pub name: String,
    /// Allocated storage in GB
    #[schema(minimum = 10, maximum = 4096)]
    pub size: u32,
    /// Data center location; immutable after creation
    pub data_center: String,
    /// Storage tier of this volume. Set at creation and immutable.
    #[serde(rename = "type")]
    pub volume_type: VolumeType,
}

/// A validated creation request; the tier is already resolved against the catalog.
#[derive(Debug, Clone)]
pub struct NewVolume {
    pub name: VolumeName,
    pub size: VolumeSize,
    pub data_center: String,
    pub volume_type: VolumeType,
}

/// A validated update; at least one field is set.
#[derive(Debug, Clone, Default)]
pub struct VolumeUpdate {
    pub name: Option<VolumeName>,
    pub size: Option<VolumeSize>,
}
