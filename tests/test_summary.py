"""`chessgrpo summary RUN_DIR` (commands/summary.py, track/report_verdict.py: the report's verdict as text): what
`make run` prints last.

Real files throughout: a copy of the diagnosis lab's healthy GRPO run (pretrained start, in-run puzzle
evaluations at steps 0, 8 and 16), real `eval games` against its start and `eval value` written into its
eval/ folder, then the summary read back from them.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from chessgrpo.models.policy import ActionPolicy, PolicyConfig, save_policy
from test_diagnose import build_lab

OPENINGS = (
    "rnbqkbnr/pppppppp/8/8/4P3/8/PPPP1PPP/RNBQKBNR b KQkq - 0 1",
    "rnbqkbnr/pppppppp/8/8/3P4/8/PPP1PPPP/RNBQKBNR b KQkq - 0 1",
)


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    return build_lab(tmp_path_factory.getbasetemp() / "diagnose_lab")


@pytest.fixture(scope="module")
def evaluated_run(lab, tmp_path_factory):
    """The healthy run with 4 games against its start (PGN beside them) and the value head's error."""
    from chessgrpo import cli

    run = tmp_path_factory.mktemp("summary") / "healthy"
    shutil.copytree(lab.healthy, run)
    openings = run.parent / "openings.epd"
    openings.write_text("\n".join(OPENINGS) + "\n")
    assert (
        cli.main(
            [
                "eval",
                "games",
                "--checkpoint",
                str(run),
                "--anchors",
                str(lab.pretrain),
                "--games",
                "4",
                "--openings",
                str(openings),
                "--workers",
                "1",
                "max_plies=40",
                "engine.syzygy_path=null",
                f"output={run / 'eval' / 'games_vs_pretrain.json'}",
                f"pgn={run / 'eval' / 'games_vs_pretrain.pgn'}",
            ]
        )
        == 0
    )
    # The lab's network has no value head: the value head's error is measured on an untrained one (real code, a large error).
    torch.manual_seed(0)
    with_value = save_policy(
        ActionPolicy(PolicyConfig(n_layers=1, d_model=32, n_heads=2, value_head=True)), run.parent / "value_ckpt"
    )
    value_json = run / "eval" / "value.json"
    assert (
        cli.main(
            ["eval", "value", "--checkpoint", str(with_value), "--data", str(lab.data), "--output", str(value_json)]
        )
        == 0
    )
    return run


def test_summary_answers_did_it_help_by_how_much_and_what_next_in_one_screen(evaluated_run, lab, cli):
    code, out, err = cli.main("summary", str(evaluated_run))
    assert code == 0, err
    lines = out.rstrip("\n").split("\n")
    assert len(lines) <= 40
    games = json.loads((evaluated_run / "eval" / "games_vs_pretrain.json").read_text())["anchors"][0]
    assert lines[0].startswith(f"Trained: {evaluated_run}: 16 GRPO steps (move_group) from {lab.pretrain}")
    # The headline is the report's verdict: the games against the run's own start, with the number of games.
    assert lines[1].startswith("Did GRPO help?") and "over 4 games" in lines[1] and "its start" in lines[1]
    start = next(line for line in lines if line.startswith("  its start"))
    assert "4 games" in start and f"{games['score']['value']:.3f}" in start
    pgn = Path(start.split()[-1])
    assert pgn.read_text().count("[Event ") == 4  # the games' PGN, named on the line
    # The in-run evaluations, first against last: puzzles at steps 0 and 16, paired.
    first = json.loads((evaluated_run / "eval" / "step_000000_puzzles.json").read_text())["first_move_accuracy"][
        "value"
    ]
    last = json.loads((evaluated_run / "eval" / "step_000016_puzzles.json").read_text())["first_move_accuracy"]["value"]
    assert any(
        line.startswith(f"  puzzle_first_move_accuracy: {first:.4f} -> {last:.4f} (step 0 -> 16)") for line in lines
    )
    value = json.loads((evaluated_run / "eval" / "value.json").read_text())
    assert any(line.startswith("  value head error") and f"{value['mae']['value']:.3f}" in line for line in lines)
    assert any(
        "strength against Stockfish" in line and "--anchors sf-skill:0" in line for line in lines
    )  # not measured: how to
    assert lines[lines.index("Next:") + 1 :] and any(
        f"chessgrpo uci --checkpoint {evaluated_run}" in line for line in lines
    )
    assert any("make recipe" in line for line in lines) and any("rookworld_sft_tiny.yaml" in line for line in lines)


def test_summary_of_a_run_without_games_says_strength_is_not_measured(lab, tmp_path, cli):
    run = tmp_path / "entropy"
    shutil.copytree(lab.entropy, run, ignore=shutil.ignore_patterns("checkpoints"))
    code, out, _ = cli.main("summary", str(run))
    assert code == 0 and "Strength in games not measured" in out.split("\n")[1]
    assert "games against its start: chessgrpo eval games" in out  # the command that measures it


def test_summary_of_a_missing_directory_is_one_clear_error(tmp_path, cli):
    code, _, err = cli.main("summary", str(tmp_path / "nowhere"))
    assert code != 0 and f"no run directory at '{tmp_path / 'nowhere'}'" in err and "Traceback" not in err
