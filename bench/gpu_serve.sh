#!/usr/bin/env bash
# `facecast serve` on the lent GPU machine, measured with the project's client
# (bench/serve_bench.py), one server per config. The machine has torch and Triton but not
# aiortc, av, silero-vad or boto3: they travel as wheels (../shared/device/serve-wheels.sh
# .whl), and the speech clip as .gpu/speech.wav (tests/support/realtime.make_speech_wav).
# Usage there: bash bench/gpu_serve.sh CONFIG[:FLAGS] ...   e.g. rt720:--compile demo
# BENCH=bench/fleet_worker_gpu.py measures the fleet's worker class the same way instead
# (Ray does not travel there; the worker is driven directly).
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD/.whl/pure:$PWD PYTHONUNBUFFERED=1
out=${OUT:-/tmp/out}/serve
mkdir -p "$out"
nvidia-smi --query-gpu=name,memory.used,clocks.sm --format=csv,noheader
for spec in "$@"; do
  config=${spec%%:*}; flags=""; [ "$spec" != "$config" ] && flags=${spec#*:}
  bench=${BENCH:-bench/serve_bench.py}
  prefix=serve; [ "$bench" != bench/serve_bench.py ] && prefix=fleet_worker
  name=${prefix}_${config}$(echo "$flags" | tr -d ' -')
  # shellcheck disable=SC2086
  timeout 300 python3 "$bench" --config "$config" --device cuda $flags \
    --seconds "${SECONDS_LIVE:-60}" --mode live --mode push --wav .gpu/speech.wav \
    --server-log "$out/$name.log" --json "$out/$name.json" --markdown "$out/RESULTS.md" \
    || echo "FAILED $spec"
done
tar czf "${OUT:-/tmp/out}/serve.tgz" -C "$out" .
