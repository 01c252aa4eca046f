"""How results and errors read to people: one formatter for the CLI and the MCP server alike."""

from pydantic import ValidationError

from .spec import Result, ToolSpec

VERDICT_MARK = {"ok": "OK  ", "warn": "WARN", "fail": "FAIL", "info": "INFO"}
QUOTE_LIMIT = 80   # characters of a bad value an error message repeats: a 10 MB input is not echoed back


def short_repr(value, limit: int = QUOTE_LIMIT) -> str:
    """repr(value), cut to `limit` characters with a note of how long it was."""
    text = repr(value)
    if len(text) <= limit:
        return text
    return f"{text[:limit]}… ({len(text)} characters)"


def clip(text: str, width: int) -> str:
    """text in at most `width` characters, cut at a word with an ellipsis (never mid-word)."""
    if len(text) <= width:
        return text
    cut = text[:width - 1].rsplit(" ", 1)[0].rstrip(" ,;:")
    return cut + "…"


def validation_problems(e: ValidationError, flag_style: bool = False) -> list[str]:
    """One line per problem: the field (as --flag-name for the CLI), what is wrong, a short prefix of the value."""
    lines = []
    for err in e.errors():
        msg = err["msg"].removeprefix("Value error, ").removeprefix("Assertion failed, ")
        if not err["loc"]:   # a rule across fields: its message names them; the input is all the arguments
            lines.append(msg)
            continue
        where = ".".join(str(x) for x in err["loc"])
        if flag_style:
            where = "--" + where.replace("_", "-")
        got = f" (got {short_repr(err['input'])})" if "input" in err else ""
        lines.append(f"{where}: {msg}{got}")
    return lines


def validation_message(spec: ToolSpec, *errors: ValidationError) -> str:
    return f"invalid arguments for {spec.name}: " + "; ".join(p for e in errors for p in validation_problems(e))


ROW_TEXT_LIMIT = 2_000   # characters of the rows section of an answer's text; the record has every row
ROW_VALUE_LIMIT = 80     # a longer string in a row is prose already said in a finding (evidence, meaning)
ROW_QUOTE_LIMIT = 240    # the first line of a row's evidence list, quoted: what the verdict rests on


def answer_text(spec: ToolSpec, result: Result) -> str:
    """What an MCP host that reads a result's text hands the model: the human view, then the rows of the
    result's lists as one line each (short scalar values only), each fact once. Hosts that read the
    structured content instead get the whole record there (Claude Code, VS Code and Copilot's CLI forward
    only structuredContent to the model; Claude Desktop and others only the text: docs/benchmarks.md)."""
    text = format_result(spec, result)
    rows = _row_lines(result)
    if not rows:
        return text
    shown, used = [], 0
    for line in rows:
        if used + len(line) > ROW_TEXT_LIMIT:
            break
        shown.append(line)
        used += len(line) + 1
    left = len(rows) - len(shown)
    more = [f"    ... {left} more row(s) in the structured result"] if left else []
    return "\n".join([text, "  rows:", *shown, *more])


RECORD_STRING_LIMIT = 160   # a quoted log line or a paragraph of meaning, in the structured answer
RECORD_INNER_ITEMS = 1      # evidence lines and other lists inside a row: the first


def answer_record(result: Result) -> dict:
    """The structured content of an answer: the whole result (null fields kept: clients index them), with long quoted text
    and the lists inside rows cut (the first RECORD_INNER_ITEMS; a string at RECORD_STRING_LIMIT
    characters, marked). Findings, `next` and every row stay whole; the record as stored keeps everything
    (results_history returns it by result id). Hosts that forward structured content forward it alone,
    so this is what their model reads."""
    data = result.model_dump(mode="json")
    return {k: v if k in ("findings", "next") else _lean(v, depth=0) for k, v in data.items()}


def _lean(value, depth: int):
    if isinstance(value, str):
        return value if len(value) <= RECORD_STRING_LIMIT else value[:RECORD_STRING_LIMIT] + "…[cut]"
    if isinstance(value, list):
        kept = value if depth < 2 else value[:RECORD_INNER_ITEMS]
        return [_lean(v, depth + 1) for v in kept]
    if isinstance(value, dict):
        return {k: _lean(v, depth + 1) for k, v in value.items()}
    return value


def _row_lines(result: Result) -> list[str]:
    lines = []
    for name, value in result.model_dump(mode="json", exclude_none=True).items():
        if name in Result.model_fields:
            continue
        items = value if isinstance(value, list) else [value] if isinstance(value, dict) else []
        for k, item in enumerate(items):
            if isinstance(item, dict):
                cells = [f"{key}={_cell(v)}" for key, v in item.items() if _is_short_scalar(v)]
                cells += [f"{key}[0]={_quote(v[0])}" for key, v in item.items()      # the first evidence line
                          if key != "next" and isinstance(v, list) and v and isinstance(v[0], str) and v[0]]
                if cells:
                    lines.append(f"    {name}[{k}]: " + ", ".join(cells) if isinstance(value, list)
                                 else f"    {name}: " + ", ".join(cells))
    return lines


def _is_short_scalar(value) -> bool:
    return (isinstance(value, (int, float, bool)) or
            (isinstance(value, str) and value != "" and len(value) <= ROW_VALUE_LIMIT))


def _quote(text: str) -> str:
    return repr(text if len(text) <= ROW_QUOTE_LIMIT else text[:ROW_QUOTE_LIMIT] + "…")


def _cell(value) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def format_result(spec: ToolSpec, result: Result) -> str:
    """Human view: verdict, findings, the tool's scalar figures, and where to go next."""
    lines = [f"{spec.name}: {VERDICT_MARK[result.verdict].strip()}"]
    lines += [f"  - {f}" for f in result.findings]
    scalars = {k: v for k, v in result.model_dump(mode="json").items()
               if k not in Result.model_fields and isinstance(v, (int, float, str, bool)) and v != ""}
    if scalars:
        lines.append("  figures:")
        lines += [f"    {k}: {v}" for k, v in scalars.items()]
    if result.next:
        lines.append("  next: " + ", ".join(result.next))
    if result.result_id:
        lines.append(f"  stored as result #{result.result_id} (mleng run results_history --tool {spec.name})")
    return "\n".join(lines)
