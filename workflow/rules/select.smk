rule select_checkpoint:
    input:
        metrics=f"{RUN}/metrics.jsonl",
        checkpoints=f"{RUN}/checkpoints",
    output:
        selected=f"{RUN}/selected.json",
    resources:
        **job_resources("cpu"),
    conda:
        "../../envs/softtokens.yaml"
    log:
        f"{RESULTS}/logs/select/{{model}}/{{dataset}}/{{arm}}/seed{{seed}}.log",
    benchmark:
        f"{RESULTS}/benchmarks/select/{{model}}/{{dataset}}/{{arm}}/seed{{seed}}.tsv"
    shell:
        "python -m softtokens select --metrics {input.metrics} --checkpoints {input.checkpoints} --out {output.selected} > {log} 2>&1"
