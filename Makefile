# Two entry points for a fresh machine: `make demo` and `make test`.
PYTHON ?= python3.11
TORCH_SPEC ?= torch==2.13.0
VENV := .venv
BIN := $(VENV)/bin
CORES ?= 2

.PHONY: setup demo test lint clean-toy

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

test: setup
	$(BIN)/python -m pytest -q

lint: setup
	$(BIN)/snakemake --lint

clean-toy:
	rm -rf results/toy
