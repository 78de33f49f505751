"""Resemblyzer's speaker embedding (`VoiceEncoder.embed_utterance`) in numpy + librosa.

    python3 speaker_reference.py WEIGHTS.safetensors AUDIO16k.wav [--mel OUT.f32]

WEIGHTS is Resemblyzer 0.1.4's pretrained.pt converted to safetensors (tensors
`model_state.lstm.*` and `model_state.linear.*`); AUDIO is 16 kHz mono 16-bit
PCM WAV, read as int16 / 32768. Prints `{"embedding": [...256 floats], "frames": N}`
where N is the number of mel frames of the audio as given; `--mel` also writes
those frames (N x 40, row-major, little-endian float32).

No volume normalisation and no silence trimming (Resemblyzer's `preprocess_wav`):
this is the reference for the Rust path's `SpeakerEncoder::embed_trimmed`
(crates/models/speech/tests/speaker_encoder.rs). The mel is librosa's
`feature.melspectrogram` called as Resemblyzer calls it (so with the installed
librosa's default centre padding: zeros since librosa 0.10); the LSTM runs in
float64, which PyTorch's float32 matches to about 1e-6.
"""
import argparse
import json
import struct
import wave

import librosa
import numpy as np

SAMPLE_RATE = 16000
N_FFT = 400
HOP = 160
N_MELS = 40
PARTIAL_FRAMES = 160
HIDDEN = 256
LAYERS = 3


def read_safetensors(path: str) -> dict:
    """Every F32 tensor of a safetensors file, as float32 arrays."""
    with open(path, "rb") as f:
        data = f.read()
    (header_len,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + header_len])
    body = data[8 + header_len :]
    tensors = {}
    for name, info in header.items():
        if name == "__metadata__" or info["dtype"] != "F32":
            continue
        start, end = info["data_offsets"]
        tensors[name] = np.frombuffer(body[start:end], dtype="<f4").reshape(info["shape"])
    return tensors


def read_wav(path: str) -> np.ndarray:
    with wave.open(path, "rb") as w:
        if w.getframerate() != SAMPLE_RATE or w.getnchannels() != 1 or w.getsampwidth() != 2:
            raise SystemExit(f"{path}: want 16 kHz mono 16-bit PCM")
        pcm = np.frombuffer(w.readframes(w.getnframes()), dtype="<i2")
    return pcm.astype(np.float32) / np.float32(32768.0)


def wav_to_mel(wav: np.ndarray) -> np.ndarray:
    """resemblyzer.audio.wav_to_mel_spectrogram: frames x 40, float32."""
    frames = librosa.feature.melspectrogram(y=wav, sr=SAMPLE_RATE, n_fft=N_FFT, hop_length=HOP, n_mels=N_MELS)
    return frames.astype(np.float32).T


def partial_slices(n_samples: int, rate: float = 1.3, min_coverage: float = 0.75) -> list:
    """Mel frame starts of VoiceEncoder.compute_partial_slices."""
    n_frames = int(np.ceil((n_samples + 1) / HOP))
    frame_step = int(np.round((SAMPLE_RATE / rate) / HOP))
    steps = max(1, n_frames - PARTIAL_FRAMES + frame_step + 1)
    starts = list(range(0, steps, frame_step))
    coverage = (n_samples - starts[-1] * HOP) / (PARTIAL_FRAMES * HOP)
    if coverage < min_coverage and len(starts) > 1:
        starts = starts[:-1]
    return starts


def sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


def encode(weights: dict, mels: np.ndarray) -> np.ndarray:
    """VoiceEncoder.forward on a batch (batch x frames x 40): L2-normed embeddings."""
    x = mels.astype(np.float64)
    batch, steps, _ = x.shape
    for layer in range(LAYERS):
        w_ih = weights[f"model_state.lstm.weight_ih_l{layer}"].astype(np.float64)
        w_hh = weights[f"model_state.lstm.weight_hh_l{layer}"].astype(np.float64)
        bias = (
            weights[f"model_state.lstm.bias_ih_l{layer}"].astype(np.float64)
            + weights[f"model_state.lstm.bias_hh_l{layer}"].astype(np.float64)
        )
        projected = x @ w_ih.T + bias
        h = np.zeros((batch, HIDDEN))
        c = np.zeros((batch, HIDDEN))
        outputs = np.zeros((batch, steps, HIDDEN))
        for t in range(steps):
            gates = projected[:, t] + h @ w_hh.T
            i, f, g, o = np.split(gates, 4, axis=1)  # PyTorch's gate order
            c = sigmoid(f) * c + sigmoid(i) * np.tanh(g)
            h = sigmoid(o) * np.tanh(c)
            outputs[:, t] = h
        x = outputs
    w = weights["model_state.linear.weight"].astype(np.float64)
    b = weights["model_state.linear.bias"].astype(np.float64)
    raw = np.maximum(x[:, -1] @ w.T + b, 0.0)
    return raw / np.linalg.norm(raw, axis=1, keepdims=True)


def embed_utterance(weights: dict, wav: np.ndarray) -> np.ndarray:
    starts = partial_slices(len(wav))
    end = (starts[-1] + PARTIAL_FRAMES) * HOP
    if end >= len(wav):
        wav = np.pad(wav, (0, end - len(wav)), "constant")
    mel = wav_to_mel(wav)
    mels = np.array([mel[s : s + PARTIAL_FRAMES] for s in starts])
    partials = encode(weights, mels)
    raw = partials.mean(axis=0)
    return raw / np.linalg.norm(raw)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("weights")
    parser.add_argument("audio")
    parser.add_argument("--mel", help="write the audio's mel frames here (float32, frames x 40)")
    args = parser.parse_args()
    weights = read_safetensors(args.weights)
    wav = read_wav(args.audio)
    mel = wav_to_mel(wav)
    if args.mel:
        np.ascontiguousarray(mel, dtype="<f4").tofile(args.mel)
    embedding = embed_utterance(weights, wav)
    print(json.dumps({"embedding": [float(v) for v in embedding], "frames": int(mel.shape[0])}))


if __name__ == "__main__":
    main()
