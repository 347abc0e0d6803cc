"""Running the GStreamer webrtcbin peer (tests/support/gst_peer.py) from a test.

The peer needs Debian's python3-gi, so it runs under the system Python as a subprocess;
`needs_gstreamer` skips a test only where GStreamer's WebRTC stack is not installed
(`make sysdeps` installs it).
"""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

GST_PEER = Path(__file__).with_name("gst_peer.py")
SYSTEM_PYTHON = "/usr/bin/python3"


def gstreamer_missing() -> str | None:
    """Why the webrtcbin peer cannot run here (None when it can)."""
    if not shutil.which("gst-inspect-1.0") or not Path(SYSTEM_PYTHON).exists():
        return "GStreamer is not installed (make sysdeps)"
    probe = "import gi; gi.require_version('GstWebRTC', '1.0'); gi.require_version('GstSdp', '1.0')"
    elements = ["webrtcbin", "dtlssrtpdec", "opusenc", "opusdec", "vp8dec", "avdec_h264"]
    for cmd in [[SYSTEM_PYTHON, "-c", probe]] + [
        ["gst-inspect-1.0", "--exists", name] for name in elements
    ]:
        if subprocess.run(cmd, capture_output=True).returncode != 0:
            return f"GStreamer webrtcbin is not usable: {' '.join(cmd)} failed (make sysdeps)"
    return None


_MISSING = gstreamer_missing()
needs_gstreamer = pytest.mark.skipif(_MISSING is not None, reason=str(_MISSING))


async def run_gst_peer(*args: str, timeout: float = 120.0) -> dict:
    """Run tests/support/gst_peer.py under the system Python; its one JSON report."""
    proc = await asyncio.create_subprocess_exec(
        SYSTEM_PYTHON,
        str(GST_PEER),
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        out, err = await asyncio.wait_for(proc.communicate(), timeout)
    except asyncio.TimeoutError:
        proc.kill()
        await proc.wait()
        raise
    assert proc.returncode == 0, err.decode()[-2000:]
    report = json.loads(out.decode().strip().splitlines()[-1])
    print(json.dumps(report), file=sys.stderr)  # the measured numbers, with -s
    return report
