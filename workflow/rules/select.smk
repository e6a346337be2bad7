rule select_checkpoint:
    input:
        # the run's metrics and checkpoints; for a run that is another's name (same settings: grid.identity), that
        # run's selection, which it shares (softtokens.grid.jobs.select_inputs)
        unpack(lambda w: JOBS.names.select_inputs(w.model, w.dataset, w.arm, w.seed)),
    output:
        # kept (update): a selection that refuses a damaged checkpoint leaves the previous one
        selected=update(f"{RUN}/{paths.SELECTED}"),
    params:
        args=lambda w: JOBS.select_args(w.model, w.dataset, w.arm, w.seed),
    resources:
        **resources("cpu"),
    conda:
        CPU_ENV
    priority: PRIORITY["select_checkpoint"]
    log:
        log_of("select", RUN_JOB),
    benchmark:
        bench_of("select", RUN_JOB)
    shell:
        "python -m softtokens select {params.args} --out {output.selected} > {log} 2>&1"
