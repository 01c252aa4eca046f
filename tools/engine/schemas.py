"""The JSON Schemas the server publishes: each tool's own pydantic schema, with what costs an agent
tokens and tells it nothing taken out.

An agent reads every tool's schema before its first call, so bytes here are paid on every session
(bench/agent_reading_cost.py measures them). What goes, and why it is safe:
- pydantic's `title` on every schema object ("Seq Len" beside `seq_len`) repeats the name;
- `anyOf: [X, {"type": "null"}]` with `default: null` (every optional field) becomes X: leaving the
  field out means the same, and the validator still accepts an explicit null;
- `present()`'s `not: {type: null}` goes with it: `required` alone then says "given";
- a field marked `SELF_TEST` (fault injection that proves a tool names a culprit) is left out of the
  input schema: tests, the CLI and a caller who knows it still pass it (`Params` accepts it);
- cross-field rules at the root of an input schema are not published (`for_hosts`): the Anthropic API
  answers a tool list holding a root `allOf` / `anyOf` / `oneOf` with HTTP 400 ("input_schema does not
  support oneOf, allOf, or anyOf at the top level"), which ends every turn of a Claude Code session
  (anthropics/claude-code#45106), and Claude Code now drops such a tool silently, root `if`/`then` too
  (anthropics/claude-code#95504, Sept 2026); `not` goes with them, as no host documents it there. The
  field descriptions say each rule in words, and the validator still refuses what breaks one.
- `additionalProperties: false` and a boolean's `default: false` are said once, in the server
  instructions (unknown arguments are refused by name; a boolean left out is false), not per schema;
- a field marked `SELF_EVIDENT` ('layers', 'iters': name, type and bounds say it) is published without
  its description (the CLI's --help keeps it);
- guards (`guard()`) are not published: a bound that only keeps an abusive or broken caller from costing
  memory or reaching a shell or a command line, which no honest call comes near: string `maxLength` >= 32
  (identifiers, names and paths: a SLURM job id, an accelerator name), `maxItems` >= 20 (log files, shapes),
  `maxProperties` >= 1024, `maximum` >= 100,000 (overflow guards: 10 M tokens of sequence, 1e18 tokens to
  train), and a `pattern` that only limits the character set (`^[class]+$`, `^[^class]*$`, `^[class]{1,N}$`
  with N >= 32: node names, control characters). The server instructions say so, and the
  validator still refuses past each one, naming the field. A bound a caller must plan around (a window of
  5-120 s, an enum, a port range) stays;
- a lower bound that only says "positive" (`minimum: 1` on an integer, `exclusiveMinimum: 0` on a number:
  three lower bounds in four) is said once in the server instructions: a number shown with
  no lower bound is positive. Every other lower bound (0 allowed, 1.5, 10 s) stays, so the rule has no
  exception but the execution options, whose bounds the instructions give.
Validation is unchanged: `Params(**arguments)` is the authority; every other bound and enum stays in the
schema, and the rules stay in `Params.model_json_schema()`, where tests check them against the validator.
"""

import re
from collections.abc import Callable
from typing import Any

from .spec import SELF_EVIDENT, SELF_TEST

_MARKER = next(iter(SELF_TEST))
_EVIDENT = next(iter(SELF_EVIDENT))
# Keywords that constrain the object as a whole: at the root of a tool's input schema some hosts refuse them.
ROOT_RULES = ("allOf", "anyOf", "oneOf", "not", "if", "then", "else")


# The smallest bound of each kind that is a guard (see the module docstring). Lengths and list sizes from these
# are abuse bounds on identifiers and paths (a SLURM job id, a node name, 20 log files): no caller plans by them.
GUARD_AT_LEAST = {"maxLength": 32, "maxItems": 20, "maxProperties": 1024, "maximum": 100_000}
# A pattern that is one character class (or its negation), repeated: it limits characters, not form.
_CHARSET_ONLY = re.compile(r"\^\[(?:\\.|[^\]\\])+\](?:[+*]|\{\d+,(\d+)\})\$")


def guard(key: str, value: Any) -> bool:
    """Is `key: value` (one keyword of a schema object) a guard, left out of what hosts are shown?"""
    if key == "pattern" and isinstance(value, str):
        m = _CHARSET_ONLY.fullmatch(value)
        return bool(m) and (m.group(1) is None or int(m.group(1)) >= GUARD_AT_LEAST["maxLength"])
    least = GUARD_AT_LEAST.get(key)
    return least is not None and isinstance(value, (int, float)) and not isinstance(value, bool) and value >= least


def positive_only(key: str, value: Any, schema: dict) -> bool:
    """Does `key: value`, a keyword of the schema object `schema`, only say "positive" (an integer's minimum 1,
    a number's exclusiveMinimum 0)?"""
    if isinstance(value, bool) or "minimum" in schema and "exclusiveMinimum" in schema:
        return False    # True is not 1; and of two lower bounds both stay, as neither alone is the rule
    kind = schema.get("type")
    return (kind == "integer" and key == "minimum" and value == 1
            or kind == "number" and key == "exclusiveMinimum" and value == 0)


def _pruned(schema: Any, drop: Callable[[str, Any, dict], bool]) -> Any:
    """`schema` without every keyword `key: value` of a schema object `obj` where drop(key, value, obj) (a new
    object); a sub-schema left empty by it says nothing more than absent, and goes too."""
    if isinstance(schema, list):
        return [_pruned(item, drop) for item in schema]
    if not isinstance(schema, dict):
        return schema
    out = {}
    for key, value in schema.items():
        if key in ("properties", "$defs", "definitions") and isinstance(value, dict):
            out[key] = {name: _pruned(sub, drop) for name, sub in value.items()}   # keys are field names
        elif not drop(key, value, schema):
            out[key] = _pruned(value, drop)
    for key in ("propertyNames", "additionalProperties", "items"):
        if out.get(key) == {}:
            del out[key]
    return out


def without_guards(schema: Any) -> Any:
    """`schema` without its guards (a new object)."""
    return _pruned(schema, lambda key, value, _: guard(key, value))


def without_positive_bounds(schema: Any) -> Any:
    """`schema` without lower bounds that only say "positive" (a new object): the instructions say it once."""
    return _pruned(schema, positive_only)


def _is_null(schema: Any) -> bool:
    return isinstance(schema, dict) and schema == {"type": "null"}


def compact(schema: Any, inputs: bool = True) -> Any:
    """`schema` without titles and (inputs) with optional fields shown as their non-null type (a new object).

    Output schemas keep their nulls (`inputs=False`): a result carries its unset fields as null, and
    clients validate structured content against the output schema."""
    if isinstance(schema, list):
        return [compact(item, inputs) for item in schema]
    if not isinstance(schema, dict):
        return schema
    out: dict[str, Any] = {}
    evident = inputs and schema.get(_EVIDENT) is True
    for key, value in schema.items():
        if key == "title" and isinstance(value, str) or key == _EVIDENT or evident and key == "description":
            continue
        if key in ("properties", "$defs", "definitions") and isinstance(value, dict):
            # mappings of names: their keys are field names, never schema keywords
            out[key] = {name: compact(sub, inputs) for name, sub in value.items()
                        if not (isinstance(sub, dict) and sub.get(_MARKER))}
            continue
        out[key] = compact(value, inputs)
    if not inputs:
        return out
    if _is_null(out.get("not")):
        # `present()`'s "and not null": optional fields are published non-null, so `required` says it
        del out["not"]
    if isinstance(out.get("properties"), dict):
        out["properties"] = {k: v for k, v in out["properties"].items() if v != {}}
        if not out["properties"] and "required" in out:
            del out["properties"]
    options = out.get("anyOf")
    if isinstance(options, list) and any(_is_null(o) for o in options) and out.get("default", 0) is None:
        rest = [o for o in options if not _is_null(o)]
        del out["anyOf"], out["default"]
        if len(rest) == 1 and not set(rest[0]) & set(out):
            out.update(rest[0])
        else:
            out["anyOf"] = rest
    if "required" in out and "properties" in out:   # a hidden field is never required
        out["required"] = [r for r in out["required"] if r in out["properties"]]
        if not out["required"]:
            del out["required"]
    return out


def for_hosts(schema: dict) -> dict:
    """A Params schema as tools/list publishes it: compacted, without guards or "positive" lower bounds, and
    without cross-field rules at its root."""
    out = without_positive_bounds(without_guards(compact(schema)))
    for key in ROOT_RULES:
        out.pop(key, None)
    # said once in the server instructions: unknown arguments are refused, booleans default to false
    if out.get("additionalProperties") is False:
        del out["additionalProperties"]
    for prop in out.get("properties", {}).values():
        if prop.get("type") == "boolean" and prop.get("default") is False:
            del prop["default"]
    return out
