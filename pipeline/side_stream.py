"""Work queued on a CUDA stream of its own, beside the main stream's, in a fixed order.

The GPU runs two streams' kernels at once where one leaves room: a VAE decode (short,
convolution-bound kernels) fills the gaps of a DiT's next block. `SideStream.after_main()`
queues work after everything the main stream has queued so far (it reads what the main
stream wrote), keeps the tensors it reads alive until the side stream is done with them
(the caching allocator would otherwise hand their memory to the main stream's next
block), and `SideStream.host()` brings a result to the host waiting only for the side
stream. State that lives from one piece of work to the next (a causal decoder's cache) is
made and dropped on the side stream only: freed memory is then reused in that stream's
order, never by the main stream while side work still reads it. On a CPU there is no side
stream: the same calls run the work in place, in the same order, so the frames are the
same and only the timing differs.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TypeVar

import torch
from torch import Tensor

T = TypeVar("T")


class SideStream:
    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.stream = torch.cuda.Stream(device) if device.type == "cuda" else None

    @contextmanager
    def after_main(self, *reads: Tensor) -> Iterator[None]:
        """Queue the block's work on the side stream, after the main stream's work so far;
        `reads`: main-stream tensors the work reads."""
        if self.stream is None:
            yield
            return
        self.stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(self.stream):
            yield
        for tensor in reads:
            tensor.record_stream(self.stream)

    def host(self, fetch: Callable[[], T]) -> T:
        """`fetch()` (a copy to the host) on the side stream: the host waits for the side
        stream's work, not the main stream's."""
        if self.stream is None:
            return fetch()
        with torch.cuda.stream(self.stream):
            return fetch()
