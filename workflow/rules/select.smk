rule select_checkpoint:
    input:
        metrics=f"{RESULTS}/runs/{{model}}/{{dataset}}/{{mode}}/seed{{seed}}/metrics.jsonl",
        checkpoints=f"{RESULTS}/runs/{{model}}/{{dataset}}/{{mode}}/seed{{seed}}/checkpoints",
    output:
        selected=f"{RESULTS}/runs/{{model}}/{{dataset}}/{{mode}}/seed{{seed}}/selected.json",
    resources:
        **job_resources("cpu"),
    conda:
        "../../envs/softtokens.yaml"
    log:
        f"{RESULTS}/logs/select/{{model}}/{{dataset}}/{{mode}}/seed{{seed}}.log",
    benchmark:
        f"{RESULTS}/benchmarks/select/{{model}}/{{dataset}}/{{mode}}/seed{{seed}}.tsv"
    shell:
        "python -m softtokens select --metrics {input.metrics} --checkpoints {input.checkpoints} --out {output.selected} > {log} 2>&1"
