"""`python -m tools.gpu_health [--field value ...] [--json]`: run gpu_health by hand."""

from ..engine.cli import tool_main
from . import SPEC

tool_main(SPEC)
