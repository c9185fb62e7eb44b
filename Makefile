# Two commands do all the set-up on a fresh machine:
#   make run    -- set up .venv and start the dashboard on the embedded default
#   make test   -- set up .venv, .venv-vllm and headless Chromium, then run the test suite
PY := .venv/bin/python
ARGS ?=

.PHONY: setup run test test-benches lint browser vllm-setup
setup:
	@bash scripts/setup.sh

run: setup
	$(PY) app.py $(ARGS)

browser:
	@bash scripts/install_browser.sh

# vLLM in its own virtualenv (.venv-vllm): the CPU build here, upstream vLLM on GPU machines.
vllm-setup:
	@bash scripts/setup_vllm.sh

test: setup browser vllm-setup
	$(PY) -m ruff check .
	$(PY) -m pytest -q $(ARGS)

# Every bench under bench/ in its quickest mode (10-15 min): after moving modules.
test-benches: setup browser
	$(PY) -m pytest -q -m bench tests/test_benches.py $(ARGS)

lint: setup
	$(PY) -m ruff check .
