"""The evaluation registry: an evaluation added with one entry is compared, read back and diagnosed
with no other edit; the built-in entries say what the hand-wired tables used to."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from chessgrpo.eval.registry import (
    EVALUATIONS,
    Evaluation,
    HeldOutMetric,
    PairedMetric,
    held_out_metrics,
    paired_objective,
    register,
    unregister,
)
from chessgrpo.track.run_data import load_run

FENS = [f"{file}7/8/8/8/8/8/8/K6k w - - 0 1" for file in range(1, 13)]
"""Twelve distinct item keys (pairing needs only a stable key per item)."""

LEGALITY = Evaluation(
    name="legality",
    command="chessgrpo eval legality",
    item_key="fen",
    record_marker="legal",
    records_label="legality",
    paired=(PairedMetric("legal_rate", "legal", True),),
    held_out=(HeldOutMetric("legal_rate", "legal_rate", "legal", True, "fraction of positions"),),
    summary_marker="legal_rate",
)


@pytest.fixture
def legality():
    """LEGALITY registered for one test."""
    register(LEGALITY)
    yield LEGALITY
    unregister(LEGALITY.name)


def _result(step: int | None, legal: list[float]) -> dict:
    """A result file as the evaluation writes it: the summary metric with its interval and per-item records."""
    n, value = len(legal), sum(legal) / len(legal)
    payload = {
        "player": f"step {step}" if step is not None else "standalone",
        "legal_rate": {"value": value, "low": max(0.0, value - 0.2), "high": min(1.0, value + 0.2), "n": n},
        "records": {"player": [{"fen": fen, "legal": outcome} for fen, outcome in zip(FENS, legal)]},
    }
    return payload if step is None else {**payload, "step": step}


def _write_run(run: Path, evaluation: Evaluation, before: list[float], after: list[float]) -> None:
    (run / "eval").mkdir(parents=True)
    (run / "config.yaml").write_text("kind: move_group\nsteps: 10\n")
    rows = []
    for step, legal in ((0, before), (10, after)):
        payload = _result(step, legal)
        (run / "eval" / evaluation.step_file(step)).write_text(json.dumps(payload))
        held = payload["legal_rate"]
        rows.append(
            {
                "step": step,
                "loss/total": 1.0,
                "eval/legal_rate": held["value"],
                "eval/legal_rate_low": held["low"],
                "eval/legal_rate_high": held["high"],
            }
        )
    (run / "metrics.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    (run / "eval" / "legality_final.json").write_text(
        json.dumps({**_result(None, after), "baselines": {"random": _result(None, before)}})
    )


def test_an_evaluation_registered_once_is_compared_and_read_back(tmp_path, cli, legality):
    before, after = [0.0] * 10 + [1.0] * 2, [1.0] * 11 + [0.0]
    run = tmp_path / "run"
    _write_run(run, legality, before, after)
    first, last = legality.step_files(run / "eval")
    assert [first.name, last.name] == ["step_000000_legality.json", "step_000010_legality.json"]

    # eval compare recognises the files by their records, pairs them by FEN and prints the entry's metric.
    code, out, _ = cli.main("eval", "compare", str(first), str(last), "--json")
    comparison = json.loads(out)
    assert code == 0 and comparison["kind"] == "legality" and comparison["n"] == len(FENS)
    assert list(comparison["metrics"]) == ["legal_rate"] and comparison["metrics"]["legal_rate"]["verdict"] == "better"
    code, out, _ = cli.main("eval", "compare", str(first), str(last))
    assert code == 0 and out.startswith("legality: B = step 10 vs A = step 0 on 12 shared items")

    # Run data reads its metric rows, its per-step files (with n and records) and its standalone file.
    data = load_run(run)
    assert [point.step for point in data.evals] == [0, 10]
    assert data.evals[0].metrics["legal_rate"].n == len(FENS)
    assert math.isclose(data.evals[1].metrics["legal_rate"].value, 11 / 12)
    assert [record["legal"] for record in data.evals[1].records["legality"]] == after
    (standalone,) = data.standalone
    assert standalone.kind == "legality" and standalone.path.name == "legality_final.json"
    assert math.isclose(standalone.baselines["random"]["legal_rate"].value, 2 / 12)
    assert data.games == []  # its step files are not mistaken for game summaries

    # Diagnose pairs its change from the records; a sweep objective eval/legal_rate gets the paired interval.
    from chessgrpo.track.diagnose import Thresholds
    from chessgrpo.track.diagnose.changes import heldout_change

    change = heldout_change(data, "legal_rate", data.evals[0], data.evals[1], Thresholds())
    assert change is not None and change.paired and change.low > 0
    assert paired_objective("eval/legal_rate") == (legality, "legal_rate")
    from chessgrpo.sweep.study import paired_change

    difference, n = paired_change(run, "eval/legal_rate", 0, 10)
    assert n == len(FENS) and difference.low > 0


def test_without_its_entry_the_files_are_not_recognised(tmp_path, cli):
    run = tmp_path / "run"
    _write_run(run, LEGALITY, [0.0] * 12, [1.0] * 12)
    code, _, err = cli.main("eval", "compare", *map(str, LEGALITY.step_files(run / "eval")))
    assert code != 0 and "records are neither offline, puzzle, endgame nor games records" in err
    data = load_run(run)
    assert data.standalone == [] and all(not point.records for point in data.evals)


def test_the_built_in_entries():
    assert list(EVALUATIONS) == ["offline", "puzzles", "endgame", "lm", "games", "epd", "value"]
    assert list(held_out_metrics()) == [
        "esl",
        "top1",
        "blunder_rate",
        "puzzle_first_move_accuracy",
        "puzzle_solve_rate",
        "mate_rate",
        "dtz_optimal_rate",
        "p_reward",
        "p_format_rate",
        "p_best_accuracy",
        "a_format_rate",
        "a_exact_state_accuracy",
    ]
    assert EVALUATIONS["offline"].step_file(20) == "step_000020_offline.json"
    # Sweep objectives whose change is paired from per-step files, and those that are not.
    assert paired_objective("eval/puzzle_solve_rate") == (EVALUATIONS["puzzles"], "solve_rate")
    assert paired_objective("eval/mate_rate") == (EVALUATIONS["endgame"], "mate_rate")
    assert [paired_objective(m) for m in ("eval/dtz_optimal_rate", "eval/p_reward", "eval/nll", "reward/mean")] == [
        None
    ] * 4
    with pytest.raises(ValueError, match="already registered"):
        register(EVALUATIONS["offline"])
