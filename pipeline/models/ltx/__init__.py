"""LTX-Video models: the causal video VAE that SoulX-FlashHead Lite decodes with."""

from pipeline.models.ltx.vae import RELEASE, TINY, LtxVae, LtxVaeConfig, latent_shape, load_ltx_vae

__all__ = ["RELEASE", "TINY", "LtxVae", "LtxVaeConfig", "latent_shape", "load_ltx_vae"]
