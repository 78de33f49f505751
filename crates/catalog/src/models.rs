//! Models served by the platform, with the unit they bill in and its price.
//!
//! Prices are exact: an integer number of micro-USD for an integer number of
//! whole units (`{ micro_usd = 500000, per = 5 }` is 0.50 USD per 5 seconds).
//! Nothing here is a float, so every price an operator can write is represented
//! exactly.
use serde::{Deserialize, Serialize};

use crate::Hold;

/// The longest audio a speech-to-text model accepts, in seconds. A
/// transcription job holds credit for this much audio, since its length is
/// only known once the worker has decoded it.
pub const MAX_AUDIO_SECONDS: u32 = 1800;

/// The most tokens an embedding model reads of one input (the longest
/// position table of the BERT family). An embedding job holds credit for
/// this many tokens per input, since an input's length in tokens is only
/// known once the worker has tokenized it.
pub const MAX_EMBEDDING_TOKENS: usize = 512;

/// What a model produces.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ModelKind {
    Image,
    Video,
    Speech,
    /// Speech to text.
    Transcription,
    Text,
    /// Text to vectors (sentence embeddings).
    Embedding,
    Diagnostic,
    /// A user's serverless endpoint (their own container image).
    Endpoint,
}

/// Prefix of every serverless endpoint id: a job route's id with it names a
/// user's endpoint, not a model of the catalog (whose ids may not start
/// with it).
pub const ENDPOINT_PREFIX: &str = "ep_";

/// Whether `id` names a user's serverless endpoint rather than a model.
pub fn is_endpoint_id(id: &str) -> bool {
    id.starts_with(ENDPOINT_PREFIX)
}

/// `micro_usd` micro-dollars for every `per` whole units.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "RawPrice")]
pub struct Price {
    micro_usd: i64,
    per: i64,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPrice {
    micro_usd: i64,
    #[serde(default = "one")]
    per: i64,
}

fn one() -> i64 {
    1
}

impl TryFrom<RawPrice> for Price {
    type Error = String;

    fn try_from(raw: RawPrice) -> Result<Self, String> {
        Price::new(raw.micro_usd, raw.per)
    }
}

impl Price {
    /// `micro_usd` (≥ 0) for every `per` (≥ 1) whole units.
    pub fn new(micro_usd: i64, per: i64) -> Result<Self, String> {
        if micro_usd < 0 {
            return Err(format!("price must not be negative (got {micro_usd} micro-USD)"));
        }
        if per < 1 {
            return Err(format!("`per` must be at least 1 (got {per})"));
        }
        Ok(Self { micro_usd, per })
    }

    /// Micro-dollars charged for [`Price::per`] whole units.
    pub fn micro_usd(self) -> i64 {
        self.micro_usd
    }

    /// Whole units the price is for.
    pub fn per(self) -> i64 {
        self.per
    }

    /// [`Price::micro_usd`] as an exact decimal string of USD: `10.00`,
    /// `0.0024`, `0.00001`.
    pub fn usd(self) -> String {
        let text = format!("{}.{:06}", self.micro_usd / 1_000_000, self.micro_usd % 1_000_000);
        let trimmed = text.trim_end_matches('0');
        match trimmed.strip_suffix('.') {
            Some(whole) => format!("{whole}.00"),
            None => trimmed.to_string(),
        }
    }
}

/// One model: its id (the `<model_id>` in `/v2/<model_id>/…`), kind, billing
/// unit (the unit its workers report usage in) and price per unit.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelSpec {
    pub id: String,
    pub kind: ModelKind,
    /// e.g. `megapixels`, `seconds`, `characters`, `tokens`, `requests`.
    pub unit: String,
    pub price: Price,
    /// The most units one job may use, read from its input: what a job
    /// holds of its owner's credit ([`Hold`]). Unset: one unit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hold: Option<Hold>,
}

impl ModelSpec {
    pub fn new(id: impl Into<String>, kind: ModelKind, unit: impl Into<String>, price: Price) -> Self {
        Self {
            id: id.into(),
            kind,
            unit: unit.into(),
            price,
            hold: None,
        }
    }

    /// This spec with `hold` as its credit hold rule.
    pub fn with_hold(mut self, hold: Option<Hold>) -> Self {
        self.hold = hold;
        self
    }

    /// The most units a job with `input` may use ([`ModelSpec::hold`]).
    pub fn hold_units(&self, input: &serde_json::Value) -> f64 {
        self.hold
            .as_ref()
            .map_or(1.0, |hold| hold.units(input, self.price.per()))
    }

    /// The job-path view of a user's endpoint: its jobs cost nothing
    /// themselves (its workers' time is billed instead), counted in requests.
    pub fn endpoint(id: impl Into<String>) -> Self {
        Self::new(id, ModelKind::Endpoint, "requests", Price { micro_usd: 0, per: 1 })
    }
}

/// The configured models. Deserializes from a list of [`ModelSpec`] (in TOML,
/// `[[models]]` tables), rejecting duplicate or empty ids.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "Vec<ModelSpec>", into = "Vec<ModelSpec>")]
pub struct ModelCatalog {
    models: Vec<ModelSpec>,
}

impl TryFrom<Vec<ModelSpec>> for ModelCatalog {
    type Error = String;

    fn try_from(models: Vec<ModelSpec>) -> Result<Self, String> {
        ModelCatalog::new(models)
    }
}

impl From<ModelCatalog> for Vec<ModelSpec> {
    fn from(catalog: ModelCatalog) -> Self {
        catalog.models
    }
}

impl Default for ModelCatalog {
    /// The built-in set: `gantry-echo` and one example model of each kind.
    fn default() -> Self {
        Self {
            models: default_models(),
        }
    }
}

impl ModelCatalog {
    pub fn new(models: Vec<ModelSpec>) -> Result<Self, String> {
        for (i, model) in models.iter().enumerate() {
            if model.id.is_empty() {
                return Err("model id must not be empty".into());
            }
            if is_endpoint_id(&model.id) {
                return Err(format!(
                    "model {:?}: ids starting with {ENDPOINT_PREFIX:?} are reserved for serverless endpoints",
                    model.id
                ));
            }
            if model.unit.is_empty() {
                return Err(format!("model {:?}: unit must not be empty", model.id));
            }
            if models[..i].iter().any(|other| other.id == model.id) {
                return Err(format!("model {:?} is listed twice", model.id));
            }
        }
        Ok(Self { models })
    }

    pub fn get(&self, id: &str) -> Option<&ModelSpec> {
        self.models.iter().find(|m| m.id == id)
    }

    pub fn iter(&self) -> impl Iterator<Item = &ModelSpec> {
        self.models.iter()
    }
}

fn price(micro_usd: i64, per: i64) -> Price {
    Price { micro_usd, per }
}

fn default_models() -> Vec<ModelSpec> {
    use ModelKind::*;
    let pixels = || {
        Some(Hold::Product {
            fields: [("width", 1024), ("height", 1024), ("num_images", 1)]
                .into_iter()
                .map(|(field, default)| (field.to_owned(), default))
                .collect(),
            divide: 1_000_000,
        })
    };
    vec![
        // 0.00001 USD per request.
        ModelSpec::new("gantry-echo", Diagnostic, "requests", price(10, 1)),
        // 0.0024 USD per megapixel (fast).
        ModelSpec::new("flux-schnell", Image, "megapixels", price(2_400, 1)).with_hold(pixels()),
        // 0.02 USD per megapixel (standard).
        ModelSpec::new("flux-dev", Image, "megapixels", price(20_000, 1)).with_hold(pixels()),
        // 0.50 USD per 5 seconds.
        ModelSpec::new("wan-video", Video, "seconds", price(500_000, 5)).with_hold(Some(Hold::Blocks {
            field: "duration".into(),
            default: 10,
        })),
        // 0.05 USD per 1000 characters.
        ModelSpec::new("kokoro-tts", Speech, "characters", price(50_000, 1_000))
            .with_hold(Some(Hold::Length("prompt".into()))),
        // 10.00 USD per million tokens.
        ModelSpec::new("qwen-text", Text, "tokens", price(10_000_000, 1_000_000)).with_hold(Some(Hold::Units(8192))),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid_and_found_by_id() {
        let catalog = ModelCatalog::default();
        let check = ModelCatalog::new(catalog.iter().cloned().collect()).unwrap();
        assert_eq!(check, catalog);
        let echo = catalog.get("gantry-echo").unwrap();
        assert_eq!(echo.kind, ModelKind::Diagnostic);
        assert_eq!(echo.unit, "requests");
        assert_eq!(catalog.get("wan-video").unwrap().price, Price::new(500_000, 5).unwrap());
        assert!(catalog.get("nope").is_none());
    }

    #[test]
    fn prices_print_exactly_in_usd() {
        let usd = |micro| Price::new(micro, 1).unwrap().usd();
        assert_eq!(usd(10_000_000), "10.00");
        assert_eq!(usd(10), "0.00001");
        assert_eq!(usd(2_400), "0.0024");
        assert_eq!(usd(500_000), "0.5");
    }

    #[test]
    fn deserializes_and_validates() {
        #[derive(Deserialize)]
        struct Config {
            models: ModelCatalog,
        }
        let json = serde_json::json!({"models": [
            {"id": "a", "kind": "image", "unit": "megapixels", "price": {"micro_usd": 20000}},
            {"id": "b", "kind": "text", "unit": "tokens", "price": {"micro_usd": 10000000, "per": 1000000}},
        ]});
        let config: Config = serde_json::from_value(json).unwrap();
        assert_eq!(config.models.get("a").unwrap().price.per(), 1);
        assert_eq!(config.models.get("b").unwrap().price.micro_usd(), 10_000_000);

        for bad in [
            serde_json::json!([{"id": "a", "kind": "image", "unit": "mp", "price": {"micro_usd": -1}}]),
            serde_json::json!([{"id": "a", "kind": "image", "unit": "mp", "price": {"micro_usd": 1, "per": 0}}]),
            serde_json::json!([
                {"id": "a", "kind": "image", "unit": "mp", "price": {"micro_usd": 1}},
                {"id": "a", "kind": "text", "unit": "tokens", "price": {"micro_usd": 1}}
            ]),
            serde_json::json!([{"id": "a", "kind": "audio", "unit": "mp", "price": {"micro_usd": 1}}]),
        ] {
            assert!(serde_json::from_value::<ModelCatalog>(bad.clone()).is_err(), "{bad}");
        }
    }
}
