# fedray developer commands. `make demo` and `make test` work on a fresh machine:
# they create the virtual environment (.venv) on first use.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin

.PHONY: venv demo test lint bench mutation clean

$(BIN)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $@

venv: $(BIN)/.installed

demo: venv  ## FedAvg on 1,000 synthetic FEMNIST writers (about a minute on 2 cores)
	$(BIN)/fedray run jobs/quickstart.yaml

test: venv  ## the whole test suite (about 40 minutes on 2 cores)
	$(BIN)/ruff check .
	$(BIN)/python -m pytest -q

lint: venv
	$(BIN)/ruff check .

bench: venv  ## fedray vs a plain PyTorch loop, the vectorized step, 1,000 vs 100,000 clients, a run's start-up
	$(BIN)/python benchmarks/throughput.py
	$(BIN)/python benchmarks/vectorized_step.py
	$(BIN)/python benchmarks/scale.py
	$(BIN)/python benchmarks/startup.py

mutation: venv  ## can the core math's tests fail? small bugs put in one at a time (docs/testing.md; long, not in `make test`)
	nice -n 19 $(BIN)/python tools/mutation.py $(MUTATION_ARGS)

clean:
	rm -rf $(VENV) runs .pytest_cache .ruff_cache
