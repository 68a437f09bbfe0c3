"""scripts/blunder_causes.py: a policy's big losses in an `eval games` PGN, by cause, with real Stockfish."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# White (the policy: the side with a WhiteSource header) plays Qc1, leaving the knight on d4 to the knight on c6
# and the queen on d8; then the anchor's reply. A second game, against another anchor, must be ignored.
PGN = """[Event "chessgrpo eval games"]
[White "policy"]
[Black "anchor"]
[Result "*"]
[FEN "r2qk2r/ppp2ppp/2n5/3p4/3N4/8/PPPQ1PPP/R3K2R w KQkq - 0 1"]
[SetUp "1"]
[WhiteSource "runs/x"]
[Anchor "sf-skill:0"]

1. Qc1 Nxd4 *

[Event "chessgrpo eval games"]
[White "anchor"]
[Black "policy"]
[Result "*"]
[BlackSource "runs/x"]
[Anchor "random"]

1. e4 f6 2. d4 g5 *
"""


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "blunder_causes.py"), *args],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_a_defender_walking_away_is_counted_as_leaving_a_piece_hanging(tmp_path):
    games = tmp_path / "games.pgn"
    games.write_text(PGN)
    result = _run(str(games), "--anchor", "sf-skill:0", "--nodes", "2000")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].startswith("1 policy moves against sf-skill:0; 1 lost more than 0.2")
    counts = {line[:34].strip(): int(line[34:].split()[0]) for line in lines[2:]}
    assert counts == {
        "allows mate": 0,
        "en prise": 0,
        "leaves hanging": 1,
        "a piece can be taken at a gain": 0,
        "deeper tactic": 0,
    }
    # The random-anchor game (never read for sf-skill:0) has two policy moves: f6 loses ~0.4 to no capture
    # (a deeper tactic: Qh5+ comes), then g5, from an already lost position, allows Qh4 mate (~0.08 more).
    other = _run(str(games), "--anchor", "random", "--nodes", "2000", "--drop", "0.05")
    assert other.returncode == 0, other.stderr
    assert other.stdout.startswith("2 policy moves against random; 2 lost more than 0.05")
    counts = {line[:34].strip(): int(line[34:].split()[0]) for line in other.stdout.splitlines()[2:]}
    assert counts["allows mate"] == 1 and counts["deeper tactic"] == 1
    missing = _run(str(games), "--anchor", "sf-elo:1350")
    assert missing.returncode != 0 and "no games against 'sf-elo:1350'" in missing.stderr
