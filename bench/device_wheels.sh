#!/usr/bin/env bash
# Build the Python packages that the lent GPU machine lacks into folders that travel with `carry`
# (all ignored by git; the working tree and the carried folders together stay under 64 MiB).
#   .whl/       diffusers (Facecast's Wan VAE), its per-pipeline folders stripped (2 MB, not 6),
#               and ftfy (umT5's prompt cleaning, LiveAvatar), and cuDNN's Python graph API
#               for the device's Python 3.12 (nvidia-cudnn-frontend, 2 MB: liveavatar.attention
#               fp8; in .whlserve without its C++ headers), and torchao 0.18
#               (bench/fp8_bench.py's comparison, 3.4 MB).
#               bench/gpu_flashhead.sh decode|speed|serve, bench/gpu_liveavatar.sh parity|speed
#   .whlserve/  ../shared/device/serve-wheels.sh's bundle (aiortc, av, boto3, silero-vad, ...) with
#               the stripped diffusers wheel added and its pure/ folder zipped as pure.zip:
#               bench/gpu_flashhead.sh sessions, bench/gpu_liveavatar.sh serve
#   .whlref/    with `refs`: the authors' stack for the parity and authors-timing runs (20 MB):
#               transformers 4.57.3, tokenizers 0.22.2, huggingface_hub 0.36.2, diffusers 0.35.2,
#               loguru; and .ref/liveavatar, LiveAvatar's package from a checkout of theirs
#               (LIVEAVATAR_GIT: its git dir, e.g. the `fetch` tool's mirror), 1.5 MB:
#               bench/gpu_liveavatar.sh parity (with AUTHORS_COMPILE=1, their compiled loop)
# Usage, from the project's root: bash bench/device_wheels.sh   (versions: the project's .venv)
#   LIVEAVATAR_GIT=/work/.mirror/Alibaba-Quark+LiveAvatar/repo \
#   FLASHHEAD_GIT=/work/.mirror/Soul-AILab+SoulX-FlashHead/repo bash bench/device_wheels.sh refs
set -euo pipefail
if [ "${1:-}" = refs ]; then
  rm -rf .whlref && mkdir -p .whlref .ref
  for pkg in transformers==4.57.3 tokenizers==0.22.2 huggingface_hub==0.36.2 diffusers==0.35.2 \
    loguru==0.7.3; do
    python3 -m pip download -q --no-deps --only-binary=:all: -d .whlref "$pkg" 2>/dev/null
  done
  rm -rf .ref/liveavatar .ref/flash_head
  git --git-dir="${LIVEAVATAR_GIT:?the git dir of a LiveAvatar checkout}" archive HEAD liveavatar \
    | tar -x -C .ref
  # FLASHHEAD_GIT (optional): SoulX-FlashHead's package too, for bench/gpu_flashhead.sh parity
  # (their pipeline timed beside Facecast's: DTYPES= bash bench/gpu_flashhead.sh parity); git
  # may name a large example file the mirror lacks, outside flash_head/: harmless
  [ -z "${FLASHHEAD_GIT:-}" ] || git --git-dir="$FLASHHEAD_GIT" archive HEAD flash_head | tar -x -C .ref
  exclude="$(git rev-parse --git-common-dir)/info/exclude"
  for d in .whlref .ref; do grep -qx "/$d/" "$exclude" 2>/dev/null || echo "/$d/" >>"$exclude"; done
  du -sh .whlref .ref/*
  exit 0
fi
py=${PYTHON:-$PWD/.venv/bin/python}
exclude="$(git rev-parse --git-common-dir)/info/exclude"  # a worktree's too
for d in .whl .whlserve; do
  grep -qx "/$d/" "$exclude" 2>/dev/null || echo "/$d/" >>"$exclude"
done
version=$($py -c "import importlib.metadata as m; print(m.version('diffusers'))")
tmp=$(mktemp -d)
python3 -m pip download -q --no-deps --only-binary=:all: -d "$tmp" "diffusers==$version" 2>/dev/null
# the pipelines' own folders (hundreds of models' glue) are never imported by Facecast
mkdir -p "$tmp/x" && (cd "$tmp/x" && python3 -m zipfile -e "$tmp"/diffusers-*.whl .)
find "$tmp/x/diffusers/pipelines" "$tmp/x/diffusers/modular_pipelines" -mindepth 1 -maxdepth 1 -type d \
  -exec rm -rf {} +
rm -rf .whl && mkdir -p .whl
(cd "$tmp/x" && python3 -m zipfile -c "$OLDPWD/.whl/diffusers-$version-py3-none-any.whl" ./*)
# ftfy cleans umT5's prompt (LiveAvatar); wcwidth, which it imports, as its pure-Python 0.2
# (the newer ones are 0.8 MB binary wheels, and the serve bundle is near the limit)
python3 -m pip download -q --no-deps --only-binary=:all: -d .whl \
  "ftfy==$($py -c "import importlib.metadata as m; print(m.version('ftfy'))")" "wcwidth==0.2.13" 2>/dev/null
rm -rf .whlserve
PYTHON=$py bash ../shared/device/serve-wheels.sh .whlserve >/dev/null
# the serve bundle's diffusers without the three folders serving never imports (ControlNets,
# the command line, guiders: 155 kB packed): with cuDNN's graph API below, the tree and the
# bundle fit under the 64 MiB carry
rm -rf "$tmp/x/diffusers/models/controlnets" "$tmp/x/diffusers/commands" "$tmp/x/diffusers/guiders"
(cd "$tmp/x" && python3 -m zipfile -c "$OLDPWD/.whlserve/diffusers-$version-py3-none-any.whl" ./*)
cp .whl/ftfy-*.whl .whl/wcwidth-*.whl .whlserve/
# the 1.16 line: newer ones require NVIDIA's CUTLASS DSL (hundreds of MB) as well
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
  --platform manylinux_2_28_x86_64 -d .whl "nvidia-cudnn-frontend==1.16.0" 2>/dev/null
# and for serving (the FP8 attention of FlashHead and LiveAvatar): its Python and its library
# only, without the C++ headers and Blackwell's GEMM kernels (1.5 MB, not 2)
mkdir -p "$tmp/cudnn" && (cd "$tmp/cudnn" && python3 -m zipfile -e "$OLDPWD"/.whl/nvidia_cudnn_frontend-*.whl . \
  && rm -rf include cudnn/gemm_amax cudnn/gemm_swiglu \
  && python3 -m zipfile -c "$OLDPWD/.whlserve/$(basename "$OLDPWD"/.whl/nvidia_cudnn_frontend-*.whl)" ./*)
# torchao's float8 for bench/fp8_bench.py (issue 31's lever; 3.4 MB): 0.18 pairs with the
# device's torch 2.11, and its float8 inference path is Python over torch's FP8 GEMM
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
  --platform manylinux_2_28_x86_64 -d .whl "torchao==0.18.0" 2>/dev/null
# silero-vad's safetensors copy of its model (1 MB) is never loaded: realtime/vad.py takes the
# TorchScript one, and without it the tree and the bundle fit under the 64 MiB carry
rm -f .whlserve/pure/silero_vad/data/*.safetensors
# pure/ goes on PYTHONPATH as it is, never installed: its packages' RECORD files are not read
rm -f .whlserve/pure/*.dist-info/RECORD
(cd .whlserve/pure && python3 -m zipfile -c ../pure.zip ./*) && rm -rf .whlserve/pure
# every archive of the bundle packed again with LZMA, which pip and `python3 -m zipfile`
# read as they read zlib (48 MB becomes 37: PyAV's wheel alone 35.6 MB → 26.8), so the whole
# bundle, cuDNN's graph API for the default FP8 attention included, travels beside the tree;
# the same files, so their RECORD hashes still hold
python3 - .whlserve/*.whl .whlserve/pure.zip <<'PY'
import os, sys, zipfile
for path in sys.argv[1:]:
    with zipfile.ZipFile(path) as src, zipfile.ZipFile(path + ".lzma", "w") as dst:
        for info in src.infolist():
            dst.writestr(info, src.read(info), zipfile.ZIP_LZMA)
    os.replace(path + ".lzma", path)
PY
rm -rf "$tmp"
du -sh .whl .whlserve
