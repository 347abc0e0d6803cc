"""The photo stack: a real person's photo talks by moving its own pixels.

Nothing of the face is regenerated. `reference` is the one way in from a file's bytes: a
synthetic-world reference names its identity, so the world's own face geometry is used;
any other photo goes to `face`, which checks it, finds the one face in it and its
landmarks (the shared finder, `pipeline.faces`: MediaPipe's BlazeFace and FaceMesh, run by
LiteRT) and frames it. `motion` turns streamed audio into a few motion parameters per
frame (a small causal network trained on the synthetic world's ground-truth mouth); `idle`
adds blinks and head sway from a seed; `warp` moves the photo's pixels with a smooth
displacement field and paints the mouth interior where the lips part; `engine` runs it all
through the engine's streaming session API.
"""
