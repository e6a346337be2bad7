rule select_checkpoint:
    input:
        metrics=rules.train.output.metrics,
        checkpoints=rules.train.output.checkpoints,
    output:
        # kept (update): a selection that refuses a damaged checkpoint leaves the previous one
        selected=update(f"{RUN}/{paths.SELECTED}"),
    resources:
        **resources("cpu"),
    conda:
        CPU_ENV
    log:
        log_of("select", RUN_JOB),
    benchmark:
        bench_of("select", RUN_JOB)
    shell:
        "python -m softtokens select --metrics {input.metrics} --checkpoints {input.checkpoints} --out {output.selected} > {log} 2>&1"
