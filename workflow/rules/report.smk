rule tables:
    input:
        evals=eval_targets(),
        loglik=loglik_targets(),
    output:
        main=report(f"{RESULTS}/tables/main.md", category="Tables", labels={"table": "main (hard inference)"}),
        main_tex=f"{RESULTS}/tables/main.tex",
        main_csv=f"{RESULTS}/tables/main.csv",
        settings=settings_table_targets(),
        ood=ood_table_targets(),
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
        f"{RESULTS}/benchmarks/report/tables.tsv"
    shell:
        "python -m softtokens tables --settings {params.settings:q} --out-dir {params.out_dir} {input.evals} {input.loglik} > {log} 2>&1"


rule figures:
    input:
        metrics=metrics_targets(),
        evals=eval_targets(),
    output:
        figures=[report(f, category="Figures") for f in figure_targets()],
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
        f"{RESULTS}/benchmarks/report/figures.tsv"
    shell:
        "python -m softtokens figures --settings {params.settings:q} --out-dir {params.out_dir} --metrics {input.metrics} --evals {input.evals} > {log} 2>&1"
