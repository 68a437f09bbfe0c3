"""`eval compare`: paired differences between two evaluation files, with real CLI processes."""

from __future__ import annotations

import json

import pytest

from chessgrpo.eval.compare import compare_files, compare_records


def _offline(fen: str, esl: float, top1: bool) -> dict:
    return {
        "fen": fen,
        "chosen": "e2e4",
        "best": "e2e4",
        "v_best": 0.5,
        "v_chosen": 0.5 - esl,
        "esl": esl,
        "top1": top1,
        "blunder": esl > 0.2,
    }


def _write(path, player: str, records: list[dict]) -> None:
    path.write_text(json.dumps({"player": player, "records": {"player": records, "random": []}}))


def test_identical_players_differ_by_exactly_zero():
    records = [_offline(f"fen{i}", 0.01 * i, i % 2 == 0) for i in range(50)]
    comparison = compare_records("offline", records, records)
    for metric in comparison.metrics:
        assert (metric.difference.value, metric.difference.low, metric.difference.high) == (0.0, 0.0, 0.0)
        assert metric.verdict == "no significant difference"


def test_a_consistent_improvement_is_found_and_pairs_are_matched_by_fen():
    a = [_offline(f"fen{i}", 0.10 + 0.001 * i, False) for i in range(100)]
    b = [_offline(f"fen{i}", 0.05 + 0.001 * i, i < 30) for i in reversed(range(100))] + [_offline("extra", 0.9, False)]
    comparison = compare_records("offline", a, b)
    assert comparison.n == 100  # the unmatched "extra" position is left out
    esl = {m.metric: m for m in comparison.metrics}["esl"]
    assert esl.difference.value == pytest.approx(-0.05) and esl.difference.high < 0 and esl.verdict == "better"
    top1 = {m.metric: m for m in comparison.metrics}["top1"]
    assert top1.difference.value == pytest.approx(0.30) and top1.verdict == "better"


@pytest.mark.slow
def test_cli_compares_puzzle_files_and_rejects_mixed_kinds(cli, tmp_path):
    puzzles_a = [
        {"id": str(i), "rating": 1500, "first_move_correct": i < 20, "solved": i < 10, "played": []} for i in range(100)
    ]
    puzzles_b = [{**p, "first_move_correct": int(p["id"]) < 40} for p in puzzles_a]
    _write(tmp_path / "a.json", "before", puzzles_a)
    _write(tmp_path / "b.json", "after", puzzles_b)
    _write(tmp_path / "offline.json", "x", [_offline("f", 0.1, True)])
    done = cli.run("eval", "compare", str(tmp_path / "a.json"), str(tmp_path / "b.json"), "--json")
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["n"] == 100 and result["a"] == "before" and result["b"] == "after"
    first = result["metrics"]["first_move_accuracy"]
    assert first["difference"]["value"] == pytest.approx(0.2) and first["verdict"] == "better"
    assert result["metrics"]["solve_rate"]["verdict"] == "no significant difference"
    with pytest.raises(ValueError, match="cannot compare a puzzles evaluation"):
        compare_files(tmp_path / "a.json", tmp_path / "offline.json")
    (tmp_path / "empty.json").write_text(json.dumps({"player": "x"}))
    done = cli.run("eval", "compare", str(tmp_path / "a.json"), str(tmp_path / "empty.json"))
    assert done.returncode == 2 and "no per-item records" in done.stderr


def test_puzzles_split_by_check_first_solutions_and_a_descriptive_check_rate():
    # 60 check-first puzzles: A solves 30 by checking, B none (it stopped checking); 40 quiet-first:
    # A solves 10, B 30. The overall accuracy hides the shift; the split rows show it.
    def record(i: int, correct: bool, check_first: bool, played_check: bool) -> dict:
        return {
            "id": str(i),
            "rating": 1500,
            "first_move_correct": correct,
            "solved": correct,
            "played": [],
            "solution_check": check_first,
            "played_check": played_check,
        }

    a = [record(i, i < 30, True, True) for i in range(60)] + [record(i, i < 70, False, True) for i in range(60, 100)]
    b = [record(i, False, True, False) for i in range(60)] + [record(i, i < 90, False, False) for i in range(60, 100)]
    rows = {m.metric: m for m in compare_records("puzzles", a, b).metrics}
    assert rows["first_move_accuracy"].difference.value == pytest.approx(-0.10)
    check_first, quiet_first = rows["check_first_accuracy"], rows["quiet_first_accuracy"]
    assert (check_first.a.n, quiet_first.a.n) == (60, 40)
    assert check_first.difference.value == pytest.approx(-0.5) and check_first.verdict == "worse"
    assert quiet_first.difference.value == pytest.approx(+0.5) and quiet_first.verdict == "better"
    played = rows["played_check_rate"]
    assert (
        played.higher_is_better is None and played.difference.value == pytest.approx(-1.0) and played.verdict == "lower"
    )

    # Files written before the fields existed compare as before: no split rows.
    old = [{k: v for k, v in r.items() if k not in ("solution_check", "played_check")} for r in a]
    assert [m.metric for m in compare_records("puzzles", old, b).metrics] == ["first_move_accuracy", "solve_rate"]
