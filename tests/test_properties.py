"""Property-based, generic over the registry: every tool (present and future) gets these for free.

- Random VALID arguments drawn from each in-process tool's input schema never crash the server: the
  call returns a result that validates, or a clear tool error (e.g. a file that does not exist).
  Subprocess tools are left out of random valid calls: they launch ranks and benchmarks.
- Random INVALID arguments (a wrong type for one field) for EVERY tool get an error naming that field,
  before anything runs, and the server keeps serving.
"""

import anyio
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis_jsonschema import from_schema
from mcp import Client

from tools.engine.mcp_server import build_server
from tools.engine.registry import registry

SERVER = build_server()


def _schemas():
    async def fetch():
        async with Client(SERVER) as c:
            return {t.name: t.input_schema for t in (await c.list_tools()).tools}

    return anyio.run(fetch)


SCHEMAS = _schemas()
IN_PROCESS = sorted(n for n, s in registry().items() if s.runs == "in_process" and n not in ("job_cancel",))


def _call(name, args):
    async def go():
        async with Client(SERVER) as c:
            r = await c.call_tool(name, args)
            alive = await c.call_tool("knowledge_search", {"query": "nccl timeout"})
            return r, alive

    return anyio.run(go)


def _wrong_value(prop: dict):
    """A value of the wrong JSON type for this property."""
    types = set()
    for option in prop.get("anyOf", [prop]):
        t = option.get("type")
        types |= set(t) if isinstance(t, list) else {t}
    if "object" not in types:
        return {"not": "valid"}
    return 12345


@pytest.mark.parametrize("name", IN_PROCESS)
def test_random_valid_arguments_never_crash_the_server(name):
    schema = dict(SCHEMAS[name])

    @settings(max_examples=15, deadline=None, suppress_health_check=list(HealthCheck))
    @given(args=from_schema(schema))
    def check(args):
        r, alive = _call(name, args)
        assert not alive.is_error
        if r.is_error:
            text = r.content[0].text
            assert "internal error" not in text and "Traceback" not in text, text
        else:
            registry()[name].Result.model_validate(r.structured_content)

    check()


@pytest.mark.parametrize("name", sorted(registry()))
def test_invalid_arguments_name_the_field(name):
    props = SCHEMAS[name].get("properties", {})
    if not props:
        pytest.skip("tool has no arguments")

    @settings(max_examples=min(8, len(props) * 2), deadline=None, suppress_health_check=list(HealthCheck))
    @given(field=st.sampled_from(sorted(props)))
    def check(field):
        r, alive = _call(name, {field: _wrong_value(props[field])})
        assert r.is_error, f"{name}.{field} accepted a wrong type"
        assert field in r.content[0].text
        assert not alive.is_error

    check()
