"""A chess language model as a UCI engine (`chessgrpo uci --checkpoint LM_DIR`).

`LMUciEngine` is the protocol loop of `eval.uci_engine.UciEngine` (positions with their history,
``go`` in a thread with ``stop``/``ponderhit``/``infinite``, ``searchmoves``, ``isready`` during a
move, robustness against any input) with the LM as the player (`eval.lm_player.LMPlayer`): the
``bestmove`` is the LM's greedy ``B:`` for ``"P: <FEN>"``, re-sampled when ill-formed or illegal,
else a uniformly random legal move. ``go`` limits are not used (one answer per move, however much
time there is).

What it reports, and what it does not:

- one ``info depth 1 time T pv MOVE`` line with **no score**: the LM runs no search and has no
  calibrated value (its own ``E:`` for the move is the LM's claim, given as text in the info
  string below, never as ``score cp``);
- one ``info string`` per move: how the move was made (greedy answer, re-sample, fallback), the
  answer's own ``E:`` for it when listed, and the running rates (`LMPlayerStats.line`);
- no UCI options: Search, Nodes, MultiPV, SyzygyPath, Temperature, Device, UCI_Chess960 and
  UCI_ShowWDL are the action policy's. A ``setoption`` is answered "unknown option ignored", and
  python-chess therefore refuses Chess960 boards before sending them (the LM knows standard FENs
  only). MultiPV requests get the one line there is.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

import chess

from chessgrpo.eval.lm_player import LMPlayer, LMPlayerConfig
from chessgrpo.eval.uci_engine import SearchJob, UciEngine


class LMUciEngine(UciEngine):
    """`UciEngine` with a chess LM as the player (module docstring); construct, then `run()`."""

    def __init__(
        self,
        checkpoint: str | Path,
        *,
        device: str = "cpu",
        config: LMPlayerConfig | None = None,
        input: TextIO | None = None,
        output: TextIO | None = None,
    ):
        self.lm_config = config or LMPlayerConfig()
        self.given_path = Path(checkpoint)  # the run directory (if any) says whether prompts start with BOS
        self.player: LMPlayer
        super().__init__(checkpoint, device=device, input=input, output=output)
        self.name += " (chess LM)"

    def resolve(self, checkpoint: str | Path) -> Path:
        """The LM's directory (`models.lm.resolve_lm_directory`)."""
        from chessgrpo.models.lm import resolve_lm_directory

        return resolve_lm_directory(checkpoint)

    def load(self, device: str) -> Any:
        """Load the LM into `self.player`; there is no action policy (`self.policy` stays None)."""
        self.player = LMPlayer.from_path(self.given_path, device=device, config=self.lm_config)
        return None

    @property
    def has_value_head(self) -> bool:
        return False

    def option_lines(self) -> list[str]:
        """None: every option of `UciEngine` is the action policy's (module docstring)."""
        return []

    def option_setters(self) -> dict[str, Callable[[str], None]]:
        """None: a ``setoption`` is answered "unknown option ignored"."""
        return {}

    def searcher(self) -> None:
        """The LM does not search: every ``go`` asks it (`_policy_move`)."""

    def _policy_move(self, job: SearchJob) -> chess.Move:
        """The LM's move among the allowed moves, with its ``info`` line (no score) and ``info string``."""
        board = job.board
        assert board is not None
        move = self.player.choose([board], [job.allowed] if job.restricted else None)[0]
        elapsed_ms = int(1000 * (time.perf_counter() - job.control.started))
        self.send(f"info depth 1 time {elapsed_ms} pv {board.uci(move)}")
        outcome, answer = self.player.last_outcomes[0], self.player.last_answers[0]
        how = {"greedy": "greedy B: answer", "resampled": "re-sampled B: answer", "fallback": "fallback: random legal move"}[outcome]
        if answer is not None and answer.best in answer.moves:
            how += f" (its own E: {answer.evals[answer.moves.index(answer.best)]:g} pawns, not a search score)"
        self.info(f"{how}; {self.player.stats_line()}")
        return move
