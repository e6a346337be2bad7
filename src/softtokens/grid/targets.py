"""What one grid of the workflow builds: every training run, evaluation, table, figure and
report file, and which runs each ablation table row reads (grid.jobs adds how each job runs).
Names come from store.paths, so a target and the rule that makes it cannot spell a file two ways."""

from __future__ import annotations

import difflib
import glob
import json
import os
from pathlib import Path

from softtokens.store import paths
from softtokens.config.grids import EVAL_DEFAULTS, cell_rl, resolved_rl
from softtokens.config.names import setting_mode
from softtokens.store.paths import Run, parse_arm
from softtokens.grid.figures import FigureTargets
from softtokens.grid.identity import SharedRuns
from softtokens.grid.sweeps import SweepTargets


def dumps(settings: dict) -> str:
    """Settings as the command line passes them (sorted: a stable string for Snakemake's params)."""
    return json.dumps(settings, sort_keys=True)


class GridTargets:
    """The files ``config["grid"]`` (a checked config: config.check_config) makes: its runs, their
    evaluations, tables, figures and reports, and the rows of its ablation tables; its figures (``figures``), the runs
    that are other runs' names (``names``) and its hyperparameter search (``sweep``), each a part given these
    targets."""

    def __init__(self, config: dict, environ: dict | None = None, resolve_rl=None, host_mb=None):
        """``resolve_rl(config, grid, model, rl, continuous) -> rl`` turns a cell's `auto` memory settings into
        numbers (sizing.plan.resolve_memory), ``host_mb(kind, wildcards)`` is a job's host memory (sizing.host)."""
        self.config, self.environ, self.resolve_rl, self.host_mb = config, environ, resolve_rl, host_mb
        self.name = config["grid"]
        self.grid = config["grids"][self.name]
        self.results = self.grid["results"]
        self.eval = {**EVAL_DEFAULTS, **self.grid["evaluation"]}
        self.rl = resolved_rl(config, self.name)
        self.ood = self.eval.get("ood_benchmarks", [])
        self.ablations = self.grid.get("ablation_tables", {})
        self.reused = config["grids"][self.grid["reuse"]] if self.grid.get("reuse") else None
        # the toy base is supervised on the first toy dataset of the grid
        self.toy_base_dataset = next((d for d, s in self.grid["datasets"].items() if s["loader"] == "toy"), None)
        self.figures = FigureTargets(self)
        self.sweep = SweepTargets(self)
        self.names = SharedRuns(self, lambda g: type(self)({**self.config, "grid": g}))

    @property
    def shared(self) -> dict[Run, tuple[Run, str]]:
        """Each run of this grid that another run already is (grid.identity): run -> (that run, its grid)."""
        return self.names.shared

    def reruns_present(self) -> list[str]:
        """The log of `softtokens audit --rerun` (audit.rerun) where there is one: the report says what re-execution
        found and records the log's hash (a line added after the report changes the report's leaf)."""
        path = paths.reruns_path(self.results)
        return [path] if os.path.exists(path) else []

    # ------------------------------------------------------------ runs and targets
    def training_runs(self, grid: dict | None = None) -> list[Run]:
        grid = self.grid if grid is None else grid
        return [Run(c["model"], c["dataset"], mode, c.get("variant", ""), seed)
                for c in grid["training"] for mode in c["modes"] for seed in c["seeds"]]

    def run_file(self, run: Run, name: str, results: str | None = None) -> str:
        """A run's file; a run that is another's name (grid.identity) has its own selected.json (pointing at the
        other's), every other file is the run's it is."""
        if name != paths.SELECTED and results is None:
            run = self.shared.get(run, (run,))[0]
        return f"{paths.run_dir(results or self.results, run)}/{name}"


    def evaluated_models(self) -> list[tuple[str, str]]:
        """(model, trained) pairs: each evaluated base model and every run trained from it (a sweep's runs
        aside: the search selects on validation, as the paper's did)."""
        return [(m, "base") for m in self.eval["models"]] + [(r.model, r.trained) for r in self.training_runs()
                                                             if r.variant not in self.sweep.variants]

    def eval_targets(self) -> list[str]:
        return [paths.eval_path(self.results, m, t, b, s) for m, t in self.evaluated_models()
                for b in self.eval["benchmarks"] for s in self.eval["settings"]]

    def loglik_targets(self) -> list[str]:
        return [paths.loglik_path(self.results, m, t, b) for m, t in self.evaluated_models() for b in self.ood]

    def selected_targets(self) -> list[str]:
        return [self.run_file(r, paths.SELECTED) for r in self.training_runs()]

    def metrics_targets(self) -> list[str]:
        return [self.run_file(r, paths.METRICS) for r in self.training_runs() if not r.variant]

    def table_names(self) -> list[str]:
        names = ([paths.MAIN_TABLE] if self.eval["benchmarks"] else []) + [
            paths.settings_table(b) for b in self.eval["benchmarks"]]
        return names + ([paths.OOD_TABLE] if self.ood else [])

    def table_targets(self, ext: str) -> list[str]:
        return [paths.table_path(self.results, n, ext) for n in self.table_names()]

    def table_inputs(self, name: str) -> list[str]:
        """The evaluation files one table's cells are made of, and nothing more: a table is a target of
        its own, so `snakemake TABLE` plans only what it rests on. Table 1 (main): the hard-CoT settings
        of every math benchmark; settings_B: every setting on benchmark B; ood: the out-of-domain files."""
        if name == paths.OOD_TABLE:
            return self.loglik_targets()
        if name == paths.MAIN_TABLE:
            settings = [s for s in self.eval["settings"] if setting_mode(s) == "hard"]
            benchmarks = self.eval["benchmarks"]
        elif name in self.table_names():
            settings, benchmarks = self.eval["settings"], [paths.settings_benchmark(name)]
        else:
            raise KeyError(f"grid {self.name!r} has no table {name!r} (tables: {', '.join(self.table_names())})")
        return [paths.eval_path(self.results, m, t, b, s) for m, t in self.evaluated_models()
                for b in benchmarks for s in settings]

    def report_files(self) -> dict[str, str]:
        return {n: paths.report_path(self.results, n) for n in paths.REPORT_FILES}

    def ablation_targets(self, kind: str) -> list[str]:
        """Files of the ablation tables (kind "tables") or figures ("figures")."""
        if kind == "tables":
            return [paths.table_path(self.results, paths.ablation_name(n), ext) for n in self.ablations
                    for ext in (*paths.TABLE_EXTS, paths.CELLS_EXT)]
        return [paths.figure_path(self.results, paths.ablation_name(n), ext) for n in self.ablations
                for ext in paths.FIGURE_EXTS]

    def report_targets(self) -> list[str]:
        main = [*(t for ext in paths.TABLE_EXTS for t in self.table_targets(ext)),
                *self.figures.files(), *self.figures.files("pdf"), *self.report_files().values()]
        if not self.ablations and not self.sweep.runs:
            return main
        # an ablation or sweep grid: its own tables and figures; the main ones too with results of its own (toy,
        # toy-long), not when it shares the reused grid's (toy-ablations, ablations, sweeps: theirs are that grid's)
        own_results = self.reused is None or self.results != self.reused["results"]
        return [*(main if own_results else []), *self.ablation_targets("tables"), *self.ablation_targets("figures"),
                *self.sweep.files()]

    def all_targets(self) -> list[str]:
        """Every cell of the layout, so a deleted evaluation or selection is remade (with what
        depends on it) by a plain `snakemake`, not only the tables that summarise it."""
        return [*self.selected_targets(), *self.eval_targets(), *self.loglik_targets(), *self.report_targets()]

    def variant_evals_present(self) -> list[str]:
        """Ablation-variant evaluation files already in this results directory (the ablations grid
        shares the paper grid's): the reproduction report puts them beside the paper's ablation
        tables when they exist; their absence never plans a job."""
        return sorted(glob.glob(paths.eval_path(self.results, "*", "*@*-seed*", "*", "*")))

    # ------------------------------------------------------------ ablation tables
    def ablation_cell(self) -> tuple[str, str]:
        """The (model, dataset) every ablation row trains (config.check_config makes it one)."""
        return self.grid["training"][0]["model"], self.grid["training"][0]["dataset"]

    def ablation_runs(self, arm: str) -> tuple[list[Run], str, bool]:
        """Runs of one table row, the results directory they live in, and whether this grid makes
        them. A default arm (no variant) is the reused grid's runs when this grid has none."""
        model, dataset = self.ablation_cell()
        mode, variant = parse_arm(arm)
        key = (model, dataset, mode, variant)
        own = [r for r in self.training_runs() if (r.model, r.dataset, r.mode, r.variant) == key]
        if own or not self.reused:
            return own, self.results, True
        reused = [r for r in self.training_runs(self.reused) if (r.model, r.dataset, r.mode, r.variant) == key]
        return reused, self.reused["results"], False

    @staticmethod
    def _kept(files: list[str], in_dag: bool) -> list[str]:
        """A reused grid's files are read when they exist and never planned: this grid does not
        retrain or re-evaluate what another grid makes (its table rows say 'not yet run')."""
        return list(files) if in_dag else [f for f in files if os.path.exists(f)]

    def ablation_evals(self) -> list[str]:
        model, _ = self.ablation_cell()
        out = []
        every = [(b, s) for b in self.eval["benchmarks"] for s in self.eval["settings"]]
        for spec in self.ablations.values():
            if spec.get("base"):
                in_dag = model in self.eval["models"]
                where = self.results if in_dag or not self.reused else self.reused["results"]
                out += self._kept([paths.eval_path(where, model, "base", b, s) for b, s in every], in_dag)
            for arm in spec["arms"]:
                runs, where, in_dag = self.ablation_runs(arm)
                out += self._kept([paths.eval_path(where, r.model, r.trained, b, s) for r in runs for b, s in every],
                                  in_dag)
        return sorted(set(out))

    def ablation_metrics(self) -> list[str]:
        out = []
        for spec in self.ablations.values():
            for arm in spec["arms"]:
                runs, where, in_dag = self.ablation_runs(arm)
                out += self._kept([self.run_file(r, paths.METRICS, where) for r in runs], in_dag)
        return sorted(set(out))

    def ablation_settings(self) -> str:
        """Each table's rows, in order, with what each row's run resolved to (gamma, tau, placement, k)."""
        model, dataset = self.ablation_cell()
        tables = {}
        for name, spec in self.ablations.items():
            rows = []
            for arm in spec["arms"]:
                mode, variant = parse_arm(arm)
                rl = cell_rl(self.config, self.name, model, dataset, variant)
                rows.append({"arm": arm, "mode": mode, "variant": variant, "noise_factor": rl["noise_factor"],
                             "temperature": rl[f"{mode}_temperature"], "placement": rl["noise_placement"],
                             "top_k": rl["noise_top_k"], "clip_ratio": rl["max_grad_norm_ratio"],
                             "clip_groups": rl["grad_clip_groups"]})
            tables[name] = {"title": spec.get("title", name), "rows": rows, "base": bool(spec.get("base")),
                            "describe": spec.get("describe", ["mode", "placement", "temperature", "top_k",
                                                              "noise_factor"])}
        return dumps({"grid": self.name, "model": model, "dataset": dataset, "toy": "toy_base" in self.grid,
                       "tables": tables})



def outside_grid(jobs: "GridTargets", targets) -> list[str]:
    """The targets asked for on the command line that name a run or an evaluation the grid does not
    have (a seed, model, mode, benchmark or setting outside it), each with what the grid has there:
    Snakemake would plan them as new jobs without a word. Other targets (tables, rules) pass."""
    runs = set(jobs.training_runs())
    bad = []
    for target in targets:
        text = str(target)
        if not text.startswith(f"{jobs.results}/"):
            continue
        rest = text[len(jobs.results) + 1:].split("/")
        try:
            if rest[0] == "runs" and len(rest) >= 5:
                k = paths.parse_run_path("/".join(rest[:5]) + "/x")
                run = Run(k["model"], k["train_dataset"], k["train_mode"], k["variant"], k["seed"])
                if run not in runs:
                    bad.append(f"{text}: {_nearest(run, runs)}")
            elif rest[0] == "eval" and len(rest) >= 5:
                k = paths.parse_eval_path(text)
                run = paths.eval_run(k)
                if run is not None and run not in runs:
                    bad.append(f"{text}: {_nearest(run, runs)}")
                elif k["model"] not in jobs.eval["models"] and run is None:
                    bad.append(f"{text}: model {k['model']!r} is not evaluated here{_close(k['model'], jobs.eval['models'])}"
                               f" (models: {', '.join(jobs.eval['models'])})")
                elif k["benchmark"] not in (*jobs.eval["benchmarks"], *jobs.ood):
                    known = [*jobs.eval["benchmarks"], *jobs.ood]
                    bad.append(f"{text}: benchmark {k['benchmark']!r} is not in the grid{_close(k['benchmark'], known)}"
                               f" (benchmarks: {', '.join(known)})")
                elif k["benchmark"] in jobs.eval["benchmarks"] and k["setting"] not in jobs.eval["settings"]:
                    bad.append(f"{text}: setting {k['setting']!r} is not evaluated here"
                               f"{_close(k['setting'], jobs.eval['settings'])} (settings: "
                               f"{', '.join(jobs.eval['settings'])})")
        except (ValueError, IndexError):
            wrong = misspelled(jobs, rest)
            if wrong:
                bad.append(f"{text}: {wrong}")
    return bad


def _close(word: str, known) -> str:
    close = difflib.get_close_matches(str(word), [str(k) for k in known], n=1, cutoff=0.5)
    return f" (did you mean {close[0]!r}?)" if close else ""


def misspelled(jobs: "GridTargets", parts: list[str]) -> str | None:
    """A run or evaluation path that does not parse: the first word that is no name of the grid, with the
    closest that is (a misspelled mode once gave only Snakemake's 'MissingRuleException')."""
    from softtokens.config.names import MODES, SETTING_NAMES

    def near(word: str, known) -> str:
        close = difflib.get_close_matches(word, [str(k) for k in known], n=1, cutoff=0.5)
        return f" (did you mean {close[0]!r}?)" if close else f" (known: {', '.join(map(str, known))})"

    models = sorted(jobs.grid["models"])
    datasets = sorted(jobs.grid["datasets"])
    seeds = sorted({f"seed{r.seed}" for r in jobs.training_runs()})
    if parts[0] == "runs" and len(parts) >= 5:
        checks = [("model", parts[1], models), ("dataset", parts[2], datasets),
                  ("mode", parts[3].split("@")[0], MODES), ("seed", parts[4], seeds)]
    elif parts[0] == "eval" and len(parts) >= 5:
        trained = parts[2].split("-")
        checks = [("model", parts[1], models)]
        if parts[2] != "base":
            checks += [("dataset", trained[0], datasets), ("mode", (trained[1:2] or [""])[0].split("@")[0], MODES),
                       ("seed", (trained[2:3] or [""])[0], seeds)]
        checks += [("benchmark", parts[3], sorted({*jobs.eval["benchmarks"], *jobs.ood})),
                   ("setting", Path(parts[4]).stem, [*SETTING_NAMES, "loglik"])]
    else:
        return None
    for what, word, known in checks:
        if word not in known:
            return f"{what} {word!r} is not one of this grid's{near(word, known)}"
    return None


def _nearest(run: Run, runs: set) -> str:
    """What the grid has in place of ``run``: its seeds, modes or datasets there."""
    same = [r for r in runs if (r.model, r.dataset, r.mode, r.variant) == (run.model, run.dataset, run.mode, run.variant)]
    if same:
        return f"seed {run.seed} is not in the grid (seeds there: {', '.join(str(r.seed) for r in sorted(same))})"
    cells = sorted({(r.model, r.dataset) for r in runs})
    arms = sorted({r.arm for r in runs if (r.model, r.dataset) == (run.model, run.dataset)})
    if arms:
        return f"{run.arm!r} is not trained there (arms: {', '.join(arms)})"
    names = [f"{m}/{d}" for m, d in cells]
    close = difflib.get_close_matches(f"{run.model}/{run.dataset}", names, n=1, cutoff=0.5)
    return (f"{run.model}/{run.dataset} is not a training cell of the grid ("
            + (f"did you mean {close[0]!r}? " if close else "") + f"cells: {', '.join(names)})")


def target_needs(jobs: "GridTargets", targets) -> tuple[set[str], set[str]] | None:
    """(datasets, models) the jobs behind ``targets`` read, so that a cluster's pre-flight names only what a cell
    needs (one llama-3b cell once listed every dataset and model of the paper grid). None: everything (no target,
    the report, or a target this layout does not parse)."""
    if not targets:
        return None
    datasets, models = set(), set()

    def of_file(text: str) -> bool:
        rest = text[len(jobs.results) + 1:].split("/") if text.startswith(f"{jobs.results}/") else []
        if len(rest) >= 3 and rest[0] == "data":
            datasets.add(rest[1])
        elif len(rest) >= 2 and rest[0] == "models":
            models.add(rest[1])
        elif len(rest) >= 5 and rest[0] == "runs":
            k = paths.parse_run_path("/".join(rest[:5]) + "/x")
            datasets.add(k["train_dataset"])
            models.add(k["model"])
        elif len(rest) >= 5 and rest[0] == "eval":
            k = paths.parse_eval_path(text)
            run = paths.eval_run(k)
            datasets.update({k["benchmark"], *([run.dataset] if run else [])})
            models.add(k["model"])
        elif len(rest) == 2 and rest[0] in ("tables", "figures"):
            name = rest[1].split(".")[0]
            try:
                files = jobs.table_inputs(name) if rest[0] == "tables" else [
                    f for kind in jobs.figures.inputs(name).values() for f in kind]
            except KeyError:
                return False
            return all(of_file(f) for f in files) if files else False
        else:
            return False
        return True

    try:
        return (datasets, models) if all(of_file(str(t)) for t in targets) else None
    except (ValueError, IndexError):
        return None
