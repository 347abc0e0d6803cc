#!/usr/bin/env bash
# FP8 DiT linears on the lent GPU: the benchmark, the gate's precision tier against bf16,
# and `facecast serve` with them (wheels as for bench/gpu_serve.sh).
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD/.whl/pure:$PWD PYTHONUNBUFFERED=1
out=${OUT:-/tmp/out}
mkdir -p "$out"
config=${1:-rt720-low-latency}
timeout 120 python3 -m facecast bench --config "$config" --compile --precision fp8 \
  --seconds 6 --isolated-reps 1 --json "$out/bench_${config}_fp8.json" 2>&1 | tail -2
timeout 100 python3 -m facecast gate --config "$config" --baseline /tmp/gate --seconds 1.5 \
  --precision fp8 --json "$out/gate_${config}_fp8.json" 2>&1 | tail -3
timeout 110 python3 bench/serve_bench.py --config "$config" --device cuda --compile \
  --serve-arg=--precision=fp8 --seconds 30 --mode live --mode push --wav .gpu/speech.wav \
  --json "$out/serve_${config}_fp8.json" --server-log "$out/serve_${config}_fp8.log" 2>&1 | tail -2
