#!/usr/bin/env bash
# Data-scaling study (issue 19): how Spec-Bench acceptance grows with training data, for a
# parallel drafter (DFlash) against an autoregressive one (EAGLE-3).  Resumable: kill it at
# any time; run it again and it continues (each training with --resume, each eval skipped
# once its JSON exists).
#
#   setsid nohup scripts/scaling_study.sh >> "${SPECUI_TRAIN_ROOT:-/work/train-runs}/scaling.log" 2>&1 &
#   ALGOS=dflash scripts/scaling_study.sh & ALGOS=eagle3 scripts/scaling_study.sh &   # two lanes, two cores
#
# Every run trains FROM SCRATCH on the first N prompts of the general corpus's training split
# (nested subsets of one shuffled file, so every size mixes the task kinds alike), for the
# same number of epochs (EPOCHS), so steps per training token are equal across sizes.  Each
# finished drafter is benched on Spec-Bench (EVAL_LIMIT prompts: the round robin gives
# EVAL_LIMIT/6 per task group; T=0, K 8, 128 new tokens) into ROOT/scaling/bench.db, and
# `train_shipped_tools.py scaling` turns the JSON files into the table and the plot of
# docs/results.md (tau against training tokens).
#
#   SIZES       corpus sizes in prompts (default "200 600 1200 2400": what two shared cores
#               allowed over two sessions beside the other work)
#   ALGOS       default "dflash eagle3"
#   EPOCHS      default 1
set -euo pipefail
# shellcheck source=scripts/train_lib.sh
source "$(dirname "$0")/train_lib.sh"
RUNS=$ROOT/scaling
SIZES=${SIZES:-"200 600 1200 2400"}
ALGOS=${ALGOS:-"dflash eagle3"}
EPOCHS=${EPOCHS:-1}
EVAL_LIMIT=${EVAL_LIMIT:-12}
THREADS=${THREADS:-1}
mkdir -p "$RUNS"
cd "$ROOT"
export SPECUI_DATA_DIR=${SPECUI_DATA_DIR:-$ROOT/specui-data}
LOCK=$RUNS/.lock-${ALGOS// /-}  # one lane per algorithm list
exec 9>"$LOCK"
flock -n 9 || { echo "another scaling_study.sh holds $LOCK" >&2; exit 1; }
say() { echo "[$(date -u +%FT%TZ)] $*"; }
finished() { [ -f "$1/model.safetensors" ] && grep -q '"status": "finished"' "$1/train_run.json" 2>/dev/null; }

# The shipped recipes' shapes (scripts/train_shipped.sh), at batch sizes that keep a step a few seconds.
declare -A BATCH=([dflash]=4 [eagle3]=2)
declare -A SHAPE=([dflash]="--layers 3 --block-size 8 --max-anchors 64" [eagle3]="--layers 1 --ttt-steps 4")

# Smallest sizes first for every algorithm, so a cut-short session still has a curve.
for n in $SIZES; do
  for algo in $ALGOS; do
    out=$RUNS/$algo-$n
    steps=$(( (n * EPOCHS + BATCH[$algo] - 1) / BATCH[$algo] ))
    warm=$(( steps / 10 > 5 ? steps / 10 : 5 ))
    if ! finished "$out"; then
      say "$algo n=$n: $steps steps from scratch into $out"
      # shellcheck disable=SC2086 # SHAPE is a word list
      "$SPECUI" train --algorithm "$algo" --verifier embedded --prompts general --num-prompts "$n" \
        --max-new-tokens 128 --cache-dir "$ROOT/cache" --extraction mixed --out "$out" --resume \
        --threads "$THREADS" --batch-size "${BATCH[$algo]}" --draft-vocab-size 8192 --mask-token-id 16 \
        --steps "$steps" --lr 6e-4 --warmup-steps "$warm" --schedule cosine --seed 0 \
        --log-every 10 --checkpoint-every 50 --keep-checkpoints 1 --no-progress ${SHAPE[$algo]}
      finished "$out"
    fi
    if [ ! -s "$out/eval-spec-bench-T0.json" ]; then
      say "$algo n=$n: Spec-Bench eval ($EVAL_LIMIT prompts)"
      k=(); [ "$algo" = eagle3 ] && k=(-k 8)  # as shipped: EAGLE-3 trains 4 TTT steps, drafts 8
      "$SPECUI" bench --drafter "$out" --prompts spec-bench --limit "$EVAL_LIMIT" --max-new-tokens 128 \
        "${k[@]}" --threads "$THREADS" --db "$RUNS/bench.db" --json > "$out/eval.tmp"
      mv "$out/eval.tmp" "$out/eval-spec-bench-T0.json"
    fi
  done
done
"$PY" "$REPO/scripts/train_shipped_tools.py" scaling "$RUNS" --svg "$RUNS/scaling.svg" | tee "$RUNS/scaling.md"
say "scaling study: done"
