//! Text to phonemes with espeak-ng, and phonemes to the ids a Piper voice
//! reads, the way Piper does it.
//!
//! espeak-ng's library is opened when a Piper voice first needs it, not
//! linked: a binary that serves no Piper voice starts on a machine without
//! espeak-ng (a text-only GPU server, say). It is looked for as
//! `libespeak-ng.so.1` (Debian's `libespeak-ng1`), then `libespeak-ng.so`, or
//! at the path in `GANTRY_ESPEAK_LIBRARY`.
//!
//! espeak-ng keeps global state (the selected voice, its translator) and is
//! not thread-safe: every call into it goes through one process-wide lock.

use std::collections::HashMap;
use std::ffi::{CStr, CString, OsString, c_char, c_int, c_void};
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
    /// espeak-ng's library could not be opened (or lacks a function).
    #[error(
        "espeak-ng's library could not be loaded ({0}); Piper voices need it: install libespeak-ng1, or set GANTRY_ESPEAK_LIBRARY to its path"
    )]
    Library(String),
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

/// The environment variable naming espeak-ng's library file.
pub const LIBRARY_VARIABLE: &str = "GANTRY_ESPEAK_LIBRARY";

// From espeak-ng's speak_lib.h (stable since 1.49).
const AUDIO_OUTPUT_SYNCHRONOUS: c_int = 2;
const INITIALIZE_DONT_EXIT: c_int = 0x8000;
const EE_OK: c_int = 0;
const CHARS_UTF8: c_int = 1;
const PHONEMES_IPA: c_int = 0x02;

type InitializeFn = unsafe extern "C" fn(output: c_int, buflength: c_int, path: *const c_char, options: c_int) -> c_int;
type SetVoiceByNameFn = unsafe extern "C" fn(name: *const c_char) -> c_int;
type TextToPhonemesFn =
    unsafe extern "C" fn(textptr: *mut *const c_void, textmode: c_int, phonememode: c_int) -> *const c_char;

/// The three functions of espeak-ng this crate calls, from the opened
/// library (kept open with them).
struct Library {
    initialize: InitializeFn,
    set_voice_by_name: SetVoiceByNameFn,
    text_to_phonemes: TextToPhonemesFn,
    _library: libloading::Library,
}

impl Library {
    /// The first of `candidates` that opens and has the functions.
    fn open(candidates: &[OsString]) -> Result<Library, PhonemeError> {
        let mut failures = Vec::new();
        for name in candidates {
            match Self::open_one(name) {
                Ok(library) => return Ok(library),
                Err(error) => failures.push(format!("{}: {error}", name.to_string_lossy())),
            }
        }
        Err(PhonemeError::Library(failures.join("; ")))
    }

    fn open_one(name: &OsString) -> Result<Library, libloading::Error> {
        #[allow(unsafe_code)]
        // SAFETY: espeak-ng's library runs no initialisers with requirements
        // of their own; the symbols are looked up with the types speak_lib.h
        // declares, and the function pointers are kept with the library,
        // which stays open as long as they do.
        unsafe {
            let library = libloading::Library::new(name)?;
            let initialize = *library.get::<InitializeFn>(b"espeak_Initialize\0")?;
            let set_voice_by_name = *library.get::<SetVoiceByNameFn>(b"espeak_SetVoiceByName\0")?;
            let text_to_phonemes = *library.get::<TextToPhonemesFn>(b"espeak_TextToPhonemes\0")?;
            Ok(Library {
                initialize,
                set_voice_by_name,
                text_to_phonemes,
                _library: library,
            })
        }
    }
}

/// Where espeak-ng's library is looked for, in order.
fn library_candidates() -> Vec<OsString> {
    match std::env::var_os(LIBRARY_VARIABLE) {
        Some(path) if !path.is_empty() => vec![path],
        _ if cfg!(target_os = "macos") => vec!["libespeak-ng.1.dylib".into(), "libespeak-ng.dylib".into()],
        _ => vec!["libespeak-ng.so.1".into(), "libespeak-ng.so".into()],
    }
}

/// The state espeak-ng is in, behind the lock: its library once opened and
/// initialised, and the voice last selected.
struct Espeak {
    library: Option<Library>,
    voice: Option<String>,
}

static ESPEAK: Mutex<Espeak> = Mutex::new(Espeak {
    library: None,
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
    let mut guard = ESPEAK.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let espeak = &mut *guard;
    let library = match &mut espeak.library {
        Some(library) => &*library,
        slot @ None => {
            let library = Library::open(&library_candidates())?;
            // Synchronous output (nothing is played), no buffer, the default
            // data path, and never exit the process on an error.
            #[allow(unsafe_code)]
            // SAFETY: called under the lock; a null path means espeak-ng's default.
            let rate =
                unsafe { (library.initialize)(AUDIO_OUTPUT_SYNCHRONOUS, 0, std::ptr::null(), INITIALIZE_DONT_EXIT) };
            if rate <= 0 {
                return Err(PhonemeError::Init);
            }
            &*slot.insert(library)
        }
    };
    if espeak.voice.as_deref() != Some(voice) {
        let name = CString::new(voice).map_err(|_| PhonemeError::Nul)?;
        #[allow(unsafe_code)]
        // SAFETY: under the lock, after espeak_Initialize; `name` outlives the call.
        let status = unsafe { (library.set_voice_by_name)(name.as_ptr()) };
        if status != EE_OK {
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
        let clause = unsafe { (library.text_to_phonemes)(&mut cursor, CHARS_UTF8, PHONEMES_IPA) };
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

    /// Without espeak-ng's library the error says what is missing and how
    /// to fix it, naming every file tried.
    #[test]
    fn a_missing_library_is_a_clear_error() {
        let Err(error) = Library::open(&["/nonexistent/libespeak-ng.so.1".into(), "libno-such-espeak.so".into()])
        else {
            panic!("a library that does not exist opened");
        };
        let message = error.to_string();
        assert!(matches!(error, PhonemeError::Library(_)), "{message}");
        assert!(message.contains("/nonexistent/libespeak-ng.so.1"), "{message}");
        assert!(message.contains("libno-such-espeak.so"), "{message}");
        assert!(message.contains("install libespeak-ng1"), "{message}");
        // A library that opens but is not espeak-ng (no such symbol).
        let Err(PhonemeError::Library(reason)) = Library::open(&["libc.so.6".into()]) else {
            panic!("libc was taken for espeak-ng");
        };
        assert!(reason.contains("espeak_Initialize"), "{reason}");
    }
}
