"""Where the gradient of a fuzzy spike step comes from (issue 14), by replaying a finished run.

A run is deterministic on CPU, so its steps can be replayed from its base model and settings
(its checkpoint's trainer_state.json) to any step. At each of the run's first spike steps
(fuzzy_spikes.spike_steps) the update pass is computed three ways, without updating:
  none       the paper's loss (its norm must equal the run's logged one: the replay is faithful);
  >J         the softmax's Jacobian cut (p detached) at the CoT steps whose top-two scale p1 p2 / tau
             exceeds J (J = 100, 10, 1), everything else as in `none`;
  all        p detached at every CoT step: the Gaussian term then reaches theta only through E.
It also lists the CoT steps with p1 p2 / tau > 1 (their two tokens, weights, advantage) and, for
every replayed step, the size of the AdamW update ||theta_{t+1} - theta_t|| on E and on the rest.
Usage: python analysis/spike_sources.py RUN_DIR [N_SPIKES=2] [AFTER=10] [FACTOR=10]
  RUN_DIR: e.g. results/toy-long/runs/toy/toyarith/fuzzy/seed0 (its checkpoints/latest and metrics.jsonl)
Writes RUN_DIR/../../../../../analysis/spike_sources-<arm>-seed<s>.json.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import tempfile
from pathlib import Path

import torch

from softtokens.engine.rollout import COT
from softtokens.model.checkpoint import TrainerState
from softtokens.train import rloo
from softtokens.train.config import TrainConfig
from softtokens.train.loop import Trainer
from softtokens.train.rloo import LOGIT_CHUNK_STEPS
from softtokens.train.update import accumulate_gradients

sys.path.insert(0, str(Path(__file__).parent))
from fuzzy_spikes import spike_steps  # noqa: E402

CUTS = ("none", ">100", ">10", ">1", "all")


class _Softmax:
    """Stands for `torch` inside rloo: its softmax detaches p where asked and records what it saw."""

    def __init__(self, cut: str, temperature: float):
        self.cut, self.temperature, self.seen = cut, temperature, []

    def __getattr__(self, name):
        return getattr(torch, name)

    def softmax(self, x, dim=-1):
        p = torch.softmax(x, dim=dim)
        top2 = p.detach().topk(2, dim=-1)
        self.seen.append(top2)
        if self.cut == "none":
            return p
        if self.cut == "all":
            return p.detach()
        scale = top2.values[..., 0] * top2.values[..., 1] / self.temperature
        return torch.where((scale > float(self.cut.removeprefix(">"))).unsqueeze(-1), p.detach(), p)


def _dense(t: torch.Tensor) -> torch.Tensor:
    """A (possibly FSDP-sharded) tensor as one plain tensor."""
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def group_norms(policy) -> dict:
    emb = policy.lm.get_input_embeddings().weight
    sq = {"embedding": 0.0, "rest": 0.0}
    for p in policy.parameters():
        if p.grad is not None:
            sq["embedding" if p is emb else "rest"] += float(_dense(p.grad).float().pow(2).sum())
    return {k: v ** 0.5 for k, v in sq.items()}


def gradients_at(trainer: Trainer, step: int, cut: str) -> dict:
    """The update pass of `step` (Trainer.rollouts, train.update.accumulate_gradients) with the softmax
    Jacobian cut as asked; no optimiser step."""
    cfg = trainer.cfg
    rollout, _, _, adv, n, _ = trainer.rollouts(step)
    proxy = _Softmax(cut, cfg.cot_setting.temperature)
    real, rloo.torch = rloo.torch, proxy
    try:
        trainer.opt.zero_grad(set_to_none=True)
        accumulate_gradients(trainer.policy, rollout, adv, n, cfg, trainer.sigma, trainer.engine.vocab_rows,
                             trainer.gaussian_scale)
        norm = sum(float(_dense(p.grad).float().pow(2).sum()) for p in trainer.policy.parameters()
                   if p.grad is not None) ** 0.5
        groups = group_norms(trainer.policy)
    finally:
        rloo.torch = real
        trainer.opt.zero_grad(set_to_none=True)
    # what the softmax saw: one (rows, steps) top-two per micro-batch and chunk of steps, in order
    blocks = [(start, lo) for start in range(0, len(adv), cfg.micro_batch_size)
              for lo in range(0, rollout.step_ids.shape[1], LOGIT_CHUNK_STEPS)]
    if len(blocks) != len(proxy.seen):
        raise RuntimeError(f"{len(proxy.seen)} softmax calls for {len(blocks)} blocks (recomputed chunks?)")
    ties = []
    for (start, lo), top2 in zip(blocks, proxy.seen):
        v, i = top2.values, top2.indices
        phase = rollout.step_phase[start:start + v.shape[0], lo:lo + v.shape[1]]
        scale = v[..., 0] * v[..., 1] / cfg.cot_setting.temperature
        for r, c in ((scale > 1.0) & (phase == COT)).nonzero().tolist():
            ties.append({"row": start + r, "cot_step": lo + c, "advantage": float(adv[start + r]),
                         "p1_p2_over_tau": float(scale[r, c]),
                         "tokens": [trainer.tokenizer.decode([int(t)]) for t in i[r, c]],
                         "weights": [float(x) for x in v[r, c]]})
    ties.sort(key=lambda t: -t["p1_p2_over_tau"])
    return {"cut": cut, "grad_norm": norm, "groups": groups, "jacobian_above_1": ties}


def main(argv: list[str]) -> None:
    run = Path(argv[0])
    n_spikes = int(argv[1]) if len(argv) > 1 else 2
    after = int(argv[2]) if len(argv) > 2 else 10
    factor = float(argv[3]) if len(argv) > 3 else 10.0
    state = dataclasses.asdict(TrainerState.read(run / "checkpoints" / "latest"))
    cfg = TrainConfig.from_settings(state["config"])
    metrics = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if x.strip()]
    train = [m for m in metrics if m["kind"] == "train"]
    spikes = spike_steps(train, factor)[:n_spikes]
    if not spikes:
        raise SystemExit(f"{run}: no spike step in {len(train)} steps")
    # paths in the state are relative to the workflow's directory: RUN_DIR is <it>/results/<grid>/runs/...
    workdir = run.resolve().parents[6]
    base_model = Path(state["base_model"]) if Path(state["base_model"]).is_absolute() else workdir / state["base_model"]
    data = run.resolve().parents[4] / "data"
    dataset = run.parent.parent.name
    rows = [json.loads(x) for x in (data / dataset / "train.jsonl").read_text().splitlines() if x.strip()]
    results = {"run": str(run), "config": state["config"], "spike_steps": [train[i]["step"] for i in spikes],
               "spikes": [], "replayed": []}
    with tempfile.TemporaryDirectory() as tmp:
        trainer = Trainer(cfg, str(base_model), rows, [], Path(tmp) / "_resume", threads=1)
        last = spikes[-1] + after
        for step in range(min(last + 1, len(train))):
            if step in spikes:
                at = {cut: gradients_at(trainer, step, cut) for cut in CUTS}
                results["spikes"].append({"step": step + 1, "logged_grad_norm": train[step]["grad_norm"],
                                          "logged_jacobian_max": train[step].get("jacobian_max"), **at})
                print(json.dumps({"step": step + 1, "logged": train[step]["grad_norm"],
                                  **{c: round(a["grad_norm"], 1) for c, a in at.items()},
                                  "jacobian_above_1": len(at["none"]["jacobian_above_1"])}), flush=True)
            emb = trainer.policy.lm.get_input_embeddings().weight
            before = [(p is emb, _dense(p.detach()).clone()) for p in trainer.policy.parameters()]
            row = trainer.train_step(step)
            moved = {"embedding": 0.0, "rest": 0.0}
            for p, (is_emb, b) in zip(trainer.policy.parameters(), before):
                moved["embedding" if is_emb else "rest"] += float((_dense(p.detach()) - b).pow(2).sum())
            results["replayed"].append({"step": step + 1, "grad_norm": row["grad_norm"],
                                        "logged_grad_norm": train[step]["grad_norm"],
                                        "update_norm": {k: v ** 0.5 for k, v in moved.items()},
                                        "jacobian_max": row["jacobian_max"], "near_ties": row["near_ties"]})
    out = run.parents[4] / "analysis" / f"spike_sources-{run.parent.name}-{run.name}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=1))
    print(f"wrote {out}")


if __name__ == "__main__":
    main(sys.argv[1:])
