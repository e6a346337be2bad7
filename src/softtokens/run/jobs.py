"""What the workflow of one grid builds and how each job runs: targets, per-job settings and
resources, as plain Python that the Snakemake rules call (workflow/rules/common.smk).

Why here and not in the Snakefile: how an evaluation is configured, which runs an ablation row
reads, how many GPUs a training job takes decide what a number in a table means. As Python they
are unit-tested directly (tests/test_jobs.py), not only through a dry run of Snakemake; the rules
only name files and pass these settings on the command line."""

from __future__ import annotations

import json
import os

from softtokens.run import paths
from softtokens.run.config import cell_grid, cell_lr, cell_rl, resolved_logging
from softtokens.run.readings import validation_cot_cap
from softtokens.run.names import COT_KEYS, PLACEMENT_KEYS, TOY_SOURCE, built_by_workflow, packaged_name
from softtokens.run.paths import Run, parse_arm, parse_trained
from softtokens.run.provenance import config_hash
from softtokens.run.targets import GridTargets, dumps

SLURM_ENV = {"partition": "SOFTTOKENS_SLURM_PARTITION", "gpu_partition": "SOFTTOKENS_SLURM_GPU_PARTITION",
             "account": "SOFTTOKENS_SLURM_ACCOUNT"}

# Memory (MB) and time (minutes) of a job whose grid's `resources:` block does not say: on SLURM a
# job that asks for no memory is given a whole node's and jobs then run one at a time. Generous
# for the toy and small grids; the paper grid sets its own.
# A training job also asks SLURM for SIGUSR1 ten minutes before its time limit: it saves its
# resume state and exits, and the retry or requeue resumes (train.loop.Trainer.run).
DEFAULT_RESOURCES = {"train": {"mem_mb": 16000, "runtime": 720, "slurm_extra": "--signal=USR1@600"},
                     "evaluate": {"mem_mb": 16000, "runtime": 240},
                     "evaluate_loglik": {"mem_mb": 16000, "runtime": 120}, "cpu": {"mem_mb": 4000, "runtime": 60}}
GPU_KINDS = ("train", "evaluate", "evaluate_loglik")


def job_resources(grid: dict, kind: str, environ: dict | None = None) -> dict:
    """Resources of one kind of job from the grid's ``resources:`` block, plus the SLURM partition
    and account from the environment, so that nothing site-specific is in the repository. GPU
    jobs take SOFTTOKENS_SLURM_GPU_PARTITION, falling back to SOFTTOKENS_SLURM_PARTITION;
    an unset variable adds nothing (the plugin then uses the cluster's defaults), and
    ``--set-resources`` / ``--default-resources`` on the command line override all of it."""
    env = os.environ if environ is None else environ
    own = grid.get("resources", {}).get(kind, {})
    res = {k: v for k, v in DEFAULT_RESOURCES.get(kind, {}).items()
           if not (k == "mem_mb" and "mem_mb_per_cpu" in own)}
    res.update(own)
    partition = (env.get(SLURM_ENV["gpu_partition"]) if res.get("gpu", 0) > 0 else None) or env.get(SLURM_ENV["partition"])
    if partition:
        res["slurm_partition"] = partition
    if env.get(SLURM_ENV["account"]):
        res["slurm_account"] = env[SLURM_ENV["account"]]
    return res


def train_processes(grid: dict, model: str) -> int:
    """GPUs (one process each) of a model's training jobs: the model's ``train_gpus``, else the
    grid's ``resources.train.gpu``, else 1."""
    spec = grid["models"][model]
    return int(spec.get("train_gpus") or grid.get("resources", {}).get("train", {}).get("gpu") or 1)


def expect_args(pairs: list[tuple[str, dict]]) -> str:
    """`--expect PATH=HASH ...`: what the current config gives each upstream output's job, which
    the job compares with the output's provenance (provenance.check_expected; stale: it stops)."""
    items = [f"{path}={config_hash(settings)}" for path, settings in pairs]
    return "--expect " + " ".join(items) if items else ""


class GridJobs(GridTargets):
    """The jobs of ``config["grid"]``: its targets (run.targets) and each job's settings, expected
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

    def sweep_settings(self) -> str:
        """The sweep tables' job (report.sweeps): every run with its selection file, each pair's validation
        size, the grid's own values (what a model the paper did not train is compared with)."""
        runs = [{**r._asdict(), "selected": self.run_file(Run(r.model, r.dataset, r.mode, r.variant, r.seed),
                                                          paths.SELECTED)} for r in self.sweep_runs]
        sizes = {f"{r.model}/{r.dataset}": min(cell_rl(self.config, self.name, r.model, r.dataset)["val_size"],
                                               self.grid["datasets"][r.dataset].get("validation_size", 10**9))
                 for r in self.sweep_runs}
        configured = {"learning_rate": {m: float(s["lr"]) for m, s in self.grid["models"].items()},
                      "noise_factor": {m: float(self.rl["noise_factor"]) for m in self.grid["models"]}}
        return dumps({"grid": self.name, "toy": "toy_base" in self.grid, "runs": runs, "n_validation": sizes,
                      "configured": configured})

    def report_settings(self) -> str:
        return dumps({"grid": self.name, "n_samples": self.eval["n_samples"]})

    def figure_settings(self, name: str) -> str:
        """One figure's job: the grid and what the figure is (report.figures.write_figure)."""
        return dumps({"grid": self.name, "figure": self.figure_specs()[name]})

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
    def resources(self, kind: str) -> dict:
        """Resources of one kind of job (train / evaluate / evaluate_loglik / cpu). A training job
        takes its model's GPU count (models.<m>.train_gpus, chosen from the memory plan): there
        ``gpu`` is a function of the model."""
        res = job_resources(self.grid, kind, self.environ)
        if kind == "train" and res.get("gpu", 0) > 0:
            res["gpu"] = lambda model: train_processes(self.grid, model)
        if self.host_mb is not None and kind in GPU_KINDS:
            res["mem_mb"] = self._declared_memory(kind, res)
        return res

    def _declared_memory(self, kind: str, res: dict):
        """A job's mem_mb as a function of its wildcards: the host memory its plan needs (sizing.host), raised to
        what the grid's resources block asks where that is more (mem_mb, or mem_mb_per_cpu x the job's CPUs: one
        of the two is declared, never both, which SLURM refuses)."""
        own = self.grid.get("resources", {}).get(kind, {})
        res.pop("mem_mb_per_cpu", None)

        def mem_mb(wildcards) -> int:
            model = getattr(wildcards, "model", None)
            asked = own.get("mem_mb") or own.get("mem_mb_per_cpu", 0) * self.threads(kind, model)
            return max(int(asked), self.host_mb(kind, wildcards))

        return mem_mb

    def threads(self, kind: str, model: str | None = None) -> int:
        """CPU threads of a job: cpus_per_gpu x its GPUs on a GPU job (torch and the data work use
        them), else 1 (the CPU grids run many one-thread jobs side by side)."""
        res = job_resources(self.grid, kind, self.environ)
        gpus = res.get("gpu", 0)
        if kind == "train" and gpus:
            gpus = train_processes(self.grid, model)
        return int(gpus * res.get("cpus_per_gpu", 1)) if gpus else 1

    def ledger_gpus(self) -> dict:
        """GPUs held by each job, for the ledger's GPU-hours: a training job its model's
        train_gpus, an evaluation job its kind's `gpu` resource; every other rule none."""
        train = job_resources(self.grid, "train", self.environ).get("gpu", 0)
        return {"train": {m: (train_processes(self.grid, m) if train else 0) for m in self.grid["models"]},
                **{k: job_resources(self.grid, k, self.environ).get("gpu", 0) for k in GPU_KINDS[1:]}}

    def gpu_rule_env(self) -> str:
        """The conda environment of the GPU rules: torch's CUDA build pinned on a grid whose jobs ask
        for GPUs, the plain pins elsewhere (a laptop's toy grid needs no CUDA download)."""
        gpu = self.grid.get("resources", {}).get("train", {}).get("gpu")
        return "../../envs/softtokens-gpu.yaml" if gpu else "../../envs/softtokens.yaml"
