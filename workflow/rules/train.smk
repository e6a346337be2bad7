rule train:
    input:
        base=base_model_input,
        train=f"{RESULTS}/data/{{dataset}}/train.jsonl",
        validation=f"{RESULTS}/data/{{dataset}}/validation.jsonl",
    output:
        metrics=f"{RESULTS}/runs/{{model}}/{{dataset}}/{{mode}}/seed{{seed}}/metrics.jsonl",
        checkpoints=directory(f"{RESULTS}/runs/{{model}}/{{dataset}}/{{mode}}/seed{{seed}}/checkpoints"),
    params:
        settings=train_settings,
        base=base_model_arg,
        # resume state: not a declared output, so Snakemake keeps it when a job fails
        state_dir=f"{RESULTS}/runs/{{model}}/{{dataset}}/{{mode}}/seed{{seed}}/_resume",
        launcher=train_launcher,
    resources:
        **job_resources("train"),
    conda:
        "../../envs/softtokens.yaml"
    log:
        f"{RESULTS}/logs/train/{{model}}/{{dataset}}/{{mode}}/seed{{seed}}.log",
    benchmark:
        f"{RESULTS}/benchmarks/train/{{model}}/{{dataset}}/{{mode}}/seed{{seed}}.tsv"
    shell:
        "{params.launcher} -m softtokens train --settings {params.settings:q} --base {params.base} --train {input.train} --validation {input.validation} --state-dir {params.state_dir} --checkpoints {output.checkpoints} --metrics {output.metrics} --threads {threads} > {log} 2>&1"
