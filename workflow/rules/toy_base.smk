rule build_toy_base:
    input:
        train=paths.data_path(RESULTS, JOBS.toy_base_dataset, "train"),
        validation=paths.data_path(RESULTS, JOBS.toy_base_dataset, "validation"),
    output:
        model=directory(paths.model_dir(RESULTS, "{model}")),
    params:
        expect=JOBS.toy_base_expect() if JOBS.toy_base_dataset else "",
        settings=JOBS.toy_base_settings() if "toy_base" in JOBS.grid else "",
    threads: 2
    resources:
        **resources("cpu"),
    conda:
        CPU_ENV
    log:
        log_of("build_toy_base", "{model}"),
    benchmark:
        bench_of("build_toy_base", "{model}")
    shell:
        # the longest job of the demo: its progress lines reach the console as well as the log
        "python -m softtokens build-toy-base --settings {params.settings:q} {params.expect} --train {input.train} --validation {input.validation} --out {output.model} --threads {threads} 2>&1 | tee {log}"
