"""LiveAvatar's config section (`liveavatar:` in a preset), and the rules it sets on the
shared schedule and video size."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from pipeline.clock import FPS
from pipeline.sections import DTYPES, check

if TYPE_CHECKING:
    from pipeline.config import FacecastConfig

COMPILE_MODES = ("default", "max-autotune-no-cudagraphs")
# torch.compile's modes with CUDA graphs: refused, with the reason (see `compile_mode` below)
CUDA_GRAPH_MODES = ("reduce-overhead", "max-autotune")
# `pipeline.models.attention` backends for it, or auto (`self_attention` below)
SELF_ATTENTION = ("auto", "sdpa", "cudnn", "fp8")
KV_CACHES = ("auto", "model", "fp8")  # the KV cache's dtype: auto, the model's, or e4m3
LIVEAVATAR_BLOCK_FRAMES = 12  # video frames a block adds: 3 latent frames of the Wan VAE
DEFAULT_PROMPT = (
    "A person talks to the camera, looking straight ahead, with natural expressions and "
    "small head movements; soft, even lighting; a plain background; realistic, sharp detail."
)


@dataclass
class LiveAvatarConfig:
    """LiveAvatar (Wan2.2-S2V-14B with the Live-Avatar LoRA) from its published checkpoint
    (`runtime.stack: liveavatar`, `pipeline/liveavatar/`). Numbers are the authors'
    streaming settings (`infinite_inference_single_gpu.sh`)."""

    weights: str | None = None  # the Wan2.2-S2V-14B folder; --weights
    lora: str | None = None  # the Live-Avatar LoRA file or folder; --lora
    wav2vec: str | None = None  # default: the release's wav2vec2-large-xlsr-53-english/
    prompt: str = DEFAULT_PROMPT  # what the umT5 encoder reads; --prompt, an offer's "prompt"
    steps: int = 4  # Euler steps a block, no guidance (the LoRA is distilled to 4)
    shift: float = 3.0  # the sampler's timestep shift
    ref_distance: int = 30  # latent frames the reference sits ahead of a block (authors: 4..30)
    audio_window_seconds: float = 4.0  # wav2vec2 re-reads this much audio every block
    audio_lookahead_frames: int = 2  # a block waits for this much audio past its end
    dtype: str = "auto"  # auto: bfloat16 on a GPU (as the authors run it), float32 on a CPU
    # decode block k on a side CUDA stream while block k+1's DiT runs, where block k+1's
    # audio is already here (a backlog); same frames either way. Off: on one H200 it gave
    # 13.4 fps against 13.3 (the DiT keeps every SM busy, so the decode cannot hide behind
    # it), and served live its frames come a step later (bench/RESULTS.md, issue 31)
    overlap: bool = False
    # --precision fp8 on each layer's two attention output projections as well: they sit in
    # the layer's compiled half, where their inputs' quantisation fuses into the reshape
    # before them. On the H200: 14.5 fps against 14.1, 2.1 GB less held, and the gate's FP8
    # tier passed at 40.1 dB against bf16 (41.4 without them; bench/RESULTS.md, issue 31)
    fp8_outputs: bool = True
    # the self-attention's kernel: auto, sdpa (torch's exact SDPA: cuDNN's bf16 kernel on the
    # H200, 1.65 ms a call, 35 % of a block), cudnn (the same bf16 attention on whichever of
    # cuDNN's engines is fastest for each layout, timed once: on the H200 that is the engine
    # SDPA takes, 15.1 fps against 15.3) or fp8 (cuDNN's fused FP8 attention on Hopper). Both
    # cuDNN ones go through the optional nvidia-cudnn-frontend wheel and take the exact path
    # where they cannot run, said once in the log. auto: fp8 where the linears run in FP8
    # (--precision fp8 or fp8-fast) and cuDNN's FP8 kernel can run here, else sdpa. Over the
    # FP8 cache, with the queries quantised in the layer: 16.8 fps against 15.35 with fp8-fast
    # on the H200, 25 GB less held, and the gate's FP8 tier passed at 32.6 dB against bf16
    # (bf16's own band 45.1; 40.1 with bf16 attention). Over a bf16 cache it is slower (2.83
    # ms a call, 1.40 of it quantising q, k and v; bench/RESULTS.md, issue 31)
    attention: str = "auto"
    # the KV cache's step buffers: auto, in the model's dtype, or fp8 (e4m3, one scale per
    # layer for keys and one for values, set from the sink at prefill): half the bytes (26 GB,
    # not 52, on one H200), and with attention=fp8 the keys and values go into cuDNN's kernel
    # as stored. With any other attention it is slower (12.7 fps against 15.35 on the H200:
    # the cache is widened for every call). auto: fp8 where the attention is fp8 and its
    # kernel can run here
    kv_cache: str = "auto"
    # torch.compile's mode for the layers' compiled halves under --compile: default, or
    # max-autotune-no-cudagraphs (Triton GEMM templates tried against cuBLAS; minutes more at
    # start-up). The CUDA-graph modes are refused: every layer replays the same graphs, so
    # inductor's graph trees take each layer's call for a new iteration and overwrite the
    # output the next layer is reading (it failed so on the H200), and the GPU is idle only
    # 4 % of a block (~35 ms), less the copies out of the graphs that would make them safe
    compile_mode: str = "default"

    def validate(self) -> None:
        check(1 <= self.steps <= 50, "liveavatar.steps", "must be in [1, 50]")
        check(self.shift > 0, "liveavatar.shift", "must be > 0")
        check(0 <= self.ref_distance <= 64, "liveavatar.ref_distance", "must be in [0, 64]")
        check(
            1.0 <= self.audio_window_seconds <= 30.0,
            "liveavatar.audio_window_seconds",
            "must be in [1, 30]",
        )
        check(
            abs(self.audio_window_seconds * FPS - round(self.audio_window_seconds * FPS)) < 1e-9,
            "liveavatar.audio_window_seconds",
            f"must be a whole number of frames (a multiple of {1 / FPS:g} s)",
        )
        check(
            1 <= self.audio_lookahead_frames <= FPS,
            "liveavatar.audio_lookahead_frames",
            f"must be in [1, {FPS}] (wav2vec2's last state of a window falls short of its end)",
        )
        check(bool(self.prompt.strip()), "liveavatar.prompt", "must not be empty")
        check(
            self.compile_mode not in CUDA_GRAPH_MODES,
            "liveavatar.compile_mode",
            f"{self.compile_mode} puts CUDA graphs over the layers, which LiveAvatar's 40 "
            "layers sharing one graph cannot replay safely; use default or "
            "max-autotune-no-cudagraphs",
        )
        check(
            self.compile_mode in COMPILE_MODES,
            "liveavatar.compile_mode",
            f"must be one of {', '.join(COMPILE_MODES)}",
        )
        check(
            self.attention in SELF_ATTENTION,
            "liveavatar.attention",
            f"must be one of {', '.join(SELF_ATTENTION)}",
        )
        check(
            self.dtype in ("auto", *DTYPES), "liveavatar.dtype", f"must be auto or one of {DTYPES}"
        )
        check(self.kv_cache in KV_CACHES, "liveavatar.kv_cache", f"must be one of {KV_CACHES}")


def self_attention(la: LiveAvatarConfig, fp8_linears: bool, refusal: str | None) -> tuple[str, str]:
    """(the self-attention's backend, the KV cache's dtype) with `auto` resolved: cuDNN's
    FP8 attention over an FP8 cache where the linears already run in FP8 (the precision
    that opts into the gate's FP8 tier) and the kernel can run here (`refusal`: why not,
    or None); otherwise the exact SDPA over a cache in the model's dtype. A value that is
    set is kept as it is; an FP8 cache under `auto` only where the FP8 kernel reads it."""
    attention = la.attention
    if attention == "auto":
        attention = "fp8" if fp8_linears and refusal is None else "sdpa"
    kv_cache = la.kv_cache
    if kv_cache == "auto":
        kv_cache = "fp8" if attention == "fp8" and refusal is None else "model"
    return attention, kv_cache


def check_config(cfg: FacecastConfig) -> None:
    """LiveAvatar's rules across sections: blocks of 12 frames, no seams, a size the
    packed motion latents divide."""
    sch, v = cfg.schedule, cfg.video
    block = LIVEAVATAR_BLOCK_FRAMES
    check(
        sch.chunk_latents == block and sch.first_chunk_latents == block,
        "schedule",
        f"a LiveAvatar block adds {block} frames: chunk_latents and first_chunk_latents "
        f"must be {block}, seam and boundary 0",
    )
    check(sch.seam_latents == 0 and sch.boundary_latents == 0, "schedule", "no seams")
    check(
        v.width % 64 == 0 and v.height % 64 == 0,
        "video",
        f"LiveAvatar needs a size divisible by 64 (got {v.width}x{v.height}): the "
        "motion latents are packed 4x after the 2x2 patch",
    )
