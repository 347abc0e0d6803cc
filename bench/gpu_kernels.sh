#!/usr/bin/env bash
# Kernel-level measurements for issues 30 and 31 on the lent H200, one call, each step given
# a share of the call's 10 minutes (BUDGET, seconds):
#   1. LiveAvatar's self-attention kernels side by side at the release's shape
#      (bench/liveavatar_attention_bench.py: SDPA's kernels, SageAttention's INT8 QK);
#   2. the 40-layer S2V DiT block by block with each kernel (bench/liveavatar_block_bench.py);
#   3. the Wan VAE decode of a FlashHead Pro chunk, its whole pass compiled as one graph
#      (bench/wan_decode_bench.py);
#   4. FlashHead Pro's first step against a steady one, stage by stage with every kernel
#      waited for (CUDA_LAUNCH_BLOCKING=1: host times are then kernel times), eager.
# What travels (carry): .whl/ with diffusers unpacked under .whl/pure (its pipelines/*/
# left out) and the sageattention 1.0.6 wheel (Triton kernels only, 20 kB).
#   run command="bash bench/gpu_kernels.sh" carry=[".whl"]
set -uo pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD/.whl/pure:$PWD PYTHONUNBUFFERED=1
out=${OUT:-/tmp/out}
start=$SECONDS
left() { echo $(( ${BUDGET:-570} - (SECONDS - start) )); }
nvidia-smi --query-gpu=name,memory.used,clocks.sm --format=csv,noheader

timeout 90 python3 bench/liveavatar_attention_bench.py --json "$out/attention.json" \
  2>"$out/attention.log" || { echo "attention bench FAILED"; tail -5 "$out/attention.log"; }
echo "[$((SECONDS - start)) s]"
timeout 120 python3 bench/liveavatar_block_bench.py --blocks 6 --attention "${KERNELS:-sdpa,cudnn,int8}" \
  --json "$out/blocks.json" 2>"$out/blocks.log" || { echo "block bench FAILED"; tail -5 "$out/blocks.log"; }
echo "[$((SECONDS - start)) s]"
timeout $(( $(left) - 130 )) python3 bench/wan_decode_bench.py --json "$out/wan_decode.json" \
  2>"$out/wan_decode.log" || { echo "decode bench FAILED"; tail -8 "$out/wan_decode.log"; }
echo "[$((SECONDS - start)) s]"
work=/tmp/fh
python3 -m pipeline.flashhead.random_release "$work" --shape full >/dev/null 2>"$out/release.log" \
  || { echo "release FAILED"; tail -5 "$out/release.log"; }
CUDA_LAUNCH_BLOCKING=1 timeout $(( $(left) - 5 )) python3 -m facecast bench --model flashhead-pro \
  --weights "$work/release" --wav2vec "$work/wav2vec" --device cuda --precision fp8 --seconds 6 \
  --json "$out/first_step.json" 2>"$out/first_step.log" | tail -3 \
  || { echo "first-step bench FAILED"; tail -5 "$out/first_step.log"; }
echo "[$((SECONDS - start)) s]"
ls -la "$out"
