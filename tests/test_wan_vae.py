"""The Wan 2.1 VAE (pipeline/models/wan/vae.py): the authors' numbers on tiny random weights,
a streamed decode equal to the whole-chunk one, the frame counts, and one-line loader errors.

The fixture holds the seed of the weights, the inputs and the outputs of the authors'
`WanVAE.encode`/`decode` (SoulX-FlashHead), written by bench/parity/wan_vae.py.
"""

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from safetensors import safe_open

from pipeline.errors import CheckpointError
from pipeline.models.wan.vae import (
    WAN21_VAE,
    WAN21_VAE_TINY,
    WanVAE,
    checkpoint_layout,
    load_wan_vae,
    random_checkpoint,
)

FIXTURE = Path(__file__).parent / "fixtures" / "flashhead" / "wan_vae_tiny.safetensors"


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """The tiny convolutions are too small to share between threads: one is faster, and much
    faster on a CPU that other jobs keep busy."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def reference() -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    with safe_open(str(FIXTURE), framework="pt") as f:
        return {k: f.get_tensor(k) for k in f.keys()}, f.metadata()


@pytest.fixture(scope="module")
def checkpoint(reference, tmp_path_factory) -> tuple[Path, dict[str, torch.Tensor]]:
    """The fixture's weights, rebuilt from its seed, saved as the published .pth."""
    state = random_checkpoint(WAN21_VAE_TINY, seed=int(reference[1]["seed"]))
    path = tmp_path_factory.mktemp("wan") / "Wan2.1_VAE.pth"
    torch.save(state, path)
    return path, state


@pytest.fixture(scope="module")
def vae(checkpoint) -> WanVAE:
    return load_wan_vae(checkpoint[0], config=WAN21_VAE_TINY)


def assert_close(ours: torch.Tensor, theirs: torch.Tensor) -> None:
    assert ours.shape == theirs.shape
    cos = F.cosine_similarity(ours.double().flatten(), theirs.double().flatten(), dim=0)
    assert cos.item() >= 0.99999
    assert (ours - theirs).abs().max().item() <= 1e-4


def test_weights_from_the_seed_are_the_ones_the_fixture_was_made_with(reference, checkpoint):
    state = checkpoint[1]
    rebuilt = torch.tensor([[state[k].sum(), state[k].flatten()[0]] for k in sorted(state)])
    torch.testing.assert_close(rebuilt, reference[0]["weights.fingerprint"], rtol=1e-5, atol=1e-5)


@torch.inference_mode()
def test_encode_matches_the_authors(vae, reference):
    tensors = reference[0]
    clips = [k.split(".")[0] for k in tensors if k.startswith("encode_") and k.endswith(".video")]
    assert len(clips) >= 2
    for clip in clips:
        latents = vae.encode(tensors[f"{clip}.video"].float())
        assert_close(latents, tensors[f"{clip}.reference"])


@pytest.mark.parametrize("compiled", [False, pytest.param(True, marks=pytest.mark.slow)])
@torch.inference_mode()
def test_the_encoder_channels_last_and_compiled_still_matches_the_authors(
    checkpoint, reference, compiled
):
    """`compile_encoder` (FlashHead Pro's motion re-encode under --compile on a GPU): the
    encoder's weights and each clip channels-last, then compiled; the same latents."""
    vae = load_wan_vae(checkpoint[0], config=WAN21_VAE_TINY)
    vae.compile_encoder(compile=compiled)
    conv = next(m for m in vae.net.encoder.modules() if isinstance(m, torch.nn.Conv3d))
    assert conv.weight.is_contiguous(memory_format=torch.channels_last_3d)
    tensors = reference[0]
    clips = [k.split(".")[0] for k in tensors if k.startswith("encode_") and k.endswith(".video")]
    for clip in clips:
        assert_close(vae.encode(tensors[f"{clip}.video"].float()), tensors[f"{clip}.reference"])


@torch.inference_mode()
def test_decode_matches_the_authors(vae, reference):
    tensors = reference[0]
    chunks = [
        k.split(".")[0] for k in tensors if k.startswith("decode_") and k.endswith(".latents")
    ]
    assert len(chunks) >= 2
    for chunk in chunks:
        assert_close(vae.decode(tensors[f"{chunk}.latents"]), tensors[f"{chunk}.reference"])


@pytest.fixture(scope="module")
def whole_decode(vae, reference) -> torch.Tensor:
    with torch.inference_mode():
        return vae.stream().decode(reference[0]["decode_4.latents"], latents_per_pass=1)


@torch.inference_mode()
@pytest.mark.parametrize("split", [[1, 1, 1, 1], [2, 2], [1, 3], [3, 1]])
def test_streamed_decode_equals_whole_decode(vae, reference, whole_decode, split):
    lat = reference[0]["decode_4.latents"]
    stream, pieces, lo = vae.stream(), [], 0
    for n in split:
        pieces.append(stream.decode(lat[:, :, lo : lo + n], latents_per_pass=1))
        lo += n
    assert torch.equal(torch.cat(pieces, dim=2), whole_decode)


@torch.inference_mode()
@pytest.mark.parametrize("split", [[4], [1, 3], [2, 2], [1, 1, 2]])
def test_wide_passes_give_the_pixels_of_one_pass_per_latent_frame(
    vae, reference, whole_decode, split
):
    """Later latent frames go through the decoder together (the GPU's fast path); the
    causal look-backs make that the same computation, equal to float rounding."""
    lat = reference[0]["decode_4.latents"]
    stream, pieces, lo = vae.stream(), [], 0
    for n in split:
        pieces.append(stream.decode(lat[:, :, lo : lo + n]))
        lo += n
    wide = torch.cat(pieces, dim=2)
    assert wide.shape == whole_decode.shape
    assert (wide - whole_decode).abs().max().item() <= 1e-5
    with pytest.raises(ValueError, match="at least 1"):
        vae.stream().decode(lat, latents_per_pass=0)


@pytest.mark.slow
@torch.inference_mode()
@pytest.mark.parametrize("whole_pass", [False, True])
def test_the_compiled_decoder_gives_the_eager_pixels(
    checkpoint, reference, whole_decode, whole_pass
):
    """`CausalDecoder.compile` (Pro's decode under --compile on a GPU): its norms and SiLUs
    in their compiled form (a reciprocal square root, the logistic SiLU), alone or fused
    with the whole pass; the pixels of the eager decode, to float rounding."""
    vae = load_wan_vae(checkpoint[0], config=WAN21_VAE_TINY)  # compiling changes its decoder
    vae.causal_decoder.compile(whole_pass=whole_pass)
    lat = reference[0]["decode_4.latents"]
    stream = vae.stream()
    compiled = torch.cat([stream.decode(lat[:, :, :1]), stream.decode(lat[:, :, 1:])], dim=2)
    assert compiled.shape == whole_decode.shape
    assert (compiled - whole_decode).abs().max().item() <= 1e-4


@torch.inference_mode()
def test_first_latent_frame_gives_one_frame_each_later_one_four(vae, reference, whole_decode):
    lat = reference[0]["decode_4.latents"]  # (1, 16, 4, 2, 3)
    stream = vae.stream()
    assert [f.shape[2] for f in stream.frames(lat[:, :, :2])] == [1, 4]
    assert stream.decode(lat[:, :, 2:]).shape == (1, 3, 8, 16, 24)
    assert whole_decode.shape == (1, 3, 1 + 4 * 3, 16, 24)
    assert vae.encode(torch.zeros(1, 3, 9, 16, 24)).shape == (1, 16, 3, 2, 3)
    with pytest.raises(ValueError, match="1 \\+ 4k frames"):
        vae.encode(torch.zeros(1, 3, 8, 16, 24))


def test_key_table_covers_the_published_model_exactly():
    with torch.device("meta"):
        params = WanVAE(WAN21_VAE).state_dict()
    layout = checkpoint_layout(WAN21_VAE)
    assert sorted(layout.values()) == sorted(params)
    assert len(layout) == 194 and sum(p.numel() for p in params.values()) == 126_892_531
    assert layout["decoder.upsamples.7.time_conv.weight"] == (
        "net.decoder.up_blocks.1.upsamplers.0.time_conv.weight"
    )


def broken_checkpoints(tmp: Path, good: Path, state: dict[str, torch.Tensor]):
    """(what is wrong, file, words the message must hold)."""
    missing = tmp / "absent.pth"
    truncated = tmp / "truncated.pth"
    truncated.write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    not_a_dict = tmp / "list.pth"
    torch.save([torch.zeros(1)], not_a_dict)
    variants = {
        "unmapped": ({**state, "decoder.extra.weight": torch.zeros(1)}, ["decoder.extra.weight"]),
        "missing": ({k: v for k, v in state.items() if k != "conv2.bias"}, ["conv2.bias"]),
        "shape": (
            {**state, "conv2.weight": torch.zeros(16, 16, 3, 1, 1)},
            ["conv2.weight", "(16, 16, 3, 1, 1)", "(16, 16, 1, 1, 1)"],
        ),
        "dtype": (
            {**state, "conv2.bias": torch.zeros(16, dtype=torch.int64)},
            ["conv2.bias", "int64"],
        ),
    }
    yield "missing file", missing, ["not found"]
    yield "truncated", truncated, ["truncated"]
    yield "not a state dict", not_a_dict, ["not a plain state dict"]
    for name, (broken, words) in variants.items():
        path = tmp / f"{name}.pth"
        torch.save(broken, path)
        yield name, path, words


def test_loader_errors_are_one_line_naming_the_file_and_the_key(checkpoint, tmp_path):
    good, state = checkpoint
    for what, path, words in broken_checkpoints(tmp_path, good, state):
        with pytest.raises(CheckpointError) as err:
            load_wan_vae(path, config=WAN21_VAE_TINY)
        message = str(err.value)
        assert "\n" not in message, what
        assert str(path) in message, what
        for word in words:
            assert word in message, (what, message)
