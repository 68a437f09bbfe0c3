#!/usr/bin/env bash
# The main job on the default config (what `make run` runs after setup):
#   1. check the installation         chessgrpo doctor
#   2. labelled data                  chessgrpo data generate  -> data/tiny/
#   3. supervised pretraining         chessgrpo pretrain       -> runs/pretrain_tiny/
#   4. offline strength + puzzles     chessgrpo eval offline / eval puzzles (with baselines)
# Every step resumes or skips finished work, so running it again is cheap.
set -euo pipefail
cd "$(dirname "$0")/.."
CLI=.venv/bin/chessgrpo
RUN=runs/pretrain_tiny

$CLI doctor
$CLI data generate --config configs/data_tiny.yaml
if [ -e "$RUN/checkpoints/latest" ]; then
  $CLI pretrain --resume "$RUN"
else
  $CLI pretrain --config configs/pretrain_tiny.yaml
fi
$CLI eval offline --config configs/eval.yaml --checkpoint "$RUN" output=$RUN/eval/offline.json
$CLI eval puzzles --config configs/eval.yaml --checkpoint "$RUN" output=$RUN/eval/puzzles.json
