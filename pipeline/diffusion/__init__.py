"""The project's own diffusion stack (`runtime.stack: diffusion`; the `tiny`, `demo` and
`rt720` presets): audio encoder → audio-to-video DiT → super-resolution DiT → causal VAE.

`config` holds its sections (`diffusion:` in a preset); `build` makes its four networks
(`audio_encoder`, `a2v_dit`, `sr_dit`, `vae`) from them; `stages/` runs them chunk by chunk
(init, context, a2v with the `sampler`, sr, decode); `engine` is the family's engine and
stream behind `pipeline.stream`'s seam. Training is `pipeline.train`.
"""
