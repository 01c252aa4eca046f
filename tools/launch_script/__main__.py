"""`python -m tools.launch_script [--field value ...] [--json]`: run launch_script by hand."""

from ..engine.cli import tool_main
from . import SPEC

tool_main(SPEC)
