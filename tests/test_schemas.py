"""The published schemas (engine/schemas.py): smaller than pydantic's, refusing what the validator refuses,
self-test switches hidden from agents but still accepted."""

import json

import jsonschema
import pytest
from mcp import Client

from tools.engine.mcp_server import INSTRUCTIONS, build_server, input_schema
from tools.engine.registry import registry
from tools.engine.schemas import ROOT_RULES, compact
from tools.engine.spec import SELF_TEST, SUBPROCESS_TIMEOUT_S, Field, Params, present


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


def _guards(full, published, path=(), with_schema=False):
    """(path, keyword, value) of every bound in `full` that `published` leaves out (and, with_schema, the
    schema object holding it)."""
    if isinstance(full, dict):
        for key, value in full.items():
            if key in ("properties", "$defs") and isinstance(value, dict):
                for name, sub in value.items():
                    yield from _guards(sub, published.get(key, {}).get(name, {}), path + (name,), with_schema)
            elif key in published:
                yield from _guards(value, published[key], path + (key,), with_schema)
            elif not isinstance(value, (dict, list)) and not (key in ("additionalProperties", "default")
                                                              and value is False):   # said in the instructions
                yield (path, key, value, full) if with_schema else (path, key, value)


def _breaking(keyword, value):
    """A value just past one guard."""
    if keyword == "pattern":
        return "node\x01;rm"            # a control character and a ';' are outside every guarded class
    if keyword == "maxLength":
        return "a" * (value + 1)
    if keyword == "maximum":
        return value * 2 + 1
    if keyword in ("minimum", "exclusiveMinimum"):
        return 0                        # the "positive" rule of the instructions (minimum 1, exclusiveMinimum 0)
    return ["a"] * (value + 1)          # maxItems


GUARDED = sorted({(spec.name, path) for spec in registry().values()
                  for path, _, _ in _guards(compact(spec.Params.model_json_schema()), input_schema(spec))})


def test_guards_are_what_is_left_out_and_bounds_a_caller_plans_around_stay():
    from tools.engine.schemas import guard, positive_only

    left_out = {(spec.name,) + path + (key,): (value, schema) for spec in registry().values()
                for path, key, value, schema in _guards(compact(spec.Params.model_json_schema()), input_schema(spec),
                                                         with_schema=True)}
    neither = {p: v for p, (v, schema) in left_out.items() if not (guard(p[-1], v) or positive_only(p[-1], v, schema))}
    assert left_out and not neither, neither
    assert ("memory_estimate", "layers", "minimum") in left_out               # "positive": the instructions say it
    assert input_schema(registry()["memory_estimate"])["properties"]["experts"]["minimum"] == 0   # 0 allowed: shown
    assert ("collective_bench", "nodes", "items", "pattern") in left_out       # the long node-name pattern
    assert ("memory_estimate", "seq_len", "maximum") in left_out              # an overflow guard
    window = input_schema(registry()["straggler_find"])["properties"]["window_s"]
    assert (window["minimum"], window["maximum"]) == (5, 120)                 # a bound a caller plans around
    job_id = input_schema(registry()["slurm_job_diagnose"])["properties"]["job_id"]
    assert job_id["pattern"] == r"^\d+(_\d+)?$"                                # a form, not a character set
    assert not guard("maxLength", 31) and not guard("maxItems", 12) and not guard("maximum", 65536)
    assert not guard("pattern", r"^[A-Za-z0-9_.\-]{1,16}$") and guard("pattern", r"^[^\x00-\x1f\x7f]*$")
    node = input_schema(registry()["env_report"])["properties"]["node"]
    assert node == {"type": "string"}


@pytest.mark.parametrize("name,path", GUARDED)
def test_a_guard_left_out_of_the_schema_is_still_enforced_naming_the_field(name, path):
    """Every bound hosts are not shown is refused past by the validator, with a message naming the field."""
    from pydantic import ValidationError

    from tools.engine.rendering import validation_message

    spec = registry()[name]
    full = compact(spec.Params.model_json_schema())
    bounds = [(p, k, v) for p, k, v in _guards(full, input_schema(spec)) if p == path]
    assert bounds
    field = path[0]
    for _, keyword, value in bounds:
        bad = _breaking(keyword, value)
        for step in reversed(path[1:]):   # wrap the bad value where the bound sits
            if step == "items":
                bad = [bad] * max(2, full["properties"][field].get("minItems", 1))
            elif step == "additionalProperties":
                bad = {"NCCL_DEBUG": bad}
            elif step == "propertyNames":
                bad = {bad: "1"}
        with pytest.raises(ValidationError) as refused:
            spec.Params(**{field: bad})
        assert field in validation_message(spec, refused.value), (name, path, keyword)


@pytest.mark.anyio
async def test_a_call_past_an_unpublished_guard_is_refused_over_mcp_and_ordinary_calls_pass():
    async with Client(build_server()) as c:
        refused = await c.call_tool("results_history", {"host": "h" * 300})
        ordinary = await c.call_tool("results_history", {"host": "gpu-01", "limit": 1})
        on_node = await c.call_tool("env_report", {"node": "n\x01", "wait_s": 0})
    assert refused.is_error and "host" in refused.content[0].text
    assert not ordinary.is_error
    assert on_node.is_error and "node" in on_node.content[0].text


@pytest.mark.anyio
async def test_what_the_instructions_say_once_holds_for_every_tool():
    """No schema repeats additionalProperties: false or a boolean's default false; the validator still refuses
    an unknown argument by name and a boolean left out is false; a SELF_EVIDENT field is published bare."""
    from tools.engine.spec import SELF_EVIDENT

    assert "a boolean left out is false" in INSTRUCTIONS and "unknown arguments are refused" in INSTRUCTIONS
    bare = 0
    for spec in registry().values():
        schema = input_schema(spec)
        assert "additionalProperties" not in schema, spec.name
        for name, prop in schema["properties"].items():
            info = spec.Params.model_fields.get(name)
            if info is None:
                continue
            if prop.get("type") == "boolean" and "default" not in prop and info.default is not None:
                assert info.default is False, f"{spec.name}.{name}"
            if info.json_schema_extra == SELF_EVIDENT:
                assert "description" not in prop and info.description, f"{spec.name}.{name}"
                assert "x-self-evident" not in prop
                bare += 1
    assert bare >= 10
    async with Client(build_server()) as c:
        r = await c.call_tool("accelerator_specs", {"names": ["h100"], "no_such_argument": 1})
        timeout_s = {t.name: t.input_schema["properties"].get("timeout_s") for t in (await c.list_tools()).tools}
    # timeout_s shows its default only where it is not the one the instructions give
    assert f"{SUBPROCESS_TIMEOUT_S:g} unless the schema shows a default" in INSTRUCTIONS
    assert timeout_s["env_report"] == {"type": "number"} and registry()["env_report"].timeout_s == SUBPROCESS_TIMEOUT_S
    assert timeout_s["collective_bench"]["default"] == registry()["collective_bench"].timeout_s != SUBPROCESS_TIMEOUT_S
    assert r.is_error and "no_such_argument" in r.content[0].text


def _numbers(schema, path=()):
    """(path, schema object) of every integer or number in a published schema, items and anyOf branches too."""
    if isinstance(schema, dict):
        if schema.get("type") in ("integer", "number"):
            yield path, schema
        for key, value in schema.items():
            if key == "properties":
                for name, sub in value.items():
                    yield from _numbers(sub, path + (key, name))
            elif isinstance(value, (dict, list)):
                yield from _numbers(value, path + (key,))
    elif isinstance(schema, list):
        for i, item in enumerate(schema):
            yield from _numbers(item, path + (i,))


def test_a_number_shown_without_a_lower_bound_is_positive_as_the_instructions_say():
    """The rule has no exception but the execution options (whose bounds the instructions give): every
    integer or number published without a lower bound had exactly minimum 1 / exclusiveMinimum 0."""
    assert "a number shown without a lower bound is positive (an integer >= 1)" in INSTRUCTIONS
    unbounded = 0
    for spec in registry().values():
        full = compact(spec.Params.model_json_schema())
        for path, shown in _numbers(input_schema(spec)):
            if path[1] in ("wait_s", "timeout_s") or {"minimum", "exclusiveMinimum"} & set(shown):
                continue
            unbounded += 1
            source = full     # the same place in the unpublished schema: publishing only removes keywords
            for step in path:
                source = source[step]
            positive = {"integer": ("minimum", 1), "number": ("exclusiveMinimum", 0)}[shown["type"]]
            assert source.get(positive[0]) == positive[1], (spec.name, path, source)
    assert unbounded >= 80
