"""The paper's hyperparameter search re-derived (Appendix D): which value each search selects, and whether
that selection is a finding or noise. The search's runs are a grid's (config.sweeps expands them); its table,
figure and report section are what a reader sees (report.sweeps)."""
