"""Parallelism applied from outside the models: one session on several GPUs (or CPU
processes with gloo). `ulysses` shards the token sequence and trades it for heads around
each attention; `fsdp` shards weights with FSDP2; `step_pipeline` runs LiveAvatar's S2V
transformer one sampling step per GPU, the blocks flowing through like an assembly line;
`launch` starts one process per GPU."""
