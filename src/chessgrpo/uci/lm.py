"""A chess language model as a UCI engine (`chessgrpo uci --checkpoint LM_DIR`).

`LMUciEngine` is the protocol loop of `uci.engine.UciEngine` (positions with their history,
``go`` in a thread with ``stop``/``ponderhit``/``infinite``, ``searchmoves``, ``isready`` during a
move, robustness against any input) with the LM as the player (`play.lm_player.LMPlayer`): the
``bestmove`` is the LM's greedy ``B:`` for ``"P: <FEN>"``, re-sampled when ill-formed or illegal,
else a uniformly random legal move.

The clock: ``go movetime`` and ``wtime/btime/winc/binc [movestogo]`` give the move a time budget as
they give the action policy's search (`play.search_control.parse_go`, ``Move Overhead`` kept back), and one
generation (an answer) is the step that `play.search_control.SearchControl` never starts when it would end
past the deadline: the LM is asked only while another answer fits (`LMPlayer.choose`'s
``should_stop``). Re-samples the budget cuts leave the random fallback; when not even the greedy
answer fits, the move is a random legal one at once (counted as ``no_time``). A generation's time
is measured at startup (`measure_step`) and then in every ``go``. Without a time limit (``nodes``,
``depth``, ``infinite``, nothing) the LM answers with all its re-samples, as before.

What it reports, and what it does not:

- one ``info depth 1 time T pv MOVE`` line with **no score**: the LM runs no search and has no
  calibrated value (its own ``E:`` for the move is the LM's claim, given as text in the info
  string below, never as ``score cp``);
- one ``info string`` per move: how the move was made (greedy answer, re-sample, fallback), the
  answer's own ``E:`` for it when listed, and the running rates (`LMPlayerStats.line`);
- the options bots and GUIs set (`LM_OPTIONS`, the action policy's own lines and setters):
  ``Move Overhead`` (kept back from every budget), ``Threads`` (torch's threads for generation, kept
  above 1 only when measured faster, `UciEngine.set_threads`), and, accepted without effect as the
  action policy's ``Ponder`` is: ``Hash`` (the LM keeps no tree), ``Ponder``, ``MultiPV`` (there is
  one line), ``UCI_ShowWDL`` (there is no score) and ``SyzygyPath`` (the LM reads no tables; said with
  an ``info string``). So python-chess's ``configure`` takes lichess-bot's default options. Search,
  Nodes, Temperature, Device and UCI_Chess960 are the action policy's alone: a ``setoption`` of them
  is answered "unknown option ignored", and python-chess refuses Chess960 boards before sending them
  (the LM knows standard FENs only).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TextIO

import chess

from chessgrpo.play.lm_player import LMPlayer, LMPlayerConfig
from chessgrpo.uci.engine import SearchJob, UciEngine

logger = logging.getLogger(__name__)

LM_OPTIONS = ("MultiPV", "SyzygyPath", "UCI_ShowWDL", "Ponder", "Move Overhead", "Threads", "Hash")
"""The action policy's options the LM engine offers too (module docstring): lichess-bot sets them by default."""
NO_NODES = 1
"""What the LM asks `SearchControl.should_stop` for: it has no nodes, so only ``stop``, a ponder's wait and the deadline apply."""
HOW = {
    "greedy": "greedy B: answer",
    "resampled": "re-sampled B: answer",
    "fallback": "fallback: random legal move",
    "no_time": "no time for an answer: random legal move",
}


class LMUciEngine(UciEngine):
    """`UciEngine` with a chess LM as the player (module docstring); construct, then `run()`."""

    STEP_NAME = "an answer"

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
        """`UciEngine`'s lines of the `LM_OPTIONS` (the others are the action policy's alone)."""
        return [
            line
            for line in super().option_lines()
            if line.removeprefix("option name ").split(" type ")[0] in LM_OPTIONS
        ]

    def option_setters(self) -> dict[str, Callable[[str], None]]:
        """`UciEngine`'s setters of the `LM_OPTIONS`; any other ``setoption`` is answered "unknown option ignored"."""
        offered = {name.lower() for name in LM_OPTIONS}
        return {name: setter for name, setter in super().option_setters().items() if name in offered}

    def set_syzygy_path(self, value: str) -> None:
        """Accepted without effect (the LM plays its own answers, without tables), and not checked: bots send a
        default such as lichess-bot's ``./syzygy/`` whether it holds tables or not."""
        path = "" if value.strip() in ("", "<empty>") else value.strip()
        self.syzygy_path = path
        if path:
            self.info("SyzygyPath has no effect: the chess LM plays its own answers, without tables")

    def searcher(self) -> None:
        """The LM does not search: every ``go`` asks it (`_policy_move`)."""

    def measure_step(self, *, warm: bool = True) -> float | None:
        """The time of one generation (`LMPlayer.answer_seconds`, after one untimed answer when `warm`): the step a
        clock budget counts in; None when the LM fails (the next go says why)."""
        try:
            if warm:
                self.player.answer_seconds()
            return self.player.answer_seconds()
        except Exception:  # noqa: BLE001 - a failing LM fails the first go, with its own message
            logger.exception("timing an answer of the LM failed")
            return None

    def _policy_move(self, job: SearchJob) -> chess.Move:
        """The LM's move among the allowed moves within the ``go``'s budget (module docstring), with its ``info``
        line (no score) and ``info string``."""
        board, control = job.board, job.control
        assert board is not None
        move = self.player.choose(
            [board], [job.allowed] if job.restricted else None, should_stop=lambda: control.should_stop(NO_NODES)
        )[0]
        if not self.player.last_stopped:
            # Asked after the last generation too, so it is timed: the next go's first guess is a measured
            # generation, not one that faded over moves without a re-sample (`SearchControl.next_step_seed`).
            control.should_stop(NO_NODES)
        elapsed_ms = int(1000 * (time.perf_counter() - control.started))
        self.send(f"info depth 1 time {elapsed_ms} pv {board.uci(move)}")
        outcome, answer = self.player.last_outcomes[0], self.player.last_answers[0]
        how = HOW[outcome]
        if outcome == "fallback" and self.player.last_stopped:
            how += " (no time left to re-sample)"
        if answer is not None and answer.best in answer.moves:
            how += f" (its own E: {answer.evals[answer.moves.index(answer.best)]:g} pawns, not a search score)"
        self.info(f"{how}; {self.player.stats_line()}")
        return move
