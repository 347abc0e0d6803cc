#!/usr/bin/env bash
# SoulX-FlashHead on the lent GPU: parity with the authors' code at the real shapes, their
# code and Facecast's family timed side by side on the same random weights, and `facecast
# serve --model flashhead-pro` measured by its own counters.
#
# What travels (all ignored by git, named in `carry`):
#   .ref/flash_head   the authors' package, from a checkout of github.com/Soul-AILab/SoulX-FlashHead
#   .whl/             diffusers (Facecast's VAE): bash bench/device_wheels.sh
#   .whlserve/        for `serve` and `sessions`: the serve stack with diffusers and cuDNN's graph
#                     API, for the FP8 attention (bash bench/device_wheels.sh)
#   .whlref/          the authors' stack: transformers 4.57.3, tokenizers 0.22, huggingface_hub 0.36,
#                     diffusers 0.35.2, loguru (their wav2vec2 subclass predates transformers 5)
#   .gpu/             grace_square.png (the portrait framed here: OpenCV 5 there has no Haar)
#                     and speech.wav (tests/support/realtime.make_speech_wav)
#   sessions (alone): .whlserve/ with diffusers' wheel added (pipelines and modular_pipelines
#                     stripped) and its pure/ folder as pure.zip (silero's .jit model only),
#                     to stay under the 64 MiB that travels; the portrait and speech are the
#                     project's own (pipeline/assets)
#   .compile-cache/   what an earlier call compiled (`--compile-cache`), as it came back from
#                     $OUT (compile-cache_*.xz): a fresh machine then starts Pro in about a
#                     minute, not six. Each call that compiled something new sends its file back.
# Usage there: bash bench/gpu_flashhead.sh parity|decode|speed|gate|serve|sessions|soak start|soak collect
set -uo pipefail
mode=${1:?parity|decode|speed|gate|serve|sessions|soak}
wheels=.whl; case $mode in serve|sessions|soak) wheels=.whlserve ;; esac
# soak collect carries nothing (the machine keeps /tmp/site from soak start, not the wheels)
[ "$mode ${2:-}" = "soak collect" ] \
  || python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site $wheels/*.whl
# the pure-Python part of the bundle travels zipped where the tree is near its 64 MiB
[ -f $wheels/pure.zip ] && python3 -m zipfile -e $wheels/pure.zip /tmp/pure
export PYTHONPATH=/tmp/site:/tmp/pure:$PWD/$wheels/pure:$PWD PYTHONUNBUFFERED=1
out=${OUT:-/tmp/out}
work=/tmp/fh
mkdir -p "$work" "$work/logs"
# a call returns at most 8 files: each step's log stays here, and their tails go back as one
logs=$work/logs
# the compile cache every compiled command here reads and writes (--compile-cache), filled
# from what an earlier call sent back, where that was carried
cc=$work/compile-cache; mkdir -p "$cc"
for f in .compile-cache/compile-cache_*.xz; do
  [ -f "$f" ] || continue
  bin=$cc/$(basename "$f" .xz | sed 's/^compile-cache_//')
  [ -f "$bin" ] || python3 -c "import lzma, shutil, sys
with lzma.open(sys.argv[1]) as src, open(sys.argv[2], 'wb') as dst: shutil.copyfileobj(src, dst)" "$f" "$bin"
done
touch "$work/.call_start"  # what is newer was compiled in this call
nvidia-smi --query-gpu=name,memory.used,clocks.sm --format=csv,noheader

clocks_start() {  # the GPU's clocks and power every 0.5 s into $1 (bench/gpu_clocks.py)
  setsid nohup python3 bench/gpu_clocks.py record "$1" >/dev/null 2>&1 </dev/null &
}
clocks_stop() {  # $1 as for clocks_start: stop the sampler (it became nvidia-smi), print
  # what the busy samples say
  pkill -f "nvidia-smi --query-gpu=timestamp" 2>/dev/null
  cp "$1" "$out/" 2>/dev/null && echo "GPU: $(python3 bench/gpu_clocks.py summary "$1")"
}

reference() {  # the authors' code, in its own environment
  [ -d /tmp/refsite ] || python3 -m pip install -q --no-index --no-deps --no-compile \
    --target /tmp/refsite .whlref/*.whl
  mkdir -p /tmp/ref && cp -r .ref/flash_head /tmp/ref/
  PYTHONPATH=/tmp/refsite:$PWD python3 bench/parity/flashhead_reference.py \
    --reference-repo /tmp/ref --device cuda "$@"
}

profile_step() {  # PROFILE=1: a steady step's kernels by kind (bench/step_profile.py); $1 the
  # model's flags, $2 the precision
  # shellcheck disable=SC2086
  [ -z "${PROFILE:-}" ] || timeout 240 python3 bench/step_profile.py $1 --compile --precision "$2" --ops \
    --warm-steps 4 --steps 3 --json "$out/profile_${MODEL:-flashhead-pro}.json" 2>"$logs/profile.log" \
    || { echo "profile FAILED"; tail -5 "$logs/profile.log"; }
}

case $mode in
parity)  # DTYPES="float32 bfloat16" (DTYPES= runs neither: the authors' timing alone)
  for dtype in ${DTYPES-float32 bfloat16}; do
    reference --out "$work/$dtype" --shape full --dtype "$dtype" --chunks 3 \
      > "$logs/reference_$dtype.log" 2>&1 || { echo "reference $dtype FAILED"; tail -30 "$logs/reference_$dtype.log"; }
    python3 bench/parity/flashhead_compare.py --reference-out "$work/$dtype" --device cuda \
      --json "$out/parity_full_$dtype.json" 2>&1 | grep -v "Loading\|Warning\|warn" | tee "$out/parity_full_$dtype.txt"
  done
  # the authors' pipeline as they run it (compiled, bf16), timed on the same weights
  reference --out "$work/authors" --shape full --dtype bfloat16 --chunks 1 --time 12 \
    > "$logs/authors_timing.log" 2>&1; tail -2 "$logs/authors_timing.log"
  cp "$work/authors/timing.json" "$out/authors_timing.json"
  ;;
decode)  # the Wan VAE's decode schedules and layouts, one chunk
  python3 bench/wan_decode_bench.py --json "$out/wan_decode.json" 2>"$logs/wan_decode.log" \
    || { echo "decode bench FAILED"; tail -20 "$logs/wan_decode.log"; }
  ;;
speed)  # MODELS="flashhead-pro flashhead-lite", FLAGS_LIST a ;-separated list of flag sets;
  # FRESH_INDUCTOR=1: each bench with empty Inductor and Triton folders, as on a fresh machine,
  # so a second run of the same flags starts from the --compile-cache file alone
  lite=; case "${MODELS:-}" in *lite*) lite=--lite;; esac
  [ -d "$work/float32/release/Model_Lite" ] || [ -d "$work/float32/release" -a -z "$lite" ] \
    || python3 -m pipeline.flashhead.random_release "$work/float32" --shape full $lite
  IFS=';' read -ra flag_sets <<< "${FLAGS_LIST:-;--compile;--compile --precision fp8}"
  for model in ${MODELS:-flashhead-pro}; do
    w="--model $model --weights $work/float32/release --wav2vec $work/float32/wav2vec"
    w+=" --device cuda --seconds ${SECONDS_BENCH:-30} --compile-cache $cc"
    for flags in "${flag_sets[@]}"; do
      name=$model$(echo "$flags" | tr -d ' -' | tr '=.' '__')
      clocks_start "$work/clocks_$name.csv"
      fresh=(); [ -z "${FRESH_INDUCTOR:-}" ] || { d=$(mktemp -d); fresh=(env
        "TORCHINDUCTOR_CACHE_DIR=$d/inductor" "TRITON_CACHE_DIR=$d/triton"); }
      # shellcheck disable=SC2086
      timeout 560 "${fresh[@]}" python3 -m facecast bench $w $flags --json "$out/$name.json" 2>"$logs/$name.log" \
        || { echo "FAILED $model $flags"; tail -5 "$logs/$name.log"; }
      clocks_stop "$work/clocks_$name.csv"
    done
  done
  # PROFILE=1: then Pro's steady step, PRECISION (fp8 unless set)
  MODEL=flashhead-pro profile_step "--model flashhead-pro --weights $work/float32/release \
    --wav2vec $work/float32/wav2vec --device cuda" "${PRECISION:-fp8}"
  ;;
gate)  # the quality gate (Pro; MODEL=flashhead-lite, Lite): the eager bf16 stream recorded
  # twice (its own run-to-run band), then each run compiled against it. GATE_RUNS:
  # ;-separated runs, each a precision and its settings ("fp8-fast flashhead.attention=fp8;
  # default": `default` is bf16, the reassociation tier); unset, GATE_PRECISION (fp8-fast)
  # with each GATE_SETS variant (- none).
  # GATE_EAGER=1: the runs eager (seconds each, against ~4 min of compiling): which part of
  # a precision costs the frames; the compiled run still decides what ships. GATE_RECORD=0:
  # check against the baseline the last call recorded (the machine still warm)
  # MODEL=flashhead-lite: Lite's own weights and baseline, beside Pro's
  model=${MODEL:-flashhead-pro}; lite=; [ "$model" = flashhead-lite ] && lite=--lite
  weights=$work/float32; [ -n "$lite" ] && { weights=$work/lite; work=$work/lite; }
  [ -d "$weights/release" ] || python3 -m pipeline.flashhead.random_release "$weights" \
    --shape full $lite >/dev/null 2>&1
  w="--model $model --weights $weights/release --wav2vec $weights/wav2vec --device cuda"
  w+=" --compile-cache $cc"  # read only: the gate compiles as it runs, after its start-up
  # shellcheck disable=SC2086
  [ "${GATE_RECORD:-1}" = 0 ] || timeout 240 python3 -m facecast gate $w --baseline "$work/gate" \
    --record --seconds "${GATE_SECONDS:-4}" 2>"$logs/gate_record.log" | tail -1 \
    || { echo "FAILED gate record"; tail -20 "$logs/gate_record.log"; }
  [ "${GATE_RECORD:-1}" = 0 ] || cp "$work/gate/baseline.json" "$out/gate_baseline.json"
  if [ -z "${GATE_RUNS:-}" ]; then
    IFS=';' read -ra variants <<< "${GATE_SETS:--}"
    GATE_RUNS=""
    for variant in "${variants[@]}"; do
      [ "$variant" = - ] && variant=""
      GATE_RUNS+="${GATE_PRECISION:-fp8-fast} $variant;"
    done
  fi
  IFS=';' read -ra runs <<< "$GATE_RUNS"
  for run in "${runs[@]}"; do
    read -ra words <<< "$run"
    [ ${#words[@]} -gt 0 ] || continue
    precision=${words[0]}; sets=(); tag=_${precision//-/_}
    compile=(--compile); [ "${GATE_EAGER:-0}" = 1 ] && { compile=(); tag+=_eager; }
    for kv in "${words[@]:1}"; do sets+=(--set "$kv"); tag+=_${kv//[^A-Za-z0-9]/_}; done
    # shellcheck disable=SC2086
    timeout 300 python3 -m facecast gate $w --baseline "$work/gate" --precision "$precision" \
      "${compile[@]}" "${sets[@]}" --json "$out/gate$tag.json" 2>"$logs/gate$tag.log" | tail -1
    [ -f "$out/gate$tag.json" ] || { echo "FAILED gate"; tail -3 "$logs/gate$tag.log"; }
    echo "  (the run: $run)"
  done
  ;;
serve)
  [ -d "$work/float32/release" ] || python3 -m pipeline.flashhead.random_release "$work/float32" --shape full
  args="--serve-arg=--model=flashhead-pro --serve-arg=--weights=$work/float32/release"
  args+=" --serve-arg=--wav2vec=$work/float32/wav2vec --serve-arg=--reference=.gpu/grace_square.png"
  args+=" --serve-arg=--set=flashhead.frame_reference=false"
  for flag in ${SERVE_FLAGS:---compile --precision=fp8}; do args+=" --serve-arg=$flag"; done
  # shellcheck disable=SC2086
  timeout 540 python3 bench/serve_bench.py --config flashhead-pro --device cuda $args \
    --seconds "${SECONDS_LIVE:-60}" --mode live --mode push --wav .gpu/speech.wav \
    --server-log "$out/serve.log" --json "$out/serve.json" --markdown "$out/serve.md" \
    || { echo "serve FAILED"; tail -20 "$out/serve.log"; }
  ;;
sessions)  # the product bench (batched steps, capacity), then serve: an agent alone, then
  # CALLS live calls at once; MODEL=flashhead-lite for Lite; BATCH=3 (batch_streams);
  # SKIP_BENCH=1, PROFILE=1, SERVE_FLAGS, PRECISION (fp8, the default, or fp8-fast), SETS
  # (config settings for the bench and the server alike, e.g. "flashhead.attention=fp8");
  # MODES (serve_bench's calls, "push live*CALLS" unset); TAG (a suffix that keeps two runs'
  # files apart on one machine); SERVE_TIMEOUT (the whole serve: Pro's cold compile took
  # 364.5 s on a fresh H100, then the calls: 450 unset; ~75 s start-up on a warm machine)
  model=${MODEL:-flashhead-pro}
  lite=; [ "$model" = flashhead-lite ] && lite=--lite
  python3 -m pipeline.flashhead.random_release "$work/float32" --shape full $lite >/dev/null 2>&1
  w="--model $model --weights $work/float32/release --wav2vec $work/float32/wav2vec --device cuda"
  w+=" --compile-cache $cc"
  sets="--set flashhead.batch_streams=${BATCH:-3}"
  for kv in ${SETS:-}; do sets+=" --set $kv"; done
  precision=${PRECISION:-fp8}  # PRECISION=fp8-fast: Hopper's fast FP8 accumulation
  # shellcheck disable=SC2086
  [ -n "${SKIP_BENCH:-}" ] || timeout 240 python3 -m facecast bench $w --compile --precision "$precision" \
    $sets --seconds 20 --json "$out/bench_$model.json" 2>"$logs/bench_$model.log" | tail -3 \
    || { echo "bench FAILED"; tail -5 "$logs/bench_$model.log"; }
  # FIRST_STEP=1: a call's first step against a steady one, stage by stage, eager, every
  # kernel waited for (host times are then kernel times)
  # shellcheck disable=SC2086
  [ -z "${FIRST_STEP:-}" ] || CUDA_LAUNCH_BLOCKING=1 timeout 120 python3 -m facecast bench $w \
    --precision fp8 --seconds 6 --json "$out/first_step_$model.json" 2>"$logs/first_step.log" \
    | tail -2 || { echo "first-step bench FAILED"; tail -5 "$logs/first_step.log"; }
  MODEL=$model profile_step "$w $sets" "$precision"  # the bench's settings, SETS too
  args="--serve-arg=--model=$model --serve-arg=--weights=$work/float32/release"
  args+=" --serve-arg=--wav2vec=$work/float32/wav2vec --serve-arg=--reference=pipeline/assets/reference.png"
  args+=" --serve-arg=--set=flashhead.frame_reference=false --serve-arg=--set=flashhead.batch_streams=${BATCH:-3}"
  args+=" --serve-arg=--compile --serve-arg=--precision=$precision --serve-arg=--compile-cache=$cc"
  for kv in ${SETS:-}; do args+=" --serve-arg=--set=$kv"; done
  # unset: as many sessions as the engine measured it carries; set, the operator's limit
  [ -n "${MAX_SESSIONS:-}" ] && args+=" --serve-arg=--max-sessions=$MAX_SESSIONS"
  # SERVE_FLAGS: more `facecast serve` flags, e.g. --engine-process (the engine's Python off
  # the media loop's GIL; its sessions' steps still batched)
  for flag in ${SERVE_FLAGS:-}; do args+=" --serve-arg=$flag"; done
  modes=; for m in ${MODES:-push live*${CALLS:-2}}; do modes+=" --mode $m"; done
  # shellcheck disable=SC2086
  timeout "${SERVE_TIMEOUT:-450}" python3 bench/serve_bench.py --config "$model" --device cuda $args \
    --seconds "${SECONDS_LIVE:-60}" $modes \
    --wav pipeline/assets/sample_speech.wav --server-log "$out/serve_$model${TAG:-}.log" \
    --json "$out/serve_$model${TAG:-}.json" --markdown "$out/serve_$model${TAG:-}.md" \
    || { echo "serve FAILED"; tail -20 "$out/serve_$model${TAG:-}.log"; }
  ;;
soak)  # two live Pro calls for SOAK_S (600) seconds, longer than one command may run: call
  # `soak start` (returns once the server and clients run, detached with setsid), then within
  # the 30 s the machine stays warm, `soak collect` (waits for them, copies the results).
  # start carries .whlserve (with cuDNN's graph API, for the default FP8 attention under
  # fp8 and fp8-fast), collect nothing.
  # The calls' GPU memory, read every 10 s, says whether it stays flat.
  # PRECISION (fp8, or fp8-fast), BATCH, SETS and SERVE_FLAGS as for sessions; SOAK_MODES
  # (serve_bench's modes, in turn; "live*2" unless set): "push live*2" first times an
  # agent's push as the first call after start-up.
  case ${2:-start} in
  start)  # the weights an earlier call on this machine made (gate, speed) serve again
    [ -d "$work/float32/release" ] || python3 -m pipeline.flashhead.random_release "$work/float32" --shape full >/dev/null 2>&1
    args="--serve-arg=--model=flashhead-pro --serve-arg=--weights=$work/float32/release"
    args+=" --serve-arg=--wav2vec=$work/float32/wav2vec --serve-arg=--reference=pipeline/assets/reference.png"
    args+=" --serve-arg=--set=flashhead.frame_reference=false --serve-arg=--compile"
    args+=" --serve-arg=--compile-cache=$cc"
    args+=" --serve-arg=--set=flashhead.batch_streams=${BATCH:-3}"
    args+=" --serve-arg=--precision=${PRECISION:-fp8} --serve-arg=--max-sessions=2"
    for kv in ${SETS:-}; do args+=" --serve-arg=--set=$kv"; done
    # SERVE_FLAGS as for sessions, e.g. "--plan-sessions=2 --engine-process"
    for flag in ${SERVE_FLAGS:-}; do args+=" --serve-arg=$flag"; done
    for m in ${SOAK_MODES:-live*2}; do args+=" --mode $m"; done
    rm -f "$work/soak.json"
    clocks_start "$work/clocks_soak.csv"
    # shellcheck disable=SC2086
    setsid nohup python3 bench/serve_bench.py --config flashhead-pro --device cuda $args \
      --seconds "${SOAK_S:-600}" --wav pipeline/assets/sample_speech.wav \
      --server-log "$work/soak_serve.log" --json "$work/soak.json" --markdown "$work/soak.md" \
      >"$work/soak.log" 2>&1 </dev/null &
    sleep 20
    tail -n 3 "$work/soak.log" "$work/soak_serve.log"
    ;;
  collect)
    # start-up (~3.5 min) and the calls outlast one command: collect again while not done.
    # A machine that went back between the calls is a fresh one with no soak on it: say so
    # at once rather than wait out the command's limit for a file that cannot come.
    if ! pgrep -f "serve_bench.py --config flashhead-pro" >/dev/null && [ ! -f "$work/soak.json" ]; then
      echo "no soak is running here (the machine was given back between calls): start it again"
      exit 1
    fi
    # serve_bench writes soak.json after each call, so the file alone can hold call 1 of 2
    # (a collect that copied it then lost call 2 of a 5-minute soak): wait for the last write
    done_() { grep -q '"complete": true' "$work/soak.json" 2>/dev/null; }
    for _ in $(seq 1 110); do done_ && break; sleep 5; done
    done_ || echo "not done yet: run 'soak collect' again within 30 s"
    cp "$work"/soak.json "$work"/soak.md "$work"/soak.log "$work"/soak_serve.log "$out/" 2>/dev/null
    if done_; then clocks_stop "$work/clocks_soak.csv"
    else cp "$work/clocks_soak.csv" "$out/" 2>/dev/null; fi
    cat "$work/soak.log"
    # the set under way, at its calls' last 10-s samples (kept should the budget end it)
    python3 - "$work/soak.json" <<'EOF' 2>/dev/null
import json, sys
for c in json.load(open(sys.argv[1])).get("in_progress") or []:
    s = c and c["server"]
    if s:
        print("under way: %s call %d of %d at %s s: fresh %s (%s/%s), ttff %s ms" % (
            c["mode"], c["call"] + 1, c["concurrent"], c["elapsed_s"], s.get("fresh_share"),
            s.get("frames_fresh"), s.get("frames_sent"), s.get("ttff_ms")))
EOF
    ;;
  esac
  ;;
esac
# a compile cache written in this call goes back, compressed (a file back is at most 16 MiB):
# put it in .compile-cache/ here and carry that folder
# (Pro's file is ~377 MB, compiled for an H100: it cannot pack under 16 MiB, and packing it took
# the last ~100 s of a 600-s call, so a file over 128 MiB is only reported)
for bin in $(find "$cc" -name '*.bin' -newer "$work/.call_start"); do
  mb=$(du -m "$bin" | cut -f1)
  [ "$mb" -le 128 ] || { echo "compile cache: $(basename "$bin") $mb MB, too large to come back"; continue; }
  xz=$out/compile-cache_$(basename "$bin").xz
  python3 -c "import lzma, shutil, sys
with open(sys.argv[1], 'rb') as src, lzma.open(sys.argv[2], 'wb', preset=6) as dst: shutil.copyfileobj(src, dst)" "$bin" "$xz"
  echo "compile cache: $(basename "$bin") $(du -m "$bin" | cut -f1) MB, $(du -m "$xz" | cut -f1) MB packed"
  [ "$(stat -c %s "$xz")" -le 16777216 ] || { echo "  over the 16 MiB a file may come back: kept there only"; rm -f "$xz"; }
done
for f in "$logs"/*.log; do [ -f "$f" ] && { echo "== $(basename "$f")"; tail -n 40 "$f"; }; done >"$out/logs.txt"
rm -f "$logs"/*.log  # the next call on a warm machine starts with its own
ls -la "$out"
