"""`python -m tools.collective_bench [--field value ...] [--json]`: run collective_bench by hand."""

from ..engine.cli import tool_main
from . import SPEC

tool_main(SPEC)
