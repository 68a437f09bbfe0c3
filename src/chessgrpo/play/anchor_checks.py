"""Anchors checked against their engines before any game.

Before any game each engine anchor is started once (`prepare_anchors`): its handshake, its
options and one search of the start position with its limit, so an engine that is not UCI,
lacks an option, ignores its node limit or answers nonsense is one clear error up front
(docs/engines.md); unnamed ``uci:`` anchors are named by their ``id name`` there. The engine at
``engine.path`` is read once (`probe_engine`) and every Stockfish anchor is checked against it
(`check_anchor`: it is Stockfish, its UCI_Elo range holds the anchor's).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import chess

from chessgrpo.engine.locate import EngineError, find_stockfish
from chessgrpo.engine.uci import EngineUnsupported, UciProcess
from chessgrpo.errors import InputError
from chessgrpo.play.anchors import ENGINE_HASH_MB, AnchorSpec, EngineSpec, check_unique


@dataclasses.dataclass(frozen=True)
class EngineInfo:
    """What an engine binary says about itself (read once, before any game)."""

    path: str
    name: str
    """``id name``, e.g. "Stockfish 15.1"."""
    elo_min: int | None
    elo_max: int | None
    """The ``UCI_Elo`` option's range (None when the engine has no such option)."""
    options: frozenset[str] = frozenset()
    """The options it advertises (lower-case names)."""

    @property
    def is_stockfish(self) -> bool:
        return self.name.startswith("Stockfish")


def probe_engine(path: str | None = None, timeout_s: float = 30.0) -> EngineInfo:
    """Start the engine at `path` (Stockfish by default) once: its ``id name`` and options
    (``UCI_Elo ... min X max Y``)."""
    binary = find_stockfish(path)
    engine = UciProcess(binary, threads=None, hash_mb=None, startup_timeout_s=timeout_s)
    try:
        option = engine.options.get("uci_elo")
        return EngineInfo(
            path=str(binary),
            name=engine.name or "unknown engine",
            elo_min=option.min if option is not None else None,
            elo_max=option.max if option is not None else None,
            options=frozenset(engine.options),
        )
    finally:
        engine.quit()


def check_anchor(spec: AnchorSpec, info: EngineInfo) -> None:
    """`ValueError` when the engine at ``engine.path`` cannot play the Stockfish anchor `spec`
    (it is not Stockfish; UCI_Elo outside its range)."""
    if not spec.is_stockfish:
        return
    if not info.is_stockfish:
        raise InputError(
            f"anchor {spec.text!r} plays Stockfish, but engine.path is {info.name} ({info.path}); set engine.path to "
            f"Stockfish, and play other engines with uci:{info.path}[:depth=N|:nodes=N] (docs/engines.md)"
        )
    if spec.kind != "sf-elo":
        return
    if info.elo_min is None or info.elo_max is None:
        raise InputError(f"anchor {spec.text!r}: {info.name} has no UCI_Elo option; use sf-skill:N instead")
    if not info.elo_min <= spec.value <= info.elo_max:  # type: ignore[operator]
        raise InputError(
            f"anchor {spec.text!r}: {info.name} accepts UCI_Elo {info.elo_min}..{info.elo_max} only "
            f"(for weaker play use sf-skill:0..20)"
        )


def probe_anchor(spec: AnchorSpec) -> AnchorSpec:
    """Start a UCI anchor's engine once, set its options and search the start position with its
    limit: the spec with the engine's ``id name`` and the options it got. Anything wrong (not
    UCI, an option it lacks, a node limit it ignores, no legal ``bestmove``, a hang) is one
    `EngineError` naming the anchor and the engine, before any game."""
    engine = spec.engine
    if engine is None:
        raise InputError(f"{spec.text!r} is not a UCI engine anchor")
    where = f"anchor {spec.text!r}"
    try:
        process = UciProcess(
            engine.command[0],
            args=engine.command[1:],
            threads=1,
            hash_mb=ENGINE_HASH_MB,
            options=dict(engine.options),
            startup_timeout_s=min(30.0, engine.timeout_s),
        )
    except EngineUnsupported as error:
        raise EngineUnsupported(f"{where}: {error}") from None
    except EngineError as error:
        raise EngineError(f"{where}: {error}") from None
    board = chess.Board()
    try:
        result = process.search(
            board.fen(),
            nodes=engine.nodes,
            depth=engine.depth,
            movetime_ms=engine.movetime_ms,
            timeout_s=engine.timeout_s,
        )
        best = result.best_move
        try:
            legal = best is not None and board.is_legal(chess.Move.from_uci(best))
        except ValueError:
            legal = False
        if not legal:
            raise EngineError(
                f"engine {process.label} answered `bestmove {result.bestmove_text}` to the start position "
                f"({engine.limit_text()}): not a legal move"
            )
    except EngineUnsupported as error:
        raise EngineUnsupported(f"{where}: {error}") from None
    except EngineError as error:
        raise EngineError(f"{where}: {error} (checked once, searching the start position, before any game)") from None
    finally:
        process.quit()
    id_name = process.name or Path(engine.command[0]).name
    return dataclasses.replace(
        spec, engine=dataclasses.replace(engine, id_name=id_name, applied=tuple(process.settings.items()))
    )


def prepare_anchors(specs: list[AnchorSpec]) -> list[AnchorSpec]:
    """`probe_anchor` every UCI anchor, and name the unnamed ones (``uci:PATH`` without ``name=``)
    by their ``id name``, followed by their limit when two would share a name."""
    probed = [probe_anchor(spec) if spec.kind == "uci" else spec for spec in specs]
    taken = {spec.text for spec in probed if not _unnamed(spec)}
    ids = [spec.engine.id_name for spec in probed if _unnamed(spec)]  # type: ignore[union-attr]
    named = []
    for spec in probed:
        if _unnamed(spec):
            engine: EngineSpec = spec.engine  # type: ignore[assignment]
            shared = engine.id_name in taken or ids.count(engine.id_name) > 1
            name = f"{engine.id_name} {engine.limit_text()}" if shared else engine.id_name
            spec = dataclasses.replace(spec, text=name)
        named.append(spec)
    try:
        check_unique(named)
    except ValueError as error:
        raise InputError(f"{error}: give each engine its own name (uci:PATH:name=NAME)") from None
    return named


def _unnamed(spec: AnchorSpec) -> bool:
    return spec.kind == "uci" and spec.engine is not None and not spec.engine.name
