"""The engine's UCI options: what ``uci`` announces, how ``setoption`` sets each one, and the checks that refuse a bad
value (an ``info string error: ...`` naming the option; the value in use is kept). `UciOptions` is mixed into
`uci.engine.UciEngine`, which owns the option values and provides `info`, `reset_searcher`, `measure_step`, the
model (`policy`) and the position (`board`).

- ``Search`` (combo ``puct``/``alphabeta``/``none``, default puct): ``none`` = the policy's move
  without search (the only choice for a checkpoint without a value head, which falls back to
  it and says so once with an ``info string`` at the first ``go``).
- ``Nodes`` (spin, default 256): the node budget of ``go`` without a node or time limit.
- ``MultiPV`` (spin, default 1, at most 16): ``info`` lines per search, best first.
- ``SyzygyPath`` (string, default empty = off): Syzygy tables for exact 3-4-piece values;
  a directory without tables is refused.
- ``Temperature`` (string: 0 = argmax, or a number in [0.001, 100]): the policy-only player's
  sampling temperature (search always plays its most visited move). NaN, infinities,
  negatives and values in (0, 0.001) (denormals included) are refused.
- ``Device`` (string, a torch device): the model is copied to the device and run once on a
  position there; only when that gives finite logits matching the current device's does the
  copy replace the model (``meta``, a missing GPU or an unknown name is refused, and the model
  in use is never touched).
- ``UCI_Chess960`` (check, default false): positions (``startpos``, Shredder-FEN or X-FEN) are
  Chess960 positions and castling is written king-takes-rook (``e1h1``) in ``bestmove``,
  ``pv`` and ``searchmoves``; the standard-chess network sees them through
  `chessgrpo.uci.chess960`.
- ``UCI_ShowWDL`` (check, default false): ``wdl W D L`` after every score.
- ``Ponder`` (check): announced so GUIs offer pondering; ``go ponder`` works either way.
- ``Move Overhead`` (spin, ms, default 50, at most 5000): kept back from every clock and
  ``movetime`` budget (bots raise it when they flag on a slow network).
- ``Threads`` (spin, default: torch's threads): torch's intra-op threads for the network's
  forwards; values above the machine's CPUs are clamped (bots set what their machine has), and
  more than 1 is kept only when a search step is measured faster with them (`set_threads`).
- ``Hash`` (spin, MiB, default 391): bounds the search tree: a search stops growing at
  Hash * 256 nodes (~4 kB a node), at most `MAX_NODES`.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable

import chess
import numpy as np
import torch

from chessgrpo.play.search_control import MAX_MOVE_OVERHEAD_MS, MAX_NODES, SEARCH_CHOICES, hash_nodes

DEFAULT_NODES = 256
MAX_MULTIPV = 16
MAX_THREADS = 1024
"""``Threads`` takes any value up to this (bots set what their machine has); it is clamped to the CPUs."""
MAX_HASH_MB = 1 << 20
"""``Hash`` takes any value up to this; above `DEFAULT_HASH_MB` it changes nothing (the tree stops at `MAX_NODES`)."""
INFO_INTERVAL_S = 1.0
"""A long search (``infinite``, ``ponder``, long clocks) sends its ``info`` lines this often."""
MIN_TEMPERATURE, MAX_TEMPERATURE = 1e-3, 100.0
"""Temperature is 0 (argmax) or lies in this range: below it softmax(logits / T) overflows to argmax anyway."""
WINNING_MATERIAL = 3
"""The policy-only player avoids repetitions when this many pawns ahead (as `PolicyMover`)."""
DEVICE_TOLERANCE = 0.05
"""A new device's logits may differ from the current device's by this much (TF32, fused kernels)."""


def parse_spin(value: str, low: int, high: int) -> int | None:
    """The integer `value` when it lies in [low, high], else None."""
    try:
        number = int(value.strip())
    except ValueError:
        return None
    return number if low <= number <= high else None


def parse_check(value: str) -> bool | None:
    """A UCI check option's value (true/false), else None."""
    text = value.strip().lower()
    return {"true": True, "false": False}.get(text)


def parse_temperature(value: str | float) -> float:
    """0 or a number in [`MIN_TEMPERATURE`, `MAX_TEMPERATURE`]; anything else raises `ValueError`."""
    try:
        temperature = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"Temperature must be a number, got {str(value)[:50]!r}") from None
    if temperature == 0.0:
        return 0.0
    if not MIN_TEMPERATURE <= temperature <= MAX_TEMPERATURE:  # also NaN, inf, negatives, denormals
        raise ValueError(
            f"Temperature must be 0 or in [{MIN_TEMPERATURE:g}, {MAX_TEMPERATURE:g}], got {str(value)[:50]!r}"
        )
    return temperature


def check_syzygy_path(path: str) -> None:
    """Raise `FileNotFoundError` unless `path` is a directory (or several) holding Syzygy tables."""
    from chessgrpo.engine.tablebase import Tablebase

    Tablebase(path).close()


class UciOptions:
    """The options of `UciEngine` (module docstring): `option_lines` for ``uci``, `set_option` for ``setoption``,
    one ``set_<option>`` per option; each refuses a bad value with an ``info string`` and keeps the old one."""

    def option_lines(self) -> list[str]:
        """The ``option`` lines of the ``uci`` reply, with the current values as defaults."""
        check = {True: "true", False: "false"}
        return [
            f"option name Search type combo default {self.search_algorithm} "
            + " ".join(f"var {c}" for c in SEARCH_CHOICES),
            f"option name Nodes type spin default {self.nodes} min 1 max {MAX_NODES}",
            f"option name MultiPV type spin default {self.multipv} min 1 max {MAX_MULTIPV}",
            f"option name SyzygyPath type string default {self.syzygy_path or '<empty>'}",
            f"option name Temperature type string default {self.temperature:g}",
            f"option name Device type string default {self.device}",
            f"option name UCI_Chess960 type check default {check[self.chess960]}",
            f"option name UCI_ShowWDL type check default {check[self.show_wdl]}",
            f"option name Ponder type check default {check[self.ponder]}",
            f"option name Move Overhead type spin default {self.move_overhead_ms} min 0 max {MAX_MOVE_OVERHEAD_MS}",
            f"option name Threads type spin default {self.threads} min 1 max {MAX_THREADS}",
            f"option name Hash type spin default {self.hash_mb} min 1 max {MAX_HASH_MB}",
        ]

    def set_option(self, arguments: list[str]) -> None:
        if not arguments or arguments[0] != "name":
            self.info("error: expected setoption name <name> [value <value>]")
            return
        if "value" in arguments:
            split = arguments.index("value")
            name, value = " ".join(arguments[1:split]), " ".join(arguments[split + 1 :])
        else:
            name, value = " ".join(arguments[1:]), ""
        setter = self.option_setters().get(name.lower())
        if setter is None:
            self.info(f"unknown option ignored: {name[:100]}")
        else:
            setter(value)

    def option_setters(self) -> dict[str, Callable[[str], None]]:
        """The setter of each option `option_lines` announces, by lower-case name."""
        return {
            "search": self.set_search,
            "nodes": self.set_nodes,
            "multipv": self.set_multipv,
            "syzygypath": self.set_syzygy_path,
            "temperature": self.set_temperature,
            "device": self.set_device,
            "uci_chess960": self.set_chess960,
            "uci_showwdl": self.set_show_wdl,
            "ponder": self.set_ponder,
            "move overhead": self.set_move_overhead,
            "threads": self.set_threads,
            "hash": self.set_hash,
        }

    def set_search(self, value: str) -> None:
        choice = value.strip().lower()
        if choice not in SEARCH_CHOICES:
            self.info(
                f"error: Search must be one of {', '.join(SEARCH_CHOICES)}, got {value[:50]!r}; keeping {self.search_algorithm}"
            )
            return
        self.search_algorithm = choice
        self.reset_searcher()

    def set_nodes(self, value: str) -> None:
        nodes = parse_spin(value, 1, MAX_NODES)
        if nodes is None:
            self.info(f"error: Nodes must be an integer in [1, {MAX_NODES}], got {value[:50]!r}; keeping {self.nodes}")
            return
        self.nodes = nodes

    def set_multipv(self, value: str) -> None:
        multipv = parse_spin(value, 1, MAX_MULTIPV)
        if multipv is None:
            self.info(
                f"error: MultiPV must be an integer in [1, {MAX_MULTIPV}], got {value[:50]!r}; keeping {self.multipv}"
            )
            return
        self.multipv = multipv

    def set_syzygy_path(self, value: str) -> None:
        path = "" if value.strip() in ("", "<empty>") else value.strip()
        if path:
            try:
                check_syzygy_path(path)
            except (OSError, ValueError) as error:
                self.info(f"error: SyzygyPath refused ({error}); keeping {self.syzygy_path or '<empty>'}")
                return
        self.syzygy_path = path
        self.reset_searcher()

    def set_temperature(self, value: str) -> None:
        try:
            temperature = parse_temperature(value)
        except ValueError as error:
            self.info(f"error: {error}; keeping {self.temperature:g}")
            return
        self.temperature = temperature
        self._rng = np.random.default_rng(time.time_ns() % (2**62))

    def set_device(self, value: str) -> None:
        """Validate the device on a copy of the model (module docstring); only then swap it in."""
        text = value.strip()
        try:
            candidate = self.validated_copy(text)
        except Exception as error:  # noqa: BLE001 - any failure means: keep the device in use
            self.info(
                f"error: cannot use device {text[:50]!r} ({type(error).__name__}: {' '.join(str(error).split())[:200]}); keeping {self.device}"
            )
            return
        self.policy = candidate
        self.device = text
        self.reset_searcher()  # rebuilt on the new device at the next `go`

    def validated_copy(self, text: str):
        """A copy of the model on device `text` that computes what the current one does; raises otherwise."""
        import torch

        device = torch.device(text)
        if device.type == "meta":
            raise ValueError("the meta device holds no data and cannot run the model")
        if device.type == "cuda":
            if not torch.cuda.is_available():
                raise ValueError("CUDA is not available")
            if device.index is not None and device.index >= torch.cuda.device_count():
                raise ValueError(f"there are {torch.cuda.device_count()} CUDA devices")
        if device.type == "mps" and not (hasattr(torch.backends, "mps") and torch.backends.mps.is_available()):
            raise ValueError("MPS is not available")
        candidate = copy.deepcopy(self.policy).to(device).eval()
        probe = chess.Board("r1bqkbnr/pppp1ppp/2n5/4p3/4P3/5N2/PPPP1PPP/RNBQKB1R w KQkq - 2 3")
        with torch.no_grad():
            tokens, _ = self.policy.inputs([probe])
            reference = self.policy(tokens).float().cpu()
            logits = candidate(tokens.to(device)).float().cpu()
        if logits.shape != reference.shape or not torch.isfinite(logits).all():
            raise ValueError("the model gives no finite logits there")
        difference = float((logits - reference).abs().max())
        if difference > DEVICE_TOLERANCE * max(1.0, float(reference.abs().max())):
            raise ValueError(f"the model computes different logits there (max difference {difference:.3g})")
        return candidate

    def set_chess960(self, value: str) -> None:
        flag = parse_check(value)
        if flag is None:
            self.info(
                f"error: UCI_Chess960 must be true or false, got {value[:50]!r}; keeping {str(self.chess960).lower()}"
            )
            return
        if flag == self.chess960:
            return
        self.chess960 = flag
        if self.board is not None:
            board = self.board.copy()
            board.chess960 = flag
            if board.status() != chess.STATUS_VALID:
                self.board = None
                self.info("error: the current position has Chess960 castling rights; send a new position")
            else:
                self.board = board

    def set_show_wdl(self, value: str) -> None:
        flag = parse_check(value)
        if flag is None:
            self.info(
                f"error: UCI_ShowWDL must be true or false, got {value[:50]!r}; keeping {str(self.show_wdl).lower()}"
            )
            return
        self.show_wdl = flag

    def set_ponder(self, value: str) -> None:
        flag = parse_check(value)
        if flag is None:
            self.info(f"error: Ponder must be true or false, got {value[:50]!r}; keeping {str(self.ponder).lower()}")
            return
        self.ponder = flag  # `go ponder` works either way; the option only tells the GUI it may ponder

    def set_move_overhead(self, value: str) -> None:
        overhead = parse_spin(value, 0, MAX_MOVE_OVERHEAD_MS)
        if overhead is None:
            self.info(
                f"error: Move Overhead must be an integer in [0, {MAX_MOVE_OVERHEAD_MS}] ms, got {value[:50]!r}; "
                f"keeping {self.move_overhead_ms}"
            )
            return
        self.move_overhead_ms = overhead

    def set_threads(self, value: str) -> None:
        """Torch's intra-op threads for the network's forwards (the search itself is one thread). More than
        the CPUs is clamped; more than one is kept only when a search step is measured faster with them than
        with one (on busy cores, threads that wait for each other make a small batch many times slower)."""
        threads = parse_spin(value, 1, MAX_THREADS)
        if threads is None:
            self.info(
                f"error: Threads must be an integer in [1, {MAX_THREADS}], got {value[:50]!r}; keeping {self.threads}"
            )
            return
        from chessgrpo.engine.pool import available_cores  # affinity masks and containers, not the host's count

        usable = min(threads, available_cores())
        if usable < threads:
            self.info(f"Threads {threads}: this process may use {usable} CPUs; using {usable}")
        torch.set_num_threads(usable)
        self.threads = usable
        if usable == 1:
            return
        torch.set_num_threads(1)
        one = self.measure_step()  # warm: the startup's threads (1 under chessgrpo uci)
        torch.set_num_threads(usable)
        # one call, with the new threads' start-up in it: it is several seconds on busy cores, and errs towards 1
        many = self.measure_step(warm=False)
        if one is None or many is None:  # no search to measure (policy-only play: one position per call)
            return
        if one < many:
            self.info(
                f"Threads {usable}: {self.STEP_NAME} takes {1000 * many:.0f} ms with {usable} threads and "
                f"{1000 * one:.0f} ms with 1 (busy cores?); using 1"
            )
            torch.set_num_threads(1)
            self.threads, self.step_seconds = 1, one
        else:
            self.step_seconds = many

    def set_hash(self, value: str) -> None:
        """The search tree's memory bound in MiB: a search stops growing at `hash_nodes` nodes (~4 kB each)."""
        hash_mb = parse_spin(value, 1, MAX_HASH_MB)
        if hash_mb is None:
            self.info(
                f"error: Hash must be an integer in [1, {MAX_HASH_MB}] MiB, got {value[:50]!r}; keeping {self.hash_mb}"
            )
            return
        self.hash_mb = hash_mb
        if hash_nodes(hash_mb) < self.nodes:
            self.info(
                f"Hash {hash_mb} MiB holds {hash_nodes(hash_mb)} nodes: searches stop there (Nodes is {self.nodes})"
            )

    @property
    def max_nodes(self) -> int:
        """The most nodes one search may grow: `MAX_NODES`, or fewer under a small ``Hash``."""
        return hash_nodes(self.hash_mb)
