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
    import peft

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
    from safetensors import safe_open

    from pipeline.models.encoders.umt5 import (
        PromptEncoder,
        UMT5Shape,
        random_wan_state,
        write_tokenizer,
    )

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
    from pipeline.models.encoders.umt5 import UMT5Shape, load_umt5, random_wan_state

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
    large model's structure; the weights re-made here from the seed, the clip read again."""
    from safetensors import safe_open

    from pipeline.clock import MODEL_RATE
    from pipeline.media import read_audio
    from pipeline.models.encoders.s2v_speech import (
        S2VSpeechFeatures,
        bucket,
        to_feature_rate,
        write_random_wav2vec2,
    )

    fixture = FIXTURES / "s2v_speech_tiny.safetensors"
    with safe_open(str(fixture), "pt") as f:
        meta = json.loads(f.metadata()["meta"])
    ref = load_file(str(fixture))
    wav2vec = {k: tuple(v) if isinstance(v, list) else v for k, v in meta["wav2vec"].items()}
    speech = S2VSpeechFeatures(write_random_wav2vec2(tmp_path / "w2v", wav2vec, meta["seed"]))
    start = int(meta["start"] * MODEL_RATE)
    audio = read_audio(ROOT / meta["speech"])[start : start + int(meta["seconds"] * MODEL_RATE)]
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


# -- the release: layout, preflight, every loader error one line naming the file ----------------

S2V_CONFIG = {  # config.json's fields at a toy size (the real: dim 5120, 40 layers, …)
    "dim": 8, "ffn_dim": 12, "freq_dim": 8, "text_dim": 32, "in_dim": 16, "out_dim": 16,
    "num_heads": 2, "num_layers": 2, "cond_dim": 16, "audio_dim": 16, "num_audio_token": 4,
    "patch_size": [1, 2, 2], "audio_inject_layers": [0, 1], "eps": 1e-6, "qk_norm": True,
    "cross_attn_norm": True, "enable_adain": True, "adain_mode": "attn_norm",
    "enable_framepack": True, "framepack_drop_mode": "padd", "enable_motioner": False,
    "add_last_motion": True, "zero_timestep": True,
}  # fmt: skip


@pytest.fixture(scope="module")
def release(tmp_path_factory):
    """A random release in the published layout: a stand-in transformer state (the model's
    own comes from its file), sharded small so that there are several shards."""
    from pipeline.liveavatar.weights import write_random_release

    state = tiny_state(3)
    root = tmp_path_factory.mktemp("liveavatar")
    paths, lora = write_random_release(root, state, S2V_CONFIG, "test", seed=3,
                                       max_shard_bytes=1200)  # fmt: skip
    return paths, lora, state


def copy_release(release, tmp_path) -> tuple[Path, Path]:
    paths, lora, _ = release
    shutil.copytree(paths.root, tmp_path / "release")
    shutil.copytree(lora.parent, tmp_path / "lora")
    return tmp_path / "release", tmp_path / "lora" / lora.name


def test_a_random_release_reads_back_through_every_loader(release):
    from pipeline.liveavatar.weights import (
        check_release,
        read_merged_state,
        read_transformer_config,
        read_transformer_state,
    )
    from pipeline.models.encoders.s2v_speech import S2VSpeechFeatures
    from pipeline.models.encoders.umt5 import PromptEncoder

    paths, lora, state = release
    shards = sorted(paths.root.glob("diffusion_pytorch_model-*-of-*.safetensors"))
    assert len(shards) > 2 and paths.index.is_file()
    check_release(paths.root, lora.parent)  # the folder `huggingface-cli download` wrote
    read = read_transformer_state(paths.root)
    assert read.keys() == state.keys() and all(torch.equal(read[k], state[k]) for k in state)
    assert read_transformer_config(paths.root) == S2V_CONFIG
    merged = merge_lora(read, read_lora(lora), alpha=2.0)
    again = read_merged_state(paths.root, lora.parent, alpha=2.0)
    assert all(torch.equal(again[k], merged[k]) for k in state)
    assert not torch.equal(
        merged["blocks.1.cross_attn.v.weight"], state["blocks.1.cross_attn.v.weight"]
    )
    (ctx,) = PromptEncoder(paths.t5, paths.tokenizer, dtype=torch.float32).encode(["a man"])
    assert ctx.shape == (3, 32)  # ▁a ▁man </s>
    # 1 s: 49 wav2vec2 steps, 29 at 30 fps, 24 whole 25 fps frames (the authors' rounding)
    speech = S2VSpeechFeatures(paths.wav2vec)
    assert speech.frames(torch.zeros(16000).numpy()).shape == (24, 3, 16)


def one_line(err: pytest.ExceptionInfo, path: Path) -> None:
    assert str(path) in str(err.value), str(err.value)
    assert "\n" not in str(err.value)


def _truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[:-40])  # an interrupted download


def _edit_index(edit):
    def apply(root: Path, _lora: Path) -> Path:
        index = root / "diffusion_pytorch_model.safetensors.index.json"
        raw = json.loads(index.read_text())
        edit(raw)
        index.write_text(json.dumps(raw))
        return index

    return apply


def _drop(name: str):
    def apply(root: Path, _lora: Path) -> Path:
        path = root / name
        path.unlink()
        return path

    return apply


def _damage(name: str):
    def apply(root: Path, _lora: Path) -> Path:
        _truncate(root / name)
        return root / name

    return apply


def _first_shard(root: Path, _lora: Path) -> Path:
    return sorted(root.glob("diffusion_pytorch_model-0000*.safetensors"))[0]


def _drop_shard(root: Path, lora: Path) -> Path:
    shard = _first_shard(root, lora)
    shard.unlink()
    return shard


def _truncate_shard(root: Path, lora: Path) -> Path:
    shard = _first_shard(root, lora)
    _truncate(shard)
    return shard


def _index_lists_a_stray_key(root: Path, lora: Path) -> Path:
    shard = _first_shard(root, lora)
    _edit_index(lambda raw: raw["weight_map"].update(stray=shard.name))(root, lora)
    return shard  # the message names the shard that does not hold what the index says


def _edit_lora(edit):
    def apply(_root: Path, lora: Path) -> Path:
        tensors = load_file(str(lora))
        edit(tensors)
        save_file(tensors, str(lora))
        return lora

    return apply


def _bad_config(root: Path, _lora: Path) -> Path:
    config = root / "config.json"
    raw = json.loads(config.read_text())
    del raw["num_heads"]
    config.write_text(json.dumps(raw))
    return config


B_KEY = "base_model.model.blocks.0.ffn.0.lora_B.default.weight"

PREFLIGHT = {
    "missing t5": (_drop("models_t5_umt5-xxl-enc-bf16.pth"), "not found in the release folder"),
    "truncated t5": (_damage("models_t5_umt5-xxl-enc-bf16.pth"), "truncated or damaged"),
    "truncated vae": (_damage("Wan2.1_VAE.pth"), "truncated or damaged"),
    "missing index": (_drop("diffusion_pytorch_model.safetensors.index.json"), "not found"),
    "index not json": (_edit_index(lambda raw: raw.clear()), "no 'weight_map'"),
    "index lists a stray key": (_index_lists_a_stray_key, "holds other keys than"),
    "missing shard": (_drop_shard, "file not found"),
    "truncated shard": (_truncate_shard, "truncated or damaged"),
    "missing config field": (_bad_config, "no 'num_heads'"),
    "wav2vec2 weights": (_damage("wav2vec2-large-xlsr-53-english/model.safetensors"), "truncated"),
    "truncated lora": (lambda _r, lora: (_truncate(lora), lora)[1], "truncated or damaged"),
    "lora A without B": (_edit_lora(lambda t: t.pop(B_KEY)), "has no lora_B beside it"),
    "lora ranks disagree": (_edit_lora(lambda t: t.update({B_KEY: torch.zeros(12, 3)})), "rank"),
}


@pytest.mark.parametrize("case", sorted(PREFLIGHT))
def test_the_preflight_refuses_a_broken_release_in_one_line_naming_the_file(
    release, tmp_path, case
):
    from pipeline.liveavatar.weights import check_release

    root, lora = copy_release(release, tmp_path)
    damage, message = PREFLIGHT[case]
    path = damage(root, lora)
    with pytest.raises(CheckpointError, match=message) as err:
        check_release(root, lora)
    one_line(err, path)


def test_the_full_loads_name_the_file_too(release, tmp_path):
    from pipeline.liveavatar.weights import read_transformer_state, release_paths

    root, lora = copy_release(release, tmp_path)
    with pytest.raises(CheckpointError, match="weights folder not found") as err:
        release_paths(tmp_path / "nowhere")
    one_line(err, tmp_path / "nowhere")
    shard = _truncate_shard(root, lora)
    with pytest.raises(CheckpointError, match="truncated or damaged") as err:
        read_transformer_state(root)
    one_line(err, shard)
    shard.unlink()
    with pytest.raises(CheckpointError, match="file not found") as err:
        read_transformer_state(root)
    one_line(err, shard)


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (  # a LoRA for a layer the model does not have
            lambda t: t.update({
                "base_model.model.blocks.7.ffn.0.lora_A.default.weight": torch.zeros(4, 8),
                "base_model.model.blocks.7.ffn.0.lora_B.default.weight": torch.zeros(12, 4),
            }),
            "LoRA for 'blocks.7.ffn.0.weight', which the model does not have",
        ),
        (  # a LoRA of the wrong size for its layer
            lambda t: t.update({
                "base_model.model.blocks.0.ffn.0.lora_A.default.weight": torch.zeros(4, 9),
            }),
            r"makes shape \(12, 9\), the base weight is \(12, 8\)",
        ),
        (  # a whole weight of the wrong size
            lambda t: t.update({"base_model.model.head.weight": torch.zeros(3, 3)}),
            r"'head.weight' has shape \(3, 3\), the base weight \(4, 8\)",
        ),
    ],
)  # fmt: skip
def test_a_lora_that_does_not_fit_the_model_names_the_file(release, tmp_path, edit, message):
    _, lora, state = release
    path = _edit_lora(edit)(tmp_path, shutil.copy(lora, tmp_path / lora.name))
    with pytest.raises(CheckpointError, match=message) as err:
        merge_lora(dict(state), read_lora(path), alpha=2.0)
    one_line(err, path)


def test_a_config_flag_left_out_takes_the_authors_class_default(release, tmp_path):
    from pipeline.liveavatar.weights import read_transformer_config

    root, _ = copy_release(release, tmp_path)
    raw = json.loads((root / "config.json").read_text())
    del raw["enable_framepack"], raw["framepack_drop_mode"]
    raw["eps"] = "tiny"
    (root / "config.json").write_text(json.dumps(raw))
    with pytest.raises(CheckpointError, match="'eps' must be a float") as err:
        read_transformer_config(root)
    one_line(err, root / "config.json")
    raw["eps"] = 1e-6
    (root / "config.json").write_text(json.dumps(raw))
    config = read_transformer_config(root)
    assert config["enable_framepack"] is False and config["framepack_drop_mode"] == "drop"
    del raw["num_layers"]
    (root / "config.json").write_text(json.dumps(raw))
    with pytest.raises(CheckpointError, match="no 'num_layers'") as err:
        read_transformer_config(root)
    one_line(err, root / "config.json")
