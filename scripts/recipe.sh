#!/usr/bin/env bash
# A training recipe from nothing, then its evaluation: `bash scripts/recipe.sh cpu_hour`
# (or `make recipe`). The stages read configs/recipes/NAME/{data,pretrain,grpo}.yaml and write
# runs/NAME/ (pretrain/, grpo/, eval/, stages.tsv: the wall-clock of every stage):
#   training (the recipe's budget)    1. data generate  2. pretrain  3. GRPO
#   evaluation (not in the budget)    4. puzzles with the policy alone and with SEARCH_NODES of PUCT
#                                     5. games: pretrained and GRPO policies against the ladder (the random
#                                        mover, sf-skill:0, sf-nodes:10, sf-elo:1350; GAMES each), paired
#                                     6. both against sf-skill:0 with SEARCH_NODES of PUCT per move, paired
#                                     7. SPRT of the GRPO policy against its pretrained start (games)
# Every stage resumes or skips finished work: running the command again continues where it stopped.
# Time on 2 idle cores (measured 2026-11-27): training ~44 min (data 5.5, pretraining 16, GRPO ~22 with the engine
# cache of earlier runs); evaluation without search ~5-15 min (the SPRT plays until it decides), and stage 6 ~1.5 h per network on 2 cores (about 4 min each on a
# 16-core machine with a GPU: GAME_DEVICE=cuda). SEARCH_NODES=0 skips 4's searched half and 6.
# Environment: SEARCH_NODES (default 256; 0 skips the search stages), GAMES (default 200), GAME_DEVICE (default cpu:
# the torch device of the searching games), SPRT (default "0,10": H0 Elo 0, H1 Elo 10), SPRT_GAMES (default 4000).
set -euo pipefail
cd "$(dirname "$0")/.."
NAME=${1:?usage: scripts/recipe.sh NAME (a folder of configs/recipes/)}
RECIPE=configs/recipes/$NAME
for stage in data pretrain grpo; do
  [ -f "$RECIPE/$stage.yaml" ] || { echo "recipe $NAME: $RECIPE/$stage.yaml is missing" >&2; exit 2; }
done
CLI=.venv/bin/chessgrpo
OUT=runs/$NAME
PRETRAIN=$OUT/pretrain
GRPO=$OUT/grpo
EVAL=$OUT/eval
SEARCH_NODES=${SEARCH_NODES:-256}
GAMES=${GAMES:-200}
SPRT=${SPRT:-0,10}
SPRT_GAMES=${SPRT_GAMES:-4000}
GAME_DEVICE=${GAME_DEVICE:-cpu}
mkdir -p "$EVAL"
STAGES=$OUT/stages.tsv
[ -f "$STAGES" ] || printf 'stage\tseconds\tfinished\n' > "$STAGES"

# stage NAME COMMAND...: run it, append its wall-clock to stages.tsv (a rerun appends again).
stage() {
  local name=$1; shift
  echo; echo "== recipe $NAME: $name =="
  local started=$SECONDS
  "$@"
  printf '%s\t%s\t%s\n' "$name" "$((SECONDS - started))" "$(date -u +%FT%TZ)" >> "$STAGES"
}

$CLI doctor
stage data $CLI data generate --config "$RECIPE/data.yaml"
if [ -e "$PRETRAIN/checkpoints/latest" ]; then
  stage pretrain $CLI pretrain --resume "$PRETRAIN"
else
  stage pretrain $CLI pretrain --config "$RECIPE/pretrain.yaml" run.out_dir=$OUT run.name=pretrain
fi
if [ -e "$GRPO/checkpoints/latest" ]; then
  stage grpo $CLI train --resume "$GRPO"
else
  stage grpo $CLI train --config "$RECIPE/grpo.yaml" run.out_dir=$OUT run.name=grpo init_checkpoint=$PRETRAIN
fi
echo; echo "== recipe $NAME: training wall-clock (seconds) =="; cat "$STAGES"

# The GRPO run evaluated its start (= the pretrained policy) and its end on the same held-out
# positions and puzzles (policy alone): paired before/after.
BEFORE=$(ls $GRPO/eval/step_*_offline.json | head -1)
AFTER=$(ls $GRPO/eval/step_*_offline.json | tail -1)
echo; echo "== before (pretrained) / after (GRPO), policy alone =="
$CLI eval compare "$BEFORE" "$AFTER"
$CLI eval compare "${BEFORE%_offline.json}_puzzles.json" "${AFTER%_offline.json}_puzzles.json"

if [ "$SEARCH_NODES" -gt 0 ]; then
  for STAGE in pretrain grpo; do
    [ -f $EVAL/${STAGE}_puzzles_search$SEARCH_NODES.json ] || stage "puzzles $STAGE search $SEARCH_NODES" \
      $CLI eval puzzles --config configs/eval.yaml --checkpoint "$OUT/$STAGE" --search-nodes "$SEARCH_NODES" \
      baselines=false output=$EVAL/${STAGE}_puzzles_search$SEARCH_NODES.json
  done
  $CLI eval compare $EVAL/pretrain_puzzles_search$SEARCH_NODES.json $EVAL/grpo_puzzles_search$SEARCH_NODES.json
fi

# Games, policy alone: both stages against the same anchors from the same openings (seed 0),
# compared pair by pair.
for STAGE in pretrain grpo; do
  [ -f $EVAL/${STAGE}_games.json ] || stage "games $STAGE" \
    $CLI eval games --config configs/games.yaml --checkpoint "$OUT/$STAGE" --anchors random,sf-skill:0,sf-nodes:10,sf-elo:1350 --games "$GAMES" \
    output=$EVAL/${STAGE}_games.json pgn=$EVAL/${STAGE}_games.pgn
done
$CLI eval compare $EVAL/pretrain_games.json $EVAL/grpo_games.json

# The same network with SEARCH_NODES of PUCT per move against sf-skill:0, before and after GRPO, paired.
if [ "$SEARCH_NODES" -gt 0 ]; then
  for STAGE in pretrain grpo; do
    [ -f $EVAL/${STAGE}_games_search$SEARCH_NODES.json ] || stage "games $STAGE search $SEARCH_NODES" \
      $CLI eval games --config configs/games.yaml --checkpoint "$OUT/$STAGE" --anchors sf-skill:0 --games "$GAMES" \
      --search-nodes "$SEARCH_NODES" device=$GAME_DEVICE output=$EVAL/${STAGE}_games_search$SEARCH_NODES.json \
      pgn=$EVAL/${STAGE}_games_search$SEARCH_NODES.pgn
  done
  $CLI eval compare $EVAL/pretrain_games_search$SEARCH_NODES.json $EVAL/grpo_games_search$SEARCH_NODES.json
fi

# Does the GRPO stage win games against its own start? A sequential test stops when decided.
[ -f $EVAL/sprt.json ] || stage "sprt grpo vs pretrain" \
  $CLI eval games --config configs/games.yaml --checkpoint "$GRPO" --opponent "$PRETRAIN" --sprt "$SPRT" \
  --games "$SPRT_GAMES" output=$EVAL/sprt.json pgn=$EVAL/sprt.pgn

echo; echo "== recipe $NAME: wall-clock of every stage (seconds) =="; cat "$STAGES"
