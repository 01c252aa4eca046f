"""One light `straggler_find.node` per node, all at once, through a node transport (engine/transport.py):
srun inside a SLURM job (slurm_job.py) or ssh to a host list (ssh_job.py); the step is the same either way.

Each node prints one JSON report when its window ends. A report is credited to the node the transport
started that part on: every host name in it is replaced by that name, whatever the node wrote. srun --label
cuts a long line into labelled pieces, so a node's pieces are joined until they parse.
"""

from __future__ import annotations

import json

from .models import NodeReport
from ..engine.processes import python_module_command
from ..engine.transport import Transport

LATE_S = 90          # past the window: py-spy's start, the node's imports, the transport's connection
MAX_REPORT_CHARS = 8_000_000   # a node's report, pieces joined: far above 64 ranks' worth


def credited(report: NodeReport, host: str) -> NodeReport:
    """The report with `host` (the transport's name for the node) in every place a host is named, and
    before each of its refusals and errors."""
    report.host = report.node.host = host
    for row in [*report.ranks, *report.gpus, *report.flight]:
        row.host = host
    # what the node left out or could not do is said with the host's name, as the findings quote it alone
    report.node.refused = [f"{host}: {line}" for line in report.node.refused]
    report.node.errors = [f"{host}: {line}" for line in report.node.errors]
    return report


def sample_nodes(transport: Transport, nodes: list[str], spec: dict, progress,
                 silent_hint: str = "") -> tuple[list[NodeReport], list[str]]:
    """Every node's report, and what went wrong on the way (a node unreachable, silent, or without a report).
    `silent_hint`: where to look when a node said nothing by the deadline (the launcher's own commands)."""
    reports: dict[str, NodeReport] = {}
    pending: dict[str, str] = {}

    def on_line(node: str, line: str) -> None:
        if node in reports:
            return
        joined = pending.get(node, "") + line
        for text in dict.fromkeys((joined, line)):     # the pieces so far, or this line alone (after a stray one)
            try:
                report = NodeReport(**json.loads(text))
                break
            except (ValueError, TypeError):
                continue
        else:
            pending[node] = joined[:MAX_REPORT_CHARS]
            return
        pending.pop(node, None)
        reports[node] = credited(report, node)
        progress(0.1 + 0.8 * len(reports) / len(nodes), f"{node}: " + node_line(report))

    deadline_s = float(spec["window_s"]) + LATE_S
    ends = transport.run_step(nodes, python_module_command("straggler_find.node", json.dumps(spec)), deadline_s,
                              on_line)
    problems = []
    for node in nodes:
        end = ends[node]
        if node in reports:
            continue
        if end.how == "unreachable":
            problems.append(f"{node}: no report: {end.why.removeprefix(node + ': ')}")
        elif end.how == "silent":
            problems.append(f"{node}: no report within {deadline_s:.0f} s (the host froze, or its sampler hung): "
                            "its ranks could not be compared" + (f" ({silent_hint})" if silent_hint else ""))
        else:
            said = pending.get(node, "")[:160] or end.stderr_tail.strip()[-300:] or end.said or "no output"
            problems.append(f"{node}: no report (the sampler exited {end.code}): {said!r}")
    return [reports[n] for n in nodes if n in reports], problems


def node_line(report: NodeReport) -> str:
    """One progress row per node: each rank's waiting and working shares."""
    parts = []
    for r in report.ranks:
        if r.error:
            parts.append(f"rank {r.rank} not sampled ({r.error[:80]})")
        else:
            f = r.fractions
            parts.append(f"rank {r.rank}: collective {f.get('collective', 0):.0%}, compute {f.get('compute', 0):.0%}, "
                         f"data {f.get('data', 0):.0%} ({r.samples} samples)")
    return "; ".join(parts) or "; ".join(report.node.errors) or "no rank"
