//! Reading the asset files: JSON, gzipped or not, and JSON objects whose key
//! order matters (Python's dicts keep it, and the reference iterates some of
//! them: the symbol replacements run in file order, the months are numbered
//! by it).

use std::fmt;
use std::fs::File;
use std::io::{BufReader, Read};
use std::marker::PhantomData;
use std::path::Path;

use serde::de::{DeserializeOwned, MapAccess, Visitor};
use serde::{Deserialize, Deserializer};

use crate::G2pError;

/// Parses the JSON file `name` in `dir`, through gzip when the name ends in `.gz`.
pub(crate) fn load_json<T: DeserializeOwned>(dir: &Path, name: &str) -> Result<T, G2pError> {
    let path = dir.join(name);
    let failed = |reason: String| G2pError::Asset {
        path: path.clone(),
        reason,
    };
    let file = File::open(&path).map_err(|e| failed(e.to_string()))?;
    let reader: Box<dyn Read> = if name.ends_with(".gz") {
        Box::new(flate2::read::GzDecoder::new(file))
    } else {
        Box::new(file)
    };
    serde_json::from_reader(BufReader::with_capacity(1 << 16, reader)).map_err(|e| failed(e.to_string()))
}

/// A JSON object as its (key, value) pairs in file order.
#[derive(Debug, Clone)]
pub(crate) struct OrderedMap<V>(pub(crate) Vec<(String, V)>);

impl<V> OrderedMap<V> {
    pub(crate) fn keys(&self) -> impl Iterator<Item = &str> {
        self.0.iter().map(|(k, _)| k.as_str())
    }
}

impl<'de, V: Deserialize<'de>> Deserialize<'de> for OrderedMap<V> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Pairs<V>(PhantomData<V>);
        impl<'de, V: Deserialize<'de>> Visitor<'de> for Pairs<V> {
            type Value = OrderedMap<V>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                let mut pairs = Vec::with_capacity(map.size_hint().unwrap_or(0));
                while let Some(pair) = map.next_entry()? {
                    pairs.push(pair);
                }
                Ok(OrderedMap(pairs))
            }
        }
        deserializer.deserialize_map(Pairs(PhantomData))
    }
}
