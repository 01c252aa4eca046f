"""The published schemas (engine/schemas.py): smaller than pydantic's, refusing what the validator refuses,
self-test switches hidden from agents but still accepted."""

import json

import jsonschema
import pytest
from mcp import Client

from tools.engine.mcp_server import INSTRUCTIONS, build_server, input_schema
from tools.engine.registry import registry
from tools.engine.schemas import ROOT_RULES, compact
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


def test_no_input_schema_carries_a_rule_at_its_root_and_each_is_valid_json_schema():
    """Hosts refuse or drop a tool whose input schema has allOf/anyOf/oneOf (or if/then) at its root
    (Anthropic API HTTP 400; anthropics/claude-code#95504): none may, and every default fits its field."""
    for spec in registry().values():
        schema = input_schema(spec)
        assert schema["type"] == "object", spec.name
        assert not set(ROOT_RULES) & set(schema), (spec.name, sorted(set(ROOT_RULES) & set(schema)))
        jsonschema.Draft202012Validator.check_schema(schema)
        for name, prop in schema.get("properties", {}).items():
            if "default" in prop:
                jsonschema.validate(prop["default"], prop)   # a default the schema itself refuses misleads
        jsonschema.validate({}, {k: v for k, v in schema.items() if k != "required"})
    kept = [s.name for s in registry().values() if set(ROOT_RULES) & set(compact(s.Params.model_json_schema()))]
    assert len(kept) >= 5, kept   # the rules still exist where the validator enforces them (next test)


RULED = sorted(s.name for s in registry().values() if set(ROOT_RULES) & set(s.Params.model_json_schema()))


@pytest.mark.parametrize("name", RULED)
def test_the_validator_refuses_whatever_breaks_an_unpublished_rule(name):
    """The root rules no longer reach hosts, so they are a spec of the validator: arguments drawn from the
    published schema that break the full schema (rules included) must be refused by Params, by name."""
    from hypothesis import HealthCheck, given, settings
    from hypothesis_jsonschema import from_schema
    from pydantic import ValidationError

    spec = registry()[name]
    published = input_schema(spec)
    params_only = {**published, "properties": {k: v for k, v in published["properties"].items()
                                               if k in spec.Params.model_fields}}
    full = jsonschema.Draft202012Validator(compact(spec.Params.model_json_schema()))
    broken = []

    # derandomized: the same draws every run, so a pass or a failure repeats
    @settings(max_examples=60, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
    @given(args=from_schema(params_only))
    def check(args):
        if full.is_valid(args):
            return
        broken.append(args)
        try:
            spec.Params(**args)
        except (ValidationError, ValueError):
            return
        raise AssertionError(f"{name}: {args} breaks a rule of the schema but Params accepted it")

    check()
    assert broken, f"{name}: no drawn argument set broke a rule: the check saw nothing"


def test_a_first_purchase_with_measured_candidate_tokens_meets_the_rule_and_the_validator():
    """Found by the test above: the rule refused what the validator accepts (no current accelerator to compare)."""
    spec = registry()["upgrade_roi"]
    for current in (None, "none", " None "):
        args = {"current": current, "candidate_tokens_per_s_per_gpu": 1000.0}
        jsonschema.validate(args, compact(spec.Params.model_json_schema()))
        spec.Params(**args)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"candidate_tokens_per_s_per_gpu": 1000.0}, compact(spec.Params.model_json_schema()))


def test_the_execution_options_bounds_stated_once_are_the_ones_enforced():
    """wait_s / timeout_s publish only their type (and the tool's timeout) per tool: the instructions carry the
    bounds, so those must be what CallOptions refuses past."""
    import re

    from pydantic import ValidationError

    from tools.engine.mcp_server import CallOptions

    for name, low in (("wait_s", 0), ("timeout_s", 1)):
        m = re.search(rf"- {name} \(seconds, (\d+)-(\d+)", INSTRUCTIONS)
        assert m and int(m.group(1)) == low, name
        top = int(m.group(2))
        CallOptions(**{name: low}), CallOptions(**{name: top})
        for bad in (low - 1, top + 1):
            with pytest.raises(ValidationError, match=name):
                CallOptions(**{name: bad})
