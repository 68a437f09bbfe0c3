"""Tasks: what a group is and how it is rewarded (they own no optimizer).

- `move_group`: G moves sampled from one position, each valued by the engine for the mover.
- `trajectory`: G multi-ply trajectories from one position against an opponent (self-play,
  reference, Stockfish, tablebase defender); outcome or process supervision.
- `endgame`: tablebase rewards and metrics for the KQvK/KRvK/... curriculum.
- `rookworld`: the RookWorld text tasks (P: policy, A: environment), parsers and rewards.
"""
