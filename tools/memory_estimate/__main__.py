"""`python -m tools.memory_estimate [--field value ...] [--json]`: run memory_estimate by hand."""

from ..engine.cli import tool_main
from . import SPEC

tool_main(SPEC)
