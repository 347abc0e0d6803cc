#!/usr/bin/env bash
# The engine's speed levers on the lent GPU, each through the quality gate: records the
# eager bf16 baseline once, then for every precision named runs `facecast bench --compile`
# and `facecast gate --compile` against that baseline (FP8 gets the gate's precision tier).
# JSON under $OUT/speed. Usage there: bash bench/gpu_speed.sh CONFIG PRECISION...
#   e.g. bash bench/gpu_speed.sh rt720-low-latency default fp8
set -uo pipefail
export PYTHONUNBUFFERED=1
config=${1:-rt720-low-latency}; shift || true
out=${OUT:-/tmp/out}/speed
mkdir -p "$out"
timeout 120 python3 -m facecast gate --config "$config" --baseline /tmp/gate --record \
  --seconds 1.5 2>&1 | tail -1
for precision in "${@:-default}"; do
  timeout 150 python3 -m facecast bench --config "$config" --compile --precision "$precision" \
    --seconds 12 --isolated-reps 1 --json "$out/bench_${config}_${precision}.json" 2>&1 | tail -1
  timeout 120 python3 -m facecast gate --config "$config" --baseline /tmp/gate --compile \
    --precision "$precision" --seconds 1.5 --json "$out/gate_${config}_${precision}.json" \
    2>&1 | tail -1
done
