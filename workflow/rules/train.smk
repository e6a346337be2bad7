rule train:
    input:
        base=base_model_input,
        train=f"{RESULTS}/data/{{dataset}}/train.jsonl",
        validation=f"{RESULTS}/data/{{dataset}}/validation.jsonl",
    output:
        # update(): Snakemake keeps these while the job runs and puts them back if it fails, so a
        # forced retrain that fails leaves the previous run (and what rests on it) whole (docs/reliability.md)
        metrics=update(f"{RUN}/metrics.jsonl"),
        checkpoints=update(directory(f"{RUN}/checkpoints")),
    params:
        expect=train_expect,
        settings=train_settings,
        base=base_model_arg,
        # resume state: not a declared output, so Snakemake keeps it when a job fails
        state_dir=f"{RUN}/_resume",
        launcher=train_launcher,
        # every attempt's output (Snakemake clears {log} before a retry): undeclared, so it survives a
        # failed attempt; moved into {log} when the run succeeds. tee ignores the stop signals, so
        # that it records what training prints while it saves its state on SIGTERM / SIGUSR1
        attempts_log=f"{RESULTS}/logs/train/{{model}}/{{dataset}}/{{arm}}/seed{{seed}}.attempts.log",
    threads: job_threads("train")
    resources:
        **job_resources("train"),
    conda:
        GPU_RULE_ENV
    log:
        f"{RESULTS}/logs/train/{{model}}/{{dataset}}/{{arm}}/seed{{seed}}.log",
    benchmark:
        f"{RESULTS}/benchmarks/train/{{model}}/{{dataset}}/{{arm}}/seed{{seed}}.tsv"
    shell:
        "{params.launcher} -m softtokens train --settings {params.settings:q} {params.expect} --base {params.base} --train {input.train} --validation {input.validation} --state-dir {params.state_dir} --checkpoints {output.checkpoints} --metrics {output.metrics} --threads {threads} 2>&1 | (trap '' TERM INT USR1; tee -a {params.attempts_log} > {log}); mv {params.attempts_log} {log}"
