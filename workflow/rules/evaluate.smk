rule evaluate:
    input:
        model=eval_model_input,
        data=f"{RESULTS}/data/{{benchmark}}/test.jsonl",
    output:
        result=f"{RESULTS}/eval/{{model}}/{{trained}}/{{benchmark}}/{{setting}}.json",
    params:
        settings=eval_settings,
        model_arg=eval_model_arg,
    conda:
        "../../envs/softtokens.yaml"
    log:
        f"{RESULTS}/logs/evaluate/{{model}}/{{trained}}/{{benchmark}}/{{setting}}.log",
    benchmark:
        f"{RESULTS}/benchmarks/evaluate/{{model}}/{{trained}}/{{benchmark}}/{{setting}}.tsv"
    shell:
        "python -m softtokens evaluate --settings {params.settings:q} --setting {wildcards.setting} {params.model_arg} --data {input.data} --out {output.result} --threads {threads} > {log} 2>&1"
