"""A job whose output is one of our own tools' answers (`python -m mleng.<tool> --json` in an sbatch script, or
the human view): that tool's verdict and findings are what the job found, and its exit code says that verdict
(the CLI exits 3 for "fail", 0 otherwise), not a crash with "no known failure signature".

Recognised by shape only, never run: the JSON object printed last whose keys are exactly one tool's Result
fields, or the human view's "<tool>: FAIL" line followed by "  - " findings. The job's output is the job
owner's text: findings are repeated as the job wrote them (cut, secrets redacted), and a report that names a
stored result is said to match it only when the store (ours) holds that id for the same tool and verdict.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from ..engine.redact import redact
from ..engine.rendering import VERDICT_MARK
from ..shared.safe_read import read_tail

REPORT_BYTES = 4 * 1024 * 1024      # the end of the job's output, where the CLI printed its answer
MAX_FINDINGS, MAX_CHARS = 12, 600   # what is repeated of the job's own words
EXIT_OF = {"fail": 3, "ok": 0, "warn": 0, "info": 0}   # tools/engine/cli.py run_tool_cli


@dataclass
class ToolReport:
    tool: str
    verdict: str
    findings: list[str]
    next: list[str] = field(default_factory=list)
    result_id: int | None = None
    path: str = ""

    def explains(self, exit_code: int | None) -> bool:
        """The job's exit code is the one the CLI gives for this verdict."""
        return exit_code == EXIT_OF[self.verdict]


def words(items, limit: int) -> list[str]:
    return [redact(item[:MAX_CHARS]) for item in items if isinstance(item, str)][:limit]


def result_fields() -> dict[frozenset, str]:
    """Each tool's set of Result fields (what `--json` prints) -> the tool; sets two tools share are left out."""
    from ..engine.registry import registry

    seen: dict[frozenset, list[str]] = {}
    for name, spec in registry().items():
        seen.setdefault(frozenset(spec.Result.model_fields), []).append(name)
    return {keys: names[0] for keys, names in seen.items() if len(names) == 1}


def from_json(text: str) -> ToolReport | None:
    """The last top-level JSON object in `text` (the CLI prints it with "{" alone on a line) as a report."""
    start = text.rfind("\n{\n") + 1 if "\n{\n" in text else (0 if text.startswith("{\n") else -1)
    if start < 0:
        return None
    try:
        data, _ = json.JSONDecoder().raw_decode(text, start)
    except (ValueError, RecursionError):
        return None
    if not isinstance(data, dict) or data.get("verdict") not in EXIT_OF:
        return None
    tool = result_fields().get(frozenset(data))
    if tool is None:
        return None
    rid = data.get("result_id")
    return ToolReport(tool, data["verdict"], words(data.get("findings") or [], MAX_FINDINGS),
                      words(data.get("next") or [], 20), rid if isinstance(rid, int) else None)


def from_text(text: str) -> ToolReport | None:
    """The human view (tools/engine/rendering.py format_result): "<tool>: FAIL", "  - finding" lines,
    "  next: a, b", "  stored as result #N (...)"."""
    from ..engine.registry import registry

    marks = {mark.strip(): verdict for verdict, mark in VERDICT_MARK.items()}
    lines = text.splitlines()
    names = None
    for i in range(len(lines) - 1, -1, -1):
        tool, sep, mark = lines[i].partition(": ")
        if not sep or mark not in marks or not tool.isidentifier():
            continue
        names = names or set(registry())
        if tool in names:
            return _text_report(tool, marks[mark], lines[i + 1:])
    return None


def _text_report(tool: str, verdict: str, rest: list[str]) -> ToolReport:
    findings, nxt, rid = [], [], None
    for line in rest:
        if line.startswith("  - "):
            findings.append(line[4:])
        elif line.startswith("  next: "):
            nxt = line[8:].split(", ")
        elif line.startswith("  stored as result #"):
            number = line[len("  stored as result #"):].split(" ")[0]
            rid = int(number) if number.isdigit() else None
        elif not line.startswith("    ") and line != "  figures:":
            break
    return ToolReport(tool, verdict, words(findings, MAX_FINDINGS), words(nxt, 20), rid)


def find_report(paths: list[Path]) -> ToolReport | None:
    """The first of the job's output files whose end is one of our tools' answers."""
    for path in paths:
        try:
            text = read_tail(path, REPORT_BYTES).decode("utf-8", "replace")
        except OSError:
            continue
        report = from_json(text) or from_text(text)
        if report:
            report.path = str(path)
            return report
    return None


def stored_match(report: ToolReport) -> int | None:
    """The report's result id when our store holds that result for the same tool and verdict."""
    from ..engine.store import stored_result

    if report.result_id is None:
        return None
    row = stored_result(report.result_id)
    return report.result_id if row and row["tool"] == report.tool and row["verdict"] == report.verdict else None


def report_findings(report: ToolReport, info: dict) -> tuple[str, list[str], list[str]]:
    """(verdict, findings, next) when the job's exit code is the report's verdict: the tool's answer first."""
    code = info.get("exit_code")
    why = (f" (exit code {code} is {report.tool}'s \"fail\" verdict, not a crash)" if report.verdict == "fail"
           else "")
    first = report.findings[0] if report.findings else "(no findings)"
    stored = stored_match(report)
    head = (f"Job {info['job_id']} ({info.get('name') or '?'}) ran {report.tool}, which answered verdict "
            f"{report.verdict}{why}: {first}")
    lines = [head, *(f"{report.tool}: {f}" for f in report.findings[1:])]
    lines.append(f"That is {report.tool}'s own report, read from {report.path}"
                 + (f"; stored as result #{stored} (results_history result_id={stored} shows it)." if stored else "."))
    return report.verdict, lines, [*report.next, *(["results_history"] if stored else [])]
