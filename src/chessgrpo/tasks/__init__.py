"""Tasks: what a group is and how it is rewarded (they own no optimizer).

- `move_group`: G moves sampled from one position, each valued by the engine for the mover.
- `trajectory`: G multi-ply trajectories from one position against an opponent (self-play,
  reference, Stockfish, tablebase defender); outcome or process supervision.
- `endgame`: tablebase rewards and metrics for the KQvK/KRvK/... curriculum.
- `lm_rollout`: GRPO on text: groups of sampled LM completions, their rollout rows and learner forward;
  `rookworld_trl`: the RookWorld rewards as TRL reward functions (format in `data.rookworld_format`,
  graders in `data.rookworld_grading`); `lm_rewards`: the LM's registered rewards.
- `reward_registry`: the registry type every family's rewards share (`RegisteredReward`: a function and what it
  needs), weights (`task.rewards`) and their combination; `user_rewards`: ``module:function`` rewards.
- `supervised`, `sft`: the losses of pretraining the action policy and of fine-tuning the chess LM.
- `kinds/`: the plug-ins of the training spine, one per kind of run (pretrain, sft, move_group,
  trajectory, rookworld), each with its config.
"""
