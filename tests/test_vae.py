"""The causal VAE decoder streams: chunk by chunk with its cache equals decoding whole."""

import torch

from pipeline.config import load_config
from pipeline.diffusion.build import build_models


def test_chunked_decode_equals_whole_decode():
    cfg = load_config("tiny")
    vae = build_models(cfg)["vae"].eval()
    torch.manual_seed(0)
    z = torch.randn(1, cfg.diffusion.vae.latent_channels, 11, 16, 16)
    with torch.inference_mode():
        whole, _ = vae.decoder(z)
        parts, cache = [], None
        for lo, hi in [(0, 3), (3, 4), (4, 9), (9, 11)]:  # uneven chunks, one of a single frame
            out, cache = vae.decoder(z[:, :, lo:hi], cache)
            parts.append(out)
    chunked = torch.cat(parts, dim=2)
    assert whole.shape == (1, 3, 11 * cfg.diffusion.vae.temporal_ratio, 128, 128)
    assert (chunked - whole).abs().max().item() <= 1e-5


def test_decoder_is_causal():
    """Changing a later latent frame never changes earlier video frames."""
    cfg = load_config("tiny")
    vae = build_models(cfg)["vae"].eval()
    z = torch.randn(1, cfg.diffusion.vae.latent_channels, 6, 16, 16)
    z2 = z.clone()
    z2[:, :, 4:] += 1.0
    with torch.inference_mode():
        a, _ = vae.decoder(z)
        b, _ = vae.decoder(z2)
    r = cfg.diffusion.vae.temporal_ratio
    assert torch.equal(a[:, :, : 4 * r], b[:, :, : 4 * r])
    assert not torch.equal(a[:, :, 4 * r :], b[:, :, 4 * r :])


def test_encoder_maps_frames_to_latent_grid():
    cfg = load_config("tiny")
    vae = build_models(cfg)["vae"].eval()
    with torch.inference_mode():
        lat = vae.encode_image(torch.zeros(1, 3, 128, 128))
    assert lat.shape == (1, cfg.diffusion.vae.latent_channels, 1, 16, 16)


def test_cpu_conv_path_matches_conv3d():
    """On the CPU the causal conv runs as a 2D conv over stacked frames: same numbers."""
    from pipeline.diffusion.vae import CausalConv3d

    torch.manual_seed(0)
    conv = CausalConv3d(8, 12)
    x, cache = torch.randn(2, 8, 5, 10, 12), torch.randn(2, 8, 2, 10, 12)
    fast, new_cache = conv(x, cache)
    reference = conv.conv(torch.cat([cache, x], dim=2))
    assert (fast - reference).abs().max().item() <= 1e-5
    assert torch.equal(new_cache, x[:, :, -2:])
