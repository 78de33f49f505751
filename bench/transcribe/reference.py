#!/usr/bin/env python3
"""faster-whisper 1.2.1 reference for the Rust Whisper engine.

Transcribes a 16 kHz mono 16-bit WAV with the options the engine follows
(beam_size=1, best_of=1, temperature=0, condition_on_previous_text=True,
no VAD, timestamps on, no word timestamps) and prints JSON:
  {"text": ..., "duration": ..., "segments": [{"start", "end", "text", "tokens",
   "avg_logprob", "no_speech_prob"}, ...]}

  reference.py MODEL_DIR AUDIO.wav                   transcript as JSON
  reference.py MODEL_DIR AUDIO.wav --features OUT.f32  log-mel features (80 x frames, f32 LE)
  reference.py MODEL_DIR AUDIO.wav --encode OUT.f32    encoder output of the first 30 s window
  reference.py MODEL_DIR AUDIO.wav --bench N --threads T [--compute-type int8]
                                                     audio seconds per wall second, best of N

Needs: pip install faster-whisper==1.2.1 (brings ctranslate2 and numpy).
"""
import argparse
import json
import sys
import time
import wave

import numpy as np


def read_wav(path):
    with wave.open(path, "rb") as w:
        if w.getsampwidth() != 2 or w.getnchannels() != 1 or w.getframerate() != 16000:
            sys.exit(f"{path}: expected 16 kHz mono 16-bit PCM")
        raw = w.readframes(w.getnframes())
    return np.frombuffer(raw, dtype="<i2").astype(np.float32) / 32768.0


def ctranslate2_dir(model_dir):
    """The model directory, or (when it has no vocabulary file, as the product's
    `whisper-tiny-en` has only model.bin, config.json and tokenizer.json) a
    temporary one beside it with the vocabulary CTranslate2 wants: the
    tokenizer's tokens by id, then the 1501 timestamps <|0.00|> .. <|30.00|>."""
    import os
    import tempfile

    if any(os.path.exists(os.path.join(model_dir, f"vocabulary.{e}")) for e in ("txt", "json")):
        return model_dir
    with open(os.path.join(model_dir, "tokenizer.json"), encoding="utf-8") as f:
        tok = json.load(f)
    by_id = {i: s for s, i in tok["model"]["vocab"].items()}
    for t in tok.get("added_tokens", []):
        by_id[t["id"]] = t["content"]
    tokens = [by_id[i] for i in range(max(by_id) + 1)]
    tokens += ["<|%.2f|>" % (i * 0.02) for i in range(1501)]
    import atexit
    import shutil

    tmp = tempfile.mkdtemp(prefix="whisper-ct2-")
    atexit.register(shutil.rmtree, tmp, True)
    for name in ("model.bin", "config.json", "tokenizer.json"):
        os.symlink(os.path.abspath(os.path.join(model_dir, name)), os.path.join(tmp, name))
    with open(os.path.join(tmp, "vocabulary.txt"), "w", encoding="utf-8") as f:
        f.write("\n".join(tokens))
    return tmp


def main():
    p = argparse.ArgumentParser()
    p.add_argument("model_dir")
    p.add_argument("audio")
    p.add_argument("--features")
    p.add_argument("--encode")
    p.add_argument("--bench", type=int, default=0)
    p.add_argument("--threads", type=int, default=0)
    p.add_argument("--compute-type", default="float32")
    p.add_argument("--no-condition", action="store_true")
    p.add_argument("--device", default="cpu", help="cpu, or cuda (CTranslate2's CUDA build)")
    a = p.parse_args()

    audio = read_wav(a.audio)

    if a.features:
        from faster_whisper.feature_extractor import FeatureExtractor

        feats = FeatureExtractor()(audio)
        np.ascontiguousarray(feats, dtype="<f4").tofile(a.features)
        print(json.dumps({"shape": list(feats.shape)}))
        return

    from faster_whisper import WhisperModel

    model = WhisperModel(
        ctranslate2_dir(a.model_dir), device=a.device, compute_type=a.compute_type, cpu_threads=a.threads
    )

    if a.encode:
        from faster_whisper.audio import pad_or_trim

        feats = model.feature_extractor(audio)
        window = pad_or_trim(feats[:, : min(3000, feats.shape[1] - 1)])
        out = np.array(model.encode(window))
        np.ascontiguousarray(out[0], dtype="<f4").tofile(a.encode)
        print(json.dumps({"shape": list(out[0].shape)}))
        return

    def run():
        segments, info = model.transcribe(
            audio,
            beam_size=1,
            best_of=1,
            temperature=0.0,
            condition_on_previous_text=not a.no_condition,
            vad_filter=False,
            without_timestamps=False,
            word_timestamps=False,
        )
        return list(segments), info

    if a.bench:
        run()  # warm-up
        best = float("inf")
        for _ in range(a.bench):
            t = time.perf_counter()
            run()
            best = min(best, time.perf_counter() - t)
        secs = len(audio) / 16000
        print(json.dumps({"audio_s": secs, "best_wall_s": best, "audio_s_per_s": secs / best,
                          "threads": a.threads, "compute_type": a.compute_type, "device": a.device}))
        return

    segments, info = run()
    print(json.dumps({
        "text": "".join(s.text for s in segments).strip(),
        "duration": info.duration,
        "segments": [
            {"start": s.start, "end": s.end, "text": s.text, "tokens": list(s.tokens),
             "avg_logprob": s.avg_logprob, "no_speech_prob": s.no_speech_prob}
            for s in segments
        ],
    }, indent=1))


if __name__ == "__main__":
    main()
