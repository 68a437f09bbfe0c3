"""The policy as a UCI engine (`chessgrpo uci --checkpoint CKPT`): plays in any chess GUI,
cutechess-cli, fastchess or lichess-bot. The protocol as implemented, option by option and with
the score conventions, is described in ``docs/uci.md``.

A chess language model plays through `chessgrpo.uci.lm.LMUciEngine`, this protocol loop with the
LM as the player (``docs/uci.md``, "The chess LM as a player").

When the checkpoint's policy has a value head, ``go`` **searches** (`chessgrpo.search`: PUCT by
default, or policy-pruned alpha-beta) under the ``go`` limits; without a value head, or with
``Search none``, it plays the policy's own move.

Supported commands (https://backscattering.de/chess/uci/):

- ``uci``: ``id name``/``id author``, the options (`chessgrpo.uci.options`: each option, its range and what it
  refuses), then ``uciok``.
- ``isready`` -> ``readyok`` (also while a search runs); ``ucinewgame``; ``setoption name N value V``.
- ``position startpos|fen <FEN> [moves m1 m2 ...]``: the game history is kept, so the search
  sees repetitions (it scores a repeated position as a draw), and so does the policy-only
  player's repetition rule (`chessgrpo.play.movers.PolicyMover.repetition_moves`). A rejected
  ``position`` (malformed FEN, illegal or malformed move) leaves **no** position: ``go`` answers
  ``info string error: no valid position ...`` and ``bestmove 0000`` (the UCI null move) until a
  valid ``position`` (or ``ucinewgame``) arrives, so no move for another position is ever played.
- ``go`` (`chessgrpo.play.search_control`: `parse_go`, `parse_go_flags`): ``nodes N`` = N search
  nodes; ``movetime MS`` = a time limit; ``wtime/btime/winc/binc [movestogo]`` = simple time
  management (`clock_seconds`); with both a node and a time limit, whichever comes first. ``depth``, ``mate`` and a plain ``go``
  search the ``Nodes`` budget (the network search has no meaningful depth). A time limit is kept by never starting
  a search step that would end past it (`chessgrpo.play.search_control.SearchControl`; the first step's time is
  measured at startup, `warm_up`).
  ``infinite`` searches until ``stop`` (growing the tree up to `MAX_NODES` or ``Hash``'s bound, then waiting);
  ``ponder`` searches the same way until ``stop`` (answered with the current best move) or
  ``ponderhit``, after which the ``go`` command's own limits apply, the clock counting from the
  ``ponderhit``. ``searchmoves m1 m2 ...`` restricts the root to those moves (illegal ones are
  ignored with an error; none legal = every move). One ``info depth .. seldepth .. multipv K
  score cp X|mate N [wdl W D L] nodes .. nps .. time .. pv ..`` line per MultiPV line (also every
  `INFO_INTERVAL_S` during a long search), then ``bestmove M [ponder P]``; ``bestmove 0000``
  when the side to move has no legal move.
- Searches run in a thread while the main thread keeps reading: ``isready`` is answered at once,
  ``stop`` ends the search (its ``bestmove`` follows), ``ponderhit`` switches a ponder search to
  its limits, ``quit`` stops the search and exits. Any other command during a search (a GUI
  should send none) first waits for a finite search to finish, or stops an infinite or ponder
  one, and then runs. End of input: a finite search finishes, an infinite one is stopped, exit.

Scores (``cp``/``mate``/``wdl``, always from the side to move's view) follow
`chessgrpo.uci.scores`; searches are `chessgrpo.search`'s, stopped, restricted to
``searchmoves`` and followed through its hooks (`chessgrpo.search.base`).

Robustness: no input makes it crash. Unknown commands are ignored with an ``info string``; a bad
option value or ``go`` argument is refused with ``info string error: ...`` and changes nothing.
A search that fails falls back to the policy's move. Every response is flushed at once.
"""

from __future__ import annotations

import dataclasses
import logging
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

import chess
import numpy as np
import torch

from chessgrpo.play.search_control import (
    DEFAULT_HASH_MB,
    MAX_NODES,
    MOVE_OVERHEAD_MS,
    SearchControl,
    parse_go,
    parse_go_flags,
)
from chessgrpo.search.base import SearchResult
from chessgrpo.uci.chess960 import Chess960Evaluator, parse_uci_move, policy_logits, softmax, standard_view
from chessgrpo.uci.options import (
    DEFAULT_NODES,
    MAX_MULTIPV,
    SEARCH_CHOICES,
    UciOptions,
    check_syzygy_path,
    parse_temperature,
)
from chessgrpo.uci.protocol_text import info_lines, parse_position
from chessgrpo.uci.scores import Score, claimable_value, decided_score, estimate_score, policy_estimate

if TYPE_CHECKING:  # pragma: no cover
    from chessgrpo.search import Searcher

logger = logging.getLogger(__name__)

ENGINE_AUTHOR = "chessgrpo"
MAX_LINE = 10_000
"""Longer input lines are refused (a position with ~1500 moves fits)."""

INFO_INTERVAL_S = 1.0
"""A long search (``infinite``, ``ponder``, long clocks) sends its ``info`` lines this often."""

WINNING_MATERIAL = 3
"""The policy-only player avoids repetitions when this many pawns ahead (as `PolicyMover`)."""

QUIT_JOIN_S = 60.0
"""After ``quit`` the stopped search gets this long to answer (it stops after its current batch)."""


@dataclasses.dataclass
class SearchJob:
    """One ``go``: a snapshot of what it searches, run by `UciEngine._run_job` in its own thread."""

    board: chess.Board | None
    """None: no valid position (answered with bestmove 0000)."""
    allowed: list[chess.Move]
    """The root moves to consider (``searchmoves``, else every legal move; empty: no move)."""
    restricted: bool
    control: SearchControl
    searcher: Searcher | None
    multipv: int
    show_wdl: bool
    temperature: float
    thread: threading.Thread | None = None


class UciEngine(UciOptions):
    """A UCI protocol loop around a policy checkpoint (a `Searcher`, or the policy alone); construct, then `run()`."""

    STEP_NAME = "a search step"
    """What `measure_step` times, in the ``info string`` of ``Threads`` (the chess LM's engine times an answer)."""

    def __init__(
        self,
        checkpoint: str | Path,
        *,
        device: str = "cpu",
        temperature: float = 0.0,
        search: str = "puct",
        nodes: int = DEFAULT_NODES,
        multipv: int = 1,
        syzygy_path: str | None = None,
        input: TextIO | None = None,
        output: TextIO | None = None,
    ):
        temperature = parse_temperature(temperature)
        if search not in SEARCH_CHOICES:
            raise ValueError(f"unknown search {search!r}; choose one of {', '.join(SEARCH_CHOICES)}")
        if not 1 <= nodes <= MAX_NODES:
            raise ValueError(f"nodes must be in [1, {MAX_NODES}], got {nodes}")
        if not 1 <= multipv <= MAX_MULTIPV:
            raise ValueError(f"multipv must be in [1, {MAX_MULTIPV}], got {multipv}")
        if syzygy_path:
            check_syzygy_path(syzygy_path)  # fail at startup, not at the first endgame
        self.checkpoint = self.resolve(checkpoint)
        self.name = f"chessgrpo {Path(checkpoint).name or self.checkpoint.name}"
        self.device = device
        self.temperature = temperature
        self.search_algorithm = search
        self.nodes = nodes
        self.multipv = multipv
        self.syzygy_path = syzygy_path or ""
        self.chess960 = False
        self.show_wdl = False
        self.ponder = False
        self.move_overhead_ms = MOVE_OVERHEAD_MS
        self.hash_mb = DEFAULT_HASH_MB
        self.threads = torch.get_num_threads()
        self.step_seconds = 0.0
        """The last search's guess of one search step's time (`SearchControl.next_step_seed`): the next deadline keeps it."""
        self.stale_clock_s = 0.0
        """How long the last ``stop`` of a ``ponder`` took: kept back, beside Move Overhead, from the next go's budget."""
        self.input = input or sys.stdin
        self.output = output or sys.stdout
        self.policy = self.load(device)
        self._rng = np.random.default_rng(time.time_ns() % (2**62))
        self._searcher: Searcher | None = None
        self._fallback_announced = False
        self._job: SearchJob | None = None
        self._output_lock = threading.Lock()
        self._output_closed = False
        self.board: chess.Board | None = chess.Board()
        self.warm_up()

    def resolve(self, checkpoint: str | Path) -> Path:
        """The model directory of `checkpoint` (a subclass playing another kind of model resolves its own)."""
        from chessgrpo.models.policy import resolve_checkpoint

        return resolve_checkpoint(checkpoint)

    def load(self, device: str):
        """The model of `self.checkpoint` on `device`, in eval mode (`uci.lm` loads a chess LM instead)."""
        from chessgrpo.models.policy import load_policy

        return load_policy(self.checkpoint, device=device).eval()

    @property
    def has_value_head(self) -> bool:
        return self.policy.value_head is not None

    # ----------------------------------------------------------------------------------------

    def send(self, *lines: str) -> None:
        with self._output_lock:
            if self._output_closed:
                return
            try:
                for line in lines:
                    self.output.write(line + "\n")
                self.output.flush()
            except (OSError, ValueError):  # the GUI closed the pipe: nobody is listening
                self._output_closed = True

    def info(self, text: str) -> None:
        """An ``info string`` line; newlines removed so it stays one line."""
        self.send("info string " + " ".join(text.split())[:500])

    def run(self) -> int:
        """Read commands until ``quit`` or end of input; returns the exit code (0)."""
        quit_requested = False
        try:
            for line in self.input:
                try:
                    if not self.handle(line):
                        quit_requested = True
                        break
                except Exception as error:  # noqa: BLE001 - a UCI engine must never die on input
                    logger.exception("error handling %r", line)
                    self.info(f"error: {type(error).__name__}: {error}")
        finally:
            # quit: stop at once; end of input: let a finite search answer, stop an unbounded one
            self.finish_search(stop=quit_requested, timeout=QUIT_JOIN_S if quit_requested else None)
            self.reset_searcher()
        return 0

    def finish_search(self, *, stop: bool, timeout: float | None = None) -> None:
        """End the running search: stop it (`stop`, or when it is unbounded) or wait for it; its bestmove is sent."""
        job = self._job
        if job is None:
            return
        if stop or job.control.unbounded:
            job.control.stop()
        if job.thread is not None:
            job.thread.join(timeout)
        self._job = None

    def handle(self, line: str) -> bool:
        """Handle one command line; False means quit."""
        if len(line) > MAX_LINE:
            self.info(f"error: line of {len(line)} characters ignored (limit {MAX_LINE})")
            return True
        tokens = line.split()
        if not tokens:
            return True
        command, arguments = tokens[0], tokens[1:]
        if command == "quit":
            return False
        if command == "isready":
            self.send("readyok")
            return True
        if command in ("debug", "register"):
            return True
        if command == "stop":
            pondering = self._job is not None and self._job.control.pondering
            asked = time.perf_counter()
            self.finish_search(stop=True)
            # A missed ponder: python-chess (so lichess-bot) read the clock it sends with the next go before this
            # stop, so the step the search had in flight is spent from that clock too.
            self.stale_clock_s = time.perf_counter() - asked if pondering else 0.0
            return True
        if command == "ponderhit":
            if self._job is not None:
                self._job.control.ponderhit()
            return True
        if self._job is not None:  # a GUI sends nothing else during a search: finish it first
            self.finish_search(stop=False)
        if command == "uci":
            self.send(f"id name {self.name}", f"id author {ENGINE_AUTHOR}", *self.option_lines(), "uciok")
        elif command == "ucinewgame":
            self.board = chess.Board(chess960=self.chess960)
            self._rng = np.random.default_rng(time.time_ns() % (2**62))
        elif command == "setoption":
            self.set_option(arguments)
        elif command == "position":
            self.set_position(arguments)
        elif command == "go":
            self.go(arguments)
        else:
            self.info(f"unknown command ignored: {line.strip()[:100]}")
        return True

    def set_position(self, arguments: list[str]) -> None:
        try:
            self.board = parse_position(arguments, chess960=self.chess960)
        except ValueError as error:
            self.board = None  # never answer the next `go` for an older position
            self.info(f"error: {error}; no valid position until the next valid position command")

    # ----------------------------------------------------------------------------------- search

    def warm_up(self) -> None:
        """A search step's network calls at startup: the first `go` does not pay torch's first call (allocations,
        a few hundred ms on a CPU), and its deadline knows a step's time (`step_seconds`) instead of guessing 0."""
        seconds = self.measure_step()
        if seconds is not None:
            self.step_seconds = seconds

    def measure_step(self, *, warm: bool = True) -> float | None:
        """The time of one search step's network call (a PUCT batch of the start position), after one untimed
        call when `warm`; None without a search (policy-only play) or when the network fails (the next go says why)."""
        if self.search_algorithm == "none" or not self.has_value_head:
            return None
        try:
            searcher = self.searcher()
            if searcher is None:
                return None
            boards = [chess.Board()] * searcher.settings.batch_size
            if warm:
                searcher.evaluator.evaluate(boards, exact=False)
            started = time.perf_counter()
            searcher.evaluator.evaluate(boards, exact=False)
            return time.perf_counter() - started
        except Exception:  # noqa: BLE001 - a failing network fails the first go, with its own message
            logger.exception("measuring a search step failed")
            return None

    def reset_searcher(self) -> None:
        """Drop the searcher (closing its tablebases); the next `go` builds one from the options."""
        if self._searcher is not None:
            self._searcher.close()
            self._searcher = None

    def searcher(self) -> Searcher | None:
        """The searcher for the current options, or None for policy-only play (``Search none``, or
        no value head: said once with an ``info string``)."""
        if self.search_algorithm == "none":
            return None
        if not self.has_value_head:
            if not self._fallback_announced:
                self._fallback_announced = True
                self.info("this checkpoint has no value head: playing the policy's move without search")
            return None
        if self._searcher is None:
            from chessgrpo.search import Searcher, SearchSettings

            settings = SearchSettings(
                nodes=self.nodes, algorithm=self.search_algorithm, syzygy_path=self.syzygy_path or None
            )
            self._searcher = Searcher(self.policy, settings, evaluator_class=Chess960Evaluator)
        return self._searcher

    def go(self, arguments: list[str] | None = None) -> None:
        """Start the search of ``go <arguments>`` in a thread (`_run_job` sends its bestmove)."""
        started = time.perf_counter()
        arguments = arguments or []
        board = self.board.copy() if self.board is not None else None
        limits, problems = parse_go(
            arguments,
            board.turn if board is not None else chess.WHITE,
            min(self.nodes, self.max_nodes),
            overhead_ms=self.move_overhead_ms + round(1000 * self.stale_clock_s),
            max_nodes=self.max_nodes,
        )
        self.stale_clock_s = 0.0
        flags = parse_go_flags(arguments)
        for problem in problems:
            self.info(f"error: {problem}")
        control = SearchControl(
            limits, infinite=flags.infinite, ponder=flags.ponder, started=started, step_seconds=self.step_seconds
        )
        allowed: list[chess.Move] = []
        restricted = False
        searcher = None
        if board is None:
            self.info("error: no valid position (the last position command was rejected); send a valid position")
        elif not any(board.generate_legal_moves()):
            self.info("no legal moves: the game is over")
        else:
            allowed, restricted = self.root_moves(board, flags.searchmoves)
            try:
                searcher = self.searcher()
            except Exception as error:  # noqa: BLE001 - e.g. tables gone: play the policy's move
                logger.exception("cannot build the searcher")
                self.info(f"error: cannot search ({type(error).__name__}: {error}); playing the policy's move")
        job = SearchJob(board, allowed, restricted, control, searcher, self.multipv, self.show_wdl, self.temperature)
        job.thread = threading.Thread(target=self._run_job, args=(job,), name="uci-search", daemon=True)
        self._job = job
        job.thread.start()

    def root_moves(self, board: chess.Board, searchmoves: Sequence[str]) -> tuple[list[chess.Move], bool]:
        """The legal moves of ``searchmoves`` (errors for the others), or every legal move; and whether restricted."""
        legal = list(board.legal_moves)
        if not searchmoves:
            return legal, False
        chosen: list[chess.Move] = []
        for text in searchmoves:
            try:
                move = parse_uci_move(board, text)
            except ValueError as error:
                self.info(f"error: searchmoves: {error}; ignored")
                continue
            if move not in chosen:
                chosen.append(move)
        if not chosen:
            self.info("error: searchmoves has no legal move; searching every move")
            return legal, False
        return chosen, len(chosen) < len(legal)

    def _run_job(self, job: SearchJob) -> None:
        """The search thread: search (or ask the policy), send the info lines, wait while
        ``infinite``/``ponder`` holds the answer back, then send ``bestmove``."""
        move: chess.Move | None = None
        ponder: chess.Move | None = None
        board = job.board
        try:
            if board is not None and job.allowed:
                if job.searcher is not None:
                    move, ponder = self._searched_move(job)
                if move is None:
                    move = self._policy_move(job)
        except Exception as error:  # noqa: BLE001 - answer with a legal move rather than hang the GUI
            logger.exception("go failed in %s", board.fen() if board is not None else None)
            move = min(job.allowed, key=lambda m: m.uci()) if job.allowed else None
            self.info(f"error: {type(error).__name__}: {error}")
        self.step_seconds = job.control.next_step_seed()  # before bestmove: the next go comes after it
        job.control.wait_for_release()
        if move is None or board is None:
            self.send("bestmove 0000")
            return
        answer = f"bestmove {board.uci(move)}"
        if ponder is not None:
            after = board.copy(stack=False)
            after.push(move)
            if after.is_legal(ponder):
                answer += f" ponder {after.uci(ponder)}"
        self.send(answer)

    def _searched_move(self, job: SearchJob) -> tuple[chess.Move | None, chess.Move | None]:
        """The search's move and its expected reply (None, None when the search fails: the policy answers)."""
        board, control, searcher = job.board, job.control, job.searcher
        assert board is not None and searcher is not None

        def report(result: SearchResult) -> None:
            self.send(*self.search_info(job, result))

        try:
            result = searcher.search(
                board,
                nodes=self.max_nodes if control.unbounded else control.limits.nodes,
                root_moves=job.allowed if job.restricted else None,
                should_stop=control.should_stop,  # stop, ponderhit's node limit and deadline
                report=report,
                report_interval=INFO_INTERVAL_S,
            )
        except Exception as error:  # noqa: BLE001 - the policy's move beats a hung GUI
            logger.exception("search failed in %s", board.fen())
            self.info(f"error: the search failed ({type(error).__name__}: {error}); playing the policy's move")
            return None, None
        try:
            result = self._more_lines(job, result)
        except Exception:  # noqa: BLE001 - the lines are a courtesy; the best move is already known
            logger.exception("MultiPV lines after a decided root failed in %s", board.fen())
        self.send(*self.search_info(job, result))
        pv = result.root_moves[0].pv if result.root_moves else []
        return result.move, (pv[1] if len(pv) > 1 else None)

    def _more_lines(self, job: SearchJob, result: SearchResult) -> SearchResult:
        """`result` with as many lines as MultiPV asks. A root decided without search (a mate in one, a tablebase
        move: `search.base.decided_root`) has one line; the other allowed moves are then searched for the rest, with the
        same budget, each further decided move first (several mates in one are each a line), best first."""
        board, control, searcher = job.board, job.control, job.searcher
        assert board is not None and searcher is not None
        lines = list(result.root_moves)
        nodes = result.nodes
        while len(lines) < job.multipv and not control.should_stop(nodes):
            shown = {line.move for line in lines}
            rest = [move for move in job.allowed if move not in shown]
            if not rest:
                break
            more = searcher.search(
                board,
                nodes=self.max_nodes if control.unbounded else control.limits.nodes,
                root_moves=rest,
                should_stop=control.should_stop,
            )
            new = [line for line in more.root_moves if line.move not in shown]
            if not new:
                break
            lines += new[: job.multipv - len(lines)]
            nodes += more.nodes
        return (
            result
            if len(lines) == len(result.root_moves)
            else dataclasses.replace(result, root_moves=lines, nodes=nodes)
        )

    def search_info(self, job: SearchJob, result: SearchResult) -> list[str]:
        assert job.board is not None and job.searcher is not None
        elapsed = time.perf_counter() - job.control.started
        return info_lines(
            job.board,
            result,
            job.multipv,
            elapsed,
            exact_value=job.searcher.evaluator.exact_value,
            show_wdl=job.show_wdl,
        )

    def _policy_move(self, job: SearchJob) -> chess.Move:
        """The policy's own move among the allowed moves (argmax or a sample at the temperature,
        with `PolicyMover`'s repetition rule), announced with MultiPV ``info`` lines and its probability."""
        from chessgrpo.play.movers import PolicyMover, material_balance

        board = job.board
        assert board is not None
        moves = job.allowed
        logits, actions = policy_logits(self.policy, board, moves)
        probabilities = softmax(logits)
        candidates = list(range(len(moves)))
        if material_balance(board) >= WINNING_MATERIAL:
            repeats, allows = PolicyMover.repetition_moves(board.copy())
            for excluded in (set(repeats + allows), set(repeats)):
                kept = [i for i in candidates if moves[i] not in excluded]
                if excluded and kept and len(kept) < len(candidates):
                    candidates = kept
                    break
        if job.temperature == 0.0:
            best = max(logits[i] for i in candidates)
            chosen = min(
                (i for i in candidates if logits[i] == best), key=lambda i: actions[i]
            )  # ties: the first action, as argmax
        else:
            weights = softmax(np.array([logits[i] for i in candidates]) / job.temperature)
            chosen = candidates[int(self._rng.choice(len(candidates), p=weights))]
        shown = [chosen] + sorted((i for i in range(len(moves)) if i != chosen), key=lambda i: -probabilities[i])
        shown = shown[: job.multipv]
        scores = self.policy_scores(
            board, [moves[i] for i in shown], [float(probabilities[i]) for i in shown], float(probabilities.max())
        )
        elapsed = time.perf_counter() - job.control.started
        elapsed_ms = int(1000 * elapsed)
        nps = int(1 / max(elapsed, 1e-3))
        self.send(
            *[
                f"info depth 1 seldepth 1 multipv {rank} score {score.text(job.show_wdl)} nodes 1 nps {nps} time {elapsed_ms} pv {board.uci(moves[i])}"
                for rank, (i, score) in enumerate(zip(shown, scores), start=1)
            ]
        )
        self.info(f"policy probability {probabilities[chosen]:.3f}")
        return moves[chosen]

    def policy_scores(
        self, board: chess.Board, moves: list[chess.Move], probabilities: list[float], best: float
    ) -> list[Score]:
        """Scores of the policy's moves: decided by the rules, else the value head on the position
        after the move when there is one, else `policy_estimate`."""
        scores: list[Score | None] = [decided_score(board, move, claimable_value) for move in moves]
        pending = [i for i, score in enumerate(scores) if score is None]
        if pending and self.has_value_head:
            import torch

            afters = []
            for i in pending:
                after = board.copy(stack=False)
                after.push(moves[i])
                afters.append(standard_view(after))
            with torch.no_grad():
                tokens, _ = self.policy.inputs(afters)
                _, value_logits = self.policy(tokens, with_value=True)
                values = torch.sigmoid(value_logits.float()).cpu().numpy()
            for i, value in zip(pending, values):
                scores[i] = estimate_score(1.0 - float(value))
        else:
            for i in pending:
                scores[i] = policy_estimate(board, moves[i], probabilities[i], best)
        return scores  # type: ignore[return-value]
