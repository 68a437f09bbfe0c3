"""The project's exception base: expected errors that the command line prints as one line.

Anything derived from `ChessGRPOError` is an error the user can act on (a bad input, a missing
file, a locked run directory, a run that diverged and could not recover); the CLI prints its
message alone. `InputError` (and its `ConfigError`) is the user's input being wrong: one line
naming the input, exit status 2. Every other exception, a plain `ValueError` included (a CUDA
out-of-memory, a shape mismatch, a bug), keeps its traceback and exits 1, because that stack is
what a developer needs: raise `InputError` where input is validated, `ValueError` for internal
invariants.

Messages about bad input name the input (a file, with its line or row when known) and echo
untrusted text through `quote`, so a 10,000-character "FEN" or a multi-line library error
(`one_line`) still reads as one short line.
"""

from __future__ import annotations

ECHO_LIMIT = 100
"""Characters of untrusted input that an error message echoes (`quote`)."""


class ChessGRPOError(Exception):
    """An expected error with a message that says what was wrong and what to do."""


class InputError(ChessGRPOError, ValueError):
    """The user's input is wrong: a malformed FEN or move, a bad config value, an unreadable or
    wrong-kind file. The CLI prints its message (which names the input) and exits 2.

    A `ValueError` too, so every ``except ValueError`` (and ``pytest.raises(ValueError)``) that
    caught validation errors before this class existed still catches them.
    """


class RunLocked(ChessGRPOError):
    """Another live process holds the run directory's lock."""


class TrainingDiverged(ChessGRPOError):
    """Training produced non-finite values and the divergence policy could not recover."""


class CheckpointError(ChessGRPOError):
    """No intact checkpoint could be found or loaded."""


def quote(value: object, limit: int = ECHO_LIMIT) -> str:
    """`repr(value)` for an error message, cut to about `limit` characters.

    A longer value keeps the start of its repr, then ``...`` and the value's full length, e.g.
    ``'rnbqkbnr/pppp...' (10000 characters)``; a short one is its plain repr. The repr escapes
    newlines and control characters, so the result is always one line.
    """
    sized = isinstance(value, (str, bytes))
    text = repr(value[: limit + 1]) if sized else repr(value)  # never the repr of a huge string
    if len(text) <= limit + 2 and not (sized and len(value) > limit):  # + 2: the quotes
        return text
    size, unit = (
        (len(value), "bytes" if isinstance(value, bytes) else "characters") if sized else (len(text), "characters")
    )
    return f"{text[:limit]}... ({size} {unit})"


def one_line(error: BaseException | str, limit: int = 300) -> str:
    """The text of `error` (e.g. a pyarrow, YAML or torch exception) as one line of at most ~`limit` characters."""
    text = " ".join(str(error).split())
    if not text and isinstance(error, BaseException):
        text = type(error).__name__
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"
