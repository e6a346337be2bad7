if EVAL.get("one_job_per_setting", True):

    rule evaluate:
        input:
            model=eval_model_input,
            data=f"{RESULTS}/data/{{benchmark}}/test.jsonl",
        output:
            result=update(paths.eval_pattern(RESULTS)),  # kept, and put back if the job fails
        params:
            expect=eval_expect,
            settings=eval_settings,
            model_arg=eval_model_arg,
        threads: job_threads("evaluate")
        resources:
            **job_resources("evaluate"),
        conda:
            GPU_RULE_ENV
        log:
            f"{RESULTS}/logs/evaluate/{{model}}/{{trained}}/{{benchmark}}/{{setting}}.log",
        benchmark:
            f"{RESULTS}/benchmarks/evaluate/{{model}}/{{trained}}/{{benchmark}}/{{setting}}.tsv"
        shell:
            "python -m softtokens evaluate --settings {params.settings:q} {params.expect} --setting {wildcards.setting} {params.model_arg} --data {input.data} --out {output.result} --threads {threads} > {log} 2>&1"

else:  # one job writes a model's files for every setting (a CPU grid: the start-up is most of a job)

    rule evaluate:
        input:
            model=eval_model_input,
            data=f"{RESULTS}/data/{{benchmark}}/test.jsonl",
        output:
            results=[update(p) for p in expand(paths.eval_pattern(RESULTS), setting=EVAL["settings"], allow_missing=True)],
        params:
            expect=eval_expect,
            settings=eval_settings,
            model_arg=eval_model_arg,
            names=" ".join(EVAL["settings"]),
        threads: job_threads("evaluate")
        resources:
            **job_resources("evaluate"),
        conda:
            GPU_RULE_ENV
        log:
            f"{RESULTS}/logs/evaluate/{{model}}/{{trained}}/{{benchmark}}/all_settings.log",
        benchmark:
            f"{RESULTS}/benchmarks/evaluate/{{model}}/{{trained}}/{{benchmark}}/all_settings.tsv"
        shell:
            "python -m softtokens evaluate --settings {params.settings:q} {params.expect} --setting {params.names} {params.model_arg} --data {input.data} --out {output.results} --threads {threads} > {log} 2>&1"


rule evaluate_loglik:
    """Out-of-domain multiple choice: accuracy and NLL of the correct answer (softtokens.loglik)."""
    input:
        model=eval_model_input,
        data=f"{RESULTS}/data/{{benchmark}}/test.jsonl",
    output:
        result=update(paths.loglik_pattern(RESULTS)),
    params:
        expect=eval_expect,
        settings=loglik_settings,
        model_arg=eval_model_arg,
    threads: job_threads("evaluate_loglik")
    resources:
        **job_resources("evaluate_loglik"),
    conda:
        GPU_RULE_ENV
    log:
        f"{RESULTS}/logs/evaluate_loglik/{{model}}/{{trained}}/{{benchmark}}.log",
    benchmark:
        f"{RESULTS}/benchmarks/evaluate_loglik/{{model}}/{{trained}}/{{benchmark}}.tsv"
    shell:
        "python -m softtokens evaluate-loglik --settings {params.settings:q} {params.expect} {params.model_arg} --data {input.data} --out {output.result} --threads {threads} > {log} 2>&1"
