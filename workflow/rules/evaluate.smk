# One job per (model, benchmark, inference setting) for parallel GPU jobs; with
# `evaluation.one_job_per_setting: false` (a CPU grid, where start-up is most of a job) one job
# writes a model's files for every setting.
ONE_JOB_PER_SETTING = EVAL["one_job_per_setting"]
EVAL_SETTINGS = ["{setting}"] if ONE_JOB_PER_SETTING else EVAL["settings"]
EVALUATE_JOB = paths.eval_job("{setting}" if ONE_JOB_PER_SETTING else ALL_SETTINGS)


rule evaluate:
    input:
        model=eval_model_input,
        data=paths.data_path(RESULTS, "{benchmark}", "test"),
    output:
        # kept, and put back if the job fails
        results=[update(p) for p in expand(paths.eval_pattern(RESULTS), setting=EVAL_SETTINGS, allow_missing=True)],
    params:
        expect=eval_expect,
        settings=lambda w: JOBS.eval_settings(w.model, w.trained),
        model_arg=eval_model_arg,
        names=lambda w: w.setting if ONE_JOB_PER_SETTING else " ".join(EVAL["settings"]),
    threads: threads("evaluate")
    resources:
        **resources("evaluate"),
    conda:
        GPU_RULE_ENV
    log:
        log_of("evaluate", EVALUATE_JOB),
    benchmark:
        bench_of("evaluate", EVALUATE_JOB)
    shell:
        "python -m softtokens evaluate --settings {params.settings:q} {params.expect} --setting {params.names} {params.model_arg} --data {input.data} --out {output.results} --threads {threads} > {log} 2>&1 || python -m softtokens exit-note $? --job 'evaluate {wildcards}' --mem-mb {resources.mem_mb} --log {log}"


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
    log:
        log_of("evaluate_loglik", EVAL_JOB),
    benchmark:
        bench_of("evaluate_loglik", EVAL_JOB)
    shell:
        "python -m softtokens evaluate-loglik --settings {params.settings:q} {params.expect} {params.model_arg} --data {input.data} --out {output.result} --threads {threads} > {log} 2>&1 || python -m softtokens exit-note $? --job 'evaluate_loglik {wildcards}' --mem-mb {resources.mem_mb} --log {log}"
