# Sourced by the training recipes (scripts/train_shipped.sh, scripts/scaling_study.sh): where
# the repository, its interpreter and CLI are, and ROOT (env SPECUI_TRAIN_ROOT, default
# /work/train-runs), where runs, caches and logs go: never inside the repository.
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PY=${PY:-$REPO/.venv/bin/python}
SPECUI=${SPECUI:-$REPO/.venv/bin/specui}
ROOT=${SPECUI_TRAIN_ROOT:-/work/train-runs}
case "$ROOT" in "$REPO"|"$REPO"/*) echo "SPECUI_TRAIN_ROOT must lie outside the repository" >&2; exit 2;; esac
