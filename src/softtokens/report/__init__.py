"""What a reader sees: the tables and figures in the paper's shapes, the ablation tables, the reproduction
report (the verdicts of verdict/, every paper cell beside ours, the bill of cost/) and the numbers the
docs generate from the code (``doc_blocks``)."""
