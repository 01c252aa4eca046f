"""`python -m tools.hang_stack_dump [--field value ...] [--json]`: run hang_stack_dump by hand."""

from ..engine.cli import tool_main
from . import SPEC

tool_main(SPEC)
