"""The kinds of training run, each a plug-in of the training spine (`train.kind.Kind`).

pretrain, sft, move_group, trajectory and rookworld; the registry that maps a config's `kind:` to
one of them is `train.kinds`. Each module holds the kind's config (a `train.config.TrainConfig`
subclass) and its plug-in class; the task logic they call lives beside them in `tasks/`.
"""
