#!/usr/bin/env bash
# The photo stack at 1280x720 on the lent GPU machine, on the user's paths: the engine alone
# (bench/photo_bench.py), `facecast render` + `facecast eval --photo` of the real portraits,
# and `facecast serve --reference <portrait>` with the project's client (bench/serve_bench.py).
#
# The machine has torch and OpenCV 5 (no Haar cascades: real photos cannot be prepared
# there) but no espeak-ng, aiortc or av. The project's OpenCV 4 wheel (62 MB) and the serve
# bundle (../shared/device/serve-wheels.sh .whl, 51 MB) cannot travel in one call under its
# 64 MiB limit, so the OpenCV wheel goes in two halves over two calls into the warm
# machine's /tmp (each call must come within 30 s of the last, while the machine is warm):
#   here:  mkdir .cv1 .cv2; split -n 2 -d .cvwhl/opencv*.whl /tmp/p; mv /tmp/p00 .cv1; mv /tmp/p01 .cv2
#   bash bench/gpu_photo.sh part1   carry .cv1
#   bash bench/gpu_photo.sh part2   carry .cv2 (installs OpenCV 4 into /tmp/site)
#   bash bench/gpu_photo.sh run     carry .whl .gpu (.gpu/speech.wav: espeak-ng speech, made here)
set -uo pipefail
out=${OUT:-/tmp/out}
site=/tmp/site
work=/tmp/photo720
mkdir -p "$site" /tmp/cvparts "$work"
export PYTHONPATH=$site:$PWD/.whl/pure:$PWD PYTHONUNBUFFERED=1
case "$1" in
  part1) cp .cv1/* /tmp/cvparts/ ;;
  part2)
    cp .cv2/* /tmp/cvparts/
    wheel=/tmp/opencv_python_headless-4.14.0.94-cp37-abi3-manylinux_2_28_x86_64.whl
    cat /tmp/cvparts/* >"$wheel"
    python3 -m pip install -q --no-index --no-deps --no-compile --target "$site" "$wheel"
    python3 -c "import cv2; print('OpenCV', cv2.__version__)"
    ;;
  run)
    python3 -c "import cv2; assert cv2.__version__.startswith('4'), cv2.__version__"
    python3 -m pip install -q --no-index --no-deps --no-compile --target "$site" .whl/*.whl
    nvidia-smi --query-gpu=name,memory.used,clocks.sm --format=csv,noheader
    wav=.gpu/speech.wav
    for ref in pipeline/assets/reference.png pipeline/assets/portraits/{grace_hopper,astronaut}.jpg; do
      name=$(basename "${ref%.*}")
      python3 bench/photo_bench.py --config photo720 --device cuda --seconds 40 --wav "$wav" \
        --reference "$ref" --json "$work/photo_bench_photo720_${name}_h200.json" |
        grep -E '"(engine_fps|p50|p95|first_frame_after_s)"'
    done
    for p in grace_hopper astronaut; do
      photo=pipeline/assets/portraits/$p.jpg
      python3 -m facecast render --config photo720 --device cuda --quiet --reference "$photo" \
        --audio "$wav" --out "$work/$p.mp4"
      python3 -m facecast eval --photo "$photo" --video "$work/$p.mp4" --audio "$wav" \
        --json "$work/photo_eval720_${p}_h200.json" --strip "$out/photo_strip720_$p.jpg"
      rm -f "$work/$p.mp4"
    done
    # the default (the engine in its own process), then in the server's process
    for flags in "" "--serve-arg=--no-engine-process"; do
      name=serve_photo720$(echo "$flags" | tr -dc 'a-z')_h200
      seconds=60; [ -n "$flags" ] && seconds=30
      # shellcheck disable=SC2086
      timeout 240 python3 bench/serve_bench.py --config photo720 --device cuda \
        --seconds $seconds --mode live --mode push --wav "$wav" \
        --serve-arg=--reference=pipeline/assets/portraits/grace_hopper.jpg $flags \
        --server-log "$work/$name.log" --json "$work/$name.json" --markdown "$work/RESULTS.md" |
        grep -E "live:|push:" || echo "FAILED serve $flags"
    done
    tar czf "$out/photo720.tgz" -C "$work" .
    ;;
  *) echo "usage: $0 part1|part2|run" >&2; exit 2 ;;
esac
