"""`python -m tools.memory_bandwidth_bench [--field value ...] [--json]`: run memory_bandwidth_bench by hand."""

from ..engine.cli import tool_main
from . import SPEC

tool_main(SPEC)
