//! Text to phonemes with espeak-ng, and phonemes to the ids a Piper voice
//! reads, the way Piper does it.
//!
//! espeak-ng keeps global state (the selected voice, its translator) and is
//! not thread-safe: every call into it goes through one process-wide lock.

use std::collections::HashMap;
use std::ffi::{CStr, CString, c_char, c_int, c_void};
use std::sync::Mutex;

use serde::Deserialize;
use unicode_normalization::UnicodeNormalization;

/// Piper's special symbols: beginning and end of an utterance, and the pad
/// put after every phoneme.
pub const BOS: char = '^';
pub const EOS: char = '$';
pub const PAD: char = '_';

/// Why text could not be turned into phonemes.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PhonemeError {
    /// espeak-ng could not start (usually: its data files are missing).
    #[error(
        "espeak-ng could not be initialised (is espeak-ng-data installed? ESPEAK_DATA_PATH can point at its parent directory)"
    )]
    Init,
    /// espeak-ng has no voice of this name.
    #[error("espeak-ng has no voice '{0}'")]
    Voice(String),
    /// The text holds a NUL character.
    #[error("the text contains a NUL character")]
    Nul,
}

/// The state espeak-ng is in, behind the lock: initialised or not, and the
/// voice last selected.
struct Espeak {
    initialised: bool,
    voice: Option<String>,
}

static ESPEAK: Mutex<Espeak> = Mutex::new(Espeak {
    initialised: false,
    voice: None,
});

/// The IPA phonemes of `text` in the espeak-ng voice `voice` (for example
/// `en-us`), one string for the whole text.
///
/// espeak-ng translates one clause at a time and leaves out punctuation;
/// like Piper, the clause's punctuation is put back after its phonemes:
/// `.`, `?` and `!` alone, `,`, `:` and `;` followed by a space.
pub fn phonemize(text: &str, voice: &str) -> Result<String, PhonemeError> {
    let text = CString::new(text).map_err(|_| PhonemeError::Nul)?;
    let mut espeak = ESPEAK.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    if !espeak.initialised {
        // Synchronous output (nothing is played), no buffer, the default
        // data path, and never exit the process on an error.
        #[allow(unsafe_code)]
        // SAFETY: called under the lock; a null path means espeak-ng's default.
        let rate = unsafe {
            espeakng_sys::espeak_Initialize(
                espeakng_sys::espeak_AUDIO_OUTPUT_AUDIO_OUTPUT_SYNCHRONOUS,
                0,
                std::ptr::null(),
                espeakng_sys::espeakINITIALIZE_DONT_EXIT as c_int,
            )
        };
        if rate <= 0 {
            return Err(PhonemeError::Init);
        }
        espeak.initialised = true;
    }
    if espeak.voice.as_deref() != Some(voice) {
        let name = CString::new(voice).map_err(|_| PhonemeError::Nul)?;
        #[allow(unsafe_code)]
        // SAFETY: under the lock, after espeak_Initialize; `name` outlives the call.
        let status = unsafe { espeakng_sys::espeak_SetVoiceByName(name.as_ptr()) };
        if status != espeakng_sys::espeak_ERROR_EE_OK {
            espeak.voice = None;
            return Err(PhonemeError::Voice(voice.to_owned()));
        }
        espeak.voice = Some(voice.to_owned());
    }

    let whole = text.to_str().map_err(|_| PhonemeError::Nul)?;
    let start = text.as_ptr();
    let mut cursor: *const c_void = start.cast();
    let mut phonemes = String::new();
    // Where the clause being translated begins in `whole`. espeak-ng reads
    // one character past a clause's end before returning it, so `cursor` is
    // left just after the first character of the next clause.
    let mut clause_start = 0;
    while !cursor.is_null() {
        #[allow(unsafe_code)]
        // SAFETY: under the lock; `cursor` points into `text`, which is NUL
        // terminated and outlives the loop. espeak-ng advances it past the
        // clause it translated, or sets it to null at the end.
        let clause = unsafe {
            espeakng_sys::espeak_TextToPhonemes(
                &mut cursor,
                espeakng_sys::espeakCHARS_UTF8 as c_int,
                espeakng_sys::espeakPHONEMES_IPA as c_int,
            )
        };
        if !clause.is_null() {
            #[allow(unsafe_code)]
            // SAFETY: espeak-ng returns a NUL-terminated string in its own
            // buffer, valid until its next call; it is copied out at once.
            let clause = unsafe { CStr::from_ptr(clause as *const c_char) };
            phonemes.push_str(clause.to_string_lossy().trim());
        }
        let clause_end = if cursor.is_null() {
            whole.len()
        } else {
            let read = (cursor as usize).saturating_sub(start as usize).min(whole.len());
            // Back off the character read ahead.
            let mut end = read.saturating_sub(1);
            while end > clause_start && !whole.is_char_boundary(end) {
                end -= 1;
            }
            end.max(clause_start)
        };
        let consumed = &whole[clause_start..clause_end];
        clause_start = clause_end;
        match clause_punctuation(consumed) {
            Some(mark @ ('.' | '?' | '!')) => phonemes.push(mark),
            Some(mark) => {
                phonemes.push(mark);
                phonemes.push(' ');
            }
            None => {
                if !cursor.is_null() && !phonemes.is_empty() && !phonemes.ends_with(' ') {
                    phonemes.push(' ');
                }
            }
        }
    }
    Ok(phonemes.trim_end().to_owned())
}

/// The punctuation that ends a clause of text, as Piper keeps it: the last
/// of `.?!,:;` before trailing spaces, quotes and brackets (an ellipsis is a
/// period).
pub fn clause_punctuation(clause: &str) -> Option<char> {
    let last = clause
        .trim_end_matches(|c: char| c.is_whitespace() || "\"'”’)]}»".contains(c))
        .chars()
        .next_back()?;
    match last {
        '.' | '…' => Some('.'),
        '?' | '!' | ',' | ':' | ';' => Some(last),
        _ => None,
    }
}

/// A voice's `phoneme_id_map` (with its optional `phoneme_map`) from the
/// `.onnx.json` beside the model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PhonemeIds {
    ids: HashMap<char, Vec<i64>>,
    map: HashMap<char, Vec<char>>,
}

/// The parts of a voice config this module reads.
#[derive(Debug, Deserialize)]
struct RawMaps {
    phoneme_id_map: HashMap<String, Vec<i64>>,
    #[serde(default)]
    phoneme_map: HashMap<String, Vec<String>>,
}

impl PhonemeIds {
    /// Reads the maps out of a voice config (`{"phoneme_id_map": {"a": [14], ...}}`).
    /// Every key must be one character, and `^`, `$` and `_` must be mapped.
    pub fn from_config(config: &serde_json::Value) -> Result<Self, String> {
        let raw = RawMaps::deserialize(config).map_err(|e| format!("phoneme maps: {e}"))?;
        let one_char = |key: &str| {
            let mut chars = key.chars();
            match (chars.next(), chars.next()) {
                (Some(c), None) => Ok(c),
                _ => Err(format!("phoneme {key:?} is not one character")),
            }
        };
        let mut ids = HashMap::with_capacity(raw.phoneme_id_map.len());
        for (key, value) in raw.phoneme_id_map {
            if value.is_empty() {
                return Err(format!("phoneme {key:?} maps to no id"));
            }
            ids.insert(one_char(&key)?, value);
        }
        for special in [BOS, EOS, PAD] {
            if !ids.contains_key(&special) {
                return Err(format!("phoneme_id_map has no id for {special:?}"));
            }
        }
        let mut map = HashMap::with_capacity(raw.phoneme_map.len());
        for (key, value) in raw.phoneme_map {
            let to = value.iter().map(|s| one_char(s)).collect::<Result<Vec<_>, _>>()?;
            map.insert(one_char(&key)?, to);
        }
        Ok(Self { ids, map })
    }

    /// The ids of a phoneme string, as Piper computes them: the string is
    /// decomposed (Unicode NFD) into code points, each replaced by its
    /// `phoneme_map` entry if it has one, and written as
    /// `^ _ p1 _ p2 _ … pn _ $`. Phonemes the voice does not know are left
    /// out; they are returned too, in order of first appearance.
    pub fn ids(&self, phonemes: &str) -> (Vec<i64>, Vec<char>) {
        let mut out = Vec::with_capacity(phonemes.len() * 2 + 3);
        let mut missing = Vec::new();
        let id = |c: char| self.ids.get(&c).map_or(&[][..], Vec::as_slice);
        out.extend_from_slice(id(BOS));
        out.extend_from_slice(id(PAD));
        for phoneme in phonemes.nfd() {
            let mapped = self
                .map
                .get(&phoneme)
                .map_or(std::slice::from_ref(&phoneme), Vec::as_slice);
            for &p in mapped {
                match self.ids.get(&p) {
                    Some(ids) => {
                        out.extend_from_slice(ids);
                        out.extend_from_slice(id(PAD));
                    }
                    None => {
                        if !missing.contains(&p) {
                            missing.push(p);
                        }
                    }
                }
            }
        }
        out.extend_from_slice(id(EOS));
        (out, missing)
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn small_map() -> PhonemeIds {
        PhonemeIds::from_config(&json!({
            "phoneme_id_map": {
                "_": [0], "^": [1], "$": [2], " ": [3], ".": [10], ",": [8],
                "h": [20], "ə": [59], "l": [24], "o": [27], "ʊ": [100], "c": [16], "̧": [140],
                "ˈ": [120]
            },
            "phoneme_map": {}
        }))
        .unwrap()
    }

    #[test]
    fn ids_are_bos_pad_interspersed_and_eos() {
        let (ids, missing) = small_map().ids("həlˈoʊ.");
        assert_eq!(ids, [1, 0, 20, 0, 59, 0, 24, 0, 120, 0, 27, 0, 100, 0, 10, 0, 2]);
        assert!(missing.is_empty());
        // An empty string is still a valid (silent) utterance.
        assert_eq!(small_map().ids("").0, [1, 0, 2]);
    }

    #[test]
    fn precomposed_phonemes_are_decomposed_and_unknown_ones_dropped() {
        // "ç" is c + U+0327 after NFD; "x" and "ʒ" are not in the map.
        let (ids, missing) = small_map().ids("çx ʒx");
        assert_eq!(ids, [1, 0, 16, 0, 140, 0, 3, 0, 2]);
        assert_eq!(missing, ['x', 'ʒ']);
    }

    #[test]
    fn phoneme_map_substitutes_before_lookup() {
        let map = PhonemeIds::from_config(&json!({
            "phoneme_id_map": {"_": [0], "^": [1], "$": [2], "a": [5], "b": [6]},
            "phoneme_map": {"x": ["a", "b"]}
        }))
        .unwrap();
        assert_eq!(map.ids("xa").0, [1, 0, 5, 0, 6, 0, 5, 0, 2]);
    }

    #[test]
    fn configs_without_the_special_symbols_or_with_long_keys_are_refused() {
        let err = PhonemeIds::from_config(&json!({"phoneme_id_map": {"^": [1], "$": [2]}})).unwrap_err();
        assert!(err.contains("'_'"), "{err}");
        let err =
            PhonemeIds::from_config(&json!({"phoneme_id_map": {"_": [0], "^": [1], "$": [2], "ab": [3]}})).unwrap_err();
        assert!(err.contains("not one character"), "{err}");
    }

    #[test]
    fn clause_punctuation_is_found_behind_quotes_and_spaces() {
        assert_eq!(clause_punctuation("Hello, "), Some(','));
        assert_eq!(clause_punctuation("he said \"stop!\" "), Some('!'));
        assert_eq!(clause_punctuation("wait…"), Some('.'));
        assert_eq!(clause_punctuation("no end"), None);
        assert_eq!(clause_punctuation(""), None);
    }

    /// espeak-ng itself (the system library), as the voice uses it.
    #[test]
    fn espeak_gives_ipa_with_piper_punctuation() {
        let phonemes = phonemize("Hello, world. How are you?", "en-us").unwrap();
        // espeak-ng 1.51: "həlˈoʊ, wˈɜːld. hˌaʊ ɑːɹ juː?" (the exact vowels
        // vary by version; the shape does not).
        assert!(phonemes.starts_with("həlˈoʊ, "), "{phonemes}");
        assert!(phonemes.contains("wˈɜːld."), "{phonemes}");
        assert!(phonemes.ends_with('?'), "{phonemes}");
        assert_eq!(
            phonemize("Fine; thanks: ok", "en-us").unwrap(),
            "fˈaɪn; θˈæŋks: ˌoʊkˈeɪ"
        );
        assert_eq!(phonemes.matches(',').count(), 1, "{phonemes}");
        assert_eq!(
            phonemize("x", "no-such-voice").unwrap_err(),
            PhonemeError::Voice("no-such-voice".into())
        );
        // The voice switches back.
        assert!(phonemize("one", "en-us").unwrap().contains("wˈʌn"));
    }

    #[test]
    fn espeak_is_safe_to_call_from_many_threads() {
        let threads: Vec<_> = (0..4)
            .map(|i| std::thread::spawn(move || phonemize(&format!("Sentence number {i}."), "en-us")))
            .collect();
        let first = phonemize("Sentence number 0.", "en-us").unwrap();
        let results: Vec<String> = threads.into_iter().map(|t| t.join().unwrap().unwrap()).collect();
        assert_eq!(results[0], first);
        assert!(results.iter().all(|p| p.ends_with('.')));
    }
}
