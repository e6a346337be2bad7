"""A grid's memory plan held to its trace (gpucheck.trace): every phase of every training and evaluation job,
planned (sizing.plan) against traced, as a table and a JSON record (`softtokens plan --grid GRID --trace`).

Depth: a phase's memory is an affine function of the decoder's depth (every layer holds the same shards, cache
columns and saved activations; the root and the transients do not grow with it), so each job is traced at two
reduced depths and extrapolated to its own (tests/test_memory_trace.py checks the line at a third). A 28-layer
Llama-3.2-3B update traced whole took 12 minutes on 2 cores; two and three layers take seconds each.
"""

from __future__ import annotations

import time

from softtokens.sizing.plan import GB, Architecture, eval_memory, grid_plan, loglik_memory, train_memory

DEPTHS = (2, 3)           # decoder layers traced; the job's own depth is extrapolated from them
# the plan's phase a traced phase is compared with
TRAIN_PHASES = {"held": "held", "rollout": "rollout", "update": "backward", "optimizer step": "optimizer step",
                "validation": "validation", "staged save": "staged save"}


def extrapolated(at: dict[int, float], depth: int) -> float:
    """The affine function of depth through the two smallest traced depths, at ``depth``."""
    (d1, m1), (d2, m2) = sorted(at.items())[:2]
    return m1 + (m2 - m1) * (depth - d1) / (d2 - d1)


def job_traces(row: dict, depths=DEPTHS, tok=None) -> dict[str, dict[int, dict[str, int]]]:
    """{phase: {depth: {kind: traced bytes}}} of one grid_plan row (kinds: MemTracker's, and Total)."""
    from softtokens.gpucheck.models import check_tokenizer
    from softtokens.gpucheck.trace import TraceShape, architecture_fields, trace_evaluation, trace_loglik, trace_training

    out: dict[str, dict[int, int]] = {}
    source = row["source"]
    tok = tok or check_tokenizer(row["arch"].vocab)   # one for every depth
    for depth in depths:
        fields = architecture_fields(source, depth)
        if "job_shape" in row:
            job = row["job_shape"]
            rows = -(-job.rows // job.processes)
            shape = TraceShape(rows=rows, group=min(job.group, rows), prompt_tokens=job.prompt_tokens,
                               cot_tokens=job.cot_tokens, answer_tokens=job.answer_tokens,
                               micro_batch=job.micro_batch, val_rows=job.val_rows, val_cot_tokens=job.val_cot_tokens)
            phases = trace_training(fields, shape, job.processes, "soft" if job.continuous else "hard",
                                    job.compute_dtype, job.param_dtype,
                                    job.checkpointing, job.optimizer, tok=tok)
        elif "eval_shape" in row:
            e = row["eval_shape"]
            shape = TraceShape(rows=e["batch"], group=1, prompt_tokens=e["prompt_tokens"], cot_tokens=e["cot_tokens"],
                               answer_tokens=e["answer_tokens"])
            phases = trace_evaluation(fields, shape, compute_dtype=row["compute_dtype"], tok=tok)
        else:
            s = row["loglik_shape"]
            phases = trace_loglik(fields, s["batch"], s["context_tokens"], s["choice_tokens"], row["compute_dtype"],
                                  tok=tok)
        for phase, kinds in phases.items():
            out.setdefault(phase, {})[depth] = kinds
    return out


def planned_phases(row: dict, arch: Architecture) -> dict[str, float]:
    """{traced phase: planned bytes} of a grid_plan row, for ``arch`` (any depth)."""
    if "job_shape" in row:
        m = train_memory(arch, row["job_shape"])
        return {phase: m[key] for phase, key in TRAIN_PHASES.items()}
    if "eval_shape" in row:
        e = row["eval_shape"]
        return {"evaluate": eval_memory(arch, e["batch"], e["prompt_tokens"], e["cot_tokens"], e["answer_tokens"],
                                        row["compute_dtype"])["peak"]}
    s = row["loglik_shape"]
    return {"loglik": loglik_memory(arch, s["batch"], s["context_tokens"], s["choice_tokens"],
                                    row["compute_dtype"])["peak"]}


def traced_plan(config: dict, grid_name: str, depths=DEPTHS, jobs: list[str] | None = None, progress=print) -> list[dict]:
    """One record per (job, phase): planned and traced bytes at the job's own depth, the traced ones per depth, and
    their ratio. Jobs of the same shape (a model's datasets at the same settings) are traced once."""
    from softtokens.gpucheck.models import check_tokenizer

    grid = config["grids"][grid_name]
    records, done, tokenizers = [], {}, {}
    for row in grid_plan(config, grid_name):
        if jobs and row["job"] not in jobs:
            continue
        source = grid["models"][row["model"]]["source"]
        row = {**row, "source": source}
        arch = row["arch"]
        key = (source, repr(row.get("job_shape")), repr(row.get("eval_shape")), repr(row.get("loglik_shape")))
        start = time.perf_counter()
        if key not in done:
            if arch.vocab not in tokenizers:   # padded to 128k+ tokens: made once per vocabulary
                tokenizers[arch.vocab] = check_tokenizer(arch.vocab)
            done[key] = job_traces(row, depths, tokenizers[arch.vocab])
        traced = done[key]
        planned = planned_phases(row, arch)
        for phase, at in traced.items():
            t = extrapolated({d: k["Total"] for d, k in at.items()}, arch.layers)
            p = planned[phase]
            kinds = sorted({kind for k in at.values() for kind in k} - {"Total"})
            records.append({"job": row["job"], "phase": phase, "planned_gb": round(p / GB, 4),
                            "traced_gb": round(t / GB, 4), "ratio": round(t / p, 4), "depth": arch.layers,
                            "traced_at_depth_gb": {str(d): round(k["Total"] / GB, 4) for d, k in sorted(at.items())},
                            "traced_by_kind_gb": {kind: round(extrapolated({d: k.get(kind, 0) for d, k in at.items()},
                                                                           arch.layers) / GB, 4) for kind in kinds}})
        if progress:
            progress(f"traced {row['job']} ({len(traced)} phases, depths {', '.join(map(str, depths))}) in "
                     f"{time.perf_counter() - start:.0f} s")
    return records
