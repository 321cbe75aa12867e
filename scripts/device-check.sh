#!/usr/bin/env bash
# The GPU check: CUDA tests, then the engine benchmark (static vs fcfs vs o4, mixed workload) on random-weight
# models of the default model's shape and of Llama-2-13B's, with JSON and a summary in $OUT.
# Needs only this repository and torch, triton, transformers, numpy, pytest, prometheus-client: no model
# packages, no Whisper or Piper. About 8 minutes at most on one GPU (each step has its own time limit).
#
# Without CUDA (or with DEVICE=cpu) it runs the same steps on the CPU with the tiny shape, in seconds:
# the CUDA tests skip and the benchmark shows only that the path works.
#   OUT=dir      where results go (default ./device-results)
#   DEVICE=cpu   force the CPU;  SHAPES="tiny"  the shapes to measure (default: "default 13b" on CUDA)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-./device-results}"
mkdir -p "$OUT"
PY="${PYTHON:-}"
[ -n "$PY" ] || { [ -x .venv/bin/python ] && PY=.venv/bin/python || PY=python3; }
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"

if [ -z "${DEVICE:-}" ]; then
    DEVICE=$("$PY" -c "import torch; print('cuda' if torch.cuda.is_available() else 'cpu')")
fi
if [ "$DEVICE" = cuda ]; then
    SHAPES="${SHAPES:-default 13b}"
    BENCH_ARGS=(--max-batch-tokens 1024 --max-batch-seqs 32 --static-batch-size 32)
else
    SHAPES="${SHAPES:-tiny}"
    BENCH_ARGS=(--quick)
fi
status=0
{
    echo "device: $DEVICE"
    "$PY" -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda);
import sys; sys.exit(0) if not torch.cuda.is_available() else print(torch.cuda.get_device_name())"
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>/dev/null || true
} > "$OUT/machine.txt" 2>&1

# The CUDA tests (they skip without CUDA). No conftest: it needs the test extras and the embedded models;
# tests/ on the path for the shared kernel cases (tests/support/).
echo "== CUDA tests"
PYTHONPATH="tests${PYTHONPATH:+:$PYTHONPATH}" timeout 150 "$PY" -m pytest --noconftest -p no:cacheprovider -q -rs tests/scheduling/test_cuda.py \
    --junitxml="$OUT/cuda-tests.xml" 2>&1 | tee "$OUT/cuda-tests.txt" || status=1

for shape in $SHAPES; do
    echo "== bench engine, $shape shape, on $DEVICE"
    limit=150; [ "$shape" = 13b ] && limit=270
    timeout "$limit" "$PY" -m voicepipe.bench engine --device "$DEVICE" --random-weights "$shape" \
        --modes static,fcfs,o4 --workloads mixed "${BENCH_ARGS[@]}" --json "$OUT/bench-$shape.json" 2>&1 \
        | tee "$OUT/bench-$shape.txt" || status=1
done

"$PY" -m voicepipe.bench.device_summary "$OUT" || status=1
echo "results in $OUT (status $status)"
exit $status
