"""How many inputs that a tool's published input schema accepts does the tool then refuse?

Every refusal of a schema-valid input is a rule the schema does not state: an agent that reads the
schema cannot know it. This draws EXAMPLES inputs per tool from its MCP input schema (hypothesis-
jsonschema), validates each with the tool's Params, and counts the refusals per tool and per message.

    python bench/schema_honesty.py [EXAMPLES]          # default 30 per tool
"""

import collections
import re
import sys
import warnings

from hypothesis import HealthCheck, given, settings
from hypothesis_jsonschema import from_schema
from pydantic import ValidationError

from tools.engine.mcp_server import CallOptions, input_schema
from tools.engine.registry import registry


def check_tool(spec, examples: int) -> tuple[int, collections.Counter]:
    schema = input_schema(spec)
    seen, refused = [0], collections.Counter()

    @settings(max_examples=examples, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(args=from_schema(schema))
    def draw(args):
        seen[0] += 1
        args = {k: v for k, v in args.items() if k not in CallOptions.model_fields}
        try:
            spec.Params(**args)
        except ValidationError as e:
            first = e.errors()[0]
            refused[re.sub(r"\d+", "N", f"{'.'.join(map(str, first['loc']))}: {first['msg']}")[:110]] += 1

    draw()
    return seen[0], refused


def main() -> None:
    examples = int(sys.argv[1]) if len(sys.argv) > 1 else 30
    warnings.simplefilter("ignore")
    total = bad = 0
    for name, spec in sorted(registry().items()):
        seen, refused = check_tool(spec, examples)
        total, bad = total + seen, bad + sum(refused.values())
        if refused:
            print(f"{name}: {sum(refused.values())} of {seen} refused")
            for msg, n in refused.most_common(4):
                print(f"    {n:3d}  {msg}")
    print(f"TOTAL: {bad} of {total} schema-valid inputs refused by rules the schema does not state")


if __name__ == "__main__":
    main()
