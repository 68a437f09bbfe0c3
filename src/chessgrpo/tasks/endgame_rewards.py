"""The exact per-ply endgame reward of the trajectory task, and its regret form.

Values come from the Syzygy tables (`engine.tablebase.Tablebase.state` ->
`engine.tablebase_values.TablebaseState`: score s and distance d in plies, for a stated colour).
The reward of one own ply (the mover's move and the opponent's reply), from the mover's point of
view, with s and d before (P_t) and after (P_t+1) the ply:

    r_t = 2 (s_t+1 - s_t)                     -1 for giving away a win (win -> draw), -2 for win -> loss
        + 1 [the mover delivered mate]        "mate = 1"
        - 1 [the mover was mated]
        + shaping * (prog_t+1 - prog_t)       only when the score did not change
    prog = -d / 2 when winning (fewer own moves to mate is better), +d / 2 when losing (a longer
           loss is better), 0 in a draw; a mated position has d = 0.

For the strong side of KQvK against the perfect defender this is: +1 + shaping * d_t / 2 for the
mating move, -1 for a move that lets the win slip (stalemate, a hung queen), and otherwise
shaping * (d_t - d_t+1) / 2: +shaping for a DTZ-optimal move (the perfect defender lengthens by
one ply, the optimal move shortens by one more), 0 for a waiting move, negative for a regression.
The progress term is a potential difference (Ng et al. 1999), so it sums to
shaping * (d_0 - d_end) / 2 over a trajectory and cannot change which policies are optimal.

Regret form (`best_step_reward`): r_t - r*_t, with r*_t the largest reward any move of P_t earns
against the perfect defender (1 + shaping / 2 when mate in one is on the board, else shaping).
A DTZ-optimal move scores 0, a waiting move -shaping, a regression less, giving the win away
-1 - shaping. After the first ply the rows of a trajectory group stand in different positions;
their raw rewards are on different scales (a mate in one pays 1.1, a quiet optimal move 0.2),
so a group baseline over raw rewards would compare unlike things. Regret puts every ply on the
same scale: the tablebase acts as an exact per-position baseline.
"""

from __future__ import annotations

from chessgrpo.engine.tablebase_values import TablebaseState

MATE_REWARD = 1.0
"""Reward for delivering mate ("mate = 1"); being mated costs the same."""


def step_reward(before: TablebaseState, after: TablebaseState, shaping: float) -> float:
    """The reward of one own ply from `before` to `after` (both for the mover; module docstring)."""
    reward = 2.0 * (after.score - before.score)
    if after.delivered_mate:
        reward += MATE_REWARD
    if after.mated:
        reward -= MATE_REWARD
    if after.score == before.score:
        reward += shaping * (after.progress - before.progress)
    return reward


def best_step_reward(before: TablebaseState, shaping: float) -> float:
    """The largest `step_reward` a ply from `before` can earn when the opponent plays perfectly.

    Winning: mate in one is worth 1 + shaping / 2; otherwise the best is shaping (DTZ 2 plies
    shorter after the perfect reply). Losing: -shaping (the perfect opponent shortens the loss by
    one own move whatever is played). Drawn: 0. `step_reward - best_step_reward` is the move's
    exact regret (0 for a DTZ-optimal move, < 0 otherwise); see `TrajectoryConfig.regret`.
    """
    if before.terminal is not None:
        raise ValueError("no ply is played from a finished game")
    if before.score == 1.0:
        return MATE_REWARD + shaping * 0.5 if before.plies == 1 else shaping
    if before.score == 0.0:
        return -shaping
    return 0.0
