"""The pretrained encoders the real open models read their conditioning with.

`wav2vec2` (speech features per video frame, FlashHead's wav2vec2-base), `s2v_speech`
(Wan2.2-S2V's wav2vec2-large-xlsr-53 states, LiveAvatar's), `umt5` (Wan's umT5-XXL prompt
encoder), all loaded through `pretrained` (transformers on the project's own code path:
local files only, hub kernels off).
"""
