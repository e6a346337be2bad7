# Each table and each figure is a job of its own that reads only the files its cells need, so that
# `snakemake TABLE` plans only what that table rests on (grid.targets.table_inputs / figure_inputs).


rule main_table:
    """Table 1's shape: hard inference on every math benchmark."""
    input:
        evals=JOBS.table_inputs(paths.MAIN_TABLE),
    output:
        **table_outputs(paths.MAIN_TABLE, "table_main.rst"),
    params:
        settings=verbatim(JOBS.report_settings()),
        out_dir=output_parent,
    resources:
        **resources("cpu"),
    conda:
        CPU_ENV
    log:
        log_of("tables", paths.MAIN_TABLE),
    benchmark:
        bench_of("tables", paths.MAIN_TABLE)
    shell:
        "python -m softtokens tables --table main --settings {params.settings:q} --out-dir {params.out_dir} {input.evals} > {log} 2>&1"


rule settings_table:
    """The appendix tables' shape: one benchmark under every inference setting."""
    input:
        evals=lambda w: JOBS.table_inputs(paths.settings_table(w.benchmark)),
    output:
        **table_outputs(paths.settings_table("{benchmark}"), "table_settings.rst"),
    params:
        settings=verbatim(JOBS.report_settings()),
        out_dir=output_parent,
        table=lambda w: paths.settings_table(w.benchmark),
    wildcard_constraints:
        benchmark=alternation(EVAL["benchmarks"]),
    resources:
        **resources("cpu"),
    conda:
        CPU_ENV
    log:
        log_of("tables", paths.settings_table("{benchmark}")),
    benchmark:
        bench_of("tables", paths.settings_table("{benchmark}"))
    shell:
        "python -m softtokens tables --table {params.table} --settings {params.settings:q} --out-dir {params.out_dir} {input.evals} > {log} 2>&1"


rule ood_table:
    """The out-of-domain table: accuracy and NLL of the correct answer."""
    input:
        evals=JOBS.table_inputs(paths.OOD_TABLE) if JOBS.ood else [],
    output:
        **table_outputs(paths.OOD_TABLE, "table_ood.rst"),
    params:
        settings=verbatim(JOBS.report_settings()),
        out_dir=output_parent,
    resources:
        **resources("cpu"),
    conda:
        CPU_ENV
    log:
        log_of("tables", paths.OOD_TABLE),
    benchmark:
        bench_of("tables", paths.OOD_TABLE)
    shell:
        "python -m softtokens tables --table ood --settings {params.settings:q} --out-dir {params.out_dir} {input.evals} > {log} 2>&1"


rule training_figure:
    """Training curves of one model on one training set (every mode and seed)."""
    input:
        metrics=lambda w: JOBS.figures.inputs(f"training_{w.figure}")["metrics"],
    output:
        png=figure_output("training"),
        pdf=update(paths.figure_path(RESULTS, "training_{figure}", "pdf")),
    params:
        settings=lambda w: JOBS.figure_settings(f"training_{w.figure}"),
        out_dir=output_parent,
    wildcard_constraints:
        figure=alternation(JOBS.figures.keys("training")),
    resources:
        **resources("cpu"),
    conda:
        CPU_ENV
    log:
        log_of("figures", "training_{figure}"),
    benchmark:
        bench_of("figures", "training_{figure}")
    shell:
        "python -m softtokens figures --settings {params.settings:q} --out-dir {params.out_dir} --metrics {input.metrics} > {log} 2>&1"


rule passk_figure:
    """pass@k of one model's runs on one training set and its base, on one benchmark."""
    input:
        evals=lambda w: JOBS.figures.inputs(f"passk_{w.figure}")["evals"],
    output:
        png=figure_output("passk"),
        pdf=update(paths.figure_path(RESULTS, "passk_{figure}", "pdf")),
    params:
        settings=lambda w: JOBS.figure_settings(f"passk_{w.figure}"),
        out_dir=output_parent,
    wildcard_constraints:
        figure=alternation(JOBS.figures.keys("passk")),
    resources:
        **resources("cpu"),
    conda:
        CPU_ENV
    log:
        log_of("figures", "passk_{figure}"),
    benchmark:
        bench_of("figures", "passk_{figure}")
    shell:
        "python -m softtokens figures --settings {params.settings:q} --out-dir {params.out_dir} --evals {input.evals} > {log} 2>&1"


rule hard_passk_figure:
    """The paper's Figure 3: hard inference pass@k of every Llama (model, training set) on every benchmark."""
    input:
        evals=lambda w: JOBS.figures.inputs(f"{paths.FIG3_KIND}_{w.figure}")["evals"],
    output:
        png=figure_output(paths.FIG3_KIND),
        pdf=update(paths.figure_path(RESULTS, f"{paths.FIG3_KIND}_{{figure}}", "pdf")),
    params:
        settings=lambda w: JOBS.figure_settings(f"{paths.FIG3_KIND}_{w.figure}"),
        out_dir=output_parent,
    wildcard_constraints:
        figure=alternation(JOBS.figures.keys(paths.FIG3_KIND)),
    resources:
        **resources("cpu"),
    conda:
        CPU_ENV
    log:
        log_of("figures", f"{paths.FIG3_KIND}_{{figure}}"),
    benchmark:
        bench_of("figures", f"{paths.FIG3_KIND}_{{figure}}")
    shell:
        "python -m softtokens figures --settings {params.settings:q} --out-dir {params.out_dir} --evals {input.evals} > {log} 2>&1"


rule entropy_figure:
    """CoT entropy by position of one model's runs on one training set and its base, on one benchmark."""
    input:
        evals=lambda w: JOBS.figures.inputs(f"entropy_{w.figure}")["evals"],
    output:
        png=figure_output("entropy"),
        pdf=update(paths.figure_path(RESULTS, "entropy_{figure}", "pdf")),
    params:
        settings=lambda w: JOBS.figure_settings(f"entropy_{w.figure}"),
        out_dir=output_parent,
    wildcard_constraints:
        figure=alternation(JOBS.figures.keys("entropy")),
    resources:
        **resources("cpu"),
    conda:
        CPU_ENV
    log:
        log_of("figures", "entropy_{figure}"),
    benchmark:
        bench_of("figures", "entropy_{figure}")
    shell:
        "python -m softtokens figures --settings {params.settings:q} --out-dir {params.out_dir} --evals {input.evals} > {log} 2>&1"


REPORT = JOBS.report_files()
PAPER_CLAIMS = paths.report_path(RESULTS, paths.PAPER_CLAIMS)


rule paper_claims:
    """The paper's claims judged on its own numbers (softtokens.robustness.paper_verdicts): it reads none of this grid's
    results, so it runs beside the grid's first jobs."""
    input:
        paper=JOBS.paper_results().values(),
    output:
        claims=PAPER_CLAIMS,
    params:
        settings=verbatim(JOBS.paper_claims_settings()),
    resources:
        **resources("cpu"),
    conda:
        CPU_ENV
    log:
        log_of("paper_claims"),
    benchmark:
        bench_of("paper_claims")
    shell:
        "python -m softtokens judge-paper --settings {params.settings:q} --out {output.claims} > {log} 2>&1"


rule reproduction_report:
    input:
        evals=JOBS.eval_targets(),
        loglik=JOBS.loglik_targets(),
        variants=lambda w: JOBS.variant_evals_present(),
        # after every other job, so that the ledger holds their benchmark files
        tables=JOBS.table_targets("md"),
        figures=JOBS.figures.files(),
        selected=JOBS.selected_targets(),
        paper=JOBS.paper_results().values(),
        paper_claims=PAPER_CLAIMS,
        # the search's summary: this grid's sweep, or the sweeps grid's beside these results once it exists
        sweeps=lambda w: JOBS.sweep.summary_present(),
        # what `softtokens audit --rerun` found, where it was run: a leaf of the report, by its hash
        reruns=lambda w: JOBS.reruns_present(),
    output:
        # kept (update): a report job that refuses its inputs (audit.inputs) leaves the previous report
        md=update(REPORT["reproduction.md"]),
        html=update(report(REPORT["reproduction.html"], category="Reproduction report",
                           caption="../report/reproduction.rst")),
        cells=update(REPORT["cells.csv"]),
        ledger=update(REPORT["ledger.csv"]),
        ledger_html=update(report(REPORT["ledger.html"], category="Cost ledger", caption="../report/ledger.rst")),
        ledger_cells=update(REPORT["ledger_cells.csv"]),
        ledger_tables=update(REPORT["ledger_tables.csv"]),
        ledger_tables_html=update(report(REPORT["ledger_tables.html"], category="Cost ledger",
                                         caption="../report/ledger_tables.rst")),
        claims=update(REPORT["claims.json"]),
    params:
        settings=verbatim(JOBS.reproduction_settings()),
        bench_dir=f"{RESULTS}/benchmarks",
        out_dir=output_parent,
        sweeps=lambda w, input: f"--sweeps {input.sweeps}" if input.sweeps else "",
        reruns=lambda w, input: f"--reruns {input.reruns}" if input.reruns else "",
        paper_claims=lambda w, input: f"--paper-claims {input.paper_claims}",
    resources:
        **resources("cpu"),
    conda:
        CPU_ENV
    log:
        log_of("reproduction_report"),
    benchmark:
        bench_of("reproduction_report")
    shell:
        "python -m softtokens report --settings {params.settings:q} --bench-dir {params.bench_dir} --out-dir {params.out_dir} {params.sweeps} {params.reruns} {params.paper_claims} --tables {input.tables} -- {input.evals} {input.variants} {input.loglik} > {log} 2>&1"


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
        settings=verbatim(JOBS.ablation_settings() if JOBS.ablations else ""),
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
