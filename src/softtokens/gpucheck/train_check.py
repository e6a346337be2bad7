"""The training section: RLOO steps of the llama-3b x math cell, step time, memory beside the plan,
master entries moved, replay checks, checkpoint reload, optimizer round trip."""

from __future__ import annotations

import hashlib
import math
import shutil
import time
import traceback
from pathlib import Path

import torch

from softtokens.data.prompt import format_prompt
from softtokens.data.toy import toy_splits
from softtokens.gpucheck.measure import (
    allocated_bytes,
    gb,
    memory_check,
    peak_bytes,
    release,
    reset_peak,
    sync,
)
from softtokens.gpucheck.models import prompts_of
from softtokens.gpucheck.shape import MOVED_MIN, CheckShape, Report


# ---------------------------------------------------------------- training
def synthetic_grade(completion: str, gold: str, timeout_s: float | None = None):
    """A stand-in for the math-verify reward on random weights: a completion's hash picks its grade
    (a third correct, a third boxed but wrong, a third unboxed), so a group's rewards vary and
    RLOO has a gradient. Deterministic, and no math-verify needed."""
    from softtokens.reward.grader import Grade

    k = int.from_bytes(hashlib.sha256((completion + "|" + gold).encode()).digest()[:4], "little") % 3
    return Grade(boxed=k < 2, correct=k == 0)


def check_training(report: Report, base: Path, shape: CheckShape, arch, dev: torch.device, work: Path,
                   speed: bool = False, deadline: float | None = None) -> None:
    """RLOO steps of the cell in each of ``shape.modes`` from the base at ``base``. ``speed``: each mode's
    update profiled, the slow correctness round trips (checkpoint reload, optimizer round trip) left out;
    ``deadline`` (time.monotonic()): no new step or mode past it (the section says it was cut)."""
    sec, out = "training", {"modes": {}}
    report.sections[sec] = out
    rows = toy_splits(64, 4, 1, seed=7)
    for i, mode in enumerate(shape.modes):
        if deadline is not None and time.monotonic() > deadline:
            out["cut"] = f"at its deadline, before {mode}"
            break
        out["modes"][mode] = result = {}
        try:
            _train_mode(report, result, base, rows, shape, arch, mode, dev, work / f"state-{mode}",
                        master_check=(i == 0), speed=speed, deadline=deadline)
        except Exception as err:  # one mode's failure must not hide the others' results
            report.check(sec, f"{mode}: RLOO steps run", False, f"{type(err).__name__}: {err}",
                         detail=traceback.format_exc(limit=8))
        finally:
            release(dev)
        report.write()


def _train_mode(report, result, base: Path, rows, shape: CheckShape, arch, mode: str, dev, state_dir: Path,
                master_check: bool, speed: bool = False, deadline: float | None = None) -> None:
    from transformers import AutoModelForCausalLM

    from softtokens.sizing.plan import TrainJob, train_memory
    from softtokens.train.config import TrainConfig
    from softtokens.train.loop import Trainer
    from softtokens.train.sharding import (
        full_state_dict,
        load_optimizer,
        optimizer_state_tensors,
        save_optimizer_async,
    )

    sec = "training"
    settings = {**shape.rl, "mode": mode, "seed": 0, "lr": shape.lr, "resume_save_steps": 10**9,
                # judged here against the paper grid's bounds instead of stopping the step
                "replay_h0_gap_max": math.inf, "replay_argmax_mismatch_max": 1.0}
    cfg = TrainConfig.from_settings(settings)
    bounds = TrainConfig.from_settings({**shape.rl, "mode": mode, "seed": 0, "lr": shape.lr})
    phases: dict[str, float] = {}

    class MeasuredTrainer(Trainer):
        def rollouts(self, step):
            reset_peak(dev)
            got = super().rollouts(step)
            phases["rollout"] = peak_bytes(dev) or 0.0
            reset_peak(dev)
            return got

    t0 = time.perf_counter()
    trainer = MeasuredTrainer(cfg, str(base), rows["train"], rows["validation"], state_dir, grader=synthetic_grade)
    result["seconds_load"] = round(time.perf_counter() - t0, 1)
    result["processes"] = trainer.dp.world
    before = {k: v.clone() for k, v in full_state_dict(trainer.policy).items()} if master_check and not speed \
        else None
    steps = result["steps"] = []
    prompt_len, held = 0, None
    for step in range(shape.train_steps):
        if steps and deadline is not None and time.monotonic() > deadline:
            result["cut"] = f"at its deadline, after {len(steps)} step(s)"
            break
        held = allocated_bytes(dev)
        row = trainer.train_step(step)
        sync(dev)
        phases["update"] = peak_bytes(dev) or 0.0
        prompt_len = max(prompt_len, int(trainer.engine.encode_prompts(
            [format_prompt(p["question"]) for p in trainer.prompts_for_step(step)])[1].sum(1).max()))
        micro_batches = math.ceil(shape.rows / trainer.dp.world / cfg.micro_batch_size)
        steps.append({k: row[k] for k in ("seconds_rollout", "seconds_reward", "seconds_update", "reward",
                                          "reward_std", "grad_norm", "entropy", "replay_h0_gap", "replay_h0_gap_flipped",
                                          "replay_argmax_mismatch", "replay_argmax_flips", "replay_flip_gap_max",
                                          "completions/mean_length")}
                     | {"seconds_step": round(row["seconds_rollout"] + row["seconds_reward"] + row["seconds_update"], 3),
                        "micro_batches": micro_batches, "micro_batch_size": cfg.micro_batch_size,
                        "seconds_update_per_micro_batch": round(row["seconds_update"] / micro_batches, 3),
                        "update_tokens": row.get("update_tokens"),
                        "held_GB": gb(held), "rollout_peak_GB": gb(phases.get("rollout")),
                        "update_peak_GB": gb(phases.get("update")),
                        "reserved_peak_GB": gb(torch.cuda.max_memory_reserved(dev)) if dev.type == "cuda" else None})
        print(f"[gpu-check] training {mode} step {step + 1}: {steps[-1]}", flush=True)
        report.write()   # every measured step on disk: a cut run keeps it
    last = steps[-1]
    report.check(sec, f"{mode}: {len(steps)} RLOO steps run", True,
                 f"{last['seconds_step']} s/step (rollout {last['seconds_rollout']}, update {last['seconds_update']})")
    if mode != "hard":
        gap = last["replay_h0_gap"]
        report.check(sec, f"{mode}: replay h0 gap (steps that did not flip)",
                     gap is not None and gap <= bounds.replay_h0_gap_max, gap,
                     f"<= {bounds.replay_h0_gap_max} (rl.replay_h0_gap_max)")
    mismatch = max(s["replay_argmax_mismatch"] for s in steps)
    report.check(sec, f"{mode}: replay argmax mismatch (> {bounds.replay_logit_tolerance} nat)",
                 mismatch <= bounds.replay_argmax_mismatch_max, mismatch,
                 f"<= {bounds.replay_argmax_mismatch_max} (rl.replay_argmax_mismatch_max)")
    flips, gap = max(s["replay_argmax_flips"] for s in steps), max(s["replay_flip_gap_max"] for s in steps)
    report.check(sec, f"{mode}: replay argmax flips at near ties (bf16 noise)", None,
                 f"{flips:.4f} of CoT steps, largest gap {gap:.3f} nats", "reported")

    # memory: the last step beside the plan of that step (a one-step check measures the first step, before
    # AdamW has state: sizing.plan's first_step; from the second step on, the steady state)
    job = TrainJob(processes=trainer.dp.world, rows=shape.rows, micro_batch=cfg.micro_batch_size,
                   prompt_tokens=prompt_len, cot_tokens=cfg.cot_max_tokens, answer_tokens=cfg.answer_max_tokens,
                   continuous=mode != "hard", param_dtype=cfg.param_dtype, compute_dtype=cfg.compute_dtype,
                   checkpointing=cfg.activation_checkpointing, optimizer=trainer.optimizer_kind,
                   val_rows=cfg.val_batch_size, val_cot_tokens=cfg.validation_cot_max_tokens)
    plan = train_memory(arch, job, first_step=len(steps) == 1)
    planned = {phase: plan[phase] for phase in ("held", "rollout", "update")}
    result["optimizer"] = trainer.optimizer_kind
    measured = {"held": held, "rollout": phases.get("rollout"), "update": phases.get("update")} \
        if dev.type == "cuda" else {}
    result["memory"] = {"planned_GB": {k: gb(v) for k, v in planned.items()},
                        "measured_GB": {k: gb(v) for k, v in measured.items()},
                        "plan_terms_GB": {k: gb(v) for k, v in plan.items()},
                        "measured_peak_GB": gb(max(measured.values())) if measured else None,
                        "planned_peak_GB": gb(plan["peak"])}
    for phase in ("held", "rollout", "update"):
        memory_check(report, sec, f"{mode}: {phase} memory per GPU", measured.get(phase), planned[phase],
                      {k: gb(v) for k, v in plan.items()})

    report.write()
    if master_check:   # the loop's other phases, at the plan's rows: what `auto` sized (sizing.plan)
        _loop_phases(report, result, trainer, rows, len(steps), arch, job, dev, mode)
    if master_check or speed:   # one more update, profiled (gpucheck.update_profile): the first mode, or each
        from softtokens.gpucheck.update_profile import profile_update

        reset_peak(dev)
        prof = result["update_profile"] = profile_update(trainer, len(steps), dev, arch.parameters,
                                                          cfg.activation_checkpointing)
        # AdamW has state now whatever the steps before: the update's steady-state peak beside its plan
        steady = train_memory(arch, job, first_step=False)
        memory_check(report, sec, f"{mode}: update memory per GPU after a warm step (steady state)",
                     peak_bytes(dev) if dev.type == "cuda" else None, steady["update"],
                     {k: gb(v) for k, v in steady.items()})
        report.write()
        print(f"[gpu-check] training {mode} update profile: " + str({k: v for k, v in prof.items()
                                                                      if k != "top_kernels"}), flush=True)
        report.check(sec, f"{mode}: host reads in one update's loss pass (micro-batch {prof['micro_batch_size']}, "
                          f"{prof['micro_batches']} micro-batches)", prof["host_reads"] <= 1, prof["host_reads"],
                     "<= 1 (the sums, read once)")
        report.check(sec, f"{mode}: update TFLOP/s, share of the card's bf16 GEMM", None,
                     f"{prof['tflops']} TFLOP/s" + (f", {prof['share_of_card']:.0%} of {prof['card_bf16_tflops']}"
                                                    if prof["share_of_card"] is not None else ""), "reported")
        report.check(sec, f"{mode}: update time against the forecast of its shape", None,
                     f"{prof['seconds']} s measured, {prof['forecast_seconds']} s forecast "
                     f"({prof['measured_over_forecast']}x)", "reported")
    if master_check and not speed:   # the correctness round trips: moved entries, checkpoint, optimizer state
        after = full_state_dict(trainer.policy)
        moved = {k: float((after[k] != before[k]).float().mean()) for k in after if after[k].is_floating_point()}
        total = sum(after[k].numel() for k in moved)
        share = sum(moved[k] * after[k].numel() for k in moved) / total
        worst = min(moved, key=moved.get)
        result["master_moved"] = {"share": share, "least_moved": worst, "least_share": moved[worst]}
        report.check(sec, f"{mode}: float32 master entries moved by {len(steps) + 1} AdamW steps", share >= MOVED_MIN,
                     round(share, 5), f">= {MOVED_MIN} (least: {worst} {moved[worst]:.4f})")
        del before

        # the checkpoint a run writes, loaded the way a user loads it
        t0 = time.perf_counter()
        trainer.save("best", len(steps), with_optimizer=False)
        result["seconds_save_blocking"] = round(time.perf_counter() - t0, 2)   # staged; written in the background
        trainer.store.wait()
        saved = trainer.store.best_dir(len(steps))
        result["seconds_save"] = round(time.perf_counter() - t0, 1)
        if trainer.dp.is_main:
            plain = AutoModelForCausalLM.from_pretrained(saved, dtype=torch.float32)
            same = all(torch.equal(v, after[k]) for k, v in plain.state_dict().items() if k in after)
            report.check(sec, f"{mode}: checkpoint reloads with plain from_pretrained, master weights equal", same,
                         "equal" if same else "differ", "bit for bit")
            del plain
            # as evaluation loads a checkpoint (model.loading.load_model): from_pretrained in the compute dtype
            plain = AutoModelForCausalLM.from_pretrained(saved, dtype=trainer.rollout_model.dtype).to(dev).eval()
            ids = trainer.engine.encode_prompts(prompts_of(rows["train"], 4))
            with torch.no_grad():
                got = plain(input_ids=ids[0], attention_mask=ids[1]).logits.float()
                ref = trainer.rollout_model(input_ids=ids[0], attention_mask=ids[1]).logits.float()
            diff = float((got - ref).abs().max())
            report.check(sec, f"{mode}: reloaded checkpoint's logits equal the rollout copy's", diff == 0.0, diff,
                         "0 (both are the bf16 rounding of the same master)")
            del plain, got, ref
        del after
        # the sharded AdamW state: saved and loaded back with torch.distributed.checkpoint
        t0 = time.perf_counter()
        path = state_dir / "optimizer-check"
        save_optimizer_async(trainer.policy, trainer.opt, path, trainer.dp.save_group).result()
        kept = [t.detach().clone() for t in optimizer_state_tensors(trainer.opt)[:4]]
        for t in optimizer_state_tensors(trainer.opt)[:4]:
            t.zero_()
        load_optimizer(trainer.policy, trainer.opt, path)
        back = optimizer_state_tensors(trainer.opt)[:4]
        same = len(kept) > 0 and all(torch.equal(a.full_tensor() if hasattr(a, "full_tensor") else a,
                                                 b.full_tensor() if hasattr(b, "full_tensor") else b)
                                     for a, b in zip(kept, back))
        result["seconds_optimizer_round_trip"] = round(time.perf_counter() - t0, 1)
        report.check(sec, f"{mode}: sharded optimizer state saved and loaded (torch.distributed.checkpoint)", same,
                     f"{'equal' if same else 'differ'}, {result['seconds_optimizer_round_trip']} s")
    trainer.close()
    del trainer
    shutil.rmtree(state_dir, ignore_errors=True)


def _loop_phases(report, result, trainer, rows, done: int, arch, job, dev, mode: str) -> None:
    """Greedy validation at the plan's slots (val_batch_size rows at once, its CoT cap) and a staged save of the
    resume state, each's device peak beside its phase of the plan (after a step: AdamW has state), and the time a
    save blocks the run (what the forecast's staging rate is: rates.throughput.STAGING_GBPS)."""
    from softtokens.sizing.plan import train_memory

    sec, cfg = "training", trainer.cfg
    plan = train_memory(arch, job, first_step=False)
    terms = {k: gb(v) for k, v in plan.items()}
    trainer.val_rows = [rows["train"][i % len(rows["train"])] for i in range(cfg.val_batch_size * trainer.dp.world)]
    reset_peak(dev)
    t0 = time.perf_counter()
    trainer.validate(done)
    sync(dev)
    result["validation"] = {"rows_at_once": cfg.val_batch_size, "cot": cfg.validation_cot_max_tokens,
                            "seconds": round(time.perf_counter() - t0, 2), "peak_GB": gb(peak_bytes(dev)),
                            "planned_GB": gb(plan["validation"])}
    memory_check(report, sec, f"{mode}: greedy validation memory per GPU ({cfg.val_batch_size} rows at once)",
                 peak_bytes(dev) if dev.type == "cuda" else None, plan["validation"], terms)
    report.write()
    reset_peak(dev)
    t0 = time.perf_counter()
    trainer.save("latest", done, with_optimizer=True)
    sync(dev)
    blocking = time.perf_counter() - t0
    peak = peak_bytes(dev)
    trainer.store.wait()
    result["staged_save"] = {"seconds_blocking": round(blocking, 2), "seconds": round(time.perf_counter() - t0, 2),
                             "peak_GB": gb(peak), "planned_GB": gb(plan["staged save"])}
    memory_check(report, sec, f"{mode}: a staged save's memory per GPU (weights and AdamW state)",
                 peak if dev.type == "cuda" else None, plan["staged save"], terms)
    report.check(sec, f"{mode}: seconds a save of the resume state blocks the run (staged to host memory)", None,
                 result["staged_save"]["seconds_blocking"], "reported (the forecast's staging rate)")
    report.write()
