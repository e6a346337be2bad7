"""The numbers every verdict and every table is made of, as cells: the paper's published results
(``paper``: loading and checking ``paper_results.csv``), our evaluation files read back (``results``) and
aggregated over seeds (``ours``), one cell's standard error (``spread``), and lookups over cells
(``lookup``).

Why below the verdict, the audit and the report: all three read the same cells; a table, its audit and
the judge must not compute a number three ways."""
