rule prepare_data:
    output:
        train=f"{RESULTS}/data/{{dataset}}/train.jsonl",
        validation=f"{RESULTS}/data/{{dataset}}/validation.jsonl",
        test=f"{RESULTS}/data/{{dataset}}/test.jsonl",
    params:
        settings=dataset_settings,
        out_dir=f"{RESULTS}/data/{{dataset}}",
    conda:
        "../../envs/softtokens.yaml"
    log:
        f"{RESULTS}/logs/prepare_data/{{dataset}}.log",
    benchmark:
        f"{RESULTS}/benchmarks/prepare_data/{{dataset}}.tsv"
    shell:
        "python -m softtokens prepare-data --dataset {wildcards.dataset} --settings {params.settings:q} --out-dir {params.out_dir} > {log} 2>&1"
