"""`python -m tools.slurm_job_diagnose [--field value ...] [--json]`: run slurm_job_diagnose by hand."""

from ..engine.cli import tool_main
from . import SPEC

tool_main(SPEC)
