rule tables:
    input:
        evals=eval_targets(),
        loglik=loglik_targets(),
    output:
        main=f"{RESULTS}/tables/main.md",
        main_tex=f"{RESULTS}/tables/main.tex",
        main_csv=report(f"{RESULTS}/tables/main.csv", category="Table 1 (main)", caption="../report/table_main.rst"),
        settings=[f for f in settings_table_targets() if not f.endswith(".csv")],
        settings_csv=reported_settings_tables(),
        ood=[f for f in ood_table_targets() if not f.endswith(".csv")],
        ood_csv=([report(f"{RESULTS}/tables/ood.csv", category="Out-of-domain table", caption="../report/table_ood.rst")]
                 if OOD else []),
        cells=[f"{RESULTS}/tables/{n}.cells.json"
               for n in ["main", *(f"settings_{b}" for b in EVAL["benchmarks"]), *(["ood"] if OOD else [])]],
    params:
        settings=report_settings,
        out_dir=output_parent,
    resources:
        **job_resources("cpu"),
    conda:
        "../../envs/softtokens.yaml"
    log:
        f"{RESULTS}/logs/report/tables.log",
    benchmark:
        f"{RESULTS}/benchmarks/tables.tsv"
    shell:
        "python -m softtokens tables --settings {params.settings:q} --out-dir {params.out_dir} {input.evals} {input.loglik} > {log} 2>&1"


rule figures:
    input:
        metrics=metrics_targets(),
        evals=eval_targets(),
    output:
        figures=reported_figures(),
        pdfs=figure_targets("pdf"),
    params:
        settings=report_settings,
        out_dir=output_parent,
    resources:
        **job_resources("cpu"),
    conda:
        "../../envs/softtokens.yaml"
    log:
        f"{RESULTS}/logs/report/figures.log",
    benchmark:
        f"{RESULTS}/benchmarks/figures.tsv"
    shell:
        "python -m softtokens figures --settings {params.settings:q} --out-dir {params.out_dir} --metrics {input.metrics} --evals {input.evals} > {log} 2>&1"


rule reproduction_report:
    input:
        evals=eval_targets(),
        loglik=loglik_targets(),
        variants=variant_evals_present,
        # after every other job, so that the ledger holds their benchmark files
        tables=f"{RESULTS}/tables/main.md",
        figures=figure_targets(),
        selected=selected_targets(),
    output:
        md=REPRODUCTION[0],
        html=report(REPRODUCTION[1], category="Reproduction report", caption="../report/reproduction.rst"),
        cells=REPRODUCTION[2],
        ledger=report(REPRODUCTION[3], category="Cost ledger", caption="../report/ledger.rst"),
        ledger_cells=REPRODUCTION[4],
        ledger_tables=report(REPRODUCTION[5], category="Cost ledger", caption="../report/ledger_tables.rst"),
        claims=REPRODUCTION[6],
    params:
        settings=reproduction_settings,
        bench_dir=f"{RESULTS}/benchmarks",
        out_dir=output_parent,
    resources:
        **job_resources("cpu"),
    conda:
        "../../envs/softtokens.yaml"
    log:
        f"{RESULTS}/logs/report/reproduction.log",
    benchmark:
        f"{RESULTS}/benchmarks/reproduction_report.tsv"
    shell:
        "python -m softtokens report --settings {params.settings:q} --bench-dir {params.bench_dir} --out-dir {params.out_dir} {input.evals} {input.variants} {input.loglik} > {log} 2>&1"


rule ablation_tables:
    """The appendix ablations (noise factor, temperature, noise placement): one table and one
    greedy-validation figure each; default rows are the reused grid's runs when they exist."""
    input:
        evals=ablation_evals,
        metrics=ablation_metrics,
    output:
        tables=[report(f, category="Ablation tables", caption="../report/table_ablation.rst")
                if f.endswith(".csv") else f for f in ablation_targets() if "/tables/" in f],
        figures=[report(f, category="Ablation figures", caption="../report/figure_ablation.rst")
                 if f.endswith(".png") else f for f in ablation_targets() if "/figures/" in f],
    params:
        settings=ablation_settings,
        tables_dir=f"{RESULTS}/tables",
        figures_dir=f"{RESULTS}/figures",
    resources:
        **job_resources("cpu"),
    conda:
        "../../envs/softtokens.yaml"
    log:
        f"{RESULTS}/logs/report/ablations.log",
    benchmark:
        f"{RESULTS}/benchmarks/ablation_tables.tsv"
    shell:
        "python -m softtokens ablations --settings {params.settings:q} --tables-dir {params.tables_dir} --figures-dir {params.figures_dir} --metrics {input.metrics} --evals {input.evals} > {log} 2>&1"
