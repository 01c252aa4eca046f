"""Log triage: read logs (logscan), match the signature catalog, judge the first failure.

Used by log_triage and slurm_job_diagnose."""
