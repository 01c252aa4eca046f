"""`python -m tools.dist_smoke_test [--field value ...] [--json]`: run dist_smoke_test by hand."""

from ..engine.cli import tool_main
from . import SPEC

tool_main(SPEC)
