"""Tasks: what a group is and how it is rewarded (they own no optimizer).

- `move_group`: G moves sampled from one position, each valued by the engine for the mover.
"""
