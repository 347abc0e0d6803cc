"""Stage layer: typed units of execution, each coordinating one or more Modules.

init (reference → conditioning) · context (audio → features, noise, known frames) ·
a2v (multi-step sampling of low-res latents) · sr (one step to full res) ·
decode (streaming VAE decode to RGB frames).
"""
