"""Games against anchors as an evaluation of the registry: `run_games` plays the match of `chessgrpo eval games`.

The match itself (anchors, openings, journal and resume, SPRT, PGN, the summary) is `play.match.play_match`; this
runner hands it the subject's checkpoint and the caller's progress bar and notes, and returns its summary as a
`GamesRun`, whose result file `eval.registry.write_result` writes (``output=FILE``: the config, then the summary
with its per-pair records for `eval compare`).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from chessgrpo.errors import InputError
from chessgrpo.eval.running import EvalContext, Subject
from chessgrpo.play.match import GamesConfig, play_match


@dataclasses.dataclass
class GamesRun:
    """One match: the config it was played with and `play_match`'s summary."""

    config: GamesConfig
    summary: dict[str, Any]

    def to_json(self) -> dict[str, Any]:
        return self.summary

    def metrics(self, prefix: str = "eval/") -> dict[str, float]:
        """None: a match is read back from its summary (`track.run_data.read_games`), not from metric rows."""
        return {}


def run_games(config: GamesConfig, subject: Subject, context: EvalContext) -> GamesRun:
    """The registry's runner of ``games``: the subject's checkpoint plays the match `config` describes.

    The result file (``output``) is written through `eval.registry.write_result` before the match removes its
    journal, so an interruption after the last game never loses the match (a rerun finds the file or the
    journal); the caller's own write of the same result afterwards changes nothing."""
    from chessgrpo.eval.registry import write_result

    if subject.checkpoint is None:
        raise InputError(f"eval games plays a checkpoint, not {subject.label!r}")

    def write_before_the_journal_goes(summary: dict[str, Any]) -> None:
        if config.output:
            write_result("games", GamesRun(config, summary), path=config.output)

    summary = play_match(
        dataclasses.replace(config, output=None),
        subject.checkpoint,
        progress=lambda total: context.progress(total, "games"),
        notify=context.notify,
        on_summary=write_before_the_journal_goes,
    )
    return GamesRun(config, summary)
