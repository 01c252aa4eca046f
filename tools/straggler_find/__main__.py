from ..engine.cli import tool_main
from . import SPEC

tool_main(SPEC)
