# The paper's hyperparameter search (Appendix D): a grid's `sweep:` section is expanded into training runs
# in Python (softtokens.config.sweeps); this rule reads their selections back into a table and figure per model
# and the summary the reproduction report reads (softtokens.report.sweeps).


rule sweep_tables:
    """Per swept model: greedy validation against the swept value, the value selected beside the paper's."""
    input:
        selected=JOBS.sweep.inputs(paths.SELECTED),
    output:
        tables=reported(JOBS.sweep.files("tables"), "Hyperparameter search", "table_sweep.rst"),
        figures=reported(JOBS.sweep.files("figures"), "Hyperparameter search", "figure_sweep.rst"),
        summary=[update(p) for p in JOBS.sweep.files("summary")],
    params:
        settings=verbatim(JOBS.sweep.settings() if JOBS.sweep.runs else ""),
        tables_dir=lambda w, output: Path(output.tables[0]).parent,
        figures_dir=lambda w, output: Path(output.figures[0]).parent,
    resources:
        **resources("cpu"),
    conda:
        CPU_ENV
    log:
        log_of("sweep_tables"),
    benchmark:
        bench_of("sweep_tables")
    shell:
        "python -m softtokens sweeps --settings {params.settings:q} --tables-dir {params.tables_dir} --figures-dir {params.figures_dir} --summary {output.summary} {input.selected} > {log} 2>&1"
