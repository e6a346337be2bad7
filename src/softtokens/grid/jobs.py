"""What the workflow of one grid builds and how each job runs: targets, per-job settings and
resources, as plain Python that the Snakemake rules call (workflow/rules/common.smk).

Why here and not in the Snakefile: how an evaluation is configured, which runs an ablation row
reads, how many GPUs a training job takes decide what a number in a table means. As Python they
are unit-tested directly (tests/test_jobs.py), not only through a dry run of Snakemake; the rules
only name files and pass these settings on the command line."""

from __future__ import annotations

import functools
import json
import shlex

from softtokens.store import paths
from softtokens.config.grids import cell_grid, cell_lr, cell_rl, resolved_logging, train_processes
from softtokens.config.readings import validation_cot_cap
from softtokens.config.settings import CellSettings
from softtokens.config.names import COT_KEYS, PLACEMENT_KEYS, TOY_SOURCE, built_by_workflow, packaged_name
from softtokens.store.paths import Run, parse_arm, parse_trained
from softtokens.store.provenance import config_hash
from softtokens.grid.resources import JobResources
from softtokens.grid.targets import GridTargets, dumps

def expect_args(pairs: list[tuple[str, dict]]) -> str:
    """`--expect PATH=HASH ...`: what the current config gives each upstream output's job, which
    the job compares with the output's provenance (provenance.check_expected; stale: it stops)."""
    items = [f"{path}={config_hash(settings)}" for path, settings in pairs]
    return "--expect " + " ".join(items) if items else ""


class GridJobs(GridTargets):
    """The jobs of ``config["grid"]``: its targets (grid.targets) and each job's settings, expected
    upstream provenance and resources."""

    # ------------------------------------------------------------ per-job settings
    def dataset_settings(self, dataset: str) -> str:
        return dumps(self.grid["datasets"][dataset])

    def model_source(self, model: str) -> str:
        """The directory a job builds (the toy base, a packaged model) or the hub id / local path of a base model."""
        src = self.grid["models"][model]["source"]
        return paths.model_dir(self.results, model) if built_by_workflow(src) else src

    def base_model_input(self, model: str) -> list[str]:
        """A built base is a DAG output; a hub model or a local directory is read by the job itself (and recorded
        there as a leaf of the provenance chain)."""
        return [self.model_source(model)] if built_by_workflow(self.grid["models"][model]["source"]) else []

    def built_models(self, kind: str) -> list[str]:
        """The grid's models a job builds: ``toy`` (build_toy_base) or ``packaged`` (build_packaged_base)."""
        sources = {m: s["source"] for m, s in self.grid["models"].items()}
        if kind == "toy":
            return [m for m, s in sources.items() if s == TOY_SOURCE]
        return [m for m, s in sources.items() if packaged_name(s) is not None]

    def packaged_settings(self, model: str) -> str:
        """What a packaged base is built from (its pin lives with the registry: model.packaged)."""
        return dumps({"source": self.grid["models"][model]["source"]})

    def toy_base_settings(self) -> str:
        s = dict(self.grid["toy_base"])
        s.update(cot_max_tokens=self.rl["cot_max_tokens"], answer_max_tokens=self.rl["answer_max_tokens"])
        return dumps(s)

    def train_settings(self, model: str, dataset: str, arm: str, seed: int | str) -> str:
        """A run's settings: its cell's rl (with `auto` memory settings chosen by the memory plan, where
        the workflow hands in the resolver), mode, seed and learning rate."""
        mode, variant = parse_arm(arm)
        grid = cell_grid(self.config, self.name, model, dataset, variant)   # another grid's name: its settings
        rl = cell_rl(self.config, grid, model, dataset, variant)
        rl["validation_cot_max_tokens"] = validation_cot_cap(rl, self.config["grids"][grid]["evaluation"])
        if self.resolve_rl is not None:
            rl = self.resolve_rl(self.config, grid, model, rl, mode != "hard")
        s = dict(rl, mode=mode, seed=int(seed), lr=cell_lr(self.config, grid, model, dataset, variant))
        if variant:  # recorded in provenance; the default runs' settings stay as they were
            s["variant"] = variant
        return dumps(s)

    def run_settings(self, run: Run) -> dict:
        """A run's resolved training settings (train_settings, as a dict)."""
        return json.loads(self.train_settings(run.model, run.dataset, run.arm, run.seed))

    def cell(self, run: Run) -> CellSettings:
        """A run's settings resolved once (config.settings): what prices, sizes or runs it reads, field by field."""
        rl = self.run_settings(run)
        data = self.grid["datasets"][run.dataset]
        return CellSettings(run.model, run.dataset, run.mode, run.variant, run.seed, rl,
                            train_processes(self.grid, run.model),
                            min(int(rl["val_size"]), int(data.get("validation_size", rl["val_size"]))))

    def logging_settings(self) -> str:
        """The config's `logging` block (train.telemetry): where runs mirror their TensorBoard stream."""
        return dumps(resolved_logging(self.config))

    def eval_settings(self, model: str, trained: str) -> str:
        """An evaluation's settings. The six inference settings derive from Section 4's CoT keys (τ, γ,
        the embedding placement: the grid's `rl`), whatever an ablation run trained with, as the paper
        evaluates its ablations; `evaluation.inference_settings: run` takes the run's own keys instead."""
        keys = ("n_samples", "cot_max_tokens", "answer_max_tokens", "batch_size", "seed")
        s = {k: self.eval[k] for k in keys}
        s["dtype"] = self.rl["compute_dtype"]
        s["grading_timeout_s"] = self.rl["grading_timeout_s"]
        rl, run = self.rl, parse_trained(trained)
        if run is not None and self.eval["inference_settings"] == "run":
            rl = cell_rl(self.config, self.name, model, run.dataset, run.variant)
        s.update({k: rl[k] for k in (*COT_KEYS, *PLACEMENT_KEYS)})
        return dumps(s)

    def loglik_settings(self) -> str:
        """An out-of-domain evaluation's settings: its protocol (eval.ood), the CoT and answer budgets
        and decode batch of the math evaluations (the generative protocol decodes as they do)."""
        ev = self.eval
        return dumps({"protocol": ev["ood_protocol"], "loglik_batch_size": ev["loglik_batch_size"],
                       "batch_size": ev["batch_size"], "cot_max_tokens": ev["cot_max_tokens"],
                       "answer_max_tokens": ev["answer_max_tokens"], "dtype": self.rl["compute_dtype"]})

    def report_settings(self) -> str:
        return dumps({"grid": self.name, "n_samples": self.eval["n_samples"]})

    def figure_settings(self, name: str) -> str:
        """One figure's job: the grid and what the figure is (report.figures.write_figure)."""
        return dumps({"grid": self.name, "figure": self.figures.specs()[name]})

    def reproduction_settings(self) -> str:
        # the config itself: the report's cost forecast (cost.forecast) recomputes every job's
        return dumps({"grid": self.name, "toy": "toy_base" in self.grid, "gpus": self.ledger_gpus(),
                      "config": self.config, **self.paper_results()})

    def paper_claims_settings(self) -> str:
        """The paper_claims job's settings: what judging the paper's numbers reads of the config (its judging block,
        a numbers file of the user's)."""
        return dumps({"judging": self.config.get("judging") or {}, **self.paper_results()})

    def paper_results(self) -> dict:
        """The paper-numbers file the config names instead of the shipped one ({} for the shipped)."""
        return {"paper_results": self.config["paper_results"]} if self.config.get("paper_results") else {}

    def eval_model_input(self, model: str, trained: str) -> list[str]:
        if trained == "base":
            return self.base_model_input(model)
        return [self.run_file(parse_trained(trained)._replace(model=model), paths.SELECTED)]

    def eval_model_arg(self, model: str, trained: str) -> str:
        if trained == "base":
            return f"--model {self.model_source(model)}"
        return f"--selected {self.eval_model_input(model, trained)[0]}"

    # ------------------------------------------------------------ one job per evaluated model (a CPU grid)
    @property
    def per_model_eval(self) -> bool:
        """Whether one evaluate job makes an evaluated model's every file (evaluation.one_job_per_setting: false)."""
        return not self.eval["one_job_per_setting"]

    def model_eval_outputs(self, model: str = "{model}", trained: str = "{trained}") -> list[str]:
        """The files of one evaluated model's job: every setting on every benchmark, then every out-of-domain set."""
        return [*(paths.eval_path(self.results, model, trained, b, s) for b in self.eval["benchmarks"]
                  for s in self.eval["settings"]),
                *(paths.loglik_path(self.results, model, trained, b) for b in self.ood)]

    def model_eval_data(self) -> list[str]:
        """The test sets one evaluated model's job reads (every benchmark's, then every out-of-domain set's)."""
        return [paths.data_path(self.results, b, "test") for b in (*self.eval["benchmarks"], *self.ood)]

    def model_eval_plan(self, model: str, trained: str) -> str:
        """What one evaluated model's job writes, from which test set (commands.evaluate's evaluate-model)."""
        math = [{"benchmark": b, "data": paths.data_path(self.results, b, "test"), "settings": list(self.eval["settings"]),
                 "out": [paths.eval_path(self.results, model, trained, b, s) for s in self.eval["settings"]]}
                for b in self.eval["benchmarks"]]
        ood = [{"benchmark": b, "data": paths.data_path(self.results, b, "test"),
                "out": paths.loglik_path(self.results, model, trained, b)} for b in self.ood]
        return dumps({"math": math, "ood": ood})

    def model_eval_expect(self, model: str, trained: str) -> str:
        base = self._base_expect(model) if trained == "base" else []
        return expect_args([e for b in (*self.eval["benchmarks"], *self.ood) for e in self._data_expect(b, ("test",))]
                           + base)

    # ------------------------------------------------------------ provenance expectations
    def _data_expect(self, dataset: str, splits: tuple[str, ...]) -> list[tuple[str, dict]]:
        return [(paths.data_path(self.results, dataset, split), self.grid["datasets"][dataset]) for split in splits]

    def _base_expect(self, model: str) -> list[tuple[str, dict]]:
        source = self.grid["models"][model]["source"]
        if source == TOY_SOURCE:
            return [(self.model_source(model), json.loads(self.toy_base_settings()))]
        if packaged_name(source) is not None:
            return [(self.model_source(model), json.loads(self.packaged_settings(model)))]
        return []

    def train_expect(self, model: str, dataset: str) -> str:
        return expect_args(self._data_expect(dataset, ("train", "validation")) + self._base_expect(model))

    def eval_expect(self, model: str, trained: str, benchmark: str) -> str:
        base = self._base_expect(model) if trained == "base" else []
        return expect_args(self._data_expect(benchmark, ("test",)) + base)

    def toy_base_expect(self) -> str:
        return expect_args(self._data_expect(self.toy_base_dataset, ("train", "validation")))

    # ------------------------------------------------------------ resources
    # ------------------------------------------------------------ resources (grid.resources)
    @functools.cached_property
    def job_resources(self) -> JobResources:
        return JobResources(self.grid, self.environ, self.host_mb)

    def resources(self, kind: str) -> dict:
        return self.job_resources.resources(kind)

    def threads(self, kind: str, model: str | None = None) -> int:
        return self.job_resources.threads(kind, model)

    def ledger_gpus(self) -> dict:
        return self.job_resources.ledger_gpus()

    def gpu_rule_env(self) -> str:
        return self.job_resources.gpu_rule_env()

    def select_args(self, model: str, dataset: str, arm: str, seed: str) -> str:
        """The select command's inputs (grid.identity); a shared run's settings too (held against the run's:
        train.selection)."""
        ins = self.names.select_inputs(model, dataset, arm, seed)
        if "shared" in ins:
            return f"--share {ins['shared']} --settings {shlex.quote(self.train_settings(model, dataset, arm, seed))}"
        return f"--metrics {ins['metrics']} --checkpoints {ins['checkpoints']}"

