# Two entry points for a fresh machine: `make demo` and `make test`.
PYTHON ?= python3.11
TORCH_SPEC ?= torch==2.13.0
VENV := .venv
BIN := $(VENV)/bin
CORES ?= 2

.PHONY: setup demo demo-ablations demo-long test lint clean-toy

$(BIN)/activate:
	@command -v $(PYTHON) >/dev/null || { echo "need $(PYTHON) (set PYTHON=...)"; exit 1; }
	$(PYTHON) -m venv $(VENV)

# The torch spec goes in the same pip command as everything else, so pip never
# resolves an unpinned torch (which would download gigabytes of CUDA wheels).
$(VENV)/.installed: pyproject.toml | $(BIN)/activate
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet "$(TORCH_SPEC)" -e ".[test]"
	touch $@

setup: $(VENV)/.installed

# the DAG, then Snakemake's own HTML report of it (tables, figures, reproduction report, ledger)
demo: setup
	$(BIN)/snakemake --cores $(CORES)
	$(BIN)/snakemake --report results/toy/report.html

# the appendix ablations on the toy (not part of `demo`): the toy grid first (its runs are the
# ablation tables' default rows, reused), then 12 variants x 2 seeds (about 45 min on 2 cores)
demo-ablations: setup
	$(BIN)/snakemake --cores $(CORES)
	$(BIN)/snakemake --cores $(CORES) --config grid=toy-ablations

# the toy for a few hundred steps at a paper-like learning rate, 3 seeds (estimated: about an hour on 2 cores)
demo-long: setup
	$(BIN)/snakemake --cores $(CORES) --config grid=toy-long

test: setup
	$(BIN)/python -m pytest -q

lint: setup
	$(BIN)/snakemake --lint

clean-toy:
	rm -rf results/toy
