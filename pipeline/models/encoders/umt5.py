"""The prompt encoder of the Wan 2.x models: umT5-XXL's encoder, from Wan's own checkpoint.

Wan publishes the encoder as `models_t5_umt5-xxl-enc-bf16.pth`, a state dict in the layout
of its own T5 code (`blocks.N.attn.q.weight`, …), and the tokenizer as a transformers
folder (`google/umt5-xxl/`). The network here is transformers' `UMT5EncoderModel`, its
weights moved over by one table (`WAN_TO_HF`); the sizes are read off the tensors, so a
tiny random checkpoint loads the same way as the 5.7 B-parameter one.

`PromptEncoder.encode` returns what Wan's `T5EncoderModel` returns: each prompt cleaned as
Wan cleans it (ftfy, HTML entities, runs of white space), tokenised with `</s>`, padded or
cut to `text_len` (512), encoded with padding masked out, and cut back to its own length:
a list of [tokens, 4096] tensors.

Shapes: B prompts, L = text_len tokens, D the model width.
"""

from __future__ import annotations

import html
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from pipeline.checkpoints import read_state_dict
from pipeline.errors import CheckpointError
from pipeline.models.encoders.pretrained import load_files

if TYPE_CHECKING:  # transformers is imported where it is used: it is slow to import
    from transformers import UMT5Config, UMT5EncoderModel

TEXT_LEN = 512  # Wan's shared config: every prompt is padded or cut to this many tokens
MAX_DISTANCE = 128  # Wan's T5RelativeEmbedding: relative positions past this share a bucket

# Wan's names (per block N) → transformers' UMT5EncoderModel names
_BLOCK = {
    "norm1.weight": "layer.0.layer_norm.weight",
    "attn.q.weight": "layer.0.SelfAttention.q.weight",
    "attn.k.weight": "layer.0.SelfAttention.k.weight",
    "attn.v.weight": "layer.0.SelfAttention.v.weight",
    "attn.o.weight": "layer.0.SelfAttention.o.weight",
    "pos_embedding.embedding.weight": "layer.0.SelfAttention.relative_attention_bias.weight",
    "norm2.weight": "layer.1.layer_norm.weight",
    "ffn.gate.0.weight": "layer.1.DenseReluDense.wi_0.weight",  # the GELU branch
    "ffn.fc1.weight": "layer.1.DenseReluDense.wi_1.weight",  # the linear branch
    "ffn.fc2.weight": "layer.1.DenseReluDense.wo.weight",
}
_GLOBAL = {
    "token_embedding.weight": "shared.weight",
    "norm.weight": "encoder.final_layer_norm.weight",
}
_BLOCK_KEY = re.compile(r"blocks\.(\d+)\.(.+)")


def wan_to_hf(name: str) -> str | None:
    """transformers' name for one of Wan's umT5 encoder keys (None: not one of them)."""
    if name in _GLOBAL:
        return _GLOBAL[name]
    m = _BLOCK_KEY.fullmatch(name)
    if m and m.group(2) in _BLOCK:
        return f"encoder.block.{m.group(1)}.{_BLOCK[m.group(2)]}"
    return None


@dataclass(frozen=True)
class UMT5Shape:
    """umT5's sizes in Wan's terms (`umt5_xxl`: 256384, 4096, 4096, 10240, 64, 24, 32)."""

    vocab: int = 256384
    dim: int = 4096
    dim_attn: int = 4096
    dim_ffn: int = 10240
    num_heads: int = 64
    num_layers: int = 24
    num_buckets: int = 32

    def hf_config(self) -> UMT5Config:
        from transformers import UMT5Config

        return UMT5Config(
            vocab_size=self.vocab,
            d_model=self.dim,
            d_kv=self.dim_attn // self.num_heads,
            d_ff=self.dim_ffn,
            num_layers=self.num_layers,
            num_heads=self.num_heads,
            relative_attention_num_buckets=self.num_buckets,
            relative_attention_max_distance=MAX_DISTANCE,
            feed_forward_proj="gated-gelu",  # GELU (tanh form) on wi_0, times wi_1: Wan's ffn
            dropout_rate=0.0,
            layer_norm_epsilon=1e-6,
            is_encoder_decoder=False,
            use_cache=False,
        )

    def wan_shapes(self) -> dict[str, tuple[int, ...]]:
        """Every tensor of Wan's encoder checkpoint at this size, by its name."""
        d, a, f = self.dim, self.dim_attn, self.dim_ffn
        shapes: dict[str, tuple[int, ...]] = {
            "token_embedding.weight": (self.vocab, d),
            "norm.weight": (d,),
        }
        per_block = {
            "norm1.weight": (d,),
            "attn.q.weight": (a, d),
            "attn.k.weight": (a, d),
            "attn.v.weight": (a, d),
            "attn.o.weight": (d, a),
            "pos_embedding.embedding.weight": (self.num_buckets, self.num_heads),
            "norm2.weight": (d,),
            "ffn.gate.0.weight": (f, d),
            "ffn.fc1.weight": (f, d),
            "ffn.fc2.weight": (d, f),
        }
        for i in range(self.num_layers):
            shapes.update({f"blocks.{i}.{k}": v for k, v in per_block.items()})
        return shapes


def shape_of(state: dict[str, Tensor], source: Path) -> UMT5Shape:
    """The encoder's sizes read off its tensors (the checkpoint carries no config)."""
    try:
        vocab, dim = state["token_embedding.weight"].shape
        dim_attn = state["blocks.0.attn.q.weight"].shape[0]
        dim_ffn = state["blocks.0.ffn.fc1.weight"].shape[0]
        buckets, heads = state["blocks.0.pos_embedding.embedding.weight"].shape
    except KeyError as exc:
        raise CheckpointError(
            f"{source}: missing key {exc.args[0]!r}: not Wan's umT5 encoder checkpoint"
        ) from None
    except ValueError:
        raise CheckpointError(f"{source}: mis-shaped embeddings: not Wan's umT5 encoder") from None
    layers = 1 + max((int(m.group(1)) for k in state if (m := _BLOCK_KEY.fullmatch(k))), default=-1)
    if dim_attn % heads:
        raise CheckpointError(
            f"{source}: attention width {dim_attn} does not split into {heads} heads"
        )
    return UMT5Shape(vocab, dim, dim_attn, dim_ffn, heads, layers, buckets)


def load_umt5(
    path: Path, dtype: torch.dtype = torch.bfloat16, device: torch.device | str = "cpu"
) -> UMT5EncoderModel:
    """transformers' UMT5EncoderModel holding Wan's encoder checkpoint, on `device`, strictly:
    a missing, left-over or mis-shaped key is an error naming the file and Wan's key."""
    from transformers import UMT5EncoderModel

    state = read_state_dict(path)
    shape = shape_of(state, path)
    config = shape.hf_config()
    # eager attention: the position bias and the padding mask are added to the scores and the
    # softmax is taken in float, as in Wan's own T5 code
    config._attn_implementation = "eager"
    # built on the meta device and given the checkpoint's own tensors (assign=True): nothing
    # is allocated twice (XXL is 11 GB in bf16, 23 GB if first built in float32)
    with torch.device("meta"):
        model = UMT5EncoderModel(config)
    wanted = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    loaded: dict[str, Tensor] = {}
    for name, tensor in state.items():
        hf = wan_to_hf(name)
        if hf is None or hf not in wanted:
            raise CheckpointError(f"{path}: key {name!r} does not map onto umT5's encoder")
        if tuple(tensor.shape) != wanted[hf]:
            raise CheckpointError(
                f"{path}: {name!r} has shape {tuple(tensor.shape)}, the model expects {wanted[hf]}"
            )
        if not tensor.is_floating_point():
            raise CheckpointError(f"{path}: {name!r} is {tensor.dtype}, not floating point")
        loaded[hf] = tensor
    missing = sorted(set(wanted) - set(loaded) - {"encoder.embed_tokens.weight"})
    if missing:
        back = {wan_to_hf(k): k for k in shape.wan_shapes()}
        raise CheckpointError(f"{path}: missing key {back.get(missing[0], missing[0])!r}")
    loaded["encoder.embed_tokens.weight"] = loaded["shared.weight"]  # tied: one embedding
    model.load_state_dict(loaded, strict=True, assign=True)
    model.tie_weights()
    module: torch.nn.Module = model  # transformers' typed `to` wrapper hides nn.Module.to
    module.to(device=device, dtype=dtype).eval().requires_grad_(False)
    return model


def clean_prompt(text: str) -> str:
    """Wan's `clean='whitespace'`: ftfy's repairs, HTML entities (twice), then every run of
    white space one space, the ends stripped."""
    import ftfy
    import regex  # the `regex` module's \\s (Unicode White_Space), as Wan's

    text = html.unescape(html.unescape(ftfy.fix_text(text))).strip()
    return regex.sub(r"\s+", " ", text).strip()


class PromptEncoder:
    """Wan's umT5 checkpoint and tokenizer folder, loaded once; `encode` maps prompts to
    their token features."""

    def __init__(
        self,
        checkpoint: str | Path,
        tokenizer: str | Path,
        device: torch.device | str = "cpu",
        dtype: torch.dtype = torch.bfloat16,
        text_len: int = TEXT_LEN,
    ) -> None:
        from transformers import AutoTokenizer

        folder = Path(tokenizer)
        if not (folder / "tokenizer_config.json").is_file():
            raise CheckpointError(
                f"{folder / 'tokenizer_config.json'}: file not found (the umT5 tokenizer folder)"
            )
        self.tokenizer = load_files(AutoTokenizer, folder, "the umT5 tokenizer")
        self.model = load_umt5(Path(checkpoint), dtype, device)
        if len(self.tokenizer) > self.model.config.vocab_size:
            raise CheckpointError(
                f"{folder}: {len(self.tokenizer)} tokens, more than the encoder's "
                f"{self.model.config.vocab_size} embeddings in {checkpoint}"
            )
        self.device = torch.device(device)
        self.text_len = text_len

    def to(self, device: torch.device | str) -> PromptEncoder:
        """Move the encoder (umT5-XXL is 11 GB in bf16: it visits the GPU for a new prompt
        and waits in host memory otherwise)."""
        module: torch.nn.Module = self.model
        module.to(device)
        self.device = torch.device(device)
        return self

    def tokenize(self, prompts: list[str]) -> tuple[Tensor, Tensor]:
        """(ids_BL, mask_BL): cleaned, `</s>` appended, padded or cut to `text_len`."""
        batch = self.tokenizer(
            [clean_prompt(p) for p in prompts],
            padding="max_length",
            truncation=True,
            max_length=self.text_len,
            add_special_tokens=True,
            return_tensors="pt",
        )
        return batch.input_ids, batch.attention_mask

    @torch.inference_mode()
    def encode(self, prompts: list[str]) -> list[Tensor]:
        """One [tokens, D] tensor a prompt (the model's dtype): its own tokens, padding cut."""
        ids_BL, mask_BL = self.tokenize(prompts)
        ids_BL, mask_BL = ids_BL.to(self.device), mask_BL.to(self.device)
        out_BLD = self.model(input_ids=ids_BL, attention_mask=mask_BL).last_hidden_state
        lengths = mask_BL.gt(0).sum(dim=1).tolist()
        return [out_LD[:n] for out_LD, n in zip(out_BLD, lengths, strict=True)]


def random_wan_state(
    shape: UMT5Shape, seed: int, dtype: torch.dtype = torch.float32
) -> dict[str, Tensor]:
    """A Wan-layout encoder checkpoint of random weights, the same for a seed on every
    machine (drawn on the CPU in name order): matrices ~ N(0, 1/fan_in), embeddings ~ N(0, 1)
    (T5 does not scale them), relative position biases ~ N(0, 1), norm gains ~ 1 + N(0, 0.1²);
    each cast to `dtype` as drawn (the published file is bfloat16: 11 GB, not 23)."""
    gen = torch.Generator().manual_seed(seed)
    state: dict[str, Tensor] = {}
    for name, s in sorted(shape.wan_shapes().items()):
        noise = torch.randn(s, generator=gen)
        if len(s) == 1:
            noise = 1.0 + 0.1 * noise
        elif "embedding" not in name:
            noise = noise / math.sqrt(s[1])
        state[name] = noise.to(dtype)
    return state


def write_tokenizer(folder: Path, words: list[str] | None = None) -> Path:
    """A tiny umT5-style tokenizer folder (SentencePiece unigram in `tokenizer.json`: `<pad>`
    0, `</s>` 1, `<unk>` 2, then single characters and whole `words`), for tests and random
    releases: the real one is 4 MB of a 256k vocabulary."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    chars = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.,;:!?'\"-()&éü"
    words = words or ["the", "a", "man", "woman", "talking", "speaks", "smiles", "camera", "light"]
    pieces = [("<pad>", 0.0), ("</s>", 0.0), ("<unk>", 0.0), ("▁", -2.0)]
    pieces += [(f"▁{w}", -1.0) for w in words] + [(c, -3.0) for c in chars]
    pieces += [(f"▁{c}", -3.5) for c in chars]
    tok = Tokenizer(models.Unigram(pieces, unk_id=2, byte_fallback=False))
    tok.normalizer = normalizers.Sequence([normalizers.NFKC(), normalizers.Replace(" +", " ")])
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always")
    tok.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="always")
    tok.post_processor = processors.TemplateProcessing(
        single="$A </s>", pair="$A </s> $B </s>", special_tokens=[("</s>", 1)]
    )
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="<pad>", eos_token="</s>", unk_token="<unk>"
    )
    fast.save_pretrained(str(folder))
    return folder
