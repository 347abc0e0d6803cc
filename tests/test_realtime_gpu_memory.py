"""The engine's GPU memory on /metrics: what its tensors hold now, beside the peak, so a long
call can show it flat (`bench/serve_bench.py` reads it through each call)."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from realtime.engine_process import gpu_memory
from realtime.metrics import RealtimeMetrics
from realtime.server import metrics_text


class MemoryEngine:
    """A hosted engine that reports the given (allocated, peak) bytes."""

    def __init__(self, memory):
        self.memory = memory

    def gpu_memory(self):
        return self.memory

    def batching(self):
        return None


async def test_metrics_carry_the_gpu_memory_held_now_and_its_peak():
    service = SimpleNamespace(
        metrics=RealtimeMetrics(), sessions={}, engine=MemoryEngine((3_000_000_000, 5_000_000_000))
    )
    text = (await metrics_text(service)).decode()
    assert "facecast_gpu_memory_allocated_bytes 3e+09" in text
    assert "facecast_gpu_memory_peak_bytes 5e+09" in text
    # an engine on a CPU reports none, and the gauges stay unset (0), not wrong
    service = SimpleNamespace(metrics=RealtimeMetrics(), sessions={}, engine=MemoryEngine(None))
    text = (await metrics_text(service)).decode()
    assert "facecast_gpu_memory_allocated_bytes 0.0" in text


def test_a_cpu_has_no_gpu_memory_to_report():
    assert gpu_memory(torch.device("cpu")) is None
