#!/usr/bin/env bash
# Creates .venv-speculators: the real `speculators` 0.9.0 package in a virtualenv
# of its own, used only by scripts/make_fixtures.py to regenerate or check the
# committed conformance fixtures (tests/fixtures/speculators-0.9.0).  The test
# suite never needs it.  Idempotent: a second run only checks.
#
# Why a venv of its own: speculators 0.9.0 pins transformers<=5.19.0 and
# torch<=2.14.1, older than what the app's .venv may carry.  torch is installed
# first and explicitly, because speculators' plain `torch` requirement would
# otherwise pull the multi-GB CUDA build from PyPI; with torch==2.13.0 already
# present (the CPU wheel on this machine's local index) pip keeps it.  The
# torchvision / torchaudio wheels speculators also requires are CUDA builds that
# do not load against a CPU torch; speculators' model classes never import them,
# so they are removed again (as setup_vllm.sh does for vLLM).
#
#   SPECUI_SPECULATORS_VENV   where to create it (default .venv-speculators)
#   SPECUI_SPECULATORS_TORCH  the torch requirement installed first (default torch==2.13.0)
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/venv_lib.sh
source scripts/venv_lib.sh
TORCH=${SPECUI_SPECULATORS_TORCH:-torch==2.13.0}
venv_begin speculators "${SPECUI_SPECULATORS_VENV:-.venv-speculators}"

echo "setup_speculators: installing $TORCH, then speculators==0.9.0 into $VENV" >&2
pip install --quiet "$TORCH"
# transformers 5.19.0 is the version the committed fixtures were written with
# (their manifest.json) and the newest speculators 0.9.0 accepts.
pip install --quiet "$TORCH" speculators==0.9.0 transformers==5.19.0
pip uninstall --quiet --yes torchvision torchaudio torchcodec 2>/dev/null || true
# Fail here, not in the middle of a regeneration, when the install is unusable.
"$PY" -c "import speculators.train.data, speculators.version as v, torch, transformers; print('setup_speculators: speculators', v.version, '/ torch', torch.__version__, '/ transformers', transformers.__version__)" >&2
venv_done
