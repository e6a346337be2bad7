# Data jobs download from the Hugging Face hub: they run where Snakemake runs (on a cluster, the
# login node, which usually has internet; compute nodes often do not). A dataset's `path:`
# reads a local copy instead.
localrules:
    prepare_data,
    prepare_benchmark,


rule prepare_data:
    """A training set: train + a seeded validation slice held out of it."""
    output:
        train=paths.data_pattern(RESULTS, "train"),
        validation=paths.data_pattern(RESULTS, "validation"),
    params:
        settings=lambda w: JOBS.dataset_settings(w.dataset),
        out_dir=output_parent,
    conda:
        CPU_ENV
    priority: PRIORITY["prepare_data"]
    log:
        log_of("prepare_data", "{dataset}"),
    benchmark:
        bench_of("prepare_data", "{dataset}")
    shell:
        "python -m softtokens prepare-data --dataset {wildcards.dataset} --splits train,validation --settings {params.settings:q} --out-dir {params.out_dir} > {log} 2>&1"


rule prepare_benchmark:
    """A benchmark's test split (math or multiple choice)."""
    output:
        test=paths.data_pattern(RESULTS, "test"),
    params:
        settings=lambda w: JOBS.dataset_settings(w.dataset),
        out_dir=output_parent,
    conda:
        CPU_ENV
    log:
        log_of("prepare_benchmark", "{dataset}"),
    benchmark:
        bench_of("prepare_benchmark", "{dataset}")
    shell:
        "python -m softtokens prepare-data --dataset {wildcards.dataset} --splits test --settings {params.settings:q} --out-dir {params.out_dir} > {log} 2>&1"
