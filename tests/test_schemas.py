"""The published schemas (engine/schemas.py): smaller than pydantic's, refusing what the validator refuses,
self-test switches hidden from agents but still accepted."""

import json

import jsonschema
import pytest
from mcp import Client

from tools.engine.mcp_server import INSTRUCTIONS, build_server, input_schema
from tools.engine.registry import registry
from tools.engine.schemas import compact
from tools.engine.spec import SELF_TEST, Field, Params, present


class Example(Params):
    model_config = {"json_schema_extra": {"anyOf": [present("seq_len"), present("title")]}}
    seq_len: int | None = Field(None, ge=1, le=10, description="Tokens.")
    title: str | None = Field(None, max_length=20, description="A field named like the keyword.")
    mode: str = Field("a", max_length=5, description="Mode.")
    planted: int = Field(0, description="Fault to plant.", json_schema_extra=SELF_TEST)


def test_compact_drops_titles_and_nulls_but_keeps_bounds_rules_and_field_names():
    schema = compact(Example.model_json_schema())
    text = json.dumps(schema)
    assert '"type": "null"' not in text and '"Seq Len"' not in text
    assert schema["properties"]["seq_len"] == {"type": "integer", "minimum": 1, "maximum": 10, "description": "Tokens."}
    assert "title" in schema["properties"]                       # a field called `title` survives
    assert "planted" not in schema["properties"]
    jsonschema.validate({"seq_len": 3}, schema)
    for refused in ({}, {"seq_len": 11}, {"mode": "toolong"}):   # the cross-field rule and the bounds hold
        try:
            jsonschema.validate(refused, schema)
        except jsonschema.ValidationError:
            continue
        raise AssertionError(f"{refused} passed the compacted schema")
    assert Example(seq_len=None, title="x").seq_len is None      # validation itself is unchanged


def test_published_schemas_are_compact_and_options_are_described_once():
    for spec in registry().values():
        text = json.dumps(input_schema(spec))
        assert '"title"' not in text.replace('"title": {', ""), spec.name
        props = input_schema(spec)["properties"]
        for name, prop in props.items():   # null stays only where it is not the default (a real choice)
            if {"type": "null"} in prop.get("anyOf", []):
                assert prop.get("default") is not None, f"{spec.name}.{name}"
        if spec.runs == "subprocess":
            assert "description" not in props["wait_s"] and "description" not in props["timeout_s"]
    assert "wait_s" in INSTRUCTIONS and "timeout_s" in INSTRUCTIONS


@pytest.mark.anyio
async def test_a_hidden_self_test_switch_is_still_accepted_over_mcp():
    spec = registry()["dist_smoke_test"]
    assert "inject_fault" in spec.Params.model_fields
    assert "inject_fault" not in input_schema(spec)["properties"]
    async with Client(build_server()) as c:
        # a bad value reaches the validator (so the name is accepted), which names the field
        r = await c.call_tool("dist_smoke_test", {"inject_fault": "no_such_fault", "wait_s": 0})
    assert r.is_error and "inject_fault" in r.content[0].text and "unknown argument" not in r.content[0].text
