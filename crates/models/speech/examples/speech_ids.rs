//! Prints, as one JSON object, the sentences of a text and the phoneme ids the
//! worker feeds the voice for each (the same splitting, espeak-ng phonemes
//! and Piper id layout), so another runtime can be given the same inputs:
//!
//!     cargo run --release -p gantry-model-speech --example speech_ids -- VOICE.onnx.json "Some text. More."
//!
//! Output: `{"sentences": [{"text": "...", "phonemes": "...", "ids": [1, 0, ...]}, ...]}`.
use gantry_model_speech::phonemes::{PhonemeIds, phonemize};
use gantry_model_speech::sentences::split;

fn main() -> Result<(), String> {
    let mut args = std::env::args().skip(1);
    let (Some(config), Some(text)) = (args.next(), args.next()) else {
        return Err("usage: speech_ids VOICE.onnx.json TEXT".to_owned());
    };
    let json: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&config).map_err(|e| e.to_string())?)
        .map_err(|e| e.to_string())?;
    let voice = json["espeak"]["voice"]
        .as_str()
        .ok_or("the config names no espeak voice")?;
    let ids = PhonemeIds::from_config(&json)?;
    let mut sentences = Vec::new();
    for sentence in split(&text) {
        let phonemes = phonemize(&sentence, voice).map_err(|e| e.to_string())?;
        let (sentence_ids, _) = ids.ids(&phonemes);
        sentences.push(serde_json::json!({"text": sentence, "phonemes": phonemes, "ids": sentence_ids}));
    }
    println!("{}", serde_json::json!({ "sentences": sentences }));
    Ok(())
}
