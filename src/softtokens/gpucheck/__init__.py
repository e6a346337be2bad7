"""`softtokens gpu-check`: the paper's GPU path verified in one command, before a cluster run.

A GPU is rare here (one task in twenty is lent one, for 30 minutes) and a researcher's first
``snakemake --profile slurm`` should not be the first GPU run. So every part of the paper path
that behaves differently on a GPU runs in one self-contained command, on a random-weight model
built from the shipped ``config.json`` of the paper's Llama-3.2-3B (no download, no math-verify,
no Snakemake), at the paper grid's sizes read from ``config.yaml`` (the llama-3b x math cell and
the paper grid's evaluation):

- engine: ms per decode step in the six settings beside the memory-bandwidth bound; whether
  the step was captured in a CUDA graph; greedy hard tokens equal to HF ``generate`` (float32);
  graph replay equal to the eager step; noise fresh per step and row, and reproducible by seed;
- evaluation: one batch of each setting at the evaluation batch size, the out-of-domain scorer,
  peak memory beside ``softtokens plan``;
- training: RLOO steps of the cell (float32 master, bf16 compute, FSDP2, activation
  checkpointing), step time split rollout / reward / update, peak memory beside the plan (held,
  rollout phase, update phase), the share of master entries moved, replay h0 gap and argmax
  mismatch against the paper-grid bounds, a checkpoint reloaded by plain ``from_pretrained``,
  the sharded optimizer state saved and loaded (torch.distributed.checkpoint).

Random weights never answer right, so the training section grades with a stand-in that gives
each completion a reward from its hash: rewards vary within a prompt's group, so RLOO has a
gradient, which is all a systems check needs. ``--smoke`` runs the same code on a tiny model (on
the CPU if there is no GPU) in seconds; CI runs it. Writes ``DIR/gpu_check.json`` (rewritten
after each section, so a run stopped by a time limit keeps what it measured) and
``DIR/gpu_check.md``. docs/gpu.md says how to read it.
"""
