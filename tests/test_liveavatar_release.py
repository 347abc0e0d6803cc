"""LiveAvatar's published files (Wan2.2-S2V-14B + the Live-Avatar LoRA): the LoRA merge
against PEFT's own, the prompt and speech encoders against the authors' code (fixtures of
their outputs at tiny shapes, `bench/parity/`), and every loader error as one line naming
the file. Tiny shapes only: seconds on a CPU.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from torch import nn

from pipeline.errors import CheckpointError
from pipeline.lora import merge_lora, random_lora, read_lora

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures" / "liveavatar"
TARGETS = ["q", "k", "v", "o", "ffn.0", "ffn.2"]  # LiveAvatar's lora_target_modules


class TinyBlock(nn.Module):
    """The names PEFT's targets match in a Wan block, at toy sizes."""

    def __init__(self, dim: int = 8, ffn: int = 12) -> None:
        super().__init__()
        self.self_attn = nn.ModuleDict({m: nn.Linear(dim, dim) for m in "qkvo"})
        self.cross_attn = nn.ModuleDict({m: nn.Linear(dim, dim) for m in "qkvo"})
        self.ffn = nn.Sequential(nn.Linear(dim, ffn), nn.GELU(), nn.Linear(ffn, dim))
        self.norm3 = nn.LayerNorm(dim)


class Tiny(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList([TinyBlock(), TinyBlock()])
        self.head = nn.Linear(8, 4)


def tiny_state(seed: int) -> dict[str, torch.Tensor]:
    torch.manual_seed(seed)
    return {k: torch.randn_like(v) for k, v in Tiny().state_dict().items()}


def lora_shapes(state: dict[str, torch.Tensor]) -> dict[str, tuple[int, ...]]:
    ends = tuple(f".{t}.weight" for t in TARGETS)
    return {k: tuple(v.shape) for k, v in state.items() if k.endswith(ends)}


def write(tensors: dict[str, torch.Tensor], path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(path))
    return path


# -- the LoRA merge -------------------------------------------------------------------------


@pytest.mark.parametrize("layout", ["peft-model", "save-pretrained"])
def test_the_lora_merge_equals_pefts_merge_and_unload(tmp_path, layout):
    peft = pytest.importorskip("peft")
    base = tiny_state(0)
    rank, alpha = 4, 2.0  # LiveAvatar: 128 and 64, the same ratio
    lora = random_lora(lora_shapes(base), rank, seed=1, std=0.5)
    whole = {"base_model.model.blocks.1.norm3.weight": torch.full((8,), 1.5)}  # not LoRA
    # the authors' load: get_peft_model, load_state_dict(strict=False), merge_and_unload
    model = Tiny()
    model.load_state_dict(base)
    config = peft.LoraConfig(r=rank, lora_alpha=alpha, target_modules=TARGETS)
    wrapped = peft.get_peft_model(model, config)
    missing, unexpected = wrapped.load_state_dict(
        {**lora, "base_model.model.blocks.1.norm3.weight": whole[next(iter(whole))]},
        strict=False,
    )
    assert not unexpected
    theirs = wrapped.merge_and_unload().state_dict()

    if layout == "save-pretrained":  # no prefix, no adapter name: the same file otherwise
        lora = {k.removeprefix("base_model.model.").replace(".default", ""): v
                for k, v in lora.items()}  # fmt: skip
        whole = {"blocks.1.norm3.weight": whole[next(iter(whole))]}
    path = write({**lora, **whole}, tmp_path / "liveavatar.safetensors")
    ours = merge_lora(dict(base), read_lora(path), alpha=alpha)
    assert set(ours) == set(theirs)
    for name in theirs:
        torch.testing.assert_close(ours[name], theirs[name], atol=1e-6, rtol=1e-6, msg=name)
    assert not torch.equal(ours["blocks.0.ffn.2.weight"], base["blocks.0.ffn.2.weight"])
    assert torch.equal(ours["head.weight"], base["head.weight"])  # not a target: untouched


def test_alpha_comes_from_an_adapter_config_beside_the_file(tmp_path):
    base = tiny_state(0)
    lora = random_lora(lora_shapes(base), 4, seed=1)
    path = write(lora, tmp_path / "lora.safetensors")
    with pytest.raises(CheckpointError, match="no LoRA alpha") as err:
        merge_lora(dict(base), read_lora(path))
    assert str(path) in str(err.value)
    explicit = merge_lora(dict(base), read_lora(path), alpha=2.0)
    (tmp_path / "adapter_config.json").write_text(json.dumps({"lora_alpha": 2, "r": 4}))
    from_config = merge_lora(dict(base), read_lora(path))
    for name in base:
        assert torch.equal(explicit[name], from_config[name])


def test_a_bfloat16_merge_is_computed_in_float32_and_rounded_once(tmp_path):
    base = {k: v.bfloat16() for k, v in tiny_state(0).items()}
    lora = random_lora(lora_shapes(base), 4, seed=1, std=0.3)
    merged = merge_lora(dict(base), read_lora(write(lora, tmp_path / "l.safetensors")), 2.0)
    name = "blocks.0.self_attn.q.weight"
    a = lora[f"base_model.model.{name[:-7]}.lora_A.default.weight"]
    b = lora[f"base_model.model.{name[:-7]}.lora_B.default.weight"]
    exact = base[name].float() + 0.5 * b @ a
    assert merged[name].dtype == torch.bfloat16
    assert torch.equal(merged[name], exact.bfloat16())


# -- the prompt encoder --------------------------------------------------------------------


def test_the_prompt_encoder_reproduces_wans_t5_encoder(tmp_path):
    """`fixtures/liveavatar/umt5_tiny.safetensors`: the authors' T5EncoderModel on random
    weights (`bench/parity/umt5_reference.py`); its weights and tokenizer re-made here."""
    pytest.importorskip("ftfy")
    from safetensors import safe_open

    from pipeline.models.umt5 import PromptEncoder, UMT5Shape, random_wan_state, write_tokenizer

    fixture = FIXTURES / "umt5_tiny.safetensors"
    with safe_open(str(fixture), "pt") as f:
        meta = json.loads(f.metadata()["meta"])
    ref = load_file(str(fixture))
    torch.save(random_wan_state(UMT5Shape(**meta["shape"]), meta["seed"]), tmp_path / "t5.pth")
    tokenizer = write_tokenizer(tmp_path / "umt5-xxl")
    encoder = PromptEncoder(tmp_path / "t5.pth", tokenizer, dtype=torch.float32,
                            text_len=meta["text_len"])  # fmt: skip
    prompts = meta["prompts"]
    ids, _ = encoder.tokenize(prompts)
    outs = encoder.encode(prompts)
    for i in range(len(prompts)):
        assert torch.equal(ids[i], ref[f"ids.{i}"]), prompts[i]
        assert outs[i].shape == ref[f"out.{i}"].shape
        torch.testing.assert_close(outs[i], ref[f"out.{i}"], atol=1e-5, rtol=1e-5)
    assert outs[-1].shape[0] == meta["text_len"]  # the long prompt: cut to text_len


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda s: s.pop("blocks.1.ffn.fc2.weight"), "missing key 'blocks.1.ffn.fc2.weight'"),
        (lambda s: s.update(stray=torch.zeros(2)), "key 'stray' does not map"),
        (lambda s: s.update({"blocks.0.attn.q.weight": torch.zeros(32, 31)}), "has shape"),
    ],
)
def test_a_t5_checkpoint_that_does_not_fit_names_the_file_and_key(tmp_path, edit, message):
    from pipeline.models.umt5 import UMT5Shape, load_umt5, random_wan_state

    state = random_wan_state(UMT5Shape(vocab=64, dim=32, dim_attn=32, dim_ffn=48,
                                       num_heads=4, num_layers=2), 0)  # fmt: skip
    edit(state)
    torch.save(state, tmp_path / "models_t5_umt5-xxl-enc-bf16.pth")
    with pytest.raises(CheckpointError, match=message) as err:
        load_umt5(tmp_path / "models_t5_umt5-xxl-enc-bf16.pth")
    assert "models_t5_umt5-xxl-enc-bf16.pth" in str(err.value) and "\n" not in str(err.value)


# -- speech features -----------------------------------------------------------------------


def test_the_speech_features_reproduce_wan_s2vs_audio_encoder(tmp_path):
    """`fixtures/liveavatar/s2v_speech_tiny.safetensors`: the authors' AudioEncoder under
    transformers 4.51 (`bench/parity/s2v_speech_reference.py`) on a random wav2vec2 of the
    large model's structure; the weights and the clip re-made here from the seed."""
    import sys

    from safetensors import safe_open

    from pipeline.models.s2v_speech import (
        S2VSpeechFeatures,
        bucket,
        to_feature_rate,
        write_random_wav2vec2,
    )

    sys.path.insert(0, str(ROOT / "bench" / "parity"))
    from s2v_speech_reference import test_audio

    fixture = FIXTURES / "s2v_speech_tiny.safetensors"
    with safe_open(str(fixture), "pt") as f:
        meta = json.loads(f.metadata()["meta"])
    ref = load_file(str(fixture))
    wav2vec = {k: tuple(v) if isinstance(v, list) else v for k, v in meta["wav2vec"].items()}
    speech = S2VSpeechFeatures(write_random_wav2vec2(tmp_path / "w2v", wav2vec, meta["seed"]))
    audio = test_audio(meta["seed"], meta["seconds"])
    hidden = speech.hidden_states(audio)
    torch.testing.assert_close(hidden, ref["hidden"], atol=1e-5, rtol=1e-5)
    feat30 = to_feature_rate(hidden)
    torch.testing.assert_close(feat30, ref["feat30"], atol=1e-5, rtol=1e-5)
    buckets, clips = bucket(feat30, meta["clip_frames"])
    assert clips == meta["clips"]
    torch.testing.assert_close(buckets, ref["bucket"], atol=1e-5, rtol=1e-5)
    frames = speech.frames(audio)
    assert frames.shape[1:] == (3, 16) and frames.abs().sum(dim=(1, 2)).min() > 0
    torch.testing.assert_close(frames, ref["bucket"][0].permute(2, 0, 1)[: len(frames)])
