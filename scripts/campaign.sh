#!/usr/bin/env bash
# Starts (or restarts) the drafters' training campaign in the background where it stopped:
# low priority, one torch thread, its log in the state folder.  Safe to run at any time: a
# campaign that is still running keeps the lock and the new one exits at once.
# SHARDS processes (default 2, one a core; nice 19, so foreground work comes first) share the
# prompts by key hash and append to one cache.
#   Pause it for a benchmark or a CI run:  bash scripts/campaign.sh pause
#   ... and resume:                         bash scripts/campaign.sh resume
# Pausing signals every process under each running shard: a training stage's torchrun workers
# start sessions of their own, so signalling the shard's process group would miss them.
set -euo pipefail
cd "$(dirname "$0")/.."
STATE=${SPECUI_CAMPAIGN_DIR:-$HOME/specui-campaign}
mkdir -p "$STATE"

tree() {  # a pid and all its descendants, parents first
  echo "$1"
  local c
  for c in $(pgrep -P "$1"); do tree "$c"; done
}
if [ "${1:-}" = pause ] || [ "${1:-}" = resume ]; then
  sig=STOP; [ "$1" = resume ] && sig=CONT
  n=0
  for lock in "$STATE"/lock*; do
    [ -f "$lock" ] || continue
    flock -n "$lock" true && continue  # not held: that shard is not running (its pid is stale)
    for q in $(tree "$(cat "$lock")"); do kill -"$sig" "$q" 2>/dev/null && n=$((n + 1)); done
  done
  echo "campaign: ${1}d ($n processes)"
  exit 0
fi
bash scripts/setup.sh
# The prompts stage reads packaged text (specui/data/passages.py); once every part of the
# prompts exists nothing else needs them, but a part added later does.
if true; then
  need=()
  for p in python3-doc debian-reference-en debian-reference-de debian-reference-fr \
           debian-reference-es debian-reference-it debian-reference-ja debian-reference-pt \
           debian-reference-zh-cn debian-faq debian-faq-de debian-faq-fr debian-faq-it \
           debian-faq-ja debian-faq-nl debian-faq-pt debian-faq-ru debian-faq-zh-cn \
           debian-handbook fortunes-de fortunes-zh fortunes-ru fortunes-es fortunes-it; do
    dpkg -s "$p" >/dev/null 2>&1 || need+=("$p")
  done
  if [ ${#need[@]} -gt 0 ]; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}"
  fi
fi
SHARDS=${SHARDS:-2}
for ((i = 0; i < SHARDS; i++)); do
  log="$STATE/campaign.log"
  [ "$i" -gt 0 ] && log="$STATE/campaign-$i.log"
  THREADS=${THREADS:-1} SPECUI_CAMPAIGN_DIR="$STATE" nohup setsid nice -n 19 .venv/bin/python \
    scripts/campaign.py run --shard "$i/$SHARDS" >> "$log" 2>&1 &
  echo "campaign: shard $i/$SHARDS started (pid $!), log: $log"
done
