"""How many GPUs a training run takes (`gpus_per_run` of a grid): chosen by the work, not the node. Decoding
reads every weight once per step however few rows a GPU holds, and the per-micro-batch overhead and the
blocking part of a save are paid on every GPU, so the fewest GPUs on which the memory plan fits is the
cheapest shape; the paper's hyperparameters do not follow the world size (train.distributed splits the
same rows over the processes), so neither does the result beyond reduction order (tests/test_paper_path.py)."""

from __future__ import annotations

from softtokens.config.grids import cell_rl
from softtokens.config.grids import train_processes
from softtokens.sizing.plan import (
    PREFERRED_MICRO_BATCH,
    grid_architecture,
    plan_budget,
    resolve_memory,
    train_job_for,
    train_memory,
)

GPU_CHOICES = (1, 2, 4, 8)   # GPUs a training run may take (one node)
AUTO_GPUS_MIN_MICRO_BATCH = PREFERRED_MICRO_BATCH


def auto_gpus(config: dict, grid_name: str, model: str) -> tuple[int, str]:
    """(GPUs, why) the fewest of GPU_CHOICES on which every training cell of ``model`` fits the memory plan
    with `auto`'s micro-batch of at least AUTO_GPUS_MIN_MICRO_BATCH rows, every paper hyperparameter as it
    is (the global batch B x G, the group size and the learning rate do not follow the world size: the rows
    are split over the processes, train.distributed). A grid that declares no GPU memory: 1."""
    grid = config["grids"][grid_name]
    if not grid.get("memory_plan", {}).get("gpu_memory_gb"):
        return 1, "no GPU memory declared: one GPU"
    cells = [c for c in grid["training"] if c["model"] == model]
    if not cells:
        return train_processes(grid, model), "no training cell of this model in the grid: as written"
    budget = plan_budget(grid)
    arch = grid_architecture(grid, model)
    prompt = int(grid.get("memory_plan", {}).get("prompt_tokens", 512))
    for gpus in GPU_CHOICES:
        trial = {**grid, "models": {**grid["models"], model: {**grid["models"][model], "train_gpus": gpus}}}
        ok = True
        for c in cells:
            rl = cell_rl({**config, "grids": {**config["grids"], grid_name: trial}}, grid_name, model, c["dataset"],
                         c.get("variant", ""))
            rows = -(-rl["prompts_per_step"] * rl["samples_per_prompt"] // gpus)
            for continuous in {m != "hard" for m in c["modes"]}:
                chosen = resolve_memory({**config, "grids": {**config["grids"], grid_name: trial}}, grid_name, model,
                                        rl, continuous)
                mb = chosen["micro_batch_size"]
                peak = train_memory(arch, train_job_for(trial, model, chosen, prompt, continuous, mb,
                                                     chosen["activation_checkpointing"]))["peak"]
                if peak > budget or (mb < AUTO_GPUS_MIN_MICRO_BATCH and rows >= AUTO_GPUS_MIN_MICRO_BATCH):
                    ok = False
        if ok:
            return gpus, f"the fewest GPUs that fit with a micro-batch of at least {AUTO_GPUS_MIN_MICRO_BATCH}"
    return GPU_CHOICES[-1], "nothing smaller fits: a whole node"


def resolve_gpus(config: dict, grid_name: str) -> dict:
    """The grid's ``gpus_per_run`` applied, in place: each model's train_gpus as `auto` chooses (auto_gpus), N
    for every model, or as written (`paper`, or absent). Returns {model: (GPUs, why)}."""
    grid = config["grids"][grid_name]
    how = grid.get("gpus_per_run", "paper")
    if how != "paper":   # its own copy: a grid that reuses another shares the other's models block
        grid["models"] = {m: dict(spec) for m, spec in grid["models"].items()}
    out = {}
    for model, spec in grid["models"].items():
        if how == "paper":
            out[model] = (train_processes(grid, model), "as written (train_gpus: the paper grid's node shape)")
            continue
        gpus, why = auto_gpus(config, grid_name, model) if how == "auto" else (int(how), f"gpus_per_run: {how}")
        spec["train_gpus"] = gpus
        out[model] = (gpus, why)
    return out


def with_resolved_gpus(config: dict, grid_name: str) -> tuple[dict, dict]:
    """(``config`` with the grid's ``gpus_per_run`` applied on a copy of the grid, {model: (GPUs, why)}: resolve_gpus),
    so a forecast of a config that did not pass through the workflow's checks counts the GPUs the jobs would take."""
    out = {**config, "grids": {**config["grids"], grid_name: dict(config["grids"][grid_name])}}
    return out, resolve_gpus(out, grid_name)
