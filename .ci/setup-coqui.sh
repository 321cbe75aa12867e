#!/usr/bin/env bash
# The optional Coqui TTS stage (`--tts coqui`): coqui-tts into .venv, keeping the CPU torch 2.13.0.
# Safe to run again: exits at once when `TTS.api` already imports.
#
# Why more than `pip install coqui-tts`:
# - torch stays pinned: an open range would swap the CPU build for a CUDA build of several GB.
# - coqui-tts 0.28 refuses to import without torchaudio, and without torchcodec on torch >= 2.9;
#   its punctuation module imports `six`, which it does not declare.
# - PyPI's torchaudio is a CUDA build: its compiled extension links libc10_cuda.so, which a CPU torch
#   lacks, so `import torchaudio` fails. The extension is optional (forced alignment, CTC decoders,
#   a few C++ filters); without it torchaudio uses its pure-PyTorch code, which is all Coqui's
#   synthesis needs. So on a CPU torch the CUDA-linked libraries are removed after installing.
set -euo pipefail
cd "$(dirname "$0")/.."
py=".venv/bin/python"
pip=".venv/bin/pip"
[ -x "$py" ] || { echo "setup-coqui: no .venv here; run .ci/setup.sh first" >&2; exit 1; }

if "$py" -c "from TTS.api import TTS" >/dev/null 2>&1; then
    echo "setup-coqui: coqui-tts already importable"
    exit 0
fi

constraints="$(mktemp)"
trap 'rm -f "$constraints"' EXIT
echo "torch==2.13.0" >"$constraints"
$pip install -q -c "$constraints" "coqui-tts==0.28.*" "torchaudio==2.11.1" "torchcodec>=0.8" six

cpu_torch='import sys, torch; sys.exit(torch.version.cuda is not None)'
if ! "$py" -c "import torchaudio" >/dev/null 2>&1 && "$py" -c "$cpu_torch"; then
    libdir="$("$py" -c "import importlib.util, pathlib; \
print(pathlib.Path(importlib.util.find_spec('torchaudio').origin).parent / 'lib')")"
    echo "setup-coqui: removing torchaudio's CUDA-linked extension from $libdir (CPU torch)"
    rm -f "$libdir"/*.so
fi

"$py" -c "import torch; from TTS.api import TTS; print('setup-coqui: coqui-tts ready, torch', torch.__version__)"
