"""The reproduction report on a small fixture whose every number is computed by hand: per-seed
evaluation files of Llama-3B trained on GSM8K (hard / soft / fuzzy, two seeds) and its base, a
few paper cells, benchmark files for the ledger. Then the audit of one table cell after a data
file under it was edited."""

import json
from html import escape as html_escape
import math
from pathlib import Path

import pandas as pd
import pytest
from conftest import identified

from softtokens.cells import ours as our_cells
from softtokens.cells import spread
from softtokens.cells.paper import CELL_KEYS, TABLES, load_paper_results
from softtokens.cost import ledger
from softtokens.model.checkpoint import TrainerState
from softtokens.report.page import write_report
from softtokens.store.files import write_json
from softtokens.store.provenance import Provenance
from softtokens.verdict import reproduction

# pass@1 (%) per seed; pass@32 of hard_sample per seed
SEEDS = {
    "hard": {"hard_greedy": [70, 74], "hard_sample": [60, 62], "pass@32": [90, 92], "soft_greedy": [50, 50],
             "fuzzy_greedy": [52, 54]},
    "soft": {"hard_greedy": [73, 75], "hard_sample": [50, 52], "pass@32": [95, 97], "soft_greedy": [60, 60],
             "fuzzy_greedy": [61, 61]},
    "fuzzy": {"hard_greedy": [69, 71], "hard_sample": [59, 61], "pass@32": [88, 90], "soft_greedy": [80, 80],
              "fuzzy_greedy": [50, 50]},
    "none": {"hard_greedy": [71.4], "hard_sample": [45.0], "pass@32": [96.8], "soft_greedy": [70.0],
             "fuzzy_greedy": [72.0]},
}
NLL = {"none": [2.86], "hard": [3.19, 3.21], "soft": [2.9, 2.9], "fuzzy": [3.3, 3.3]}

PAPER = """table,model,train_dataset,train_mode,variant,benchmark,setting,metric,mean,std,highlight
tab:main,llama-3b,gsm8k,hard,,gsm8k,hard_greedy,pass@1,75.9,1.3,
tab:main,llama-3b,gsm8k,hard,,gsm8k,hard_sample,pass@1,74.3,0.8,
tab:main,llama-3b,gsm8k,hard,,gsm8k,hard_sample,pass@32,94.1,0.3,
tab:main,llama-3b,none,none,,gsm8k,hard_greedy,pass@1,71.4,0.0,
tab:main,llama-3b,gsm8k,hard,,math500,hard_greedy,pass@1,34.6,0.2,
table:stdbenchmarks,llama-3b,gsm8k,hard,,arc,loglik,nll_correct,3.16,0.01,
tab:scale,llama-3b,gsm8k,fuzzy,gamma=1.0,gsm8k,hard_greedy,pass@1,75.4,1.1,
"""


def _trained(mode: str, seed: int) -> str:
    return "base" if mode == "none" else f"gsm8k-{mode}-seed{seed}"


@pytest.fixture()
def fixture(tmp_path):
    paper = tmp_path / "paper.csv"
    paper.write_text(PAPER)
    evals = []
    for mode, by_setting in SEEDS.items():
        for seed in range(len(by_setting["hard_greedy"])):
            for setting in ("hard_greedy", "hard_sample", "soft_greedy", "fuzzy_greedy"):
                p = tmp_path / "eval" / "llama-3b" / _trained(mode, seed) / "gsm8k" / f"{setting}.json"
                p.parent.mkdir(parents=True, exist_ok=True)
                sampled = setting.endswith("sample")
                n = 32 if sampled else 1
                p1 = by_setting[setting][seed] / 100
                passk = {"1": p1, **({"32": by_setting["pass@32"][seed] / 100} if sampled else {})}
                p.write_text(json.dumps({"n_samples": n, "pass@1": p1, "pass@k": passk, "mean_cot_length": 40.0,
                                         "n_problems": 100}))
                evals.append(p)
            p = tmp_path / "eval" / "llama-3b" / _trained(mode, seed) / "arc" / "loglik.json"
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_text(json.dumps({"accuracy": 0.7, "accuracy_norm": 0.7, "nll_correct": NLL[mode][seed],
                                     "n_problems": 100}))
            evals.append(p)
    bench = tmp_path / "benchmarks"
    for job, wall, cpu in (("train/llama-3b/gsm8k/hard/seed0", 3600.0, 7200.0),
                           ("train/llama-3b/gsm8k/hard/seed1", 1800.0, 3600.0),
                           ("select/llama-3b/gsm8k/hard/seed0", 10.0, 5.0),
                           ("evaluate/llama-3b/gsm8k-hard-seed0/gsm8k/hard_greedy", 720.0, 700.0),
                           ("evaluate/llama-3b/gsm8k-hard-seed1/gsm8k/hard_greedy", 360.0, 350.0),
                           ("evaluate/llama-3b/gsm8k-hard-seed0/gsm8k/hard_sample", 100.0, 90.0)):
        f = bench / f"{job}.tsv"
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text("s\th:m:s\tmax_rss\tmax_vms\tmax_uss\tmax_pss\tio_in\tio_out\tmean_load\tcpu_time\n"
                     f"{wall}\t0:00:00\t100.0\t0\t0\t0\t0\t0\t0\t{cpu}\n")
    return {"paper": paper, "evals": evals, "bench": bench, "out": tmp_path / "report"}


def _cell(df, **keys):
    sel = df
    for k, v in keys.items():
        sel = sel[sel[k] == v]
    assert len(sel) == 1, keys
    return sel.iloc[0]


def _interval(diff, parts, test_var):
    """diff's 90% interval from seed parts [(variance, seeds)] and an exact test-set variance, by
    Welch-Satterthwaite: df = total^2 / sum(v^2 / (n - 1)) over the seed parts."""
    from scipy import stats

    total = sum(v for v, _ in parts) + test_var
    df = total ** 2 / sum(v * v / (n - 1) for v, n in parts) if parts else math.inf
    half = (stats.t.ppf(0.95, df) if df < math.inf else stats.norm.ppf(0.95)) * math.sqrt(total)
    return diff - half, diff + half


def test_cells_beside_the_paper_with_hand_computed_verdicts(fixture):
    """Ours against the paper's, unpaired, read as sameness within the margin (2.5 points, 0.1 nats):
    *agrees* only when the 90% interval lies inside it, *differs* when it lies outside, undecided
    otherwise. A seed part per side (ours: std^2 / seeds, 1 df with 2 seeds; the paper's: its ± read as
    a population std, so std^2 / (3 - 1), 2 df) and a test-set part per side (ours binomial over the
    file's 100 problems, the paper's over its benchmark's size). The old rule ('within 2 se') called
    the greedy cell a match because 100 problems leave a wide error; now it is undecided."""
    paper = load_paper_results(fixture["paper"])
    ours = our_cells.aggregate(our_cells.seed_rows(fixture["evals"]))
    cmp = reproduction.compare(paper, ours)
    base = dict(model="llama-3b", train_dataset="gsm8k", train_mode="hard", variant="")

    greedy = _cell(cmp, **base, benchmark="gsm8k", setting="hard_greedy", metric="pass@1")
    assert greedy.ours_mean == pytest.approx(72.0) and greedy.ours_std == pytest.approx(math.sqrt(8))
    assert greedy["diff"] == pytest.approx(-3.9) and greedy.margin == 2.5 and greedy.ours_n == 2
    lo, hi = _interval(-3.9, [(8 / 2, 2), (1.3 ** 2 / 2, 3)], (70 * 30 + 74 * 26) / 100 / 2 + 75.9 * 24.1 / 1319)
    assert (greedy.ci_low, greedy.ci_high) == (pytest.approx(lo), pytest.approx(hi))   # [-12.5, +4.7]
    assert greedy.agreement == reproduction.UNDECIDED

    sample = _cell(cmp, **base, benchmark="gsm8k", setting="hard_sample", metric="pass@1")
    lo, hi = _interval(-13.3, [(2 / 2, 2), (0.8 ** 2 / 2, 3)], (60 * 40 + 62 * 38) / 200 + 74.3 * 25.7 / 1319)
    assert sample["diff"] == pytest.approx(-13.3) and sample.ci_high == pytest.approx(hi) and hi < -2.5
    assert sample.agreement == reproduction.DIFFERS                                     # [-21.8, -4.8]
    passk = _cell(cmp, **base, benchmark="gsm8k", setting="hard_sample", metric="pass@32")
    assert passk.ours_mean == pytest.approx(91.0) and passk.agreement == reproduction.UNDECIDED

    base_row = _cell(cmp, model="llama-3b", train_mode="none", benchmark="gsm8k", setting="hard_greedy", metric="pass@1")
    # a base model: one evaluation, no seed part, but its benchmark's sampling error: z, and not 'agrees'
    lo, hi = _interval(0.0, [], 71.4 * 28.6 / 100 + 71.4 * 28.6 / 1319)
    assert base_row.ours_std == 0.0 and base_row.ci_high == pytest.approx(hi) and base_row.agreement == reproduction.UNDECIDED

    nll = _cell(cmp, **base, benchmark="arc", setting="loglik", metric="nll_correct")
    # the fixture's loglik files have no per-question rows: only ours' seeds (0.0002 / 2), the paper's
    # seeds (0.01^2 / 2) and its NLL spread (3.16^2 / 1165: the ARC the paper scored, cells.paper); margin 0.1 nats
    lo, hi = _interval(0.04, [(0.0002 / 2, 2), (0.01 ** 2 / 2, 3)], 3.16 ** 2 / 1165)
    assert nll.ours_mean == pytest.approx(3.2) and nll.margin == 0.1
    assert (nll.ci_low, nll.ci_high) == (pytest.approx(lo), pytest.approx(hi)) and nll.agreement == reproduction.UNDECIDED

    missing = _cell(cmp, **base, benchmark="math500", setting="hard_greedy", metric="pass@1")
    assert pd.isna(missing.ours_mean) and missing.agreement is None
    ablation = _cell(cmp, model="llama-3b", variant="gamma1.0", setting="hard_greedy")
    assert ablation.paper_variant == "gamma=1.0" and pd.isna(ablation.ours_mean)


def test_a_close_reproduction_agrees_and_a_noisy_one_cannot():
    """One paper cell, 75.0 ± 0.5 (3 seeds) on GSM8K (1,319 questions); ours 75.2 with small errors:
    variance 0.5^2/2 + 75 x 25/1319 + 0.3^2/3 + 0.1 = 1.675, interval 0.2 +- 2.13 inside ±2.5: agrees; the same mean from a noisier run (std 4 over 2 seeds) is undecided, never
    'agrees' as 'within 2 se' would have said."""
    paper = pd.DataFrame([{"table": "tab:main", "model": "m", "train_dataset": "d", "train_mode": "hard",
                           "variant": "", "benchmark": "gsm8k", "setting": "hard_greedy", "metric": "pass@1",
                           "mean": 75.0, "std": 0.5, "highlight": "", "paper_variant": ""}])
    ours = pd.DataFrame([{"model": "m", "train_dataset": "d", "train_mode": "hard", "variant": "", "benchmark": "gsm8k",
                          "setting": "hard_greedy", "metric": "pass@1", "mean": 75.2, "std": std, "n": n,
                          "sampling_var": 0.1, "se": 0.0, "protocol": None} for std, n in ((0.3, 3),)])
    assert reproduction.compare(paper, ours).agreement.iloc[0] == reproduction.AGREES
    noisy = ours.assign(std=4.0, n=2)
    assert reproduction.compare(paper, noisy).agreement.iloc[0] == reproduction.UNDECIDED


def test_tolerances_by_hand():
    assert spread.cell_se(2.0, 4, 9.0) == pytest.approx(math.sqrt(10.0))
    assert math.isnan(spread.cell_se(float("nan"), 1, 9.0))  # one seed of a trained run: spread unknown
    assert spread.proportion_var(50.0, 500) == pytest.approx(5.0)
    paper = reproduction.paper_cells(load_paper_results())   # its ± a population std: sample std^2 = std^2 3/2
    base = _cell(paper, model="llama-3b", train_mode="none", benchmark="gsm8k", setting="hard_greedy", metric="pass@1")
    assert base.n == 1 and base.se == pytest.approx(math.sqrt(71.4 * 28.6 / 1319)) and base.se > 1.2
    nll = _cell(paper, model="llama-3b", train_mode="none", benchmark="arc", metric="nll_correct")
    assert nll.se == pytest.approx(2.86 / math.sqrt(1165))   # the ARC the paper scored (cells.paper.PAPER_TEST_SIZES)
    trained = _cell(paper, model="llama-3b", train_dataset="gsm8k", train_mode="hard", variant="", benchmark="math500",
                    setting="hard_greedy", metric="pass@1")
    assert trained.n == 3 and trained.se == pytest.approx(math.sqrt(0.2 ** 2 / 2 + 34.6 * 65.4 / 500))


def test_sampling_variance_is_measured_from_the_questions(tmp_path):
    """Ours comes from the evaluation file's own questions: pass@1 from each problem's c/n, pass@k
    from each problem's pass@k, accuracy and NLL from each question's."""
    ev = tmp_path / "eval" / "m" / "base" / "b" / "hard_sample.json"
    ev.parent.mkdir(parents=True)
    problems = [{"n": 4, "correct": c} for c in (0, 1, 4, 4)]
    ev.write_text(json.dumps({"n_samples": 4, "pass@1": 9 / 16, "pass@k": {"4": 0.75}, "mean_cot_length": 1.0,
                              "n_problems": 4, "problems": problems}))
    seeds = our_cells.seed_rows([ev])
    p1 = _cell(seeds, metric="pass@1")
    values = [0, 25, 100, 100]
    mean = sum(values) / 4
    assert p1.sampling_var == pytest.approx(sum((v - mean) ** 2 for v in values) / 4 / 4)
    p4 = _cell(seeds, metric="pass@4")
    assert p4.sampling_var == pytest.approx(75 * 25 / 4)  # values 0, 100, 100, 100: p (1 - p) / N


def test_the_paper_numbers_ship_with_every_table():
    paper = load_paper_results()
    assert set(paper.table) == set(TABLES) and len(paper) == 909
    assert not paper.duplicated(["table", *CELL_KEYS]).any()
    cell = _cell(paper[paper.table == "tab:main"], model="llama-3b", train_dataset="gsm8k", train_mode="fuzzy",
                 benchmark="gsm8k", setting="hard_sample", metric="pass@32")
    assert (cell["mean"], cell["std"]) == (97.4, 0.3)


def test_ledger_counts_gpu_hours_per_job_cell_and_table(fixture):
    gpus = {"train": {"llama-3b": 2}, "evaluate": 1}
    jobs = ledger.read_jobs(fixture["bench"], gpus)
    train0 = _cell(jobs, job="train/llama-3b/gsm8k/hard/seed0")
    assert train0.gpus == 2 and train0.gpu_hours == pytest.approx(2.0) and train0.cpu_hours == pytest.approx(2.0)
    assert _cell(jobs, job="select/llama-3b/gsm8k/hard/seed0").gpu_hours == 0
    seeds = our_cells.seed_rows(fixture["evals"])
    cells = ledger.cell_costs(seeds, jobs, CELL_KEYS)
    greedy = _cell(cells, train_mode="hard", benchmark="gsm8k", setting="hard_greedy", metric="pass@1")
    # two training runs (2 + 1 GPU-h), one selection, two evaluations (0.2 + 0.1 GPU-h)
    assert greedy.jobs == 5 and greedy.gpu_hours == pytest.approx(3.3)
    tables = ledger.table_costs(cells, jobs, {"t": lambda r: r["train_mode"] == "hard" and r["benchmark"] == "gsm8k"})
    t = _cell(tables, table="t")
    assert t.jobs == 6 and t.gpu_hours == pytest.approx(3.3 + 100 / 3600)  # the shared runs counted once


def test_report_pages_show_missing_cells_and_claims(fixture):
    settings = {"grid": "fixture", "toy": False, "gpus": {"train": {"llama-3b": 2}, "evaluate": 1},
                "paper_results": str(fixture["paper"])}
    write_report(fixture["evals"], fixture["bench"], fixture["out"], settings)
    md = (fixture["out"] / "reproduction.md").read_text()
    html = (fixture["out"] / "reproduction.html").read_text()
    row = next(line for line in md.splitlines() if "math500" in line and "34.6" in line)
    assert "missing" in row and "0.0 ±" not in row.split("34.6")[1]
    assert "tab:scale** (Ablation: noise factor): 0 of 1 cells measured" in md
    assert "4 of 5 cells measured; of 4 comparable: 0 agrees, 3 undecided, 1 differs" in md  # tab:main
    assert md.index("**The answer.**") < md.index("**How a claim is judged.**")   # the answer first
    assert 'class="v-undecided"' in html and 'class="v-not-yet-measured"' in html and 'class="missing"' in html
    cells = pd.read_csv(fixture["out"] / "cells.csv")
    assert len(cells) == 7
    assert (fixture["out"] / "ledger.csv.prov.json").exists()
    jobs = pd.read_csv(fixture["out"] / "ledger.csv")
    ledger_page = (fixture["out"] / "ledger.html").read_text()  # the ledger as the Snakemake report shows it
    assert ledger_page.count("<tr") == len(jobs) + 1 and str(jobs.job.iloc[0]) in ledger_page
    claims_file = json.loads((fixture["out"] / "claims.json").read_text())
    assert len(claims_file["ours"]) >= 7 and all(c["quotes"] for c in claims_file["ours"])
    assert "<details><summary>Ours: `pass1_parity` — " in md
    # issue 72: a specification curve per judged claim (its multiverse in claims.json, its figure in the page)
    curves = 0
    for side, words in (("paper", "the paper's numbers"), ("ours", "this grid's numbers")):
        for c in claims_file[side]:
            m = c["multiverse"]
            if not m or all(row[4] is None for row in m["curve"]["rows"]):
                continue
            assert sum(m["counts"].values()) == m["distinct"] == len(m["curve"]["rows"])
            assert f"<img alt='Specification curve of `{c['key']}` on {html_escape(words)}" in html, c["key"]
            curves += 1
    assert curves >= 2 and html.count("<img alt='Specification curve of") == curves


# ---------------------------------------------------------------- audit of one cell
def _chain(tmp_path: Path) -> tuple[Path, list[Path]]:
    """data -> training checkpoint -> selection -> evaluation files of two seeds -> tables."""
    import torch
    from safetensors.torch import save_file
    from softtokens.report.tables import write_tables

    data = tmp_path / "data" / "ds"
    data.mkdir(parents=True)
    (data / "train.jsonl").write_text('{"id": "t0", "question": "1+1", "answer": "2"}\n')
    (data / "test.jsonl").write_text("".join(f'{{"id": "{i}", "question": "{i}+2", "answer": "{i + 2}"}}\n'
                                             for i in range(10)))   # the evaluations' ten questions
    for split in ("train", "test"):
        Provenance("prepare_data", {"split": split}).write_sidecar(data / f"{split}.jsonl")
    evals = []
    for seed, acc in ((0, 0.5), (1, 0.7)):
        run = tmp_path / "runs" / "toy" / "ds" / "hard" / f"seed{seed}"
        best = run / "checkpoints" / "best"
        best.mkdir(parents=True)
        save_file({"w": torch.full((2,), float(seed))}, str(best / "model.safetensors"))   # data only, as the audit asks
        TrainerState(step=8, best_val=acc, base_val=None, embedding_scale={}, sigma=0.0, noise={},
                     config={"mode": "hard", "seed": seed}, base_model="toy", base_revision=None,
                     processes=1).write(best)   # whose run it is: audit.links checks the checkpoint's identity
        train = Provenance("train", {"seed": seed}, inputs={"train": data / "train.jsonl"})
        train.write_sidecar(best)
        train.write_sidecar(run / "checkpoints")
        selected = run / "selected.json"
        write_json(selected, Provenance("select_checkpoint", {}, inputs={"checkpoints": run / "checkpoints"}).embedded(
            {"step": 8, "checkpoint": best.as_posix()}, selected))
        ev = tmp_path / "eval" / "toy" / f"ds-hard-seed{seed}" / "ds" / "hard_greedy.json"
        ev.parent.mkdir(parents=True)
        prov = Provenance("evaluate", {}, inputs={"selected": selected, "checkpoint": best, "data": data / "test.jsonl"})
        problems = [{"id": str(i), "n": 1, "correct": int(i < 10 * acc)} for i in range(10)]
        write_json(ev, identified(prov, ev, {"n_samples": 1, "pass@1": acc, "pass@k": {"1": acc},
                                             "mean_cot_length": 3.0, "problems": problems}))
        evals.append(ev)
    out = tmp_path / "tables"
    out.mkdir()
    write_tables(evals, out, {"grid": "test"})
    return out / "main.md", evals


def test_audit_of_a_cell_flags_an_edited_data_file(tmp_path, monkeypatch, capsys):
    from softtokens.audit.cell import audit_cell
    from softtokens.cli import main

    monkeypatch.chdir(tmp_path)
    table, evals = _chain(Path("."))
    lines, problems = audit_cell(table, "toy ds hard", "ds Greedy pass@1")
    assert problems == 0, lines
    assert lines[0].startswith("cell main [toy ds hard] [ds Greedy pass@1] = 60.0±14.1")
    assert sum("[evaluate]" in line for line in lines) == 2 and any("[train]" in line for line in lines)

    Path("data/ds/train.jsonl").write_text('{"question": "1+1", "answer": "3"}\n')  # edited after the run
    lines, problems = audit_cell(table, "toy ds hard", "ds Greedy pass@1")
    changed = [line for line in lines if "CHANGED" in line]
    assert problems >= 1 and changed and all("data/ds/train.jsonl" in line for line in changed)
    assert main(["audit", str(table), "--row", "toy ds hard", "--column", "ds Greedy pass@1"]) == 1
    assert "CHANGED data/ds/train.jsonl" in capsys.readouterr().out


def test_audit_of_a_cell_flags_a_result_that_no_longer_gives_the_table(tmp_path, monkeypatch):
    from softtokens.audit.cell import audit_cell

    monkeypatch.chdir(tmp_path)
    table, evals = _chain(Path("."))
    res = json.loads(evals[1].read_text())
    res["pass@1"], res["pass@k"] = 0.9, {"1": 0.9}   # the number, and its rows to match it: 9 of 10 right
    res["problems"][7]["correct"] = res["problems"][8]["correct"] = 1
    evals[1].write_text(json.dumps(res))
    lines, problems = audit_cell(table, "toy ds hard", "ds Greedy pass@1")
    assert any("CHANGED" in line and "since the table was made" in line for line in lines)
    assert any("CHANGED VALUE: the files' rows now give 70.0±28.3, the table says 60.0±14.1" in line for line in lines)
    assert any(f"EDITED {evals[1]}" in line for line in lines)   # not what its job wrote: its own hash says so
    evals[0].unlink()
    lines, _ = audit_cell(table, "toy ds hard", "ds Greedy pass@1")
    assert any(line.strip().startswith("MISSING") for line in lines)
    with pytest.raises(KeyError, match="rows: .*toy ds hard"):
        audit_cell(table, "toy ds soft", "ds Greedy pass@1")


def test_which_arc_challenge_the_paper_scored():
    """A base cell is k/N and a trained one a 3-seed mean k/(3N): of every N from 1,000 to 1,399 only
    1,165 produces all 18 of the paper's two-decimal ARC accuracies; the split's 1,172 produces 2."""
    from softtokens.cells.paper import admitted_sizes, attainable

    assert attainable(72.79, 1165, 2) and not attainable(72.79, 1172, 2)   # 848 / 1165 = 72.789
    counts = admitted_sizes(load_paper_results(), "arc", "accuracy", range(1000, 1400))
    assert counts[1165] == 18 and counts[1172] == 2
    assert [n for n, c in counts.items() if c == 18] == [1165]


def test_a_single_seed_prints_no_spread(tmp_path):
    from softtokens.cells.results import mean_std_text, parse_mean_std
    from softtokens.report.page import _pm

    assert mean_std_text(45.25, float("nan"), 1) == "45.2" and mean_std_text(45.25, 0.0, 1) == "45.2"
    assert mean_std_text(45.25, 0.0, 2) == "45.2±0.0"      # two seeds that agree: a spread of 0, said
    assert parse_mean_std("45.2") == (45.2, 0.0) and parse_mean_std("45.2±1.5") == (45.2, 1.5)
    assert _pm(45.3, 0.0, 1) == "45.3 (n=1)" and _pm(45.3, 2.0, 3) == "45.3 ± 2.0 (n=3)"


def test_our_cells_are_compared_paired_from_their_evaluation_files(tmp_path):
    """Two seeds each of hard and soft training on the same 4 questions. Per-question pass@1 averaged
    over seeds: hard (100, 100, 50, 0), soft (100, 50, 50, 0): differences (0, 50, 0, 0), variance
    625 - 12.5² = 468.75, / 4 = 117.19. Seeds: hard 75 and 50 (std 17.68, / 2 = 156.25), soft 50 and 50
    (std 0). Paired se sqrt(156.25 + 117.19) = 16.54; unpaired each cell's own test-set variance adds up
    instead: 156.25 + (1875 + 2500) / 2 / 4 + 2500 / 4 = 1328 (se 36.4)."""
    from dataclasses import replace

    from softtokens.verdict import choices, claims, uncertainty
    from softtokens.verdict.choices import DEFAULT

    correct = {"hard": [(1, 1, 1, 0), (1, 1, 0, 0)], "soft": [(1, 1, 0, 0), (1, 0, 1, 0)]}
    evals = []
    for mode, seeds in correct.items():
        for seed, cs in enumerate(seeds):
            p = tmp_path / "eval" / "m" / f"d-{mode}-seed{seed}" / "b" / "hard_greedy.json"
            p.parent.mkdir(parents=True)
            p.write_text(json.dumps({"n_samples": 1, "pass@1": sum(cs) / 4, "pass@k": {"1": sum(cs) / 4},
                                     "mean_cot_length": 1.0, "n_problems": 4,
                                     "problems": [{"id": f"q{i}", "n": 1, "correct": c} for i, c in enumerate(cs)]}))
            evals.append(p)
    ours = our_cells.aggregate(our_cells.seed_rows(evals))
    hard, soft = (ours[ours.train_mode == m].iloc[0].to_dict() for m in ("hard", "soft"))
    assert list(hard["questions"]) == [100.0, 100.0, 50.0, 0.0] and list(soft["questions"]) == [100.0, 50.0, 50.0, 0.0]
    assert hard["seeds"] == (0, 1) and hard["values"] == (75.0, 50.0)
    s = uncertainty.difference(soft, hard)
    assert s.kind == choices.PAIRED and s.se == pytest.approx(math.sqrt(156.25 + 468.75 / 4))
    unpaired = uncertainty.difference(soft, hard, replace(DEFAULT, test_set=choices.UNPAIRED))
    assert unpaired.se == pytest.approx(math.sqrt(156.25 + 4375 / 8 + 625))
    c = claims.judge_claim("pass1_parity", ours)
    assert c.comparisons == {"paired": 2} and "(paired, t, " in c.evidence[0]   # both parts read the one comparison


def test_audit_says_when_a_remade_file_gives_the_same_value(tmp_path, monkeypatch):
    """A single-cell rerun remakes an evaluation file (new provenance, new hash) with the same number:
    the audit flags the stale link and says the value has not changed."""
    from softtokens.audit.cell import audit_cell

    monkeypatch.chdir(tmp_path)
    table, evals = _chain(Path("."))
    res = json.loads(evals[0].read_text())
    record = res.pop("provenance")
    res["seconds"] = 12.5  # remade by its job: same numbers, other bytes, a record of its own
    write_json(evals[0], Provenance("evaluate", record["config"], inputs={k: v["path"] for k, v in
                                                                          record["inputs"].items()}).embedded(
        res, evals[0]))
    lines, problems = audit_cell(table, "toy ds hard", "ds Greedy pass@1")
    assert problems == 1 and any("CHANGED" in line and "since the table was made" in line for line in lines)
    assert any("VALUE UNCHANGED: the changed file(s) still give 60.0±14.1" in line for line in lines)
    assert not any("CHANGED VALUE" in line for line in lines)
