"""Which figures a grid draws and what each reads: the training curves per (model, training set), pass@k and the
CoT entropy per (model, training set, benchmark), and the paper's Figure 3 (a model family's cells under hard
inference). A part of grid.targets.GridTargets (``grid.figures``), given the grid's targets: its runs, evaluation
block and results directory."""

from __future__ import annotations

from softtokens.store import paths
from softtokens.config.names import setting_mode


class FigureTargets:
    def __init__(self, targets):
        self.targets = targets

    def specs(self) -> dict[str, dict]:
        """Every figure of the grid by name: training curves per (model, training set); pass@k and CoT
        entropy per (model, training set, benchmark), as report.figures draws them ('base' for a model
        with no run)."""
        t = self.targets
        pairs = sorted({(r.model, r.dataset) for r in t.training_runs()})
        specs = {paths.figure_name("training", m, d): {"kind": "training", "model": m, "dataset": d} for m, d in pairs}
        per_run = pairs + [(m, "base") for m in sorted(set(t.eval["models"]) - {m for m, _ in pairs})]
        for kind in ("entropy", "passk"):
            for m, d in per_run:
                for b in t.eval["benchmarks"]:
                    specs[paths.figure_name(kind, m, d, b)] = {"kind": kind, "model": m, "dataset": d, "benchmark": b}
        # the paper's Figure 3 (tex 530-535, "Hard inference pass@k for Llama models"): every Llama (model,
        # training set) cell on every benchmark, hard inference only, in one figure
        family = [(m, d) for m, d in pairs if m.split("-")[0] == paths.FIG3_FAMILY]
        if family and t.eval["benchmarks"]:
            specs[paths.figure_name(paths.FIG3_KIND, paths.FIG3_FAMILY)] = {
                "kind": paths.FIG3_KIND, "family": paths.FIG3_FAMILY, "cells": [list(c) for c in family],
                "benchmarks": list(t.eval["benchmarks"])}
        return specs

    def files(self, ext: str = "png") -> list[str]:
        return [paths.figure_path(self.targets.results, n, ext) for n in self.specs()]

    def keys(self, kind: str) -> list[str]:
        """The part of each figure name of one kind after '{kind}_' (the figure rules' wildcard)."""
        return [n.removeprefix(f"{kind}_") for n, spec in self.specs().items() if spec["kind"] == kind]

    def inputs(self, name: str) -> dict[str, list[str]]:
        """What one figure reads: the training runs' metrics (training curves) or the evaluation files
        of its runs and base model on its benchmark (pass@k, entropy)."""
        t, spec = self.targets, self.specs()[name]
        if spec["kind"] == paths.FIG3_KIND:   # the hard settings of every cell's runs and their bases
            cells = {tuple(c) for c in spec["cells"]}
            trained = [(r.model, r.trained) for r in t.training_runs() if (r.model, r.dataset) in cells
                       and not r.variant]
            bases = [(m, "base") for m in sorted({m for m, _ in cells}) if m in t.eval["models"]]
            hard = [s for s in t.eval["settings"] if setting_mode(s) == "hard"]
            return {"metrics": [], "evals": [paths.eval_path(t.results, m, tr, b, s) for m, tr in bases + trained
                                             for b in spec["benchmarks"] for s in hard]}
        model, dataset = spec["model"], spec["dataset"]
        runs = [r for r in t.training_runs() if (r.model, r.dataset, r.variant) == (model, dataset, "")]
        if spec["kind"] == "training":
            return {"metrics": [t.run_file(r, paths.METRICS) for r in runs], "evals": []}
        base = ["base"] if model in t.eval["models"] else []
        return {"metrics": [], "evals": [paths.eval_path(t.results, model, tr, spec["benchmark"], s)
                                         for tr in base + [r.trained for r in runs] for s in t.eval["settings"]]}

