# Data jobs download from the Hugging Face hub: they run where Snakemake runs (on a cluster, the
# login node, which usually has internet; compute nodes often do not). A dataset's `path:`
# reads a local copy instead.
localrules:
    prepare_data,
    prepare_benchmark,


rule prepare_data:
    """A training set: train + a seeded validation slice held out of it."""
    output:
        train=f"{RESULTS}/data/{{dataset}}/train.jsonl",
        validation=f"{RESULTS}/data/{{dataset}}/validation.jsonl",
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
        "python -m softtokens prepare-data --dataset {wildcards.dataset} --splits train,validation --settings {params.settings:q} --out-dir {params.out_dir} > {log} 2>&1"


rule prepare_benchmark:
    """A benchmark's test split (math or multiple choice)."""
    output:
        test=f"{RESULTS}/data/{{dataset}}/test.jsonl",
    params:
        settings=dataset_settings,
        out_dir=f"{RESULTS}/data/{{dataset}}",
    conda:
        "../../envs/softtokens.yaml"
    log:
        f"{RESULTS}/logs/prepare_benchmark/{{dataset}}.log",
    benchmark:
        f"{RESULTS}/benchmarks/prepare_benchmark/{{dataset}}.tsv"
    shell:
        "python -m softtokens prepare-data --dataset {wildcards.dataset} --splits test --settings {params.settings:q} --out-dir {params.out_dir} > {log} 2>&1"
