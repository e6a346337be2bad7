"""Every result path of the layout, built and parsed in one place (DESIGN.md, "Result paths").

Why one module: the rules name files, reporting and the ledger read them back, and the audit
follows them; when each did its own path arithmetic, a new key (the ablation variant) would have
had to be taught to all of them and one would have been missed. A run is (model, dataset, mode,
variant, seed). The paper's main cells are the default variant ``""`` and keep their paths; a
variant adds ``@{variant}`` to the mode ("arm"):

    {results}/runs/{model}/{dataset}/{arm}/seed{seed}/          metrics.jsonl, selected.json, checkpoints/
    {results}/eval/{model}/{trained}/{benchmark}/{setting}.json  trained = base | {dataset}-{arm}-seed{seed}
    arm = {mode} | {mode}@{variant}          e.g. fuzzy, fuzzy@gamma1.0, soft@logits-top5

Dataset names hold no '-' (config.check_config), modes are fixed words and '@' appears in no
other key, so every path parses back to its keys without ambiguity.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import NamedTuple

MODES = ("hard", "soft", "fuzzy")
VARIANT_RE = r"[A-Za-z0-9_.+-]+"
DATASET_RE = r"[A-Za-z0-9_.]+"
# Snakemake wildcard constraints (rules/common.smk), the same patterns the parsers below use
ARM_RE = rf"(?:hard|soft|fuzzy)(?:@{VARIANT_RE})?"
TRAINED_RE = rf"base|{DATASET_RE}-{ARM_RE}-seed\d+"
_ARM = re.compile(rf"(?P<mode>hard|soft|fuzzy)(?:@(?P<variant>{VARIANT_RE}))?")
_TRAINED = re.compile(rf"(?P<dataset>{DATASET_RE})-(?P<arm>{ARM_RE})-seed(?P<seed>\d+)")


class Run(NamedTuple):
    """One training run of a grid."""

    model: str
    dataset: str
    mode: str
    variant: str
    seed: int

    @property
    def arm(self) -> str:
        return arm(self.mode, self.variant)

    @property
    def trained(self) -> str:
        """The run's name in evaluation paths."""
        return f"{self.dataset}-{self.arm}-seed{self.seed}"

    @property
    def wildcards(self) -> str:
        """model/dataset/arm/seed{seed}: how logs and benchmark files name the run's jobs."""
        return f"{self.model}/{self.dataset}/{self.arm}/seed{self.seed}"


def arm(mode: str, variant: str = "") -> str:
    if mode not in MODES:
        raise ValueError(f"unknown training mode {mode!r} (one of {', '.join(MODES)})")
    if variant and not re.fullmatch(VARIANT_RE, variant):
        raise ValueError(f"variant {variant!r}: use letters, digits and _ . + - only")
    return f"{mode}@{variant}" if variant else mode


def parse_arm(text: str) -> tuple[str, str]:
    """'fuzzy@gamma1.0' -> ('fuzzy', 'gamma1.0'); 'soft' -> ('soft', '')."""
    m = _ARM.fullmatch(text)
    if not m:
        raise ValueError(f"{text!r} is not a training arm (mode or mode@variant)")
    return m["mode"], m["variant"] or ""


def parse_trained(text: str) -> Run | None:
    """'gsm8k-fuzzy@tau0.01-seed1' -> Run('', 'gsm8k', 'fuzzy', 'tau0.01', 1) (no model); 'base' -> None."""
    if text == "base":
        return None
    m = _TRAINED.fullmatch(text)
    if not m:
        raise ValueError(f"{text!r} is not 'base' or '{{dataset}}-{{mode}}[@{{variant}}]-seed{{seed}}'")
    mode, variant = parse_arm(m["arm"])
    return Run("", m["dataset"], mode, variant, int(m["seed"]))


def run_dir(results: str, run: Run) -> str:
    return f"{results}/runs/{run.model}/{run.dataset}/{run.arm}/seed{run.seed}"


def eval_path(results: str, model: str, trained: str, benchmark: str, setting: str) -> str:
    return f"{results}/eval/{model}/{trained}/{benchmark}/{setting}.json"


def loglik_path(results: str, model: str, trained: str, benchmark: str) -> str:
    return f"{results}/eval/{model}/{trained}/{benchmark}/loglik.json"


def data_path(results: str, dataset: str, split: str) -> str:
    return f"{results}/data/{dataset}/{split}.jsonl"


def parse_eval_path(path: str | Path) -> dict:
    """.../eval/{model}/{trained}/{benchmark}/{setting}.json -> model, train_dataset, train_mode,
    variant, seed, benchmark, setting (a base model: training 'none', seed 0)."""
    p = Path(path)
    setting, benchmark, trained, model = p.stem, p.parent.name, p.parent.parent.name, p.parent.parent.parent.name
    run = parse_trained(trained)
    if run is None:
        dataset, mode, variant, seed = "none", "none", "", 0
    else:
        dataset, mode, variant, seed = run.dataset, run.mode, run.variant, run.seed
    return {"model": model, "train_dataset": dataset, "train_mode": mode, "variant": variant, "seed": seed,
            "benchmark": benchmark, "setting": setting}


def parse_run_path(path: str | Path) -> dict:
    """.../runs/{model}/{dataset}/{arm}/seed{seed}/{file} -> model, train_dataset, train_mode, variant, seed."""
    seed_dir = Path(path).parent
    mode, variant = parse_arm(seed_dir.parent.name)
    return {"model": seed_dir.parent.parent.parent.name, "train_dataset": seed_dir.parent.parent.name,
            "train_mode": mode, "variant": variant, "seed": int(seed_dir.name.removeprefix("seed"))}


def eval_run(keys: dict) -> Run | None:
    """The training run behind an evaluation file's keys (parse_eval_path), None for a base model."""
    if keys["train_mode"] == "none":
        return None
    return Run(keys["model"], keys["train_dataset"], keys["train_mode"], keys.get("variant", "") or "",
               int(keys["seed"]))


# Snakemake patterns of the same paths (wildcards in braces), for the rules' inputs and outputs
def run_pattern(results: str) -> str:
    return f"{results}/runs/{{model}}/{{dataset}}/{{arm}}/seed{{seed}}"


def eval_pattern(results: str) -> str:
    return eval_path(results, "{model}", "{trained}", "{benchmark}", "{setting}")


def loglik_pattern(results: str) -> str:
    return loglik_path(results, "{model}", "{trained}", "{benchmark}")


def data_pattern(results: str, split: str) -> str:
    return data_path(results, "{dataset}", split)
