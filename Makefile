# chessgrpo: `make run` sets up and runs the main job; `make test` sets up and runs the tests.
VENV := .venv
BIN := $(VENV)/bin

.PHONY: setup run lint test test-slow test-all bench doctor recipe clean

setup:
	@bash scripts/setup.sh

run: setup
	bash scripts/quickstart.sh

# Style, imports and types (settings in pyproject.toml): ruff's formatter and linter over the code, tests, scripts
# and benches, and mypy over the GRPO core, the spine and the registries. `make test` runs it first.
lint: setup
	$(BIN)/ruff format --check --quiet src tests scripts bench
	$(BIN)/ruff check --quiet src tests scripts bench
	$(BIN)/mypy

test: setup lint
	$(BIN)/python -m pytest -q $(PYTEST_ARGS)

# The slowest end-to-end cases (marked `slow`), which `make test` leaves out; CI runs both.
test-slow: setup
	$(BIN)/python -m pytest -q -m slow $(PYTEST_ARGS)

test-all: setup
	$(BIN)/python -m pytest -q -m "slow or not slow" $(PYTEST_ARGS)

bench: setup
	$(BIN)/python bench/engine_throughput.py

recipe: setup
	bash scripts/recipe.sh cpu_hour

doctor: setup
	$(BIN)/chessgrpo doctor

clean:
	rm -rf $(VENV) runs .pytest_cache
