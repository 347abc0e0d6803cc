"""The Wan 2.x networks the open models build on: `layers` (what FlashHead's DiT and
LiveAvatar's S2V transformer share), `vae` and `vae_decode` (the Wan 2.1 VAE, FlashHead
Pro's and LiveAvatar's decoder), and `s2v` with `s2v_sink`, `s2v_audio`, `s2v_cache`
(Wan2.2-S2V's transformer, LiveAvatar's). FlashHead's own DiT is `pipeline.flashhead.dit`."""
