use gantry_catalog::VolumeType;
use serde::de::{self, Deserializer};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// A human-readable volume name (names need not be unique): 1 to
/// [`VolumeName::MAX_CHARS`] characters, none of them a control character
/// (NUL included, which PostgreSQL cannot store) or a bidirectional
/// override or isolate (U+202A–U+202E, U+2066–U+2069), which can make a
/// listing display text in an order other than the one stored. The same
/// rule on every backend, checked before any write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VolumeName(String);

impl VolumeName {
    pub const MAX_CHARS: usize = 128;

    pub fn parse(text: &str) -> Result<Self, &'static str> {
        if text.is_empty() {
            Err("must not be empty")
        } else if text.chars().count() > Self::MAX_CHARS {
            Err("must be at most 128 characters long")
        } else if text.chars().any(char::is_control) {
            Err("must not contain control characters (such as NUL, tab or newline)")
        } else if text
            .chars()
            .any(|c| matches!(c, '\u{202A}'..='\u{202E}' | '\u{2066}'..='\u{2069}'))
        {
            Err("must not contain bidirectional override or isolate characters (U+202A-U+202E, U+2066-U+2069)")
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

/// A name in a request body: a string that passes [`VolumeName::parse`].
impl<'de> Deserialize<'de> for VolumeName {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        VolumeName::parse(&text).map_err(de::Error::custom)
    }
}

/// A size in a request body: an integer that passes [`VolumeSize::parse`];
/// one beyond `i64` is as much too large as any other.
impl<'de> Deserialize<'de> for VolumeSize {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Gb;
        impl de::Visitor<'_> for Gb {
            type Value = VolumeSize;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("an integer")
            }
            fn visit_i64<E: de::Error>(self, gb: i64) -> Result<VolumeSize, E> {
                VolumeSize::parse(gb).map_err(E::custom)
            }
            fn visit_u64<E: de::Error>(self, gb: u64) -> Result<VolumeSize, E> {
                VolumeSize::parse(i64::try_from(gb).unwrap_or(i64::MAX)).map_err(E::custom)
            }
        }
        deserializer.deserialize_i64(Gb)
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

#[cfg(test)]
mod tests {
    use super::VolumeName;

    #[test]
    fn names_follow_one_rule() {
        for good in ["a", "my-dataset", "données d'été", &"x".repeat(128), "emoji 🚀 ok"] {
            assert!(VolumeName::parse(good).is_ok(), "{good:?}");
        }
        for bad in [
            "",
            "nul\u{0}",
            "tab\there",
            "line\nbreak",
            "\u{202E}evil",
            "iso\u{2066}late",
            &"x".repeat(129),
        ] {
            assert!(VolumeName::parse(bad).is_err(), "{bad:?}");
        }
    }
}
