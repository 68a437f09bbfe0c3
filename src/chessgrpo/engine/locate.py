"""Finding engine binaries: Stockfish (`find_stockfish`) and any other UCI engine (`find_engine`)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from chessgrpo.errors import ChessGRPOError

# Debian installs Stockfish into its games directory, which is often not on PATH.
_FALLBACK_LOCATIONS = ("/usr/games/stockfish", "/usr/local/bin/stockfish", "/opt/homebrew/bin/stockfish")

INSTALL_HINT = (
    "install it with `sudo apt-get install stockfish` (Debian/Ubuntu; the binary lands in /usr/games) "
    "or `brew install stockfish`, or point engine.path / $CHESSGRPO_STOCKFISH at the binary"
)


class EngineError(ChessGRPOError, RuntimeError):
    """The engine failed: missing binary, crash or hang that persisted after a retry."""


class EngineNotFoundError(EngineError, FileNotFoundError):
    """No usable Stockfish binary was found."""


def find_stockfish(path: str | os.PathLike | None = None) -> Path:
    """The Stockfish binary to run: `path` if given, else $CHESSGRPO_STOCKFISH, PATH, /usr/games.

    Raises `EngineNotFoundError` with install instructions when none is found or the given path
    is not an executable file.
    """
    if path is None:
        path = os.environ.get("CHESSGRPO_STOCKFISH") or None
    if path is not None:
        candidate = Path(path)
        if not candidate.is_file() or not os.access(candidate, os.X_OK):
            resolved = shutil.which(str(path))
            if resolved is None:
                raise EngineNotFoundError(
                    f"Stockfish binary {str(path)!r} does not exist or is not executable; {INSTALL_HINT}"
                )
            candidate = Path(resolved)
        return candidate
    found = shutil.which("stockfish")
    if found:
        return Path(found)
    for location in _FALLBACK_LOCATIONS:
        if os.path.isfile(location) and os.access(location, os.X_OK):
            return Path(location)
    raise EngineNotFoundError(f"Stockfish was not found on PATH or in /usr/games; {INSTALL_HINT}")


def find_engine(command: str | os.PathLike, *, base: str | os.PathLike | None = None) -> Path:
    """The binary of a UCI engine given as a path or a bare name (``glaurung``).

    A name without a slash is looked up on PATH, then in /usr/games (where Debian installs chess
    engines); a relative path is taken relative to `base` (an engines file's directory) when given.
    Raises `EngineNotFoundError` naming the command when it is missing or not executable."""
    text = str(command)
    if not text.strip():
        raise EngineNotFoundError("empty engine command")
    if os.sep not in text and "/" not in text:
        found = shutil.which(text) or shutil.which(text, path="/usr/games:/usr/local/games")
        if found is None:
            raise EngineNotFoundError(
                f"engine {text!r} was not found on PATH or in /usr/games; install it (Debian: `apt-get install "
                f"PACKAGE`, e.g. glaurung, toga2, ethereal-chess) or give its path"
            )
        return Path(found)
    candidate = Path(text).expanduser()
    if base is not None and not candidate.is_absolute():
        candidate = Path(base) / candidate
    if not candidate.is_file() or not os.access(candidate, os.X_OK):
        raise EngineNotFoundError(f"engine binary {str(candidate)!r} does not exist or is not executable")
    return candidate
