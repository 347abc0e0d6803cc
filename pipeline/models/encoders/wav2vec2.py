"""wav2vec2 speech features per video frame, as the Wan-based avatar models read them.

The network and its weights are transformers' (`Wav2Vec2Model` from a local model folder,
e.g. `facebook/wav2vec2-base-960h` as `huggingface-cli download` writes it; nothing is ever
downloaded here). What these models add is the timing: the convolutional features (50 per
second) are linearly resampled to exactly one per video frame before the transformer, and
every transformer layer's output is kept, so a frame's feature is (layers, width).
"""

from __future__ import annotations

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
from pipeline.transfer import to_device

# the tiny wav2vec2 that tests, parity fixtures and random releases build (transformers'
# Wav2Vec2Config keyword arguments, over its defaults or over a release's shape): every
# size shrunk, the structure kept
WAV2VEC2_TINY: dict = dict(
    hidden_size=16,
    num_hidden_layers=2,
    num_attention_heads=2,
    intermediate_size=32,
    conv_dim=(8,) * 7,
    num_conv_pos_embeddings=16,
    num_conv_pos_embedding_groups=2,
)


class SpeechFeatures:
    """A wav2vec2 model folder, loaded once; `frames()` maps audio to per-frame features."""

    def __init__(
        self, folder: str | Path, device: torch.device | str = "cpu", graphs: bool = False
    ) -> None:
        """`graphs`: on a GPU, the network runs from CUDA graphs, one per batch shape
        (`pipeline.graphs`: eager's numbers up to reassociation, its launches at once)."""
        from transformers import Wav2Vec2FeatureExtractor, Wav2Vec2Model

        folder = Path(folder)
        for name in ("config.json", "preprocessor_config.json"):
            if not (folder / name).is_file():
                raise CheckpointError(
                    f"{folder / name}: file not found (--wav2vec wants the folder of "
                    "`huggingface-cli download facebook/wav2vec2-base-960h`)"
                )
        self.model = load_model(Wav2Vec2Model, folder, "a wav2vec2 model")
        self.extractor = load_files(
            Wav2Vec2FeatureExtractor, folder, "a wav2vec2 feature extractor"
        )
        self.model.eval().requires_grad_(False).to(device)
        self.device = torch.device(device)
        self.layers = self.model.config.num_hidden_layers
        self.width = self.model.config.hidden_size
        self._states: Callable[[Tensor, int], Tensor] = (
            ShapeGraphs(self._layer_states, "wav2vec2") if graphs else self._layer_states
        )

    @torch.inference_mode()
    def frames(self, audio: np.ndarray, num_frames: int | None = None) -> Tensor:
        """float32 mono audio at MODEL_RATE → (F, layers, width) float32, one row per video
        frame (F = its duration in frames, rounded down, unless given)."""
        return self.batch_frames([audio], num_frames)[0]

    @torch.inference_mode()
    def batch_frames(self, audios: list[np.ndarray], num_frames: int | None = None) -> Tensor:
        """`frames` of several clips of one length at once (B, F, layers, width): one pass
        of the model for a batch of streams (each row normalised on its own, no padding)."""
        if len({len(a) for a in audios}) != 1:
            raise ValueError("batch_frames takes clips of one length")
        if num_frames is None:
            num_frames = int(len(audios[0]) * FPS / MODEL_RATE)
        values = self.extractor(list(audios), sampling_rate=MODEL_RATE).input_values
        # staged through pinned memory: the host goes on queueing while the GPU finishes
        # the last step's work, instead of waiting for it at this copy
        x = to_device(torch.from_numpy(np.stack(values).astype(np.float32)), self.device)
        return self._states(x, num_frames)

    def _layer_states(self, x: Tensor, num_frames: int) -> Tensor:
        """Normalised audio (B, samples) → every layer's output per frame (B, F, layers,
        width): the network alone, nothing read back to the host."""
        conv_BCt = self.model.feature_extractor(x)
        per_frame_BCF = F.interpolate(conv_BCt, size=num_frames, mode="linear", align_corners=True)
        hidden, _ = self.model.feature_projection(per_frame_BCF.transpose(1, 2))
        # every transformer layer's output, read by hooks: transformers 4 and 5 return
        # hidden states in different ways, a layer's output is the same in both
        layers: list[Tensor] = []

        def keep(_module, _args, output) -> None:
            layers.append(output[0] if isinstance(output, tuple) else output)

        hooks = [layer.register_forward_hook(keep) for layer in self.model.encoder.layers]
        try:
            self.model.encoder(hidden)
        finally:
            for hook in hooks:
                hook.remove()
        return torch.stack(layers, dim=2).float()


def write_feature_extractor(folder: Path, attention_mask: bool) -> None:
    """The feature extractor's config as wav2vec2 releases carry it, for random ones: 16 kHz
    mono, each clip normalised; an attention mask where the release takes one (the large
    XLSR models do, wav2vec2-base does not)."""
    from transformers import Wav2Vec2FeatureExtractor

    Wav2Vec2FeatureExtractor(
        feature_size=1,
        sampling_rate=MODEL_RATE,
        padding_value=0.0,
        do_normalize=True,
        return_attention_mask=attention_mask,
    ).save_pretrained(str(folder))
