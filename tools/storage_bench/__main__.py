"""`python -m tools.storage_bench [--field value ...] [--json]`: run storage_bench by hand."""

from ..engine.cli import tool_main
from . import SPEC

tool_main(SPEC)
