#!/usr/bin/env bash
# The main job on the default config (what `make run` runs after setup):
#   1. check the installation         chessgrpo doctor
#   2. labelled data                  chessgrpo data generate  -> data/tiny/
#   3. supervised pretraining         chessgrpo pretrain       -> runs/quickstart/pretrain/
#   4. offline strength + puzzles     chessgrpo eval offline / eval puzzles (with baselines)
#   5. GRPO from the pretrained policy chessgrpo train         -> runs/quickstart/grpo/
#      (it evaluates itself at step 0 and at the end on the same held-out positions and puzzles)
#   6. before/after table             chessgrpo eval compare (paired bootstrap intervals): held-out
#      positions, puzzles, and 200 games each against a random mover (chessgrpo eval games), then
#      1000 games of the GRPO policy against its pretrained start
#   7. search: the value head's quality, and puzzles with a 256-node PUCT search on the same network
#   8. diagnosis and HTML report       chessgrpo diagnose / chessgrpo report -> runs/quickstart/grpo/report.html
#   9. the summary, read first         chessgrpo summary: did GRPO help, by how much (with intervals), what next
# Every step resumes or skips finished work, so running it again is cheap.
set -euo pipefail
cd "$(dirname "$0")/.."
CLI=.venv/bin/chessgrpo
OUT=runs/quickstart
PRETRAIN=$OUT/pretrain
GRPO=$OUT/grpo

$CLI doctor
$CLI data generate --config configs/data_tiny.yaml

if [ -e "$PRETRAIN/checkpoints/latest" ]; then
  $CLI pretrain --resume "$PRETRAIN"
else
  $CLI pretrain --config configs/pretrain_tiny.yaml run.out_dir=$OUT run.name=pretrain
fi
$CLI eval offline --config configs/eval.yaml --checkpoint "$PRETRAIN" output=$PRETRAIN/eval/offline.json
$CLI eval puzzles --config configs/eval.yaml --checkpoint "$PRETRAIN" output=$PRETRAIN/eval/puzzles.json

if [ -e "$GRPO/checkpoints/latest" ]; then
  $CLI train --resume "$GRPO"
else
  $CLI train --config configs/grpo_tiny.yaml run.out_dir=$OUT run.name=grpo init_checkpoint=$PRETRAIN
fi

# The GRPO run evaluated its start (= the pretrained policy) and its end on the same positions.
BEFORE=$(ls $GRPO/eval/step_*_offline.json | head -1)
AFTER=$(ls $GRPO/eval/step_*_offline.json | tail -1)
echo
echo "== before (pretrained) / after (GRPO) =="
$CLI eval compare "$BEFORE" "$AFTER"
$CLI eval compare "${BEFORE%_offline.json}_puzzles.json" "${AFTER%_offline.json}_puzzles.json"

# Games: both policies against the random mover from the same 100 balanced openings (colour-swapped
# pairs, seed 0); compared pair by pair (the pentanomial unit). GRPO trained on positions from the
# pretrained policy's own games, played from other (unchecked, random) openings.
for STAGE in pretrain grpo; do
  $CLI eval games --config configs/games.yaml --checkpoint "$OUT/$STAGE" --anchors random --games 200 \
    output=$OUT/$STAGE/eval/games_random.json pgn=$OUT/$STAGE/eval/games_random.pgn
done
$CLI eval compare $PRETRAIN/eval/games_random.json $GRPO/eval/games_random.json
# Both already beat the random mover almost every game, so the games that can show what GRPO changed
# are the GRPO policy against its own start: 1000 games (~1.5 min; 200 leave +-48 Elo), colour-swapped
# pairs from 500 openings.
echo
echo "== GRPO policy against its pretrained start (games) =="
$CLI eval games --config configs/games.yaml --checkpoint "$GRPO" --anchors "$PRETRAIN" --games 1000 \
  output=$GRPO/eval/games_vs_pretrain.json pgn=$GRPO/eval/games_vs_pretrain.pgn

# The policy carries a value head, so it can search: what 256 PUCT nodes per move add on puzzles.
echo
echo "== value head and search =="
$CLI eval value --checkpoint "$GRPO" --output $GRPO/eval/value.json
$CLI eval puzzles --config configs/eval.yaml --checkpoint "$GRPO" --search-nodes 256 baselines=false \
  output=$GRPO/eval/puzzles_search256.json
$CLI eval compare "${AFTER%_offline.json}_puzzles.json" $GRPO/eval/puzzles_search256.json

# Why (or whether) the run learned, and a report with every plot; `report` prints the report's path.
echo
echo "== diagnosis of the GRPO run =="
$CLI diagnose "$GRPO"
echo
$CLI report "$GRPO"

# What a newcomer reads first: the last screen. Did GRPO help, by how much, where the files are, what next.
echo
echo "== summary =="
$CLI summary "$GRPO"
