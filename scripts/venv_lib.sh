# Sourced by the scripts/setup_*.sh that build a virtualenv of their own (.venv-vllm,
# .venv-speculators): each is set up once, and again only when its script changes.
#
#   venv_begin NAME VENV [FILE...]
#                          sets PY (the venv's python); exits the calling script when VENV
#                          was set up by this version of scripts/setup_NAME.sh and of each
#                          FILE it installs (its stamp is newer than all of them); otherwise
#                          creates the venv if needed
#   pip ...                pip of that venv
#   venv_done              stamps the venv as set up and says how long it took

venv_begin() {
  VENV_NAME=$1 VENV=$2 PY="$2/bin/python" STAMP="$2/.specui-$1-installed" VENV_START=$(date +%s)
  local f fresh=1
  for f in "scripts/setup_$1.sh" "${@:3}"; do
    { [ -f "$STAMP" ] && [ "$STAMP" -nt "$f" ]; } || fresh=0
  done
  if [ "$fresh" = 1 ]; then
    exit 0
  fi
  [ -x "$PY" ] || python3 -m venv "$VENV"
}

pip() { "$PY" -m pip --disable-pip-version-check "$@"; }

venv_done() {
  touch "$STAMP"
  echo "setup_$VENV_NAME: $VENV ready in $(( $(date +%s) - VENV_START )) s" >&2
}
