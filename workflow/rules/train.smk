rule train:
    input:
        base=lambda w: JOBS.base_model_input(w.model),
        train=rules.prepare_data.output.train,
        validation=rules.prepare_data.output.validation,
    output:
        # update(): Snakemake keeps these while the job runs and puts them back if it fails, so a
        # forced retrain that fails leaves the previous run (and what rests on it) whole (docs/reliability.md)
        metrics=update(f"{RUN}/{paths.METRICS}"),
        checkpoints=update(directory(f"{RUN}/{paths.CHECKPOINTS}")),
        # TensorBoard event files (train.telemetry); live in {state_dir}/tensorboard while it trains
        tensorboard=update(directory(f"{RUN}/{paths.TENSORBOARD}")),
    params:
        expect=lambda w: JOBS.train_expect(w.model, w.dataset),
        settings=lambda w: JOBS.train_settings(w.model, w.dataset, w.arm, w.seed),
        base=lambda w: JOBS.model_source(w.model),
        logging=verbatim(JOBS.logging_settings()),
        # resume state: not a declared output, so Snakemake keeps it when a job fails
        state_dir=f"{RUN}/{paths.RESUME}",
        processes=processes,
        # every attempt's output (Snakemake clears {log} before a retry): undeclared, so it survives a
        # failed attempt; moved into {log} when the run succeeds. tee ignores the stop signals, so
        # that it records what training prints while it saves its state on SIGTERM / SIGUSR1
        attempts_log=log_of("train", RUN_JOB + ".attempts"),
    threads: threads("train")
    resources:
        **resources("train"),
    conda:
        GPU_RULE_ENV
    priority: PRIORITY["train"]
    log:
        log_of("train", RUN_JOB),
    benchmark:
        bench_of("train", RUN_JOB)
    shell:
        "python -m softtokens train --processes {params.processes} --settings {params.settings:q} {params.expect} --base {params.base} --train {input.train} --validation {input.validation} --state-dir {params.state_dir} --checkpoints {output.checkpoints} --metrics {output.metrics} --tensorboard {output.tensorboard} --logging {params.logging:q} --threads {threads} 2>&1 | (trap '' TERM INT USR1; tee -a {params.attempts_log} > {log}) || python -m softtokens exit-note $? --job 'train {wildcards}' --mem-mb {resources.mem_mb} --log {log} --log {params.attempts_log}; mv {params.attempts_log} {log}"
