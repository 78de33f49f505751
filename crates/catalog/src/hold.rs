//! How much credit a job holds while it is queued and running.
//!
//! Each priced model states its rule in the model manifest (`hold = { … }`):
//! which fields of a job's input bound the units the job can use. The job
//! core only applies the rule ([`Hold::units`]) and prices the result; it
//! knows no model's fields.
use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The most units one job of a model may use, read from its input. In TOML,
/// one of:
///
/// - `hold = { units = 8192 }`: a fixed number (a text model's context);
/// - `hold = { length = "prompt" }`: the characters of a string field (at
///   least 1; 1 when it is absent);
/// - `hold = { product = { fields = { width = 1024, height = 1024, num_images = 1 }, divide = 1000000 } }`:
///   the product of numeric fields, each replaced by its default when absent
///   or not a positive number, divided by `divide` (pixels to megapixels);
/// - `hold = { blocks = { field = "duration", default = 10 } }`: a numeric
///   field (or its default), rounded up to whole blocks of the price's `per`
///   (a video billed per started 5 s block holds every block it can start);
/// - `hold = { items = { field = "input", each = 512 } }`: the entries of a
///   list field (a list of numbers, a string or no field count as one) times
///   `each`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum Hold {
    Units(u64),
    Length(String),
    Product {
        fields: BTreeMap<String, u64>,
        #[serde(default = "one")]
        divide: u64,
    },
    Blocks {
        field: String,
        default: u64,
    },
    Items {
        field: String,
        each: u64,
    },
}

fn one() -> u64 {
    1
}

impl Hold {
    /// The units a job with `input` may use at most, for a price of `per`
    /// units a step. Never below 0; a rule's zero `divide` counts as 1.
    pub fn units(&self, input: &Value, per: i64) -> f64 {
        let number = |key: &str| {
            input
                .get(key)
                .and_then(Value::as_f64)
                .filter(|n| n.is_finite() && *n > 0.0)
        };
        match self {
            Hold::Units(units) => *units as f64,
            Hold::Length(field) => input
                .get(field)
                .and_then(Value::as_str)
                .map_or(1.0, |text| text.chars().count().max(1) as f64),
            Hold::Product { fields, divide } => {
                let product: f64 = fields
                    .iter()
                    .map(|(field, default)| number(field).unwrap_or(*default as f64))
                    .product();
                product / (*divide).max(1) as f64
            }
            Hold::Blocks { field, default } => {
                let block = per.max(1) as f64;
                (number(field).unwrap_or(*default as f64) / block).ceil() * block
            }
            Hold::Items { field, each } => {
                let items = match input.get(field) {
                    // A list of texts or of token lists; a list of numbers is one input.
                    Some(Value::Array(items)) if !items.iter().all(Value::is_number) => items.len().max(1),
                    _ => 1,
                };
                (items as u64).saturating_mul(*each) as f64
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    /// A manifest entry's `hold`, from its JSON form.
    #[derive(Debug, Deserialize)]
    struct Entry {
        hold: Hold,
    }

    fn rule(json: &str) -> Result<Hold, serde_json::Error> {
        serde_json::from_str::<Entry>(json).map(|entry| entry.hold)
    }

    #[test]
    fn a_video_holds_every_block_it_can_start() {
        let video = rule(r#"{"hold": {"blocks": {"field": "duration", "default": 10}}}"#).unwrap();
        assert_eq!(video.units(&json!({}), 5), 10.0);
        assert_eq!(video.units(&json!({"duration": 4}), 5), 5.0);
        assert_eq!(video.units(&json!({"duration": 5.5}), 5), 10.0);
        assert_eq!(video.units(&json!({"duration": 2.5}), 1), 3.0);
        // Not a positive number: the default.
        assert_eq!(video.units(&json!({"duration": -3}), 5), 10.0);
        assert_eq!(video.units(&json!({"duration": "long"}), 5), 10.0);
    }

    #[test]
    fn images_hold_their_pixels_and_count() {
        let image = rule(
            r#"{"hold": {"product": {"fields": {"width": 1024, "height": 1024, "num_images": 1}, "divide": 1000000}}}"#,
        )
        .unwrap();
        assert_eq!(image.units(&json!({}), 1), 1.048576);
        assert_eq!(
            image.units(&json!({"width": 512, "height": 512, "num_images": 4}), 1),
            1.048576
        );
        assert_eq!(image.units(&json!({"width": 2000, "height": 500}), 1), 1.0);
    }

    #[test]
    fn texts_hold_their_characters_and_lists_their_entries() {
        let speech = Hold::Length("prompt".into());
        assert_eq!(speech.units(&json!({"prompt": "héllo"}), 1000), 5.0);
        assert_eq!(speech.units(&json!({"prompt": ""}), 1000), 1.0);
        assert_eq!(speech.units(&json!({}), 1000), 1.0);
        let embed = Hold::Items {
            field: "input".into(),
            each: 512,
        };
        assert_eq!(embed.units(&json!({"input": "one"}), 1), 512.0);
        assert_eq!(embed.units(&json!({"input": ["a", "b", "c"]}), 1), 1536.0);
        assert_eq!(embed.units(&json!({"input": [1, 2, 3]}), 1), 512.0);
        assert_eq!(embed.units(&json!({"input": [[1, 2], [3]]}), 1), 1024.0);
        assert_eq!(Hold::Units(8192).units(&json!({"max_tokens": 5}), 1_000_000), 8192.0);
    }

    #[test]
    fn a_rule_with_an_unknown_form_or_field_is_refused() {
        for bad in [
            r#"{"hold": {"pixels": 4}}"#,
            r#"{"hold": {"blocks": {"field": "duration"}}}"#,
            r#"{"hold": {"items": {"field": "input", "each": 1, "extra": 2}}}"#,
            r#"{"hold": {"units": -1}}"#,
        ] {
            assert!(rule(bad).is_err(), "{bad}");
        }
    }
}
