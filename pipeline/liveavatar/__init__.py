"""LiveAvatar (Alibaba Quark, Apache-2.0): Wan2.2-S2V-14B with the Live-Avatar LoRA, run
from the published checkpoints.

`weights` reads and checks the two downloads as users make them (the Wan2.2-S2V-14B
folder and the `liveavatar.safetensors` LoRA) and writes random releases of the same
layout for tests and benchmarks; `s2v_weights` is the transformer's key table (published
names onto `pipeline.models.wan.s2v`) and draws random weights of its shapes. The LoRA is
merged by `pipeline.lora`, the prompt is encoded by `pipeline.models.encoders.umt5`, speech by
`pipeline.models.encoders.s2v_speech`.
"""
