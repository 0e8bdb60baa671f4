# backfill: make run (the whole system locally), make test (what CI runs: lint, types, tests).

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: venv run test test-s3 fmt lint clean promtool chromium

venv: $(STAMP)

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

# Reinstall only when pyproject.toml changed since the last install.
$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -e '.[test]'
	touch $(STAMP)

run: venv
	exec $(BIN)/backfill dev

lint: venv
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

# promtool (Debian's prometheus package) runs the alert-rule tests in tests/unit/test_deploy.py.
# Installed when missing: with apt-get as root, otherwise stop with the command to run.
promtool:
	@if command -v promtool >/dev/null 2>&1; then exit 0; fi; \
	if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
		echo "promtool missing: installing Debian's prometheus package"; \
		apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends prometheus; \
	else \
		echo "promtool is missing. Install it with: sudo apt-get install -y prometheus" >&2; exit 1; \
	fi; \
	command -v promtool >/dev/null 2>&1 || { echo "promtool still missing after installing prometheus" >&2; exit 1; }

# Debian's Chromium runs the console's browser tests (tests/browser, Playwright with
# executable_path; never `playwright install`). Installed when missing, like promtool.
chromium:
	@if [ -x /usr/bin/chromium ]; then exit 0; fi; \
	if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
		echo "chromium missing: installing Debian's chromium package"; \
		apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends chromium; \
	else \
		echo "chromium is missing. Install it with: sudo apt-get install -y chromium" >&2; exit 1; \
	fi; \
	[ -x /usr/bin/chromium ] || { echo "/usr/bin/chromium still missing after installing chromium" >&2; exit 1; }

# Random test order (pytest-randomly; the seed is printed, rerun one with --randomly-seed=N).
# A run that collected no test fails (pytest exits 5): a green run must have tested something.
# Then the e2e modules marked `store` (the ones whose outcome depends on the file store: files,
# batches, results, crashes, tenancy, retention) run again on the S3 store against moto's server,
# after the main run, not alongside it (two runs at once pushed 2 cores into flaky timing).
# `make test-s3` runs the whole e2e suite on S3 (BACKFILL_TEST_STORE=s3).
test: lint promtool chromium
	$(BIN)/pytest -q
	BACKFILL_TEST_STORE=s3 $(BIN)/pytest -q -m store tests/e2e

test-s3: venv
	BACKFILL_TEST_STORE=s3 $(BIN)/pytest -q tests/e2e

fmt: venv
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

clean:
	rm -rf build dist *.egg-info .pytest_cache .mypy_cache .ruff_cache
	find . -path ./$(VENV) -prune -o -type d -name __pycache__ -exec rm -rf {} +
