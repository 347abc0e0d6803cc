"""Run Wan's own umT5 prompt encoder (as LiveAvatar ships it) on random weights and keep what
it returns: the parity fixture of `pipeline.models.encoders.umt5`.

    python bench/parity/umt5_reference.py --reference-repo PATH [--out FILE] [--check]
        [--shape tiny|wide] [--dtype float32|bfloat16]

PATH is a checkout of github.com/Alibaba-Quark/LiveAvatar; nothing of it is copied into
Facecast: its `t5.py` and `tokenizers.py` are imported from PATH in this process (they need
`ftfy` and `regex`), with `umt5_xxl` shrunk to the tiny shape below (their
`T5EncoderModel` builds the 5.7 B-parameter encoder otherwise) and `torch.cuda` asked for
no device on a CPU. The weights are `pipeline.models.encoders.umt5.random_wan_state` saved as the
`.pth` they load, the tokenizer `write_tokenizer`'s tiny folder.

It writes FILE (default `tests/fixtures/liveavatar/umt5_tiny.safetensors`): their output
for each prompt (`out.N`, float32) and its token ids (`ids.N`), with the seed, shape,
text_len and prompts in the metadata. With `--check` it also loads the same files through
Facecast's `PromptEncoder` and prints the largest difference. `--shape wide` (umT5-XXL's
widths and heads, 2 of its 24 layers, text_len 512) and `--dtype bfloat16` (as Wan runs it)
only check, writing no fixture.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import sys
import tempfile
import types
from pathlib import Path

import torch

FACECAST = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(FACECAST))

from pipeline.models.encoders.umt5 import (  # noqa: E402
    PromptEncoder,
    UMT5Shape,
    random_wan_state,
    write_tokenizer,
)

SEED = 5
TEXT_LEN = 40  # > 2 x 8 exact buckets: the logarithmic buckets are reached, and prompts cut
SHAPES = {
    "tiny": UMT5Shape(vocab=192, dim=32, dim_attn=32, dim_ffn=48, num_heads=4, num_layers=2),
    "wide": UMT5Shape(vocab=192, num_layers=2),  # XXL's 4096/10240/64 heads, 2 layers
}
PROMPTS = [
    "A man talking to the camera",
    "  A woman   smiles &amp;amp; speaks,\n\tsoft light  ",  # white space, HTML entities
    "cafÃ© Ã¼ber",  # mojibake: ftfy repairs it
    " ".join(["the man speaks"] * 16),  # longer than TEXT_LEN: cut, </s> kept
]


def import_theirs(repo: Path, shape: UMT5Shape) -> types.ModuleType:
    """Their `wan_2_2/modules/t5.py`, imported as a module of a stand-in package (its
    `from .tokenizers import …` then finds their tokenizers.py, and nothing else of theirs
    is imported)."""
    modules = repo / "liveavatar" / "models" / "wan" / "wan_2_2" / "modules"
    package = types.ModuleType("wan_modules")
    package.__path__ = [str(modules)]
    sys.modules["wan_modules"] = package
    # `T5EncoderModel(device=torch.cuda.current_device())` is evaluated when t5.py is read
    current = torch.cuda.current_device
    torch.cuda.current_device = lambda: 0  # type: ignore[assignment]
    try:
        for name in ("tokenizers", "t5"):
            spec = importlib.util.spec_from_file_location(
                f"wan_modules.{name}", modules / f"{name}.py"
            )
            assert spec and spec.loader
            module = importlib.util.module_from_spec(spec)
            sys.modules[spec.name] = module
            spec.loader.exec_module(module)
    finally:
        torch.cuda.current_device = current  # type: ignore[assignment]
    t5 = sys.modules["wan_modules.t5"]
    tiny = dict(
        vocab_size=shape.vocab,
        dim=shape.dim,
        dim_attn=shape.dim_attn,
        dim_ffn=shape.dim_ffn,
        num_heads=shape.num_heads,
        encoder_layers=shape.num_layers,
        decoder_layers=shape.num_layers,
        num_buckets=shape.num_buckets,
        shared_pos=False,
        dropout=0.1,
    )
    t5.umt5_xxl = lambda **kw: t5._t5("umt5-xxl", **{**tiny, **kw})
    return t5


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--reference-repo", type=Path, required=True)
    p.add_argument(
        "--out", type=Path, default=FACECAST / "tests/fixtures/liveavatar/umt5_tiny.safetensors"
    )
    p.add_argument("--check", action="store_true")
    p.add_argument("--shape", choices=sorted(SHAPES), default="tiny")
    p.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    args = p.parse_args()
    from safetensors.torch import save_file

    shape, dtype = SHAPES[args.shape], getattr(torch, args.dtype)
    fixture = args.shape == "tiny" and dtype == torch.float32
    text_len = TEXT_LEN if args.shape == "tiny" else 512
    t5 = import_theirs(args.reference_repo.resolve(), shape)
    with tempfile.TemporaryDirectory() as tmp:
        ckpt, tok = Path(tmp) / "t5.pth", write_tokenizer(Path(tmp) / "tokenizer")
        torch.save(random_wan_state(shape, SEED, dtype), ckpt)
        theirs = t5.T5EncoderModel(
            text_len=text_len,
            dtype=dtype,
            device=torch.device("cpu"),
            checkpoint_path=str(ckpt),
            tokenizer_path=str(tok),
        )
        with torch.no_grad():
            outs = theirs(PROMPTS, torch.device("cpu"))
        ids, _ = theirs.tokenizer(PROMPTS, return_mask=True, add_special_tokens=True)
        tensors = {f"out.{i}": o.float().contiguous() for i, o in enumerate(outs)}
        tensors |= {f"ids.{i}": ids[i].contiguous() for i in range(len(PROMPTS))}
        meta = {
            "seed": SEED,
            "text_len": TEXT_LEN,
            "shape": dataclasses.asdict(shape),
            "prompts": PROMPTS,
        }
        if fixture:
            args.out.parent.mkdir(parents=True, exist_ok=True)
            save_file(tensors, str(args.out), metadata={"meta": json.dumps(meta)})
            print(f"wrote {args.out}: {[tuple(o.shape) for o in outs]}")
        if args.check:
            ours = PromptEncoder(ckpt, tok, dtype=dtype, text_len=text_len)
            our_ids, _ = ours.tokenize(PROMPTS)
            assert torch.equal(our_ids, ids), "token ids differ"
            for i, (a, b) in enumerate(zip(ours.encode(PROMPTS), outs, strict=True)):
                assert a.shape == b.shape, (i, a.shape, b.shape)
                err = (a.float() - b.float()).abs().max() / b.float().abs().max()
                print(
                    f"prompt {i}: {tuple(a.shape)} max |ours - theirs| / max |theirs| = {err:.3g}"
                )


if __name__ == "__main__":
    main()
