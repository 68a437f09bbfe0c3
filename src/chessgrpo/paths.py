"""Where data files are found, whatever the current directory.

The configs name their inputs relative to the repository: ``data/tiny`` (a dataset made by
`chessgrpo data generate`) and ``../shared/data/...`` (the shared puzzles, Syzygy tables and
RookWorld samples beside the checkout). `resolve_data_path` finds such a path from any current
directory; the first that exists wins:

1. an absolute path: used as is (never searched elsewhere);
2. a relative path that exists from the current directory: used as is, so a user's own relative
   paths keep meaning what they always meant;
3. under ``$CHESSGRPO_DATA``: ``../shared/data/X`` is looked for as ``$CHESSGRPO_DATA/X``, any
   other relative path P as ``$CHESSGRPO_DATA/P``;
4. under the repository root (the directory with pyproject.toml above this package's source,
   when running from a checkout): ``<root>/P``, which for ``../shared/data/X`` is the shared
   directory beside the checkout.

When none exists, `DataNotFoundError` (a `FileNotFoundError`) names the path, every place it was
looked for and ``CHESSGRPO_DATA``. `find_data_path` is the same search returning None instead.
"""

from __future__ import annotations

import os
from pathlib import Path, PurePosixPath

DATA_ENV = "CHESSGRPO_DATA"
"""Environment variable: a directory holding the shared data (puzzles CSV, syzygy/, ...)."""

SHARED_PREFIX = ("..", "shared", "data")
"""The leading parts of the configs' shared-data defaults (``../shared/data/X``)."""


class DataNotFoundError(FileNotFoundError):
    """A data path was found neither as given nor under $CHESSGRPO_DATA nor the repository root."""


def repo_root() -> Path | None:
    """The checkout this package runs from (pyproject.toml beside ``src/chessgrpo``); None for an installed copy."""
    root = Path(__file__).resolve().parents[2]  # <root>/src/chessgrpo/paths.py
    if (root / "pyproject.toml").is_file() and (root / "src" / "chessgrpo").is_dir():
        return root
    return None


def shared_suffix(path: str | os.PathLike) -> Path | None:
    """X of a ``../shared/data/X`` path (``Path('.')`` for the directory itself); None for other paths."""
    parts = PurePosixPath(str(path).replace(os.sep, "/")).parts
    if tuple(parts[: len(SHARED_PREFIX)]) != SHARED_PREFIX:
        return None
    return Path(*parts[len(SHARED_PREFIX) :]) if len(parts) > len(SHARED_PREFIX) else Path(".")


def _relative_to_data(given: Path) -> Path:
    """What `given` is called under $CHESSGRPO_DATA: X for ``../shared/data/X``, else itself."""
    suffix = shared_suffix(given)
    return suffix if suffix is not None else given


def candidates(path: str | os.PathLike) -> list[tuple[str, Path | None]]:
    """Where `path` is looked for, in order, as (which place, path); path None: that place is not
    available (``$CHESSGRPO_DATA`` unset, no checkout)."""
    given = Path(path).expanduser()
    if given.is_absolute():
        return [("as given", given)]
    places: list[tuple[str, Path | None]] = [("the current directory", given)]
    data = os.environ.get(DATA_ENV)
    places.append((f"${DATA_ENV}", Path(data).expanduser() / _relative_to_data(given) if data else None))
    root = repo_root()
    places.append(("the repository root", Path(os.path.normpath(root / given)) if root is not None else None))
    return places


def find_data_path(path: str | os.PathLike) -> Path | None:
    """The first existing place of `path` (see the module docstring); None when there is none."""
    for _, place in candidates(path):
        if place is not None and place.exists():
            return place
    return None


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
