"""What a reader sees: the tables and figures in the paper's shapes, the ablation tables, the
reproduction report beside the paper's own numbers with its claim checks, the cost ledger, and
the audit of a table cell back to its data."""
