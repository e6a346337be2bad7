"""What the Snakefile and its rules call around the jobs: the checks before any job (start-up), the summaries a run of
one cell leaves older than it, update() backups a killed Snakemake left, the outputs an interrupted job left, the
SLURM status check. Below commands/ (the CLI alone), above every room a job runs."""
