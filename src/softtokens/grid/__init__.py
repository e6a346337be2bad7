"""What one grid builds, for Snakemake: its targets, the figures it draws, which runs are one run under two names,
each job's settings and resources, the memory each job declares. Above sizing (a job's memory and GPUs are its
plan's), below everything that prices, audits or reports a grid."""
