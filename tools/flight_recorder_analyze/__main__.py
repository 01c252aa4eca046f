"""`python -m tools.flight_recorder_analyze [--field value ...] [--json]`: run flight_recorder_analyze by hand."""

from ..engine.cli import tool_main
from . import SPEC

tool_main(SPEC)
