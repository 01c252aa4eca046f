"""A size limit on every result, for every tool: what the MCP answer carries and the store keeps.

A tool's output grows with its input (per rank, per file, per group): a hostile or just enormous input
must not turn into a 75 MB answer or a 50 MB row in the results database. `bound_result` leaves a
result under MAX_RESULT_CHARS of JSON alone (the common case costs one json.dumps); a bigger one has
its longest lists cut (then its longest strings), largest first, until it fits, and says what was cut
in a finding. The trimmed result is validated against the tool's own Result model, so structured
content still matches the output schema; if it cannot be, only the verdict, findings and next remain.
"""

import json

from .spec import Result, ToolSpec

MAX_RESULT_CHARS = 1_000_000   # JSON characters of one result, as answered and as stored
LONG_STRING = 10_000           # strings longer than this may be cut once lists cannot give more
MAX_PASSES = 64


def _size(value) -> int:
    return len(json.dumps(value, separators=(",", ":"), default=str))


def _measure(node, path: str, out: list) -> int:
    """JSON size of `node`; every list and long string goes to `out` as (size, path, parent, key)."""
    if isinstance(node, dict):
        total = 2
        for key, value in node.items():
            size = _measure(value, f"{path}.{key}" if path else str(key), out)
            if isinstance(value, (list, str)):
                out.append((size, f"{path}.{key}" if path else str(key), node, key))
            total += _size(str(key)) + 2 + size
        return total
    if isinstance(node, list):
        total = 2
        for i, value in enumerate(node):
            size = _measure(value, f"{path}[{i}]", out)
            if isinstance(value, (list, str)):
                out.append((size, f"{path}[{i}]", node, i))
            total += size + 1
        return total
    return _size(node)


def _cut(parent, key, excess: int) -> str:
    """Shorten parent[key] (a list or a string) by at least `excess` characters where it can; a note."""
    value = parent[key]
    if isinstance(value, str):
        keep = max(200, len(value) - excess - 100)
        parent[key] = value[:keep] + f"… [cut: {len(value)} characters]"
        return f"kept {keep} of {len(value)} characters"
    room, keep = _size(value) - excess - 200, 0
    for item in value:
        room -= _size(item) + 1
        if room < 0:
            break
        keep += 1
    keep = max(1, min(keep, len(value) - 1)) if len(value) > 1 else 0
    parent[key] = value[:keep]
    return f"kept {keep} of {len(value)} items"


def _trim(data: dict, limit: int) -> list[str]:
    notes: dict[str, str] = {}
    for _ in range(MAX_PASSES):
        found: list = []
        total = _measure(data, "", found)
        if total <= limit:
            break
        lists = [c for c in found if isinstance(c[2][c[3]], list) and len(c[2][c[3]]) > 1]
        strings = [c for c in found if isinstance(c[2][c[3]], str) and len(c[2][c[3]]) > LONG_STRING]
        candidates = lists or strings
        if not candidates:
            break
        _, path, parent, key = max(candidates, key=lambda c: c[0])
        notes.setdefault(path, _cut(parent, key, total - limit))
    return [f"{path}: {note}" for path, note in notes.items()]


def bound_data(data: dict, limit: int, what: str) -> tuple[dict, str | None]:
    """(data, None) when its JSON fits in `limit` characters; else (a trimmed copy, a note on what was cut).
    Plain JSON data, no model: the store applies it to every row whoever wrote it."""
    size = _size(data)
    if size <= limit:
        return data, None
    data = json.loads(json.dumps(data, default=str))
    cuts = _trim(data, limit - 2000)   # room for the note itself
    note = f"{what} cut to fit {limit} characters of JSON (it was {size}): " + "; ".join(cuts[:8])[:1500]
    return data, note


def bound_result(spec: ToolSpec, result: Result, limit: int = MAX_RESULT_CHARS) -> Result:
    """`result` if its JSON fits in `limit` characters; otherwise a trimmed copy that says what was cut."""
    data, note = bound_data(result.model_dump(mode="json"), limit, "Output")
    if note is None:
        return result
    note += ". Narrow the input (fewer files, ranks or groups) to see everything."
    data["findings"] = [*data.get("findings", [])[:50], note]
    try:
        trimmed = spec.Result.model_validate(data)
    except ValueError:
        trimmed = None
    if trimmed is None or _size(trimmed.model_dump(mode="json")) > limit:
        findings = [str(f)[:2000] for f in result.findings[:20]] + [note]
        trimmed = spec.Result(verdict=result.verdict, findings=findings, next=result.next[:20],
                              job=result.job, result_id=result.result_id)
    return trimmed
