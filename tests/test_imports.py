"""The package's structure: sub-packages by layer, each importing only the layers below it (at
module level or inside a function), no circle between modules, no module over 400 lines and no
class over 200 (docs/layout.md)."""

import ast
import subprocess
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "softtokens"
# bottom to top: a module may import its own layer and the ones before it
# (config is lowest, then the store: names, settings and paths are read by every layer; data reads reward's answer
# normaliser to check golds when it prepares a dataset)
LAYERS = ("config", "store", "reward", "data", "model", "engine", "rates", "train", "sizing", "grid", "eval", "cells",
          "cost", "audit", "crate", "verdict", "robustness", "search", "report", "gpucheck", "workflow", "commands", "cli", "bytecode")
MAX_MODULE_LINES, MAX_CLASS_LINES = 400, 200
MAX_ROOM_LINES = 2500   # a sub-package past this holds more than one thing users come for: split it


def modules() -> dict[str, Path]:
    out = {}
    for p in PACKAGE.rglob("*.py"):
        parts = p.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        if name != "softtokens.__main__":
            out[name] = p
    return out


def layer(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else None


def import_graph() -> dict[str, set[str]]:
    mods = modules()
    graph = {m: set() for m in mods}
    for m, path in mods.items():
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            for name in names:
                if name in mods and name != m and name != "softtokens":
                    graph[m].add(name)
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(m: str) -> list[str] | None:
        state[m] = 1
        stack.append(m)
        for n in sorted(graph[m]):
            if state.get(n) == 1:
                return stack[stack.index(n):] + [n]
            if n not in state and (found := visit(n)):
                return found
        stack.pop()
        state[m] = 2
        return None

    for m in sorted(graph):
        if m not in state and (found := visit(m)):
            return found
    return None


def test_find_cycle_sees_a_circle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_no_module_imports_another_in_a_circle():
    graph = import_graph()
    assert "softtokens.data.sources" in graph["softtokens.data.splits"]  # the graph sees the imports
    assert find_cycle(graph) is None, " -> ".join(find_cycle(graph))


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    upward = []
    for m, deps in graph.items():
        mine = layer(m)
        for d in deps:
            theirs = layer(d)
            if mine in LAYERS and theirs in LAYERS and LAYERS.index(theirs) > LAYERS.index(mine):
                upward.append(f"{m} -> {d}")
    return upward


def test_upward_imports_are_seen():
    graph = {"softtokens.engine.cot": {"softtokens.config.names"}, "softtokens.store.paths": {"softtokens.train.loop"}}
    assert upward_imports(graph) == ["softtokens.store.paths -> softtokens.train.loop"]


def test_each_layer_imports_only_downward():
    graph = import_graph()
    assert "softtokens.config.grids" in graph["softtokens.train.config"]  # the graph sees the imports
    upward = upward_imports(graph)
    assert not upward, upward
    assert {layer(m) for m in modules()} - {None, "__init__"} <= set(LAYERS)


def test_no_module_or_class_too_big_to_read():
    big = []
    for m, path in modules().items():
        text = path.read_text()
        if len(text.splitlines()) > MAX_MODULE_LINES:
            big.append(f"{m}: {len(text.splitlines())} lines")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.ClassDef) and node.end_lineno - node.lineno + 1 > MAX_CLASS_LINES:
                big.append(f"{m}.{node.name}: {node.end_lineno - node.lineno + 1} lines")
    assert not big, big


def test_no_room_holds_more_than_it_can_say_in_a_line():
    """A sub-package is one room with one job (docs/layout.md); one that grows past MAX_ROOM_LINES has
    become the place for several (report/ once held the verdict, the bill and the audit: 4.9k lines)."""
    sizes: dict[str, int] = {}
    for m, path in modules().items():
        if layer(m):
            sizes[layer(m)] = sizes.get(layer(m), 0) + len(path.read_text().splitlines())
    assert sizes["report"] > 0 and sizes["verdict"] > 0   # the rooms are seen
    big = {room: n for room, n in sizes.items() if n > MAX_ROOM_LINES}
    assert not big, big


def test_no_native_code():
    assert not [p for p in PACKAGE.rglob("*") if p.suffix in (".c", ".cc", ".cpp", ".h", ".so")]


def test_the_names_that_must_not_drift_live_at_their_homes():
    """DESIGN.md's public names, at the homes docs/layout.md lists, with their contracts."""
    import torch

    from softtokens.engine.settings import INFERENCE_SETTINGS
    from softtokens.eval.metrics import pass_at_k
    from softtokens.reward import reward
    from softtokens.train.rloo import gaussian_log_prob, rloo_advantages

    assert pass_at_k(4, 2, 1) == 0.5 and pass_at_k(4, 0, 2) == 0.0
    assert (reward(" \\boxed{72}.", "72"), reward(" \\boxed{7}.", "72"), reward(" 72", "72")) == (100, 10, 0)
    assert torch.allclose(rloo_advantages(torch.tensor([[1.0, 0.0, 0.0]])), torch.tensor([[1.0, -0.5, -0.5]]))
    assert gaussian_log_prob(torch.ones(2), torch.zeros(2), 0.5).item() == -4.0
    paper_six = ["hard_greedy", "hard_sample", "soft_greedy", "soft_sample", "fuzzy_greedy", "fuzzy_sample"]
    assert list(INFERENCE_SETTINGS)[:6] == paper_six   # the paper's six first; a setting of ours may follow
    assert INFERENCE_SETTINGS["soft_sample"] == ("soft", 0.5, 0.33)


def test_the_workflow_and_the_jobs_that_compute_nothing_load_neither_torch_nor_transformers():
    """Every `snakemake` start (and every job a cluster executor starts) parses the workflow, and the
    data, selection, table, figure and report jobs are small: torch and transformers would be most of
    their time (~1.3 s and ~1.5 s of start-up each). Only jobs that run a model load them."""
    code = ("import sys\n"
            # what workflow/rules/common.smk imports, and the plan check of the paper grid (hub models)
            "from softtokens.data.sources import loader_kind\n"
            "from softtokens.config.grids import check_config, load_config\n"
            "from softtokens.grid.jobs import GridJobs\n"
            "from softtokens.workflow.backups import settle\n"
            "from softtokens.workflow.slurm_check import status_command_problem\n"
            "from softtokens.sizing.plan import check_plan\n"
            "config = load_config('config.yaml', loader_kind)\n"
            "for grid in ('toy', 'paper'):\n"
            "    check_plan(config, grid)\n"
            "    GridJobs({**config, 'grid': grid}).all_targets()\n"
            # the commands of the jobs that run no model, and the provenance record each job writes
            "import softtokens.cli\n"
            "from softtokens.data.splits import prepare\n"
            "from softtokens.train.selection import select_best, check_checkpoint\n"
            "from softtokens.report import tables, figures, page, ablations\n"
            "from softtokens.audit import cell, status\n"
            "from softtokens.store.provenance import Provenance\n"
            "Provenance('tables', {}).record()\n"
            "print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=PACKAGE.parents[1], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip() == "[]"
