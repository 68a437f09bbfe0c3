"""Readers of run directories: diagnosis and reports (the top of the library; the spine never imports them).

- `run_data`: a run directory read back (config, rows, evaluation files), also while it runs;
- `diagnose`: pure checks over a run that say why it is not learning (`chessgrpo diagnose`; a package: the
  checks by kind, `findings`, `changes`);
- `plots` (`plot_series`, `plots_training`, `plots_evaluation`), `figures` (`figure_panels`, `panel_drawing`)
  and `report` (`report_sections`, `report_provenance`, `report_verdict`): the figures (each figure's function;
  their backend-neutral description and its plotly and matplotlib drawings) and the self-contained HTML report
  (`chessgrpo report`).

The writers they read (metrics.jsonl and the TensorBoard / W&B mirrors) belong to the spine:
`chessgrpo.train.metrics` and `chessgrpo.train.backends`.
Heavy modules (matplotlib, plotly) are imported only by the functions that need them.
"""
