"""A job launched without SLURM (torchrun over ssh), sampled on every host at once through the SSH transport.

The same per-node sampler as under SLURM (`straggler_find.node`) runs on each host over ssh
(engine/transport.py: BatchMode, known host keys only, argv quoted once), and finds the job's ranks there by
torchrun's rendezvous id or the launcher's command line, keeping only the caller's own processes
(shared/process_targets/runs.py). A report is credited to the host whose connection it came on: every host
name in it is replaced by that name, whatever the node wrote.
"""

import json

from .models import NodeReport
from .slurm_job import node_line
from ..engine.processes import python_module_command
from ..engine.spec import ToolFailure
from ..engine.transport import SshTransport, node_set

MAX_HOSTS = 64
LATE_S = 90          # past the window: py-spy's start, the node's imports, ssh's connection


def hosts_of(hosts: list[str]) -> list[str]:
    """Plain host names from the caller's node sets, at most MAX_HOSTS; ToolFailure saying what is wrong."""
    try:
        return node_set(hosts, limit=MAX_HOSTS)
    except ValueError as e:
        raise ToolFailure(f"hosts: {e} (straggler_find samples at most {MAX_HOSTS} hosts at once)") from None


def credited(report: NodeReport, host: str) -> NodeReport:
    """The report with `host` (the transport's name for the connection) in every place a host is named, and
    before each of its refusals and errors."""
    report.host = report.node.host = host
    for row in [*report.ranks, *report.gpus, *report.flight]:
        row.host = host
    # what the node left out or could not do is said with the host's name, as the findings quote it alone
    report.node.refused = [f"{host}: {line}" for line in report.node.refused]
    report.node.errors = [f"{host}: {line}" for line in report.node.errors]
    return report


def sample_hosts(hosts: list[str], spec: dict, progress) -> tuple[list[NodeReport], list[str]]:
    """Every host's report, and what went wrong on the way (a host unreachable, silent, or without a report)."""
    nodes = hosts_of(hosts)
    named = f"run {spec['run_id']}" if spec.get("run_id") else f"the job launched by {spec['launcher_match']!r}"
    progress(0.05, f"sampling {named} on {len(nodes)} host(s) over ssh for {spec['window_s']:.0f} s")
    reports: dict[str, NodeReport] = {}
    unreadable: dict[str, str] = {}

    def on_line(node: str, line: str) -> None:
        try:
            report = NodeReport(**json.loads(line))
        except (ValueError, TypeError):
            unreadable[node] = line[:160]
            return
        reports[node] = credited(report, node)
        progress(0.1 + 0.8 * len(reports) / len(nodes), f"{node}: " + node_line(report))

    deadline_s = float(spec["window_s"]) + LATE_S
    ends = SshTransport().run_step(nodes, python_module_command("straggler_find.node", json.dumps(spec)),
                                   deadline_s, on_line)
    problems = []
    for node in nodes:
        end = ends[node]
        if node in reports:
            continue
        if end.how == "unreachable":
            problems.append(f"{node}: no report: {end.why.removeprefix(node + ': ')}")
        elif end.how == "silent":
            problems.append(f"{node}: no report within {deadline_s:.0f} s (the host froze, or its sampler hung): "
                            "its ranks could not be compared")
        else:
            said = unreadable.get(node) or end.stderr_tail.strip()[-300:] or "no output"
            problems.append(f"{node}: no report (the sampler exited {end.code}): {said!r}")
    return [reports[n] for n in nodes if n in reports], problems
