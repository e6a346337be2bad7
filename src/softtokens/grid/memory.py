"""The memory each job of a grid declares and needs, as the workflow plans it and `softtokens plan` prints it: the
host plan of each job (sizing.host) over the grid's training runs and evaluated models (grid.jobs)."""

from __future__ import annotations

from softtokens.sizing.host import HostPlan, gb


def job_memory(jobs) -> list[tuple[str, int]]:
    """(job, declared mem_mb) of every training and evaluation job of the grid (grid.jobs.GridJobs.resources)."""
    from types import SimpleNamespace

    out = []
    train = jobs.resources("train").get("mem_mb")
    if callable(train):
        for r in sorted({(r.model, r.dataset, r.arm) for r in jobs.training_runs()}):
            out.append((f"train {r[0]}/{r[1]}/{r[2]}", train(SimpleNamespace(model=r[0], dataset=r[1], arm=r[2]))))
    kinds = (("evaluate", jobs.eval["benchmarks"] or jobs.ood),) if jobs.per_model_eval else (
        ("evaluate", jobs.eval["benchmarks"]), ("evaluate_loglik", jobs.ood))
    for kind, wanted in kinds:
        mem = jobs.resources(kind).get("mem_mb")
        if callable(mem) and wanted:
            out += [(f"{kind} {m}", mem(SimpleNamespace(model=m))) for m in sorted({m for m, _ in jobs.evaluated_models()})]
    return out


def host_table(config: dict, grid_name: str) -> str:
    """`softtokens plan`'s host memory: per training cell and evaluated model, a process's peak by phase, and what
    the job declares (mem_mb: Snakemake's bound on one machine, the SLURM request on a cluster)."""
    from types import SimpleNamespace

    from softtokens.grid.jobs import GridJobs
    from softtokens.config.grids import train_processes

    plan, jobs = HostPlan(config, grid_name), GridJobs({**config, "grid": grid_name})
    lines = [f"host memory ({'per GPU process' if plan.on_gpu else 'one CPU process a job'}; GB): the peak of each "
             "phase, and what the job declares (x processes, x 1.1)",
             "| job | processes | loading | rollout / update or staging a save | peak | declares (MB) |",
             "|---|---|---|---|---|---|"]
    cells = sorted({(r.model, r.dataset, r.mode) for r in jobs.training_runs()})
    for model, dataset, mode in cells:
        m = plan.train(model, dataset, mode)
        later = gb(m["staging a save"]) if plan.on_gpu else f"{gb(m['rollout'])} / {gb(m['update'])}"
        n = train_processes(plan.grid, model) if plan.on_gpu else 1
        mb = plan.mb("train", SimpleNamespace(model=model, dataset=dataset, arm=mode))
        lines.append(f"| train {model}/{dataset}/{mode} | {n} | {gb(m['loading'])} | {later} | {gb(m['peak'])} | "
                     f"{mb:,} |")
    for model in sorted({m for m, _ in jobs.evaluated_models()}) if plan.eval["benchmarks"] else []:
        m = plan.evaluate(model)
        mb = plan.mb("evaluate", SimpleNamespace(model=model))
        lines.append(f"| evaluate {model} | 1 | {gb(m['loading'])} | {gb(m['decoding']) if 'decoding' in m else '-'} | "
                     f"{gb(m['peak'])} | "
                     f"{mb:,} |")
    return "\n".join(lines)
