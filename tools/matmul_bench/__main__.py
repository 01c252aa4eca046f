"""`python -m tools.matmul_bench [--field value ...] [--json]`: run matmul_bench by hand."""

from ..engine.cli import tool_main
from . import SPEC

tool_main(SPEC)
