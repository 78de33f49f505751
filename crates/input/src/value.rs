//! Member types that check their own rule while they are read and state it
//! in their schema: the rule is written once.
use std::fmt;
use std::marker::PhantomData;

use serde::de::{self, Deserialize, Deserializer, Visitor};
use utoipa::openapi::RefOr;
use utoipa::openapi::schema::{KnownFormat, ObjectBuilder, Schema, SchemaFormat, Type};
use utoipa::{PartialSchema, ToSchema};

/// Reads a whole number (a JSON number with no fractional part: `5.0` is an
/// integer, as JSON Schema counts it) and checks it with `accept`; a failure
/// says it must be `expected` ("an integer from 1 to 8").
fn whole_number<'de, D: Deserializer<'de>>(
    deserializer: D,
    expected: &str,
    accept: impl Fn(u64) -> bool,
) -> Result<u64, D::Error> {
    struct Whole<'a, A> {
        expected: &'a str,
        accept: A,
    }
    impl<A: Fn(u64) -> bool> Whole<'_, A> {
        fn problem(&self, got: &dyn fmt::Display) -> String {
            format!("must be {} (got {got})", self.expected)
        }
    }
    impl<A: Fn(u64) -> bool> Visitor<'_> for Whole<'_, A> {
        type Value = u64;

        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str(self.expected)
        }

        fn visit_u64<E: de::Error>(self, n: u64) -> Result<u64, E> {
            if (self.accept)(n) {
                Ok(n)
            } else {
                Err(E::custom(self.problem(&n)))
            }
        }

        fn visit_i64<E: de::Error>(self, n: i64) -> Result<u64, E> {
            match u64::try_from(n) {
                Ok(n) => self.visit_u64(n),
                Err(_) => Err(E::custom(self.problem(&n))),
            }
        }

        fn visit_f64<E: de::Error>(self, n: f64) -> Result<u64, E> {
            if n.fract() == 0.0 && n >= 0.0 && n <= u64::MAX as f64 {
                self.visit_u64(n as u64)
            } else {
                Err(E::custom(self.problem(&n)))
            }
        }
    }
    deserializer.deserialize_any(Whole { expected, accept })
}

/// An integer from `LOW` to `HIGH`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Between<const LOW: u64, const HIGH: u64>(pub u64);

impl<'de, const LOW: u64, const HIGH: u64> Deserialize<'de> for Between<LOW, HIGH> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let expected = format!("an integer from {LOW} to {HIGH}");
        whole_number(deserializer, &expected, |n| (LOW..=HIGH).contains(&n)).map(Self)
    }
}

impl<const LOW: u64, const HIGH: u64> PartialSchema for Between<LOW, HIGH> {
    fn schema() -> RefOr<Schema> {
        ObjectBuilder::new()
            .schema_type(Type::Integer)
            .format(Some(SchemaFormat::KnownFormat(KnownFormat::Int64)))
            .minimum(Some(LOW as f64))
            .maximum(Some(HIGH as f64))
            .into()
    }
}

impl<const LOW: u64, const HIGH: u64> ToSchema for Between<LOW, HIGH> {}

/// An integer of at least `MIN`, with no maximum of its own (where the
/// model decides the most, it checks it after reading).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct AtLeast<const MIN: u64>(pub u64);

impl<'de, const MIN: u64> Deserialize<'de> for AtLeast<MIN> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let expected = format!("an integer of at least {MIN}");
        whole_number(deserializer, &expected, |n| n >= MIN).map(Self)
    }
}

impl<const MIN: u64> PartialSchema for AtLeast<MIN> {
    fn schema() -> RefOr<Schema> {
        ObjectBuilder::new()
            .schema_type(Type::Integer)
            .format(Some(SchemaFormat::KnownFormat(KnownFormat::Int64)))
            .minimum(Some(MIN as f64))
            .into()
    }
}

impl<const MIN: u64> ToSchema for AtLeast<MIN> {}

/// A string of at most `MAX` characters (Unicode scalar values, as JSON
/// Schema's `maxLength` counts them).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct Chars<const MAX: usize>(pub String);

impl<const MAX: usize> Chars<MAX> {
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl<'de, const MAX: usize> Deserialize<'de> for Chars<MAX> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        let count = text.chars().count();
        if count > MAX {
            return Err(de::Error::custom(format!(
                "must be a string of at most {MAX} characters (got {count})"
            )));
        }
        Ok(Self(text))
    }
}

impl<const MAX: usize> PartialSchema for Chars<MAX> {
    fn schema() -> RefOr<Schema> {
        ObjectBuilder::new()
            .schema_type(Type::String)
            .max_length(Some(MAX))
            .into()
    }
}

impl<const MAX: usize> ToSchema for Chars<MAX> {}

/// A string with at least one character.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct NonEmpty(pub String);

impl NonEmpty {
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl<'de> Deserialize<'de> for NonEmpty {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        if text.is_empty() {
            return Err(de::Error::custom("must not be empty"));
        }
        Ok(Self(text))
    }
}

impl PartialSchema for NonEmpty {
    fn schema() -> RefOr<Schema> {
        ObjectBuilder::new()
            .schema_type(Type::String)
            .min_length(Some(1))
            .into()
    }
}

impl ToSchema for NonEmpty {}

/// An array of `MIN` to `MAX` entries, each read as `T`.
#[derive(Debug, Clone, PartialEq)]
pub struct Items<T, const MIN: usize, const MAX: usize>(pub Vec<T>);

impl<'de, T: Deserialize<'de>, const MIN: usize, const MAX: usize> Deserialize<'de> for Items<T, MIN, MAX> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let items = Vec::<T>::deserialize(deserializer)?;
        if (MIN..=MAX).contains(&items.len()) {
            return Ok(Self(items));
        }
        Err(de::Error::custom(format!(
            "must be an array of {MIN} to {MAX} entries (got {})",
            items.len()
        )))
    }
}

/// utoipa shows a generic type's schema through this (hidden) trait, which
/// gives `PartialSchema` too; the entries' schema comes in `generics`.
impl<T: ToSchema, const MIN: usize, const MAX: usize> utoipa::__dev::ComposeSchema for Items<T, MIN, MAX> {
    fn compose(mut generics: Vec<RefOr<Schema>>) -> RefOr<Schema> {
        let items = if generics.is_empty() {
            T::schema()
        } else {
            generics.remove(0)
        };
        utoipa::openapi::schema::ArrayBuilder::new()
            .items(items)
            .min_items(Some(MIN))
            .max_items(Some(MAX))
            .into()
    }
}

impl<T: ToSchema, const MIN: usize, const MAX: usize> ToSchema for Items<T, MIN, MAX> {}

/// The range of a [`Real`]: floating-point bounds cannot be const generics,
/// so each range is a small type, made by [`bounds!`](crate::bounds).
pub trait Bounds {
    const MIN: f64;
    const MAX: f64;
    /// Whether `MIN` itself is refused (a number above it is needed).
    const ABOVE_MIN: bool = false;
}

/// A number within `B`'s range.
pub struct Real<B>(pub f64, PhantomData<B>);

impl<B> Real<B> {
    pub fn new(value: f64) -> Self {
        Self(value, PhantomData)
    }
}

impl<B> Clone for Real<B> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<B> Copy for Real<B> {}

impl<B> PartialEq for Real<B> {
    fn eq(&self, other: &Self) -> bool {
        self.0 == other.0
    }
}

impl<B> fmt::Debug for Real<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl<'de, B: Bounds> Deserialize<'de> for Real<B> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let n = f64::deserialize(deserializer)?;
        let low_ok = if B::ABOVE_MIN { n > B::MIN } else { n >= B::MIN };
        if low_ok && n <= B::MAX {
            return Ok(Self::new(n));
        }
        let range = if B::ABOVE_MIN {
            format!("above {} and at most {}", B::MIN, B::MAX)
        } else {
            format!("from {} to {}", B::MIN, B::MAX)
        };
        Err(de::Error::custom(format!("must be a number {range} (got {n})")))
    }
}

/// utoipa shows a generic type's schema through this (hidden) trait, which
/// gives `PartialSchema` too; `B` is no schema of its own.
impl<B: Bounds> utoipa::__dev::ComposeSchema for Real<B> {
    fn compose(_: Vec<RefOr<Schema>>) -> RefOr<Schema> {
        let number = ObjectBuilder::new()
            .schema_type(Type::Number)
            .format(Some(SchemaFormat::KnownFormat(KnownFormat::Double)))
            .maximum(Some(B::MAX));
        let number = if B::ABOVE_MIN {
            number.exclusive_minimum(Some(B::MIN))
        } else {
            number.minimum(Some(B::MIN))
        };
        number.into()
    }
}

impl<B: Bounds> ToSchema for Real<B> {}

/// Declares ranges for [`Real`]:
/// ```
/// gantry_input::bounds! {
///     /// A sampling temperature.
///     pub Temperature: 0.0..=2.0;
///     /// A probability mass: above 0, at most 1.
///     pub TopP: 0.0..=1.0, above_min;
/// }
/// ```
#[macro_export]
macro_rules! bounds {
    ($($(#[$meta:meta])* $vis:vis $name:ident: $min:literal..=$max:literal $(, $flag:ident)?;)*) => {$(
        $(#[$meta])*
        $vis struct $name;
        impl $crate::Bounds for $name {
            const MIN: f64 = $min;
            const MAX: f64 = $max;
            $(const ABOVE_MIN: bool = $crate::bounds!(@flag $flag);)?
        }
        // The derive asks a generic argument for its schema; a range has none.
        impl $crate::__utoipa::PartialSchema for $name {
            fn schema() -> $crate::__utoipa::openapi::RefOr<$crate::__utoipa::openapi::schema::Schema> {
                $crate::__utoipa::openapi::schema::Object::new().into()
            }
        }
        impl $crate::__utoipa::ToSchema for $name {}
    )*};
    (@flag above_min) => { true };
}
