"""A call our answers suggest ("fleet_sweep partition=...") fits the tool's schema: model round 11 (cl-cpu-starved)
was told "fleet_sweep nodes=[mln4]", where fleet_sweep's nodes is a count, not a list of names."""

from __future__ import annotations

import re
from pathlib import Path

from tools.engine.registry import registry

TOOLS = Path(__file__).resolve().parent.parent / "tools"


def test_every_suggested_argument_is_one_the_tool_takes_in_the_shape_given():
    specs = registry()
    call = re.compile(r"\b(" + "|".join(map(re.escape, specs)) + r") ([a-z_]+)=(\[?)")
    checked = 0
    for path in TOOLS.rglob("*.py"):
        for m in call.finditer(path.read_text()):
            tool, arg, is_list = m.groups()
            fields = specs[tool].Params.model_fields
            assert arg in fields, f"{path}: '{m.group(0)}': {tool} has no argument {arg}"
            if is_list:
                shape = str(fields[arg].annotation)
                assert "list" in shape, f"{path}: '{m.group(0)}...': {tool}.{arg} is {shape}, not a list"
            checked += 1
    assert checked >= 4
