# One job per (model, benchmark, inference setting) and one per (model, out-of-domain set), for parallel GPU jobs;
# with `evaluation.one_job_per_setting: false` (a CPU grid, where the process start-up is most of a job) one job per
# evaluated model writes its every file, the out-of-domain ones included (evaluate_per_model.smk).
ONE_JOB_PER_SETTING = EVAL["one_job_per_setting"]


if ONE_JOB_PER_SETTING:

    include: "evaluate_per_setting.smk"

else:

    include: "evaluate_per_model.smk"
