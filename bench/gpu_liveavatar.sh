#!/usr/bin/env bash
# LiveAvatar (Wan2.2-S2V-14B + LoRA, block-causal) on the lent H200: parity with the authors'
# code at the real shape (fp32, then bf16), their streaming loop and Facecast's timed on the
# same weights, the DiT alone and the whole stream (`facecast bench`), and `facecast serve`.
# No weights are downloaded: every parameter is random at the real shapes, drawn on the GPU.
#
# What travels: the tree (git-tracked files) and, named in `carry` (ignored by git):
#   .ref/liveavatar  the authors' package: git --git-dir=/work/.mirror/Alibaba-Quark+LiveAvatar/repo
#                    archive HEAD liveavatar | tar -x -C .ref   (1.5 MB; their 9c2c38d)
#   .whlref/         their stack as wheels (20 MB; the same bundle as FlashHead's, cp -r
#                    /work/main/.whlref .): diffusers 0.35.2 (their ModelMixin,
#                    FlowMatchEulerDiscreteScheduler), transformers 4.57.3, tokenizers 0.22.2,
#                    huggingface_hub 0.36.2, loguru. Their requirements.txt pins transformers
#                    <= 4.51.3 and diffusers >= 0.31 for the whole pipeline; the modules the
#                    reference loads (causal_model_s2v, wan_2_2/modules/{model,attention,s2v},
#                    causal_motioner, inference_utils) import only torch, einops (on the
#                    image), diffusers, numpy. flash-attn is not installed there (see parity).
#   .whl/            diffusers for Facecast's VAE (bash bench/device_wheels.sh): parity, speed
#   .whlserve/       the serve stack (aiortc, av, ...) with diffusers and cuDNN's graph API
#                    (bash bench/device_wheels.sh, 50.2 MB): serve; the portrait and speech are the
#                    project's own (pipeline/assets)
# The carry limit is 64 MiB all told: parity carries .ref .whlref .whl (25 MB), speed .whl, serve
# .whlserve (with the 16.5 MB tree, 0.36 MB under: the next wheel added needs room made).
#
# The calls (one mode per call; each stays under the 10-minute limit by its own clock, BUDGET=570 s,
# every step given what is left):
#   run command="bash bench/gpu_liveavatar.sh parity" carry=[".ref",".whlref",".whl"]
#   run command="bash bench/gpu_liveavatar.sh speed"  carry=[".whl"]
#   run command="bash bench/gpu_liveavatar.sh serve"  carry=[".whlserve"]
#   run command="bash bench/gpu_liveavatar.sh gate"   carry=[".whl"]
#   run command="bash bench/gpu_liveavatar.sh line" carry=[".whl"] kind=nvidia-h200-x2
# Options (env): DTYPES="float32 bfloat16" (parity; DTYPES= runs neither), BLOCKS32=6, STEPS32=2,
# BLOCKS16=8 (bf16 keeps 4 steps; blocks 3.. are timed: the key window full), AUTHORS_COMPILE=1
# (parity: also time their loop under their torch.compile if 120 s are left; alone:
# DTYPES= AUTHORS_COMPILE=1 bash bench/gpu_liveavatar.sh parity), PRECISIONS="default fp8"
# (speed: `facecast bench --precision`, default "default"), OVERLAPS="true false" (speed: the
# decode beside the next block's DiT, and serial; default "false", the product's),
# BENCH_FLAGS="--compile" (speed: each layer's dense work compiled, the cache and attention
# eager; ~1 min more for the graphs on a fresh machine), BLOCK_BENCH=0 (speed: no DiT-alone
# bench), PROFILE=1 (speed: then one steady block's kernels by kind, bench/step_profile.py;
# PROFILE_FLAGS default "--compile --ops": the operators by input shapes too),
# SECONDS_BENCH=20, SECONDS_LIVE=60,
# SERVE_FLAGS="--compile --precision=fp8" (serve; default none), LEAN=0 (the full 11 GB umT5),
# ATTENTION_BENCH=1 (speed: the self-attention's kernels first, ~1 min), FP8_BENCH=1 (speed: the
# block's linears, the project's FP8 against torchao's, ~6 min), GRAPHS_CHECK=1 (speed:
# bench/graphs_check.py, CUDA graphs against eager, ~20 s), BB_ATTENTION=sdpa,fp8
# (speed: the DiT-alone bench once per kernel), SETS="-;liveavatar.fp8_outputs=true" (speed:
# a ;-separated list of --set variants, each a space-separated list of key=value, "-" none;
# every precision and overlap runs each),
# GATE_SETS (gate: the same list for FP8 against the eager bf16 baseline; default "-"),
# GATE_PRECISIONS="fp8 fp8-fast" (gate: each with every GATE_SETS variant; default fp8),
# GATE_SECONDS=4 (gate: seconds of video a run), GATE_FLAGS
# (gate: more flags for every run, e.g. a size on a CPU).
#
# Expected time (one H200). A block forward at 704x384 is 3 latent frames = 3168 tokens against
# a sink of 2640 and a 12-frame window of 12672: ~117 TFLOP (the matrix products,
# liveavatar_block_bench.forward_flops), 4 a block = ~40 TFLOP a video frame.
#   parity ~5-6 min: fp32 (no TF32: GEMMs ~50 TFLOP/s, fp32 attention ~20) ~3 s a forward, 2
#     steps x 6 blocks + 2 sink = 14 forwards ~45 s a side + ~40 s build/draw/import (each side
#     gets (570 - 150) / 2 s at most); bf16 (~600 TFLOP/s) ~0.2 s a forward,
#     4 x 8 + 4 = 36 ~8 s a side + ~40 s. Memory: fp32 66 GB of weights + 27 GB of KV cache a
#     step (hence STEPS32=2: 4 steps would need 172 GB); bf16 33 + 13 x 4 = 85 GB.
#   speed ~7 min: block bench (DiT alone, 10 blocks) ~1.5 min; the random release (transformer
#     drawn on the GPU, 2-layer umT5: ~38 GB on disk, 47 GB with LEAN=0; the disk is 64 GiB)
#     ~2-3 min; `facecast bench --seconds 20` (load 33 GB, warm-up, 500 frames at ~15 fps) ~2-3
#     min. fp8 as a second call (PRECISIONS=fp8) if the first leaves too little.
#   serve ~7 min: the release ~2-3 min, server start ~1-2 min, a 60 s live call, a push.
# Dry run on a CPU (how this was checked before any GPU; tiny/test shapes, same code paths but
# the GPU draws and their cuDNN kernel): common="DEVICE=cpu SKIP_WHEELS=1 PYTHON=.venv/bin/python"
#   $common SHAPE=tiny DTYPES=float32 REFSITE=<a --target install of .whlref + einops> \
#     bash bench/gpu_liveavatar.sh parity                                         (~25 s)
#   $common RELEASE_SHAPE=test SIZE=64x64 LAYERS=1 BB_BLOCKS=2 SECONDS_BENCH=1 \
#     BENCH_FLAGS="--set video.width=64 --set video.height=64 --isolated-reps 1" \
#     bash bench/gpu_liveavatar.sh speed                                          (~2 min)
#   $common RELEASE_SHAPE=test SECONDS_LIVE=10 \
#     SERVE_SET="--set=video.width=64 --set=video.height=64" bash bench/gpu_liveavatar.sh serve
set -uo pipefail
mode=${1:?parity|speed|serve}
dev=${DEVICE:-cuda}
shape=${SHAPE:-full}
py=${PYTHON:-python3}
budget=${BUDGET:-570}
out=${OUT:-/tmp/out}
work=${WORK:-/tmp/la}
mkdir -p "$out" "$work" "$work/logs"
# a call returns at most 8 files: each step's log stays here, and their tails go back as one
logs=$work/logs
left() { echo $((budget - SECONDS)); }
wheels=.whl; [ "$mode" = serve ] && wheels=.whlserve
if [ -z "${SKIP_WHEELS:-}" ]; then
  "$py" -m pip install -q --no-index --no-deps --no-compile --target /tmp/site $wheels/*.whl
  # the serve bundle's pure-Python part travels zipped, to stay under the 64 MiB that travels
  [ -f $wheels/pure.zip ] && "$py" -m zipfile -e $wheels/pure.zip /tmp/pure
fi
export PYTHONPATH=/tmp/site:/tmp/pure:$PWD PYTHONUNBUFFERED=1
if [ "$dev" = cuda ]; then nvidia-smi --query-gpu=name,memory.used,clocks.sm --format=csv,noheader; fi
df -h "$work" | tail -1

reference() {  # SECONDS_LIMIT ARGS...: the authors' code, in its own environment
  local limit=$1
  shift
  local site=${REFSITE:-/tmp/refsite} repo=${REFREPO:-/tmp/laref}
  [ -d "$site" ] || "$py" -m pip install -q --no-index --no-deps --no-compile \
    --target "$site" .whlref/*.whl
  [ -d "$repo/liveavatar" ] || { mkdir -p "$repo" && cp -r .ref/liveavatar "$repo/"; }
  PYTHONPATH=$site:$PWD timeout "$limit" "$py" bench/parity/liveavatar_reference.py \
    --reference-repo "$repo" --device "$dev" --shape "$shape" "$@"
}

release() {  # a full-shape random release on disk, once per machine
  rel=$work/release
  if [ ! -f "$rel/release/config.json" ] || [ ! -f "$rel/lora/liveavatar.safetensors" ]; then
    local lean=--lean
    [ "${LEAN:-1}" = 0 ] && lean=
    timeout "$(left)" "$py" -m pipeline.liveavatar.random_release "$rel" \
      --shape "${RELEASE_SHAPE:-full}" --device "$dev" $lean >"$logs/release.log" 2>&1 \
      || { echo "random release FAILED"; tail -20 "$logs/release.log"; exit 1; }
    echo "release written at ${SECONDS} s: $(du -sh "$rel" | cut -f1)"
    df -h "$work" | tail -1
  fi
  weights=$rel/release
  lora=$rel/lora/liveavatar.safetensors
}

case $mode in
parity)
  for dtype in ${DTYPES-float32 bfloat16}; do
    steps=4 blocks=${BLOCKS16:-8}
    [ "$dtype" = float32 ] && steps=${STEPS32:-2} blocks=${BLOCKS32:-6}
    d=$work/$dtype
    # fp32 leaves bf16 150 s (its two processes need about 2 x 60)
    limit=$(left)
    [ "$dtype" = float32 ] && limit=$((limit - 150))
    t0=$SECONDS
    reference $((limit / 2)) --out "$d" --dtype "$dtype" --steps "$steps" --blocks "$blocks" \
      >"$logs/reference_$dtype.log" 2>&1 \
      || { echo "reference $dtype FAILED"; tail -30 "$logs/reference_$dtype.log"; continue; }
    grep "^built\|^reference:" "$logs/reference_$dtype.log"
    timeout $((limit - (SECONDS - t0))) "$py" bench/parity/liveavatar_compare.py \
      --reference-out "$d" --json "$out/parity_${shape}_$dtype.json" 2>&1 \
      | grep -v "Warning\|warn" | tee "$out/parity_${shape}_$dtype.txt"
    [ -f "$d/timing.json" ] && cp "$d/timing.json" "$out/authors_timing_$dtype.json"
    cp "$d/release/config.json" "$out/config_$shape.json"
    echo "$dtype done at ${SECONDS} s"
  done
  if [ -n "${AUTHORS_COMPILE:-}" ] && [ "$(left)" -gt 120 ]; then
    # their loop as they run it: torch.compile on (their ENABLE_COMPILE default), bf16
    reference "$(left)" --out "$work/compiled" --dtype bfloat16 --blocks "${BLOCKS16:-8}" --compile \
      >"$logs/authors_compiled.log" 2>&1 || echo "compiled timing FAILED or cut short"
    tail -1 "$logs/authors_compiled.log"
    [ -f "$work/compiled/timing.json" ] && cp "$work/compiled/timing.json" "$out/authors_timing_compiled.json"
  fi
  ;;
speed)
  # ATTENTION_BENCH=1: the self-attention's kernels side by side at the release's shape, each
  # against fp32 (bench/liveavatar_attention_bench.py: SDPA's, SageAttention's, cuDNN's FP8)
  [ -z "${ATTENTION_BENCH:-}" ] || timeout 180 "$py" bench/liveavatar_attention_bench.py \
    --json "$out/attention_kernels.json" 2>"$logs/attention_kernels.log" | tail -12 \
    || { echo "attention bench FAILED"; tail -20 "$logs/attention_kernels.log"; }
  # FP8_BENCH=1: the block's linears in FP8, the project's Fp8Linear against torchao's float8
  # (bench/fp8_bench.py --liveavatar; torchao travels in .whl), ~6 min of compiling (dynamo
  # reset before each module); its JSON is written after every shape
  [ -z "${FP8_BENCH:-}" ] || timeout 420 "$py" bench/fp8_bench.py --liveavatar \
    --json "$out/fp8_linears.json" 2>"$logs/fp8_linears.log" \
    || { echo "fp8 linear bench FAILED"; tail -20 "$logs/fp8_linears.log"; }
  # the DiT alone (Facecast), random weights drawn on the GPU, 10 blocks: the last 6 with the
  # key window full (BLOCK_BENCH=0 skips it)
  [ "${BLOCK_BENCH:-1}" = 0 ] || timeout $(($(left) / 4)) "$py" bench/liveavatar_block_bench.py --device "$dev" \
    --size "${SIZE:-704x384}" --layers "${LAYERS:-40}" --blocks "${BB_BLOCKS:-10}" \
    --attention "${BB_ATTENTION:-sdpa}" \
    --json "$out/block_bench.json" 2>"$logs/block_bench.log" \
    || { echo "block bench FAILED"; tail -20 "$logs/block_bench.log"; }
  release
  # GRAPHS_CHECK=1: pipeline.graphs' CUDA graphs against eager, the release's wav2vec2 too
  [ -z "${GRAPHS_CHECK:-}" ] || timeout 120 "$py" bench/graphs_check.py \
    --wav2vec "$weights/wav2vec2-large-xlsr-53-english" 2>"$logs/graphs_check.log" \
    || { echo "graphs check FAILED"; tail -20 "$logs/graphs_check.log"; }
  # the whole stream: audio features, the DiT's 4 steps a block, the VAE decode
  # OVERLAPS="true false": block k decoded beside block k+1's DiT (liveavatar.overlap), and not
  IFS=';' read -ra variants <<< "${SETS:--}"
  for precision in ${PRECISIONS:-default}; do
    for overlap in ${OVERLAPS:-false}; do
      for variant in "${variants[@]}"; do
        sets=(); tag=
        if [ "$variant" != - ]; then
          for kv in $variant; do sets+=(--set "$kv"); tag+=_${kv//[^A-Za-z0-9]/_}; done
        fi
        name=bench_liveavatar_${precision}_overlap_$overlap$tag
        # shellcheck disable=SC2086
        timeout "$(left)" "$py" -m facecast bench --model liveavatar --weights "$weights" \
          --lora "$lora" --device "$dev" --seconds "${SECONDS_BENCH:-20}" \
          --precision "$precision" --set "liveavatar.overlap=$overlap" "${sets[@]}" \
          ${BENCH_FLAGS:-} --json "$out/$name.json" 2>"$logs/$name.log" \
          || { echo "FAILED bench $precision overlap=$overlap $variant"; tail -20 "$logs/$name.log"; }
        echo "$variant: $(tail -1 "$logs/$name.log")"
      done
    done
  done
  # PROFILE=1: one steady block's kernels by kind (bench/step_profile.py), the window full
  if [ -n "${PROFILE:-}" ]; then
    precisions=${PRECISIONS:-default}
    # shellcheck disable=SC2086
    timeout "$(left)" "$py" bench/step_profile.py --model liveavatar --weights "$weights" \
      --lora "$lora" --device "$dev" --precision "${precisions%% *}" ${PROFILE_FLAGS:---compile --ops} \
      --warm-steps 6 --steps 2 --json "$out/profile_liveavatar.json" 2>"$logs/profile.log" \
      || { echo "FAILED profile"; tail -20 "$logs/profile.log"; }
  fi
  ;;
gate)  # the quality gate: the eager bf16 stream recorded twice (its own run-to-run band),
  # then FP8 compiled against it, once for each GATE_SETS variant (the gate's precision tier)
  release
  # shellcheck disable=SC2206
  w=(--model liveavatar --weights "$weights" --lora "$lora" --device "$dev" ${GATE_FLAGS:-})
  timeout "$(left)" "$py" -m facecast gate "${w[@]}" --baseline "$work/gate" --record \
    --seconds "${GATE_SECONDS:-4}" 2>"$logs/gate_record.log" | tail -1 \
    || { echo "FAILED gate record"; tail -20 "$logs/gate_record.log"; }
  IFS=';' read -ra variants <<< "${GATE_SETS:--}"
  for precision in ${GATE_PRECISIONS:-fp8}; do
    for variant in "${variants[@]}"; do
      sets=(); tag=_${precision//-/_}
      if [ "$variant" != - ]; then
        for kv in $variant; do sets+=(--set "$kv"); tag+=_${kv//[^A-Za-z0-9]/_}; done
      fi
      timeout "$(left)" "$py" -m facecast gate "${w[@]}" --baseline "$work/gate" \
        --precision "$precision" --compile "${sets[@]}" --json "$out/gate$tag.json" \
        2>"$logs/gate$tag.log" | tail -1
      [ -f "$out/gate$tag.json" ] || { echo "FAILED gate"; tail -3 "$logs/gate$tag.log"; }
      echo "  (the variant: $precision $variant)"
    done
  done
  ;;
serve)
  release
  args="--serve-arg=--model=liveavatar --serve-arg=--weights=$weights --serve-arg=--lora=$lora"
  # the project's portrait, its face box as LiteRT finds it here (the device image lacks LiteRT)
  args+=" --serve-arg=--reference=pipeline/assets/reference.png"
  args+=" --serve-arg=--face-box=${FACE_BOX:-72,74,113,113}"
  for flag in ${SERVE_FLAGS:-} ${SERVE_SET:-}; do args+=" --serve-arg=$flag"; done
  # shellcheck disable=SC2086
  timeout "$(left)" "$py" bench/serve_bench.py --config liveavatar --device "$dev" $args \
    --seconds "${SECONDS_LIVE:-60}" --mode live --mode push --wav pipeline/assets/sample_speech.wav \
    --server-log "$out/serve.log" --json "$out/serve.json" --markdown "$out/serve.md" \
    || { echo "serve FAILED"; tail -20 "$out/serve.log"; }
  ;;
line)  # two GPUs or more (kind nvidia-h200-x2): the step pipeline against one GPU, eager bf16,
  # random weights drawn on each GPU, no release needed (bench/step_pipeline_bench.py)
  common="--device $dev --size ${SIZE:-704x384} --layers ${LAYERS:-40}"
  # shellcheck disable=SC2086
  timeout $(($(left) / 3)) "$py" bench/liveavatar_block_bench.py $common --blocks 8 \
    --json "$out/line_one_gpu.json" 2>"$logs/line_one_gpu.log" | tail -1 \
    || { echo "one-GPU block bench FAILED"; tail -20 "$logs/line_one_gpu.log"; }
  # LINES: ;-separated step_pipeline_bench flags, one layout each (default: two steps a GPU,
  # then the DiT on one GPU and the collector on the other)
  IFS=';' read -ra lines <<< "${LINES:---step-ranks 2;--step-ranks 1 --decode-rank}"
  i=0
  for flags in "${lines[@]}"; do
    i=$((i + 1))
    # shellcheck disable=SC2086
    timeout $(($(left) / (${#lines[@]} - i + 1))) "$py" bench/step_pipeline_bench.py $common \
      $flags --blocks "${LINE_BLOCKS:-12}" --json "$out/line_$i.json" 2>"$logs/line_$i.log" \
      | tail -1 || { echo "step pipeline ($flags) FAILED"; tail -20 "$logs/line_$i.log"; }
  done
  ;;
*)
  echo "unknown mode $mode: parity|speed|gate|serve|line"
  exit 2
  ;;
esac
echo "finished at ${SECONDS} s"
for f in "$logs"/*.log; do [ -f "$f" ] && { echo "== $(basename "$f")"; tail -n 40 "$f"; }; done >"$out/logs.txt"
rm -f "$logs"/*.log  # the next call on a warm machine starts with its own
ls -la "$out"
