#![allow(clippy::unwrap_used, clippy::expect_used)]

//! The CLIP tokenizer against open_clip 3.3.0's `SimpleTokenizer` (ids
//! produced with `open_clip.tokenizer.SimpleTokenizer().encode(text)`, with
//! ftfy 6.3.1 and regex installed) on the vocabulary the wheel ships.

use std::path::Path;

use gantry_model_diffusion::tokenizer::{CONTEXT_LENGTH, Tokenizer};

const VOCAB: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/bpe_simple_vocab_16e6.txt.gz");

const CASES: [(&str, &[u32]); 7] = [
    (
        "a photograph of an astronaut riding a horse",
        &[320, 8853, 539, 550, 18376, 6765, 320, 4558],
    ),
    (
        "A red cat, sitting on a mat!!! (high quality) -- 4k, 8K UHD.",
        &[
            320, 736, 2368, 267, 4919, 525, 320, 9063, 995, 263, 1400, 3027, 264, 2432, 275, 330, 267, 279, 330, 84,
            4414, 269,
        ],
    ),
    (
        "Don't stop: it's the café's \"best\" croissant & coffee?",
        &[
            847, 713, 1691, 281, 585, 568, 518, 15304, 568, 257, 949, 257, 46011, 261, 2453, 286,
        ],
    ),
    (
        "zxqvbnmplk florpt supercalifragilisticexpialidocious",
        &[
            89, 87, 80, 85, 10496, 76, 712, 330, 15784, 1459, 1642, 2857, 13093, 2076, 5868, 26850, 835, 639, 38466,
        ],
    ),
    ("  multiple   spaces\tand\nnewlines  ", &[6470, 9006, 537, 1218, 3418]),
    (
        "émoji 🙂 test #hashtag @user 3.14159",
        &[
            3459, 617, 2697, 14860, 1628, 258, 9238, 287, 7031, 274, 269, 272, 275, 272, 276, 280,
        ],
    ),
    (
        "We're they'll I'm you've she'd",
        &[649, 982, 889, 1342, 328, 880, 592, 1200, 1043, 1896],
    ),
];

fn open_clip() -> Tokenizer {
    Tokenizer::from_bpe_file(Path::new(VOCAB)).unwrap()
}

#[test]
fn matches_open_clip_simple_tokenizer() {
    let tok = open_clip();
    assert_eq!(tok.vocab().len(), 49408);
    assert_eq!(tok.end_token(), 49407);
    assert_eq!(tok.token_id("<|startoftext|>"), Some(49406));
    for (text, ids) in CASES {
        assert_eq!(tok.encode(text), ids, "{text:?}");
    }
}

#[test]
fn pads_and_truncates_to_77() {
    let tok = open_clip();
    let ids = tok.encode_padded("a photograph of an astronaut riding a horse", 49407);
    assert_eq!(ids.len(), CONTEXT_LENGTH);
    assert_eq!(&ids[..10], &[49406, 320, 8853, 539, 550, 18376, 6765, 320, 4558, 49407]);
    assert!(ids[10..].iter().all(|&i| i == 49407));
    let ids = tok.encode_padded("a cat", 0);
    assert_eq!(&ids[..5], &[49406, 320, 2368, 49407, 0]);
    assert!(ids[4..].iter().all(|&i| i == 0));
    let long = "cat ".repeat(200);
    let ids = tok.encode_padded(&long, 0);
    assert_eq!(ids.len(), CONTEXT_LENGTH);
    assert_eq!((ids[0], ids[75], ids[76]), (49406, 2368, 49407));
}

#[test]
fn hugging_face_vocab_and_merges_give_the_same_ids() {
    let tok = open_clip();
    let dir = tempfile::tempdir().unwrap();
    let vocab: std::collections::BTreeMap<_, _> = tok.vocab().iter().collect();
    std::fs::write(dir.path().join("vocab.json"), serde_json::to_string(&vocab).unwrap()).unwrap();
    let mut merges = String::from("#version: 0.2\n");
    for (a, b) in tok.merges() {
        merges.push_str(&format!("{a} {b}\n"));
    }
    std::fs::write(dir.path().join("merges.txt"), merges).unwrap();
    let hf = Tokenizer::from_vocab_and_merges(&dir.path().join("vocab.json"), &dir.path().join("merges.txt")).unwrap();
    for (text, ids) in CASES {
        assert_eq!(hf.encode(text), ids, "{text:?}");
    }
}
