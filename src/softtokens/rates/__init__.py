"""What a GPU step costs: the rates gpu-check measured (decode steps, the update's FLOP rate and its cost
per micro-batch, the log-likelihood pass, saves), read from its reports and scaled to a model.

Why a layer of its own, below train/: the forecast (cost/) prices a grid with these rates, and the
training side's choices (``auto``'s micro-batch, the GPUs a run takes) can ask the same model which
choice is faster, without reaching up into the bill."""
