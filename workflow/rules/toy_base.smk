rule build_toy_base:
    input:
        train=paths.data_path(RESULTS, JOBS.toy_base_dataset, "train"),
        validation=paths.data_path(RESULTS, JOBS.toy_base_dataset, "validation"),
    output:
        model=directory(paths.model_dir(RESULTS, "{model}")),
    params:
        expect=verbatim(JOBS.toy_base_expect() if JOBS.toy_base_dataset else ""),
        settings=verbatim(JOBS.toy_base_settings() if "toy_base" in JOBS.grid else ""),
    wildcard_constraints:
        model=alternation(JOBS.built_models("toy")),
    threads: 2
    resources:
        **resources("cpu"),
    conda:
        CPU_ENV
    priority: PRIORITY["build_toy_base"]
    log:
        log_of("build_toy_base", "{model}"),
    benchmark:
        bench_of("build_toy_base", "{model}")
    shell:
        # the longest job of the demo: its progress lines reach the console as well as the log
        "python -m softtokens build-toy-base --settings {params.settings:q} {params.expect} --train {input.train} --validation {input.validation} --out {output.model} --threads {threads} 2>&1 | tee {log}"


rule build_packaged_base:
    """A real pretrained model a pip package ships (`source: pip:NAME`), dequantized into a model directory that
    every job of the grid loads (softtokens.model.packaged)."""
    output:
        model=directory(paths.model_dir(RESULTS, "{model}")),
    params:
        settings=lambda w: JOBS.packaged_settings(w.model),
    wildcard_constraints:
        model=alternation(JOBS.built_models("packaged")),
    threads: 2
    resources:
        **resources("cpu"),
    conda:
        CPU_ENV
    priority: PRIORITY["build_packaged_base"]
    log:
        log_of("build_packaged_base", "{model}"),
    benchmark:
        bench_of("build_packaged_base", "{model}")
    shell:
        "python -m softtokens build-packaged-base --settings {params.settings:q} --out {output.model} --threads {threads} > {log} 2>&1 || python -m softtokens exit-note $? --job 'build_packaged_base {wildcards}' --mem-mb {resources.mem_mb} --log {log}"
