#!/usr/bin/env bash
# Installs the Debian packages the test suite needs (chromium for the browser test,
# espeak-ng for offline speech; mkvtoolnix's mkvinfo and ffmpeg's ffprobe check the KVS
# mirror's bytes independently, as AWS's producer CI does; the FFmpeg libraries the code
# itself uses come with PyAV's wheel). Idempotent.
set -euo pipefail
need=()
command -v chromium >/dev/null 2>&1 || need+=(chromium)
command -v espeak-ng >/dev/null 2>&1 || need+=(espeak-ng)
command -v mkvinfo >/dev/null 2>&1 || need+=(mkvtoolnix)
command -v ffprobe >/dev/null 2>&1 || need+=(ffmpeg)
if [ ${#need[@]} -eq 0 ]; then exit 0; fi
if [ "$(id -u)" -ne 0 ]; then
  echo "facecast: missing Debian packages: ${need[*]}; run: sudo apt-get install -y ${need[*]}" >&2
  exit 1
fi
echo "installing Debian packages: ${need[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
