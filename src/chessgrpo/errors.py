"""The project's exception base: expected errors that the command line prints as one line.

Anything derived from `ChessGRPOError` is an error the user can act on (a bad input, a missing
file, a locked run directory, a run that diverged and could not recover); the CLI prints its
message alone. Every other exception (a CUDA out-of-memory, a shape mismatch, a bug) keeps its
traceback, because that stack is what a developer needs.
"""

from __future__ import annotations


class ChessGRPOError(Exception):
    """An expected error with a message that says what was wrong and what to do."""


class RunLocked(ChessGRPOError):
    """Another live process holds the run directory's lock."""


class TrainingDiverged(ChessGRPOError):
    """Training produced non-finite values and the divergence policy could not recover."""


class CheckpointError(ChessGRPOError):
    """No intact checkpoint could be found or loaded."""
