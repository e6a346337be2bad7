"""What a job needs before it runs: a model's architecture numbers, the per-GPU memory plan of every job of
a grid, and the GPUs a training run takes. Above train/ (it sizes train.config's settings), below the bill
(cost/) that prices the jobs it sizes."""
