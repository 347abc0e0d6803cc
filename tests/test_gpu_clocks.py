"""bench/gpu_clocks.py reads nvidia-smi's CSV as the driver writes it: busy samples only,
columns by place (the header calls clocks.sm clocks.current.sm), N/A tolerated."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

from gpu_clocks import summary  # noqa: E402

HEADER = (
    "timestamp, utilization.gpu [%], clocks.current.sm [MHz], clocks.current.memory [MHz], "
    "power.draw [W], temperature.gpu, clocks_event_reasons.active\n"
)


def test_summary_counts_busy_samples_and_the_reasons_clocks_were_held(tmp_path):
    path = tmp_path / "clocks.csv"
    path.write_text(
        HEADER
        + "2026/12/05 17:20:00.000, 0, 345, 2619, 80.1, 30, 0x0000000000000001\n"  # idle
        + "2026/12/05 17:20:00.500, 98, 1980, 3201, 650.3, 55, 0x0000000000000000\n"
        + "2026/12/05 17:20:01.000, 100, 1710, 3201, 699.8, 61, 0x0000000000000004\n"
        + "2026/12/05 17:20:01.500, 100, 1755, 3201, [N/A], 62, 0x0000000000000004\n"
    )
    text = summary(str(path))
    assert text.startswith("3 of 4 samples busy")
    assert "SM clock p50 1755 MHz (min 1710, max 1980)" in text
    assert "power p50 675 W (max 700)" in text  # the N/A row left out
    assert "0x0000000000000004 in 2, 0x0000000000000000 in 1" in text


def test_summary_of_an_idle_gpu_says_so(tmp_path):
    path = tmp_path / "clocks.csv"
    path.write_text(HEADER + "2026/12/05 17:20:00.000, 3, 345, 2619, 80.1, 30, 0x1\n")
    assert "none with the GPU busy" in summary(str(path))
