//! A JSON object read into one typed struct, and that struct's JSON Schema.
//!
//! The management API's request bodies and the models' job inputs are both
//! structs that derive `serde::Deserialize` (with `deny_unknown_fields` where
//! unknown members are refused) and `utoipa::ToSchema`. The field types check
//! their own rules while they are read ([`Between`], [`AtLeast`], [`Chars`], [`NonEmpty`],
//! [`Items`], [`Real`], a serde enum), so the same type is at once:
//! - the parser: [`read`] reports every failure of every member at once, each
//!   with its place (`width`, `messages.0.role`);
//! - the schema: [`schema_of`] is the type's JSON Schema with nested types
//!   written in place, which the API serves (`inputSchema`, the public
//!   OpenAPI document) and the console's forms are drawn from.
//!
//! Rules that span fields (width equal to height, exactly one of two
//! sources) or need the model (a voice it has) stay code, run on the typed
//! struct once its members are well formed.

mod read;
mod schema;
mod value;

pub use read::{Failure, describe, kind, present, present_object, read, sentence};
pub use schema::schema_of;
#[doc(hidden)]
pub use utoipa as __utoipa;
pub use value::{AtLeast, Between, Bounds, Chars, Items, NonEmpty, Real};

#[cfg(test)]
mod tests;
