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
