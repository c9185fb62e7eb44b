# Two commands do all the set-up on a fresh machine:
#   make run    -- set up .venv and start the dashboard on the embedded default
#   make test   -- set up .venv (and headless Chromium) and run the test suite
PY := .venv/bin/python
ARGS ?=

.PHONY: setup run test lint browser
setup:
	@bash scripts/setup.sh

run: setup
	$(PY) app.py $(ARGS)

browser:
	@bash scripts/install_browser.sh

test: setup browser
	$(PY) -m ruff check .
	$(PY) -m pytest -q $(ARGS)

lint: setup
	$(PY) -m ruff check .
