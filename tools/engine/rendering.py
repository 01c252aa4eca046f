"""How results and errors read to people: one formatter for the CLI and the MCP server alike."""

import json

from pydantic import BaseModel, ValidationError

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


ROW_TEXT_LIMIT = 2_000   # characters of the rows section of an answer's text; the store has every row
ROW_VALUE_LIMIT = 80     # a longer string in a row is prose already said in a finding (evidence, meaning)
ROW_QUOTE_LIMIT = 240    # the first line of a row's evidence list, quoted: what the verdict rests on


def answer_text(spec: ToolSpec, result: Result) -> str:
    """What an MCP host that reads a result's text hands the model: the human view, then the rows of the
    model view (answer_record) as one line each (short scalar values only), each fact once. Hosts that read the
    structured content instead get the model view there (Claude Code, VS Code and Copilot's CLI forward
    only structuredContent to the model; Claude Desktop and others only the text: docs/benchmarks.md)."""
    view = answer_record(result)
    text = format_result(spec, result, view)
    rows = _row_lines({k: v for k, v in view.items() if k not in type(result).whole_fields})   # given whole below
    shown, used = [], 0
    for line in rows:
        if used + len(line) > ROW_TEXT_LIMIT:
            break
        shown.append(line)
        used += len(line) + 1
    left = len(rows) - len(shown)
    more = [f"    ... {left} more row(s)" + (f" (results_history result_id={result.result_id})" if result.result_id
                                             else "")] if left else []
    lines = [text, "  rows:", *shown, *more] if shown else [text]
    lines += [f"  {name}: {json.dumps(value, ensure_ascii=False)}" for name, value in _whole_values(result)]
    if view.get("not_shown"):
        lines.append(f"  not shown: {view['not_shown']}")
    return "\n".join(lines)


def _whole_values(result: Result):
    """(name, value) of each `whole_fields` value of the result and of its top-level records (results_history's
    stored record, job_status's finished answer): asked for whole, so the text gives them whole, as JSON, less the
    verdict, findings and next steps the lines above already say."""
    places = [(result, "")] + [(getattr(result, name), f"{name}.") for name in type(result).model_fields
                              if isinstance(getattr(result, name), BaseModel)]
    for model, prefix in places:
        whole = getattr(type(model), "whole_fields", ())            # a plain BaseModel (JobRef) declares none
        # As JSON, not the live value: a whole field may hold records (pairwise's suspects), which json.dumps
        # below cannot write (a real model's pairwise answer was lost to that after 7 minutes of measuring).
        dumped = model.model_dump(mode="json", include=set(whole)) if whole else {}
        for name in whole:
            value = dumped[name]
            if isinstance(value, dict):
                value = {k: v for k, v in value.items() if not _said_above(result, k, v)}
            if _said(value):
                yield prefix + name, value


def _said_above(result: Result, key: str, value) -> bool:
    """Does the answer's own verdict, findings or next already say `value` (the record's `key`)?"""
    own = {"verdict": [result.verdict], "findings": result.findings, "next": result.next}.get(key)
    said = value if isinstance(value, list) else [value]
    return own is not None and all(item in own for item in said)


RECORD_STRING_LIMIT = 160   # a quoted log line or a paragraph of meaning, in the structured answer
RECORD_INNER_ITEMS = 1      # evidence lines and other lists of prose inside a row: the first
RECORD_INNER_NAMES = 64     # names and figures inside a row (a group's ranks, a link's two ends): up to this many,
#                             since a cut list of names reads as another answer (ranks [0] for ranks 0-2)


def answer_record(result: Result) -> dict:
    """The model view of a result: what a host that forwards structured content hands its model, and what the
    text's rows are drawn from. Findings and `next` whole; every other field unless its class lists it in
    `detail_fields` (a finding says it already, or it is bulk); inside rows no null or empty value, lists cut to
    their first RECORD_INNER_ITEMS (lists of names or figures: RECORD_INNER_NAMES) and strings to RECORD_STRING_LIMIT
    characters (marked), except `whole_fields`;
    a field without a default is always there (clients validate the answer against the output schema).
    Top-level fields stay even when null or empty (clients index them). `not_shown` names what was left out and
    the call that returns the stored record whole (results_history result_id=N). A result that is not stored
    (a tool with store=False, or a store that failed) keeps its detail fields: nothing else could return them."""
    data = result.model_dump(mode="json")
    view, dropped = _view(result, data, depth=0, stored=result.result_id is not None)
    if dropped:
        view["not_shown"] = f"{', '.join(sorted(dropped))}; whole: results_history result_id={result.result_id}"
    return view


def _view(model, data: dict, depth: int, stored: bool) -> tuple[dict, set[str]]:
    """`data` (model_dump of the pydantic model `model`) as the model view, and the names of what it left out
    (detail fields only when the result is `stored`)."""
    kind = type(model)
    detail = getattr(kind, "detail_fields", ()) if stored else ()     # a plain BaseModel (JobRef) declares none
    dropped = {name for name in detail if _said(data.get(name)) and not _at_default(kind, name, getattr(model, name))}
    view = {}
    for name, value in data.items():
        if name in detail:
            continue
        if depth == 0 and name in Result.model_fields:
            view[name] = value                                 # verdict, findings, next, job, result_id whole
        elif name in getattr(kind, "whole_fields", ()):
            view[name] = value
        else:
            lean, inner = _lean(getattr(model, name, None), value, depth + 1, stored)
            field = kind.model_fields.get(name)
            # The top level is the tool's contract: an empty `drain` says "none", and clients index it. Inside a
            # row an empty value says nothing, unless the output schema requires the field.
            if depth == 0 or _said(lean) or (field is not None and field.is_required()):
                view[name] = lean
            dropped |= {f"{name}.{n}" for n in inner}
    return view, dropped


def _lean(obj, value, depth: int, stored: bool):
    """One value of the model view: records through _view, lists inside rows cut, long strings cut."""
    if isinstance(value, str):
        return (value if len(value) <= RECORD_STRING_LIMIT else value[:RECORD_STRING_LIMIT] + "…[cut]"), set()
    if isinstance(obj, BaseModel) and isinstance(value, dict):
        return _view(obj, value, depth, stored)
    if isinstance(value, list):
        kept = value if depth < 2 else value[:RECORD_INNER_NAMES if _names(value) else RECORD_INNER_ITEMS]
        objs = obj if isinstance(obj, list) and len(obj) == len(value) else [None] * len(value)
        out, dropped = [], set()
        for o, v in zip(objs, kept):
            lean, inner = _lean(o, v, depth + 1, stored)
            out.append(lean)
            dropped |= inner
        return out, dropped
    if isinstance(value, dict):
        objs = obj if isinstance(obj, dict) else {}
        out, dropped = {}, set()
        for k, v in value.items():
            lean, inner = _lean(objs.get(k), v, depth + 1, stored)
            if _said(lean):
                out[k] = lean
            dropped |= inner
        return out, dropped
    return value, set()


def _names(values: list) -> bool:
    """Only short scalars (node names, ranks, figures, None): an identity or a row of figures, not prose."""
    return all(v is None or isinstance(v, (int, float, bool)) or (isinstance(v, str) and len(v) <= ROW_VALUE_LIMIT)
               for v in values)


def _at_default(kind, name: str, value) -> bool:
    """Is `value` the default of the field `name` of the model class `kind` (0 lines omitted: nothing to name)?"""
    field = kind.model_fields[name]
    return not field.is_required() and value == field.get_default(call_default_factory=True)


def _said(value) -> bool:
    """Does `value` say anything (not null, not an empty string, list or map)?"""
    return value is not None and value != "" and value != [] and value != {}


def _row_lines(view: dict) -> list[str]:
    lines = []
    for name, value in view.items():
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


def format_result(spec: ToolSpec, result: Result, view: dict | None = None) -> str:
    """Human view: verdict, findings, the tool's scalar figures (those of the model view `view` when given), and
    where to go next."""
    lines = [f"{spec.name}: {VERDICT_MARK[result.verdict].strip()}"]
    lines += [f"  - {f}" for f in result.findings]
    fields = result.model_dump(mode="json") if view is None else view
    scalars = {k: v for k, v in fields.items()
               if k not in Result.model_fields and isinstance(v, (int, float, str, bool)) and v != ""}
    if scalars:
        lines.append("  figures:")
        lines += [f"    {k}: {v}" for k, v in scalars.items()]
    if result.next:
        lines.append("  next: " + ", ".join(result.next))
    if result.result_id and not (view or {}).get("not_shown"):    # not_shown says where the stored record is
        lines.append(f"  stored as result #{result.result_id} (mleng run results_history --tool {spec.name})")
    return "\n".join(lines)
