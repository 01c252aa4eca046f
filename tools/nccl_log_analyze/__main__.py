"""`python -m tools.nccl_log_analyze [--field value ...] [--json]`: run nccl_log_analyze by hand."""

from ..engine.cli import tool_main
from . import SPEC

tool_main(SPEC)
