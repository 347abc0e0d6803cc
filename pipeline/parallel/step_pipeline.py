"""LiveAvatar's S2V transformer over several GPUs: one sampling step per rank, the blocks
flowing through the ranks like an assembly line (the authors' "timestep-forcing pipeline
parallelism", issue 24).

The stream keeps one KV cache per sampling step (`pipeline.models.wan.s2v`): step i of a
block writes its keys and values into cache i and reads only cache i. Nothing else ties the
steps together, so step i can live on its own rank with its own cache. Rank r (0..S-1) holds
the whole transformer and step r's cache alone (`new_cache(..., steps=1)`, written as its
step 0); it prefills that cache itself (prompt and sink), then for every block runs its one
Euler step and hands the block to rank r+1. The last step's rank hands the final latents to
the collector: a decode rank (rank S, the VAE's) or, without one, rank 0.

Schedule, S = 4 step ranks and a decode rank; bN.sK = step K of block N, one forward each:

    time      ->  |  t0   |  t1   |  t2   |  t3   |  t4   |  t5   |  t6   |
    rank 0 (s0)   | b0.s0 | b1.s0 | b2.s0 | b3.s0 | b4.s0 | b5.s0 | b6.s0 |
    rank 1 (s1)   |       | b0.s1 | b1.s1 | b2.s1 | b3.s1 | b4.s1 | b5.s1 |
    rank 2 (s2)   |       |       | b0.s2 | b1.s2 | b2.s2 | b3.s2 | b4.s2 |
    rank 3 (s3)   |       |       |       | b0.s3 | b1.s3 | b2.s3 | b3.s3 |
    rank 4 (VAE)  |       |       |       |       | dec b0| dec b1| dec b2|

- Fewer GPUs than steps: a rank may run several consecutive steps with a cache of those
  steps alone (`StepLayout.step_ranks`). On two GPUs, two steps each (`StepLayout(4,
  step_ranks=2, decode_rank=False)`): rank 0 runs steps 0-1 and decodes, rank 1 steps 2-3;
  at the H200's 0.16 s a forward (`--precision fp8-fast`) and ~0.1 s of decode, the pace is
  rank 0's ~0.43 s a 0.48-s block, real time where one GPU makes 0.61x of it. Or every step
  on one GPU and the decode on the other (`StepLayout(4, step_ranks=1)`): ~0.64 s a block,
  0.75x real time.
- Throughput: one block per rank's steps once the line is full, S times one GPU's with a
  rank a step (more, as the decode leaves the step ranks); the slowest rank sets the pace.
  Rank 0 also draws the noise and encodes the block's audio tokens (milliseconds); without
  a decode rank it decodes as well and paces the line at one forward plus one decode.
- Latency per block: unchanged, S forwards in a row (then the decode) plus S hops of a few
  hundred KB; the first block comes out after S forwards.
- Memory per step rank at 704x384 in bf16: the weights (16.3 B parameters, 32.6 GB) and
  one step's cache
  (14.0 GB: 12.5 GB of ring, 1.1 GB of sink keys, 0.4 GB of prompt keys), 47 GB, where one
  GPU holds the weights and all four caches (32.6 + 51.7 GB). The decode rank holds the VAE.
- Sent per block and hop (704x384, bf16): the latents (1, 16, 3, 48, 88), 405,504 B; the
  audio tokens, global (1, 3, 5120) 30,720 B and local (1, 3, 5, 5120) 153,600 B; an 8-byte
  header. About 590 KB: ~25 us over PCIe 4 x16, a few us over NVLink. To the collector:
  the latents and the header.

Sends are `isend`s: a rank posts its block and goes on to the next one; a step rank posts
the receive of block b+1 before it computes block b (two receive buffers, allocated once),
so transfers hide behind the forwards. The header carries the block's index, or END when
rank 0's blocks run out; it is read on the host (one sync per block, after the block's data
has arrived) so that every rank stops with the stream. On GPUs (NCCL) the first message
between two ranks creates their communicator, a blocking handshake: the first block pays
it, which a warm-up stream absorbs. Not yet run on GPUs (none were lent): the tests run the
same code on CPU processes with gloo.

Design decisions:
- Audio tokens: rank 0 encodes them (`encode_audio`, a few small convolutions) and they
  ride with the latents. Every rank encoding them itself would need the wav2vec2 features
  (1, 25, 1024, 12) on every rank, 614 KB bf16 a block: more bytes than the tokens' 184 KB,
  and a second source of truth. Only rank 0 needs the stream's audio.
- Noise: rank 0 draws it from one generator seeded as the single-process stream's
  (`LiveAvatarStream`), in the same order: a seed gives the same noise on 1 or S+1 GPUs,
  and on the CPU the same latents bit for bit (tests/test_step_pipeline.py).
- The model is not touched: a step rank calls `forward_block(..., step=0)` on its one-step
  cache with its own timestep (`S2VCache` indexes steps by position; `SinkPrefill` fills
  every step buffer it has, here one).

How the engine would call it (not wired; the lead does that): `launch` one process per GPU
(`pipeline.parallel.launch`, world = `StepLayout.world`); the decode rank loads the VAE,
encodes the reference and motion latents and shares them (`share_start`); every step rank
calls `run_step_pipeline` with a factory loading the transformer; rank 0 passes an iterator
that yields each block's wav2vec2 features as the engine's audio queue fills (it ends the
stream when it stops, and END goes down the line also when it raises); the decode rank
passes `on_latents`, which decodes the block (`WanDecodeStream.decode`, warmed with the
motion latents) and puts the frames on a bounded queue to the serving process. Compile,
FP8 and warm-up apply to each step rank's model inside its factory; the per-block hot path
is `StepStage.run`.

The other option, Ulysses within a step (`pipeline.parallel.ulysses`, used for Facecast's
own DiTs): P ranks run every step of every block together, each on 1/P of the block's
tokens (3,168 at 704x384: 792 at P = 4), trading tokens for heads around each
self-attention. It divides a block's compute by about P, so the latency per block drops,
which the step pipeline cannot do (its throughput gain is at best the same P-fold, less the
all-to-alls and the smaller matmuls). It beats the step pipeline when latency matters more
than throughput: the first frames of an interactive turn, or a block whose 4 forwards do
not fit in its 0.48 s on one GPU (a real-time stream needs the block done before the next
is due, however many blocks are in flight); and with fewer GPUs than steps. Its cost: per
self-attention, the block's q, k, v out and the output back, about 130 MB a layer across
the group in bf16 at 704x384 (about 1 GB a forward a rank at P = 4: milliseconds over
NVLink, to hide behind the compute, as `UlyssesAttention`'s head groups do). What the S2V
transformer would need:
- the KV cache sharded by heads: each rank keeps N/P heads of every step's ring and of the
  sink's keys (the cache divided by P: 51.7 GB to 13 GB at P = 4);
- `CausalSelfAttention` handing its `KeyValues` the tensors after the all-to-all, all the
  block's tokens and N/P heads, so that `CachedStep` writes and reads its head shard (RoPE
  for the whole block, the sink's re-rotation per head shard);
- the per-frame work (the modulation's and the audio injection's (T, L/T) reshapes, the
  FrameHead) done per token with each token's frame index, as a shard of 792 tokens cuts
  across 1,056-token frames; the text cross-attention is per token and runs as it is;
- 40 heads splitting over P (2, 4, 5, 8); the weights stay whole on every GPU unless FSDP
  shards them.
The two compose: Ulysses over P GPUs inside each of the S stages, S x P GPUs.

Not handled here: replacing the sink mid-stream (`prefill` again, the authors'
`--enable_online_decode`): every step rank would re-prefill its cache between the same two
blocks, which a header flag sent down the line could order.

Legend: B batch, C latent channels, T latent frames, H/W latent height/width, D model
width, M audio tokens per latent frame, S sampling steps (step ranks).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace

import torch
import torch.distributed as dist
from torch import Tensor

from pipeline.models.wan.s2v import S2VConfig, S2VTransformer, euler_sigmas
from pipeline.models.wan.s2v_audio import AudioTokens
from pipeline.models.wan.s2v_cache import S2VCache

END = -1  # the header of the message that ends the stream

Works = list[dist.Work]


@dataclass(frozen=True)
class StepLayout:
    """Which rank does what: `step_ranks` ranks (all `steps` by default) run the sampling
    steps, `steps / step_ranks` consecutive ones each; with a decode rank, the rank after
    them collects the final latents, otherwise rank 0 does. Two GPUs: `StepLayout(4,
    step_ranks=2, decode_rank=False)` (two steps a GPU) or `StepLayout(4, step_ranks=1)`
    (every step on one GPU, the decode on the other)."""

    steps: int
    decode_rank: bool = True
    step_ranks: int | None = None  # None: one step a rank

    def __post_init__(self) -> None:
        if self.steps < 1 or self.ranks < 1 or self.steps % self.ranks:
            raise ValueError(
                f"{self.steps} sampling steps cannot be split evenly over {self.ranks} ranks"
            )
        if self.world < 2:
            raise ValueError(
                "a step pipeline needs 2 processes or more: run one process as it is "
                "(LiveAvatarStream)"
            )

    @property
    def ranks(self) -> int:
        """Ranks that run sampling steps (0..ranks-1)."""
        return self.steps if self.step_ranks is None else self.step_ranks

    @property
    def steps_per_rank(self) -> int:
        return self.steps // self.ranks

    @property
    def world(self) -> int:
        return self.ranks + int(self.decode_rank)

    @property
    def collector(self) -> int:
        return self.ranks if self.decode_rank else 0

    def next_rank(self, rank: int) -> int:
        return rank + 1 if rank < self.ranks - 1 else self.collector

    def sends_audio(self, rank: int) -> bool:
        """Whether rank's messages carry the audio tokens: to a step rank, not the collector."""
        return rank < self.ranks - 1


@dataclass
class StreamStart:
    """What every step rank prefills its cache with (the stream's prompt and sink), and how
    the blocks are sampled; the tensors on the rank's device."""

    prompt_BLC: Tensor  # umT5 features of the prompt
    ref_BC1HW: Tensor  # the reference's latents
    motion_BCTHW: Tensor  # the motion latents
    seed: int  # rank 0's noise generator
    dtype: torch.dtype  # the model's: latents travel in it between steps
    shift: float = 3.0  # the Euler schedule's (`euler_sigmas`)
    ref_distance: int | None = None  # `S2VTransformer.sink_shift`

    def to(self, device: torch.device | str) -> StreamStart:
        return replace(
            self,
            prompt_BLC=self.prompt_BLC.to(device),
            ref_BC1HW=self.ref_BC1HW.to(device),
            motion_BCTHW=self.motion_BCTHW.to(device),
        )


def share_start(start: StreamStart | None, src: int, device: torch.device | str) -> StreamStart:
    """`start` from rank `src` (None elsewhere) on every rank, on `device`. Once a stream;
    the tensors go through the CPU (a pickled CUDA tensor would land on src's GPU)."""
    box = [start.to("cpu") if start is not None else None]
    dist.broadcast_object_list(box, src=src)
    got = box[0]
    if got is None:
        raise RuntimeError(f"rank {src} shared no stream start: pass it there")
    return got.to(device)


@dataclass(frozen=True)
class Wire:
    """The shapes of a block's message: header (1,) int64, latents (B, C, T, H, W), audio
    tokens global (B, T, D) and local (B, T, M, D), in the model's dtype."""

    latents: tuple[int, ...]
    audio_global: tuple[int, ...]
    audio_local: tuple[int, ...]
    dtype: torch.dtype
    device: torch.device

    @classmethod
    def of(cls, cfg: S2VConfig, start: StreamStart) -> Wire:
        B, _, _, H, W = start.ref_BC1HW.shape
        T, D = cfg.frames_per_block, cfg.dim
        return cls(
            (B, cfg.out_dim, T, H, W),
            (B, T, D),
            (B, T, cfg.num_audio_token + 1, D),
            start.dtype,
            start.ref_BC1HW.device,
        )

    def header(self, block: int) -> Tensor:
        return torch.full((1,), block, dtype=torch.int64, device=self.device)

    def empty(self, audio: bool) -> list[Tensor]:
        """Buffers for one message: header and latents, then the audio tokens if `audio`."""
        shapes = [self.latents, self.audio_global, self.audio_local] if audio else [self.latents]
        return [self.header(END)] + [
            torch.empty(s, dtype=self.dtype, device=self.device) for s in shapes
        ]


def post_send(parts: list[Tensor], dst: int) -> Works:
    return [w for p in parts if (w := dist.isend(p, dst)) is not None]


def post_recv(parts: list[Tensor], src: int) -> Works:
    return [w for p in parts if (w := dist.irecv(p, src)) is not None]


def wait_all(works: Works) -> None:
    for w in works:
        w.wait()


# -- one step of every block ------------------------------------------------------------------


class StepStage:
    """Sampling steps `first .. first + count - 1` of every block: the model, a cache of those
    steps alone, their timesteps and sigma differences. `run` is the hot path: `count`
    forwards and Euler updates, no host sync."""

    def __init__(
        self, model: S2VTransformer, start: StreamStart, first: int, count: int, steps: int
    ) -> None:
        dev = start.ref_BC1HW.device
        timesteps, sigmas = euler_sigmas(steps, start.shift)
        timesteps, sigmas = timesteps.to(dev), sigmas.to(dev)
        self.model, self.ref_distance = model, start.ref_distance
        self.t = [timesteps[i : i + 1] for i in range(first, first + count)]
        self.dsigma = [sigmas[i + 1] - sigmas[i] for i in range(first, first + count)]
        B, _, _, H, W = start.ref_BC1HW.shape
        self.cache: S2VCache = model.new_cache(B, (H, W), count, dev, start.dtype)
        model.prefill(self.cache, start.prompt_BLC, start.ref_BC1HW, start.motion_BCTHW)

    def run(self, x_BCTHW: Tensor, audio: AudioTokens) -> Tensor:
        x = x_BCTHW
        # this rank's cache holds its steps alone: its buffer j is the stream's step first + j
        for j, (t, dsigma) in enumerate(zip(self.t, self.dsigma, strict=True)):
            flow = self.model.forward_block(x, t, audio, self.cache, j, None, self.ref_distance)
            # diffusers' Euler step in fp32, back in the model's dtype (as LiveAvatarStream)
            x = (x.float() + dsigma * flow.float()).to(x.dtype)
        self.cache.advance()
        return x


# -- the collector: the final latents, in block order ----------------------------------------


class Collector:
    """Receives the last step's latents from rank `src`, in order; hands each to
    `on_latents(block, latents)`, or keeps it when there is none."""

    def __init__(
        self, wire: Wire, src: int, on_latents: Callable[[int, Tensor], None] | None
    ) -> None:
        self.wire, self.src, self.on_latents = wire, src, on_latents
        self.pending: deque[tuple[Works, list[Tensor]]] = deque()
        self.kept: list[Tensor] = []
        self.ended = False

    def post(self) -> None:
        parts = self.wire.empty(audio=False)
        self.pending.append((post_recv(parts, self.src), parts))

    def deliver(self, keep: int | None) -> None:
        """Hand over the messages that have arrived, in order, waiting for the oldest while
        more than `keep` are pending (None: until END). Arrival is polled with
        `is_completed`, which NCCL answers; gloo's receives complete only when waited."""
        while self.pending and not self.ended:
            works, (header, x) = self.pending[0]
            must = keep is None or len(self.pending) > keep
            if not must and not all(w.is_completed() for w in works):
                return
            wait_all(works)
            self.pending.popleft()
            index = int(header.item())
            if index == END:
                self.ended = True
            elif self.on_latents is not None:
                self.on_latents(index, x)
            else:
                self.kept.append(x)

    def run(self) -> None:
        """The decode rank's loop. No receive is posted ahead (one past END would never be
        matched); the last step rank's send waits for it at most until its next block is
        done, so a decode shorter than a forward costs the line nothing."""
        while not self.ended:
            self.post()
            self.deliver(keep=None)


def _first_step(
    stage: StepStage,
    layout: StepLayout,
    wire: Wire,
    start: StreamStart,
    blocks: Iterable[Tensor],
    collector: Collector | None,
) -> None:
    """Rank 0: per block, the audio tokens, fresh noise, step 0; then on to rank 1."""
    gen = torch.Generator(device=wire.device).manual_seed(start.seed)
    dst, audio_on = layout.next_rank(0), layout.sends_audio(0)
    sent: Works = []
    try:
        for b, feats_BSAF in enumerate(blocks):
            audio = stage.model.encode_audio(feats_BSAF)
            noise = torch.randn(wire.latents, generator=gen, dtype=wire.dtype, device=wire.device)
            x = stage.run(noise, audio)
            wait_all(sent)  # the previous block's send has read its buffers
            parts = [wire.header(b), x]
            sent = post_send(
                parts + [audio.global_BTD, audio.local_BTMD] if audio_on else parts, dst
            )
            if collector is not None:
                collector.post()
                # block b - S's final latents were due while block b was computed: wait
                # for them past that (bounded buffers); take any that came earlier
                collector.deliver(keep=layout.ranks)
    finally:  # END also when the blocks failed: every rank leaves its loop
        wait_all(sent)
        wait_all(post_send(wire.empty(audio=audio_on), dst))
        if collector is not None:
            collector.post()
            collector.deliver(keep=None)


def _later_step(stage: StepStage, layout: StepLayout, wire: Wire, rank: int) -> None:
    """Step ranks after the first: receive a block, run this rank's steps, pass it on;
    block b+1 is received while block b is computed."""
    last = not layout.sends_audio(rank)
    dst = layout.next_rank(rank)
    bufs = [wire.empty(audio=True) for _ in range(2)]
    pending = post_recv(bufs[0], rank - 1)
    sent: Works = []
    i = 0
    while True:
        wait_all(pending)
        header, x, glob, local = bufs[i % 2]
        wait_all(sent)  # it read bufs[(i + 1) % 2], which the next receive refills
        if int(header.item()) == END:  # the one host sync per block: go on or stop
            wait_all(post_send([header, x] if last else bufs[i % 2], dst))
            return
        pending = post_recv(bufs[(i + 1) % 2], rank - 1)
        x = stage.run(x, AudioTokens(glob, local))
        sent = post_send([header, x] if last else [header, x, glob, local], dst)
        i += 1


def run_step_pipeline(
    rank: int,
    layout: StepLayout,
    cfg: S2VConfig,
    model_factory: Callable[[], S2VTransformer],
    start: StreamStart,
    blocks: Iterable[Tensor] = (),
    on_latents: Callable[[int, Tensor], None] | None = None,
) -> list[Tensor]:
    """Run one stream on this rank of `layout` (the default process group, rank = global
    rank, world = `layout.world`); every rank calls it and returns when the stream ends.

    `model_factory` builds the transformer, weights loaded (called on step ranks only);
    `start` is the same on every rank (`share_start`); `blocks` (read on rank 0 only) yields
    each block's wav2vec2 features (B, S, A, 4 * frames_per_block) and ends the stream when
    it stops. On the collector (`layout.collector`), `on_latents(block, latents_BCTHW)` gets
    each block's final latents in order; without it they are returned, else []."""
    if dist.get_world_size() != layout.world:
        raise ValueError(
            f"{layout.ranks} step ranks{' and a decode rank' if layout.decode_rank else ''} "
            f"need {layout.world} processes, the group has {dist.get_world_size()}"
        )
    wire = Wire.of(cfg, start)
    model = model_factory() if rank < layout.ranks else None
    if model is not None and model.cfg != cfg:
        raise ValueError(f"model_factory built a transformer of {model.cfg}, not of {cfg}")
    with torch.inference_mode():
        collector = None
        if rank == layout.collector:
            collector = Collector(wire, layout.ranks - 1, on_latents)
        if model is not None:
            per = layout.steps_per_rank
            stage = StepStage(model, start, rank * per, per, layout.steps)
            if rank == 0:
                _first_step(stage, layout, wire, start, blocks, collector)
            else:
                _later_step(stage, layout, wire, rank)
        elif collector is not None:
            collector.run()
    return collector.kept if collector is not None else []
