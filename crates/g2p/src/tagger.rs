//! Averaged-perceptron part-of-speech tagger (Penn Treebank tags), trained
//! on spaCy's tags so that the lexicon's part-of-speech readings ("read",
//! "live", "record") and function-word rules come out as in the reference.
//!
//! A word with one dominant tag is answered from the tag dictionary; any
//! other word gets the tag whose weights, summed over fifteen context
//! features (the word, its suffix, its shape, its neighbours and the two
//! tags before it), score highest. Scores are summed feature by feature in
//! the reference's order in `f64`, so ties and near-ties resolve the same way.

use std::collections::{HashMap, HashSet};
use std::path::Path;

use serde::Deserialize;

use crate::G2pError;
use crate::assets::load_json;
use crate::pystr::{self, is_alpha, is_alpha_char, is_digit, is_digit_char, is_lower, is_upper};

const START: [&str; 2] = ["-START2-", "-START-"];
const END: [&str; 2] = ["-END-", "-END2-"];

#[derive(Deserialize)]
struct Model {
    tags: Vec<String>,
    tagdict: HashMap<String, String>,
    vocab: Option<Vec<String>>,
    weights: HashMap<String, HashMap<String, f64>>,
}

/// The loaded tagger.
pub(crate) struct Tagger {
    tags: Vec<String>,
    tagdict: HashMap<String, String>,
    vocab: Option<HashSet<String>>,
    /// Feature -> (index into `tags`, weight).
    weights: HashMap<String, Vec<(usize, f64)>>,
}

/// The word as the features see it: hyphenated words, years and numbers
/// fold into one symbol each, the rest is lowercased.
fn norm(word: &str) -> String {
    if word.contains('-') && !word.starts_with('-') {
        "!HYPHEN".to_owned()
    } else if is_digit(word) && pystr::len(word) == 4 {
        "!YEAR".to_owned()
    } else if word.chars().next().is_some_and(is_digit_char) {
        "!DIGITS".to_owned()
    } else {
        pystr::lower(word)
    }
}

/// The word's shape: "x", "XX", "X1", "Xx", "xX", "d", or the first four
/// characters with digits as "d" and letters as "x".
fn shape(word: &str) -> String {
    if is_alpha(word) {
        let rest = pystr::after_first(word);
        return if is_lower(word) {
            "x"
        } else if is_upper(word) {
            if pystr::len(word) > 1 { "XX" } else { "X1" }
        } else if word
            .chars()
            .next()
            .is_some_and(|c| is_upper(c.encode_utf8(&mut [0; 4])))
            && is_lower(rest)
        {
            "Xx"
        } else {
            "xX"
        }
        .to_owned();
    }
    if is_digit(word) {
        return "d".to_owned();
    }
    word.chars()
        .take(4)
        .map(|c| {
            if is_digit_char(c) {
                'd'
            } else if is_alpha_char(c) {
                'x'
            } else {
                c
            }
        })
        .collect()
}

impl Tagger {
    pub(crate) fn load(dir: &Path) -> Result<Tagger, G2pError> {
        let model: Model = load_json(dir, "tagger.json.gz")?;
        let index: HashMap<&str, usize> = model.tags.iter().enumerate().map(|(i, t)| (t.as_str(), i)).collect();
        let weights = model
            .weights
            .into_iter()
            .map(|(feature, ws)| {
                let ws = ws
                    .into_iter()
                    .filter_map(|(tag, w)| index.get(tag.as_str()).map(|&i| (i, w)))
                    .collect();
                (feature, ws)
            })
            .collect();
        Ok(Tagger {
            weights,
            tagdict: model.tagdict,
            vocab: model.vocab.map(|v| v.into_iter().collect()),
            tags: model.tags,
        })
    }

    /// The tag of each word.
    pub(crate) fn tag(&self, words: &[String]) -> Vec<String> {
        // The feature window: START, the normalised words (those outside the
        // tagger's vocabulary replaced by their shape), END.
        let mut context: Vec<String> = START.iter().map(|s| (*s).to_owned()).collect();
        for word in words {
            let n = norm(word);
            let known = self.vocab.as_ref().is_none_or(|v| v.contains(&n));
            context.push(if known { n } else { format!("<{}>", shape(word)) });
        }
        context.extend(END.iter().map(|s| (*s).to_owned()));

        let mut tags: Vec<String> = Vec::with_capacity(words.len());
        let (mut prev, mut prev2) = (START[1].to_owned(), START[0].to_owned());
        for (i, word) in words.iter().enumerate() {
            let tag = match self.tagdict.get(word) {
                Some(tag) => tag.clone(),
                None => self.predict(&features(i, word, &context, &prev, &prev2)),
            };
            prev2 = std::mem::replace(&mut prev, tag.clone());
            tags.push(tag);
        }
        tags
    }

    /// The best-scoring tag (ties to the greater tag name); "NN" when no
    /// feature is known at all.
    fn predict(&self, features: &[String]) -> String {
        let mut scores = vec![0.0f64; self.tags.len()];
        let mut any = false;
        for feature in features {
            if let Some(ws) = self.weights.get(feature) {
                any |= !ws.is_empty();
                for &(tag, w) in ws {
                    scores[tag] += w;
                }
            }
        }
        if !any {
            return "NN".to_owned();
        }
        let best = self.tags.iter().zip(&scores).max_by(|(ta, sa), (tb, sb)| {
            sa.partial_cmp(sb)
                .unwrap_or(std::cmp::Ordering::Equal)
                .then_with(|| ta.cmp(tb))
        });
        best.map_or_else(|| "NN".to_owned(), |(tag, _)| tag.clone())
    }
}

/// The reference's fifteen features; `context[i + 2]` is the current word.
fn features(i: usize, word: &str, context: &[String], prev: &str, prev2: &str) -> Vec<String> {
    let at = |k: usize| context.get(k).map_or("", String::as_str);
    let j = i + 2;
    let first: String = word.chars().take(1).collect();
    vec![
        "b".to_owned(),
        format!("s3={}", pystr::tail(word, 3)),
        format!("p1={first}"),
        format!("w={}", at(j)),
        format!("sh={}", shape(word)),
        if i == 0 { "i0" } else { "i+" }.to_owned(),
        format!("t-1={prev}"),
        format!("t-2={prev2}"),
        format!("t-12={prev},{prev2}"),
        format!("w-1={}", at(j - 1)),
        format!("s3-1={}", pystr::tail(at(j - 1), 3)),
        format!("w-2={}", at(j - 2)),
        format!("w+1={}", at(j + 1)),
        format!("s3+1={}", pystr::tail(at(j + 1), 3)),
        format!("w+2={}", at(j + 2)),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shapes_and_norms() {
        assert_eq!(shape("hello"), "x");
        assert_eq!(shape("NASA"), "XX");
        assert_eq!(shape("I"), "X1");
        assert_eq!(shape("Hello"), "Xx");
        assert_eq!(shape("iPhone"), "xX");
        assert_eq!(shape("1984"), "d");
        assert_eq!(shape("3.14"), "d.dd");
        assert_eq!(shape("B52s"), "xddx");
        assert_eq!(norm("well-known"), "!HYPHEN");
        assert_eq!(norm("-5"), "-5");
        assert_eq!(norm("1984"), "!YEAR");
        assert_eq!(norm("42nd"), "!DIGITS");
        assert_eq!(norm("Dog"), "dog");
    }
}
