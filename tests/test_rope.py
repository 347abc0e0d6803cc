"""`apply_rope`, every model's RoPE: each adjacent channel pair turned by its token's angle,
the same numbers eager as the pairwise rotation the published models write, and compiled
without the stacked float32 buffer that form costs on the GPU."""

from __future__ import annotations

import pytest
import torch

from pipeline.models.layers import apply_rope, grid_positions, rope_angles


def rotated_pairwise(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """The rotation as the Wan models write it (heads first): (x1 cos - x2 sin, x1 sin + x2 cos)."""
    x1, x2 = x.float().unflatten(-1, (-1, 2)).unbind(-1)
    return torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), -1).flatten(-2).type_as(x)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rope_gives_the_pairwise_rotations_numbers_exactly(dtype):
    """Eager, bit for bit what the pairwise rotation gives (FlashHead's and LiveAvatar's
    parity with their authors rests on it), heads first or tokens first; lengths kept."""
    g = torch.Generator().manual_seed(0)
    angles = rope_angles(grid_positions(3, 4, 5), 24)  # (60, 12): t, h, w parts
    cos, sin = angles.cos(), angles.sin()
    x_BNLH = (torch.randn(2, 3, 60, 24, generator=g) * 7).to(dtype)
    want = rotated_pairwise(x_BNLH, cos, sin)
    assert torch.equal(apply_rope(x_BNLH, cos, sin), want)
    x_BLNH = x_BNLH.transpose(1, 2)
    assert torch.equal(apply_rope(x_BLNH, cos, sin, tokens_first=True), want.transpose(1, 2))
    if dtype == torch.float32:  # a rotation: each pair keeps its length
        pairs_in, pairs_out = (t.unflatten(-1, (-1, 2)).norm(dim=-1) for t in (x_BNLH, want))
        torch.testing.assert_close(pairs_out, pairs_in, rtol=1e-5, atol=1e-5)


def test_rope_compiled_matches_eager():
    """Compiled (the form the GPU runs), within float32 rounding of eager."""
    g = torch.Generator().manual_seed(1)
    angles = rope_angles(grid_positions(2, 3, 3), 12) * 3.0
    x = torch.randn(1, 18, 2, 12, generator=g)
    rope = torch.compile(lambda x, c, s: apply_rope(x, c, s, tokens_first=True))
    got = rope(x, angles.cos(), angles.sin())
    want = apply_rope(x, angles.cos(), angles.sin(), tokens_first=True)
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)
