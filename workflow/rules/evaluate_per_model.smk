# One job per evaluated model (base or trained run), evaluation.one_job_per_setting: false (a CPU grid): its files
# of every inference setting on every benchmark and of every out-of-domain set, from one process (the start-up,
# imports and loading, paid once: on a 2-core host ~8 s a process, most of a toy evaluation).


rule evaluate:
    """A model on every benchmark under every inference setting, and on every out-of-domain set (softtokens.eval)."""
    input:
        model=eval_model_input,
        data=JOBS.model_eval_data(),
    output:
        # kept, and put back if the job fails
        results=[update(p) for p in JOBS.model_eval_outputs()],
    params:
        expect=lambda w: JOBS.model_eval_expect(w.model, w.trained),
        settings=lambda w: JOBS.eval_settings(w.model, w.trained),
        loglik=verbatim(JOBS.loglik_settings()),
        plan=lambda w: JOBS.model_eval_plan(w.model, w.trained),
        model_arg=eval_model_arg,
    threads: threads("evaluate")
    resources:
        **resources("evaluate"),
    conda:
        GPU_RULE_ENV
    priority: PRIORITY["evaluate"]
    log:
        log_of("evaluate", paths.model_eval_job()),
    benchmark:
        bench_of("evaluate", paths.model_eval_job())
    shell:
        "python -m softtokens evaluate-model --settings {params.settings:q} --loglik-settings {params.loglik:q} --plan {params.plan:q} {params.expect} {params.model_arg} --model-name {wildcards.model} --threads {threads} > {log} 2>&1 || python -m softtokens exit-note $? --job 'evaluate {wildcards}' --mem-mb {resources.mem_mb} --log {log}"
