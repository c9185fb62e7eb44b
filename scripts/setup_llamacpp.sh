#!/usr/bin/env bash
# Creates .venv-llamacpp: llama.cpp through the prebuilt `xllamacpp` wheel (CPU build),
# in a virtualenv of its own, used only by bench/engine_peer.py as the peer engine.
# The app, its tests and `make test` never need it.  Idempotent: a second run only checks.
#
# Why a venv of its own: the bench runs llama.cpp in a subprocess of this venv, so the
# app's .venv carries no llama.cpp build.
#
#   SPECUI_LLAMACPP_VENV     where to create it (default .venv-llamacpp)
#   SPECUI_LLAMACPP_PACKAGE  the requirement (default xllamacpp)
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/venv_lib.sh
source scripts/venv_lib.sh
PACKAGE=${SPECUI_LLAMACPP_PACKAGE:-xllamacpp}
venv_begin llamacpp "${SPECUI_LLAMACPP_VENV:-.venv-llamacpp}"
echo "setup_llamacpp: installing $PACKAGE into $VENV" >&2
pip install --quiet --only-binary :all: "$PACKAGE"
"$PY" -c "import xllamacpp, importlib.metadata as m; print('setup_llamacpp: xllamacpp', m.version('xllamacpp'))" >&2
venv_done
