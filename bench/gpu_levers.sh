#!/usr/bin/env bash
# The speed levers of issue 13 on the lent GPU, each measured alone: the decode stage's
# convolution layouts (bench/decode_bench.py), FP8 GEMM scaling and kernels
# (bench/fp8_bench.py), then `facecast bench` on the config. Results under $OUT/levers.
# Usage there: bash bench/gpu_levers.sh [CONFIG] [BENCH FLAGS...]
set -uo pipefail
export PYTHONUNBUFFERED=1
config=${1:-rt720-low-latency}; shift || true
out=${OUT:-/tmp/out}/levers
mkdir -p "$out"
timeout 200 python3 bench/decode_bench.py --config "$config" --json "$out/decode_$config.json" \
  || echo "FAILED decode_bench"
timeout 200 python3 bench/fp8_bench.py --config "$config" --json "$out/fp8_$config.json" \
  || echo "FAILED fp8_bench"
timeout 150 python3 -m facecast bench --config "$config" --compile --seconds 12 \
  --isolated-reps 1 --json "$out/bench_$config.json" "$@" 2>&1 | tail -4
