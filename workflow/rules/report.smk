rule tables:
    input:
        evals=JOBS.eval_targets(),
        loglik=JOBS.loglik_targets(),
    output:
        md=JOBS.table_targets("md"),
        tex=JOBS.table_targets("tex"),
        csv=JOBS.table_targets("csv"),
        html=[reported([f], "Tables", f"table_{Path(f).stem.split('_')[0]}.rst", table=Path(f).stem)[0]
              for f in JOBS.table_targets("html")],
        cells=JOBS.table_targets(paths.CELLS_EXT),
    params:
        settings=JOBS.report_settings(),
        out_dir=output_parent,
    resources:
        **resources("cpu"),
    conda:
        CPU_ENV
    log:
        log_of("tables"),
    benchmark:
        bench_of("tables")
    shell:
        "python -m softtokens tables --settings {params.settings:q} --out-dir {params.out_dir} {input.evals} {input.loglik} > {log} 2>&1"


rule figures:
    input:
        metrics=JOBS.metrics_targets(),
        evals=JOBS.eval_targets(),
    output:
        figures=[reported_figure(f) for f in JOBS.figure_targets()],
        pdfs=JOBS.figure_targets("pdf"),
    params:
        settings=JOBS.report_settings(),
        out_dir=output_parent,
    resources:
        **resources("cpu"),
    conda:
        CPU_ENV
    log:
        log_of("figures"),
    benchmark:
        bench_of("figures")
    shell:
        "python -m softtokens figures --settings {params.settings:q} --out-dir {params.out_dir} --metrics {input.metrics} --evals {input.evals} > {log} 2>&1"


REPORT = JOBS.report_files()


rule reproduction_report:
    input:
        evals=JOBS.eval_targets(),
        loglik=JOBS.loglik_targets(),
        variants=lambda w: JOBS.variant_evals_present(),
        # after every other job, so that the ledger holds their benchmark files
        tables=rules.tables.output.md,
        figures=rules.figures.output.figures,
        selected=JOBS.selected_targets(),
    output:
        md=REPORT["reproduction.md"],
        html=report(REPORT["reproduction.html"], category="Reproduction report", caption="../report/reproduction.rst"),
        cells=REPORT["cells.csv"],
        ledger=REPORT["ledger.csv"],
        ledger_html=report(REPORT["ledger.html"], category="Cost ledger", caption="../report/ledger.rst"),
        ledger_cells=REPORT["ledger_cells.csv"],
        ledger_tables=REPORT["ledger_tables.csv"],
        ledger_tables_html=report(REPORT["ledger_tables.html"], category="Cost ledger",
                                  caption="../report/ledger_tables.rst"),
        claims=REPORT["claims.json"],
    params:
        settings=JOBS.reproduction_settings(),
        bench_dir=f"{RESULTS}/benchmarks",
        out_dir=output_parent,
    resources:
        **resources("cpu"),
    conda:
        CPU_ENV
    log:
        log_of("reproduction_report"),
    benchmark:
        bench_of("reproduction_report")
    shell:
        "python -m softtokens report --settings {params.settings:q} --bench-dir {params.bench_dir} --out-dir {params.out_dir} {input.evals} {input.variants} {input.loglik} > {log} 2>&1"


rule ablation_tables:
    """The appendix ablations (noise factor, temperature, noise placement): one table and one
    greedy-validation figure each; default rows are the reused grid's runs when they exist."""
    input:
        evals=lambda w: JOBS.ablation_evals(),
        metrics=lambda w: JOBS.ablation_metrics(),
    output:
        tables=reported(JOBS.ablation_targets("tables"), "Ablation tables", "table_ablation.rst"),
        figures=reported(JOBS.ablation_targets("figures"), "Ablation figures", "figure_ablation.rst"),
    params:
        settings=JOBS.ablation_settings() if JOBS.ablations else "",
        tables_dir=f"{RESULTS}/tables",
        figures_dir=f"{RESULTS}/figures",
    resources:
        **resources("cpu"),
    conda:
        CPU_ENV
    log:
        log_of("ablation_tables"),
    benchmark:
        bench_of("ablation_tables")
    shell:
        "python -m softtokens ablations --settings {params.settings:q} --tables-dir {params.tables_dir} --figures-dir {params.figures_dir} --metrics {input.metrics} --evals {input.evals} > {log} 2>&1"
