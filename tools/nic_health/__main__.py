"""`python -m tools.nic_health [--sample-s S] [--json]`: run nic_health by hand."""

from ..engine.cli import tool_main
from . import SPEC

tool_main(SPEC)
