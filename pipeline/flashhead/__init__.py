"""SoulX-FlashHead (Soul-AILab, Apache-2.0) run from its published checkpoint.

`dit` is its transformer (the Wan 2.1 DiT with per-frame audio cross-attention); `weights`
reads the release folder as users download it (the DiT's key table included); `framing`
makes the face-centred square the model expects; `color` is the colour correction that
keeps long sessions from drifting; `engine` is the family's engine and stream behind
`pipeline.stream`'s seam. The shared networks it runs are `pipeline.models.wan.vae` (Pro's
Wan 2.1 VAE), `pipeline.models.ltx.vae` (Lite's LTX-Video VAE) and
`pipeline.models.encoders.wav2vec2`.
"""
