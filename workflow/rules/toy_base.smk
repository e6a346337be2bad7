rule build_toy_base:
    input:
        train=f"{RESULTS}/data/{TOY_BASE_DATASET}/train.jsonl",
        validation=f"{RESULTS}/data/{TOY_BASE_DATASET}/validation.jsonl",
    output:
        model=directory(f"{RESULTS}/models/{{model}}"),
    params:
        expect=toy_base_expect,
        settings=toy_base_settings,
    threads: 2
    resources:
        **job_resources("cpu"),
    conda:
        "../../envs/softtokens.yaml"
    log:
        f"{RESULTS}/logs/build_toy_base/{{model}}.log",
    benchmark:
        f"{RESULTS}/benchmarks/build_toy_base/{{model}}.tsv"
    shell:
        "python -m softtokens build-toy-base --settings {params.settings:q} {params.expect} --train {input.train} --validation {input.validation} --out {output.model} --threads {threads} > {log} 2>&1"
