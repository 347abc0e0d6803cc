"""Speech features as Wan2.2-S2V (and LiveAvatar on it) reads them, from wav2vec2-large-xlsr-53.

The release carries `wav2vec2-large-xlsr-53-english/` (a transformers `Wav2Vec2ForCTC`
folder); the network is the `Wav2Vec2Model` inside it, the CTC head unused. What S2V adds
is which states it keeps and its timing, unlike FlashHead's (`pipeline.models.encoders.wav2vec2`):

1. the whole clip is normalised (the feature extractor) and run through the model at its
   own 50 states a second;
2. every hidden state is kept, stacked: the transformer's input and each layer's output,
   the last one through the encoder's final layer norm: 25 x 1024 a step for the large
   model (`hidden_states`). These are the states transformers 4 returns with
   `output_hidden_states=True`, which the authors stack; transformers 5 returns the last
   layer's output without that norm, so they are read here by hooks, the same in both;
3. linearly resampled to 30 a second (`align_corners=True`; the authors' `video_rate`),
   then picked for each 25 fps video frame at the nearest 30 fps step (`to_video_frames`),
   zeros past the audio's end, in buckets of whole clips (`bucket`).

The authors encode a whole clip at once (normalised as a whole, attention over all of it);
a stream that encodes windows gets different features near a window's edges: how wide a
window the engine keeps is its choice, not made here.

Shapes: L hidden states (layers + 1), T steps, W the model width, F video frames.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from pipeline.clock import FPS, MODEL_RATE
from pipeline.errors import CheckpointError
from pipeline.graphs import ShapeGraphs
from pipeline.models.encoders.pretrained import load_files, load_model
from pipeline.models.encoders.wav2vec2 import write_feature_extractor
from pipeline.transfer import to_device

STATES_PER_SECOND = 50  # wav2vec2's convolutions: one state per 20 ms at 16 kHz
FEATURE_RATE = 30  # the authors' AudioEncoder.video_rate: the grid the states are resampled to

# jonatasgrosman/wav2vec2-large-xlsr-53-english's config.json (the shape the release ships),
# as transformers.Wav2Vec2Config keyword arguments
XLSR53_LARGE = dict(
    hidden_size=1024,
    num_hidden_layers=24,
    num_attention_heads=16,
    intermediate_size=4096,
    conv_dim=(512,) * 7,
    conv_bias=True,
    num_conv_pos_embeddings=128,
    num_conv_pos_embedding_groups=16,
    do_stable_layer_norm=True,
    feat_extract_norm="layer",
    layer_norm_eps=1e-5,
    vocab_size=33,
)


class S2VSpeechFeatures:
    """The release's wav2vec2 folder, loaded once; `frames()` maps a clip to per-frame
    features, `hidden_states()` is step 2 alone."""

    def __init__(
        self,
        folder: str | Path,
        device: torch.device | str = "cpu",
        dtype: torch.dtype = torch.float32,
        graphs: bool = False,
    ) -> None:
        """`graphs`: on a GPU, the network runs from a CUDA graph (`pipeline.graphs`:
        eager's numbers up to reassociation, its launches at once; the window is the same
        length every block)."""
        from transformers import Wav2Vec2FeatureExtractor, Wav2Vec2ForCTC

        folder = Path(folder)
        for name in ("config.json", "preprocessor_config.json"):
            if not (folder / name).is_file():
                raise CheckpointError(
                    f"{folder / name}: file not found (the release's "
                    "wav2vec2-large-xlsr-53-english/ folder)"
                )
        # the release's Wav2Vec2ForCTC, read whole (strict); its CTC head is unused
        ctc = load_model(Wav2Vec2ForCTC, folder, "a wav2vec2 CTC model")
        self.model = ctc.wav2vec2
        self.extractor = load_files(
            Wav2Vec2FeatureExtractor, folder, "a wav2vec2 feature extractor"
        )
        module: torch.nn.Module = self.model  # transformers' typed `to` hides nn.Module.to
        module.to(device=device, dtype=dtype).eval().requires_grad_(False)
        self.device, self.dtype = torch.device(device), dtype
        self.num_states = self.model.config.num_hidden_layers + 1
        self.width = self.model.config.hidden_size
        self._states: Callable[[Tensor], Tensor] = (
            ShapeGraphs(self._all_states, "wav2vec2-large") if graphs else self._all_states
        )

    def graphs_captured(self) -> int:
        """Input shapes the network runs from a CUDA graph (0: eager)."""
        return self._states.captured if isinstance(self._states, ShapeGraphs) else 0

    @torch.inference_mode()
    def hidden_states(self, audio: np.ndarray) -> Tensor:
        """float32 mono audio at MODEL_RATE → (L, T, W) float32 at 50 steps a second."""
        values = self.extractor(audio, sampling_rate=MODEL_RATE).input_values[0]
        # staged through pinned memory: no wait here for the GPU's queued work
        x = to_device(torch.from_numpy(np.asarray(values, np.float32)), self.device, self.dtype)
        return self._states(x[None])

    def _all_states(self, x: Tensor) -> Tensor:
        """Normalised audio (1, samples) → (L, T, W) float32: the network alone, nothing
        read back to the host."""
        layers = self.model.encoder.layers
        states: list[Tensor] = []

        def keep_input(_module, args) -> None:
            states.append(args[0])

        def keep_output(_module, _args, output) -> None:
            states.append(output[0] if isinstance(output, tuple) else output)

        hooks = [layers[0].register_forward_pre_hook(keep_input)]
        hooks += [layer.register_forward_hook(keep_output) for layer in layers[:-1]]
        try:
            last = self.model(x).last_hidden_state  # the last layer, through the final norm
        finally:
            for hook in hooks:
                hook.remove()
        return torch.cat([*states, last]).float()

    def frames(self, audio: np.ndarray, fps: int = FPS) -> Tensor:
        """(F, L, W): one feature per video frame of the clip (F = its frames, rounded down
        on the 30 fps grid, then as many 25 fps frames as fit before the grid's end)."""
        z_LTW = to_feature_rate(self.hidden_states(audio))
        return to_video_frames(z_LTW, fps, num_frames=(z_LTW.shape[1] * fps) // FEATURE_RATE)


def to_feature_rate(states_LTW: Tensor, num_steps: int | None = None) -> Tensor:
    """50 states a second → 30 (the authors' `linear_interpolation`: linear, corners aligned;
    the length rounded down unless given)."""
    if num_steps is None:
        num_steps = int(states_LTW.shape[1] / STATES_PER_SECOND * FEATURE_RATE)
    z_LWT = F.interpolate(
        states_LTW.transpose(1, 2), size=num_steps, mode="linear", align_corners=True
    )
    return z_LWT.transpose(1, 2)


def frame_steps(num_frames: int, fps: int = FPS) -> Tensor:
    """The 30 fps step each video frame reads: round(k / fps · 30). Exact integer rounding,
    half up; the authors round a float (half to even), the same wherever no frame falls
    exactly half-way, which at 25 fps none does (k · 6/5 is never n + 1/2)."""
    k = torch.arange(num_frames)
    return (2 * k * FEATURE_RATE + fps) // (2 * fps)


def to_video_frames(z_LTW: Tensor, fps: int, num_frames: int) -> Tensor:
    """(F, L, W): frame k takes the 30 fps step nearest k / fps seconds; zeros for frames
    past the audio (the authors' `get_audio_embed_bucket_fps` with m = 0)."""
    steps = frame_steps(num_frames, fps)
    inside = steps < z_LTW.shape[1]
    out_FLW = z_LTW.new_zeros(num_frames, z_LTW.shape[0], z_LTW.shape[2])
    out_FLW[inside] = z_LTW[:, steps[inside]].transpose(0, 1)
    return out_FLW


def bucket(z_LTW: Tensor, clip_frames: int, fps: int = FPS) -> tuple[Tensor, int]:
    """What the authors' `encode_audio` hands the transformer: (audio_1LWF, clips), the
    frames of `clips` whole clips of `clip_frames` (one more than the audio fills), as
    (1, L, W, F)."""
    scale = FEATURE_RATE / fps  # the authors' float arithmetic, for the same count at edges
    clips = int(z_LTW.shape[1] / (clip_frames * scale)) + 1
    frames_FLW = to_video_frames(z_LTW, fps, clips * clip_frames)
    return frames_FLW.permute(1, 2, 0)[None], clips


def write_random_wav2vec2(folder: Path, config_kwargs: dict, seed: int) -> Path:
    """A `Wav2Vec2ForCTC` folder of random weights laid out as the release's
    `wav2vec2-large-xlsr-53-english/` (weights, config, feature extractor, CTC vocabulary),
    for tests and benchmarks: `config_kwargs` is `XLSR53_LARGE` or a shrunk copy."""
    from transformers import Wav2Vec2Config, Wav2Vec2CTCTokenizer, Wav2Vec2ForCTC

    from pipeline.random_weights import randomise_module

    folder.mkdir(parents=True, exist_ok=True)
    config = Wav2Vec2Config(**{**XLSR53_LARGE, **config_kwargs})
    model = Wav2Vec2ForCTC(config)
    randomise_module(model, seed)
    model.save_pretrained(str(folder))
    write_feature_extractor(folder, attention_mask=True)
    letters = ["<pad>", "<s>", "</s>", "<unk>", "|", "'", *"abcdefghijklmnopqrstuvwxyz"]
    vocab = {c: i for i, c in enumerate(letters[: config.vocab_size])}
    (folder / "vocab.json").write_text(json.dumps(vocab))
    Wav2Vec2CTCTokenizer(str(folder / "vocab.json")).save_pretrained(str(folder))
    return folder
