#!/usr/bin/env bash
# The speech the Whisper steps of bench/gpu/device-check.sh transcribe: about a minute of the
# story the Whisper engine's long-clip test speaks (crates/models/transcribe/tests/long_story.txt),
# spoken by espeak-ng, as 16 kHz mono 16-bit WAV (what transcribe_bench and
# bench/transcribe/reference.py read). The same text gives the same file on any machine with the
# same espeak-ng.
#   bash bench/gpu/speech-sample.sh OUT.wav
set -euo pipefail
out=${1:?OUT.wav}
story="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)/crates/models/transcribe/tests/long_story.txt"
raw="$(mktemp --suffix=.wav)"
trap 'rm -f "$raw"' EXIT
espeak-ng -f "$story" -w "$raw"
ffmpeg -loglevel error -y -i "$raw" -ar 16000 -ac 1 -sample_fmt s16 "$out"
