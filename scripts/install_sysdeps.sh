#!/usr/bin/env bash
# Installs the Debian packages the test suite needs (chromium for the browser test,
# espeak-ng for offline speech; mkvtoolnix's mkvinfo and ffmpeg's ffprobe check the KVS
# mirror's bytes independently, as AWS's producer CI does; GStreamer's WebRTC stack with the
# system Python's gi bindings for the interop tests, whose webrtcbin peer tests/gst_peer.py
# runs under /usr/bin/python3; the FFmpeg libraries the code itself uses come with PyAV's
# wheel). Idempotent.
set -euo pipefail
need=()
command -v chromium >/dev/null 2>&1 || need+=(chromium)
command -v espeak-ng >/dev/null 2>&1 || need+=(espeak-ng)
# webrtcbin, DTLS/SRTP (plugins-bad, libnice), Opus (base), VP8 and RTP (good), H.264
# decoding (libav), the tools (gst-inspect-1.0) and the typelibs python3-gi loads.
gstreamer=(
  gstreamer1.0-tools gstreamer1.0-plugins-base gstreamer1.0-plugins-good
  gstreamer1.0-plugins-bad gstreamer1.0-nice gstreamer1.0-libav
  gir1.2-gst-plugins-bad-1.0 python3-gi
)
for pkg in "${gstreamer[@]}"; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "ok installed" || need+=("$pkg")
done
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
