# One job per (model, benchmark, inference setting) and one per (model, out-of-domain set): parallel GPU jobs
# (evaluation.one_job_per_setting: true, the default and the paper grid's).


rule evaluate:
    input:
        model=eval_model_input,
        data=paths.data_path(RESULTS, "{benchmark}", "test"),
    output:
        # kept, and put back if the job fails
        result=update(paths.eval_pattern(RESULTS)),
    params:
        expect=eval_expect,
        settings=lambda w: JOBS.eval_settings(w.model, w.trained),
        model_arg=eval_model_arg,
    threads: threads("evaluate")
    resources:
        **resources("evaluate"),
    conda:
        GPU_RULE_ENV
    priority: PRIORITY["evaluate"]
    log:
        log_of("evaluate", paths.eval_job("{setting}")),
    benchmark:
        bench_of("evaluate", paths.eval_job("{setting}"))
    shell:
        "python -m softtokens evaluate --settings {params.settings:q} {params.expect} --setting {wildcards.setting} {params.model_arg} --model-name {wildcards.model} --benchmark {wildcards.benchmark} --data {input.data} --out {output.result} --threads {threads} > {log} 2>&1 || python -m softtokens exit-note $? --job 'evaluate {wildcards}' --mem-mb {resources.mem_mb} --log {log}"


rule evaluate_loglik:
    """Out-of-domain multiple choice: accuracy and NLL of the correct answer (softtokens.eval.ood)."""
    input:
        model=eval_model_input,
        data=paths.data_path(RESULTS, "{benchmark}", "test"),
    output:
        result=update(paths.loglik_pattern(RESULTS)),
    params:
        expect=eval_expect,
        settings=verbatim(JOBS.loglik_settings()),
        model_arg=eval_model_arg,
    threads: threads("evaluate_loglik")
    resources:
        **resources("evaluate_loglik"),
    conda:
        GPU_RULE_ENV
    priority: PRIORITY["evaluate_loglik"]
    log:
        log_of("evaluate_loglik", EVAL_JOB),
    benchmark:
        bench_of("evaluate_loglik", EVAL_JOB)
    shell:
        "python -m softtokens evaluate-loglik --settings {params.settings:q} {params.expect} {params.model_arg} --model-name {wildcards.model} --benchmark {wildcards.benchmark} --data {input.data} --out {output.result} --threads {threads} > {log} 2>&1 || python -m softtokens exit-note $? --job 'evaluate_loglik {wildcards}' --mem-mb {resources.mem_mb} --log {log}"
