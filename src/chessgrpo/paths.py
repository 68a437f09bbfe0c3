"""Where data files are found, whatever the current directory.

The configs name their inputs relative to the repository: ``data/syzygy``, ``data/lichess_puzzles_dev.csv`` and
``data/rookworld_samples.txt`` (shipped in the repository, see data/README.md) and ``data/tiny`` (a dataset made by
`chessgrpo data generate`). `resolve_data_path` finds such a path from any current directory; the first that
exists wins:

1. an absolute path: used as is (never searched elsewhere);
2. under ``$CHESSGRPO_DATA``, when it is set: the variable stands for the repository's ``data/`` directory, so
   ``data/X`` is looked for as ``$CHESSGRPO_DATA/X`` and any other relative path P as ``$CHESSGRPO_DATA/P``. It
   comes first so that larger tables or other puzzle files placed there replace the shipped ones everywhere;
3. a relative path that exists from the current directory: used as is, so a user's own relative paths keep
   meaning what they always meant;
4. under the repository root (the directory with pyproject.toml above this package's source, when running from
   a checkout): ``<root>/P``, where the shipped data lives.

When none exists, `DataNotFoundError` (a `FileNotFoundError`) names the path, every place it was looked for and
``CHESSGRPO_DATA``. `find_data_path` is the same search returning None instead.
"""

from __future__ import annotations

import os
from pathlib import Path, PurePosixPath

DATA_ENV = "CHESSGRPO_DATA"
"""Environment variable: a directory that stands for the repository's ``data/`` (puzzles CSV, syzygy/, ...)."""

DATA_DIR = "data"
"""The repository's data directory (relative to its root): the shipped data and what `chessgrpo data` makes."""

SYZYGY_DEFAULT = "data/syzygy"
"""The shipped 3-4-piece Syzygy tables: every ``syzygy_path`` default."""

PUZZLES_DEFAULT = "data/lichess_puzzles_dev.csv"
"""The shipped 500 Lichess puzzles: the puzzle evaluations' default."""

ROOKWORLD_SAMPLES_DEFAULT = "data/rookworld_samples.txt"
"""The shipped RookWorld text-task samples (format tests, the tiny LMs' tokenizer)."""


class DataNotFoundError(FileNotFoundError):
    """A data path was found neither as given nor under $CHESSGRPO_DATA nor the repository root."""


def repo_root() -> Path | None:
    """The checkout this package runs from (pyproject.toml beside ``src/chessgrpo``); None for an installed copy."""
    root = Path(__file__).resolve().parents[2]  # <root>/src/chessgrpo/paths.py
    if (root / "pyproject.toml").is_file() and (root / "src" / "chessgrpo").is_dir():
        return root
    return None


def data_suffix(path: str | os.PathLike) -> Path | None:
    """X of a ``data/X`` path (``Path('.')`` for ``data`` itself); None for other paths."""
    parts = PurePosixPath(str(path).replace(os.sep, "/")).parts
    if not parts or parts[0] != DATA_DIR:
        return None
    return Path(*parts[1:]) if len(parts) > 1 else Path(".")


def _relative_to_data(given: Path) -> Path:
    """What `given` is called under $CHESSGRPO_DATA: X for ``data/X``, else itself."""
    suffix = data_suffix(given)
    return suffix if suffix is not None else given


def candidates(path: str | os.PathLike) -> list[tuple[str, Path | None]]:
    """Where `path` is looked for, in order, as (which place, path); path None: that place is not
    available (``$CHESSGRPO_DATA`` unset, no checkout)."""
    given = Path(path).expanduser()
    if given.is_absolute():
        return [("as given", given)]
    data = os.environ.get(DATA_ENV)
    places: list[tuple[str, Path | None]] = [
        (f"${DATA_ENV}", Path(data).expanduser() / _relative_to_data(given) if data else None),
        ("the current directory", given),
    ]
    root = repo_root()
    places.append(("the repository root", Path(os.path.normpath(root / given)) if root is not None else None))
    return places


def find_data_place(path: str | os.PathLike) -> tuple[str, Path] | None:
    """(which place, path) of the first existing place of `path` (see the module docstring); None when there is none."""
    for where, place in candidates(path):
        if place is not None and place.exists():
            return where, place
    return None


def find_data_path(path: str | os.PathLike) -> Path | None:
    """The first existing place of `path` (see the module docstring); None when there is none."""
    found = find_data_place(path)
    return found[1] if found is not None else None


def data_origin(path: str | os.PathLike) -> str:
    """Which set `path` resolves to, for `chessgrpo doctor`: "shipped with the repository" (under its data/),
    "from $CHESSGRPO_DATA", "from the current directory", "as given" or "not found"."""
    found = find_data_place(path)
    if found is None:
        return "not found"
    where, place = found
    root = repo_root()
    if root is not None and Path(place).resolve().is_relative_to((root / DATA_DIR).resolve()):
        return "shipped with the repository" if where != f"${DATA_ENV}" else f"from ${DATA_ENV}"
    return {"as given": "as given", f"${DATA_ENV}": f"from ${DATA_ENV}"}.get(where, f"from {where}")


def places_looked(path: str | os.PathLike) -> str:
    """Every place `path` is looked for, for a message: "/cwd/P (the current directory), ..."."""
    given = Path(path).expanduser()
    if given.is_absolute():
        return str(given)
    looked = []
    for where, place in candidates(path):
        if where == "the current directory":
            looked.append(f"{os.path.normpath(Path.cwd() / given)} (the current directory)")
        elif where == f"${DATA_ENV}":
            unset = f"${DATA_ENV}/{_relative_to_data(given)} (${DATA_ENV} is not set)"
            looked.append(f"{place} (${DATA_ENV})" if place is not None else unset)
        elif place is not None:
            looked.append(f"{place} ({where})")
        else:
            looked.append(f"{where} (not running from a checkout)")
    return ", ".join(looked)


def resolve_data_path(path: str | os.PathLike, what: str = "data file") -> Path:
    """`path` found from any current directory (see the module docstring).

    Raises:
        DataNotFoundError: it exists nowhere; the message names `what`, the path, each place
            looked and how to point ``$CHESSGRPO_DATA`` at the data.
    """
    found = find_data_path(path)
    if found is not None:
        return found
    given = Path(path).expanduser()
    if given.is_absolute():
        raise DataNotFoundError(f"{what} {str(path)!r} not found")
    raise DataNotFoundError(
        f"{what} {str(path)!r} not found; looked at {places_looked(path)}. Set {DATA_ENV} to the directory that "
        f"holds {_relative_to_data(given)}, or pass an existing path"
    )


def resolve_optional(path: str | os.PathLike | None, what: str = "data file", *, required: bool = True) -> str | None:
    """`resolve_data_path` for a config value that may be null (returned as is) and may hold
    several os.pathsep-separated directories (each resolved). With ``required=False`` a path that
    is not found is returned unchanged, for the code that uses it (or never does) to judge."""
    if path is None or str(path) == "":
        return path  # type: ignore[return-value]
    parts = [part for part in str(path).split(os.pathsep) if part]
    resolved = []
    for part in parts:
        if required:
            resolved.append(str(resolve_data_path(part, what)))
        else:
            found = find_data_path(part)
            resolved.append(str(found) if found is not None else part)
    return os.pathsep.join(resolved)
