"""Every host of a job launched without SLURM (torchrun over ssh), dumped at once through the SSH transport.

Each host runs the same per-node dump as under SLURM (`hang_stack_dump --run-id ... --json`, or
--launcher-match), which keeps only the caller's processes of that run on that host (shared/process_targets/
runs.py). The transport reads each host's answer on its own connection: every process in it is credited to
the host that connection reached, whatever host name the node wrote.
"""

import json

from .stacks import ProcessStack
from ..engine.spec import ToolFailure
from ..engine.transport import SshTransport, node_set

MAX_HOSTS = 64
NOTHING_THERE = "no process matched"     # the per-node dump's own failure when no target is found (run())
MAX_REPORT_LINES = 200_000      # a node's JSON report, indented one field a line: far above 1024 processes' worth


def hosts_of(hosts: list[str]) -> list[str]:
    """Plain host names from the caller's node sets, at most MAX_HOSTS; ToolFailure saying what is wrong."""
    try:
        return node_set(hosts, limit=MAX_HOSTS)
    except ValueError as e:
        raise ToolFailure(f"hosts: {e} (hang_stack_dump reaches at most {MAX_HOSTS} hosts at once)") from None


def dump_hosts(nodes: list[str], argv: list[str], per_process_timeout_s: float,
               progress) -> tuple[list[ProcessStack], list[str], list[str], list[str]]:
    """(processes, problems, hosts that sent no report, processes the hosts left out), as run_all_nodes."""
    lines: dict[str, list[str]] = {n: [] for n in nodes}

    def on_line(node: str, line: str) -> None:
        if len(lines[node]) < MAX_REPORT_LINES:
            lines[node].append(line)

    deadline_s = per_process_timeout_s * 4 + 60
    progress(0.1, f"dumping on {len(nodes)} host(s) over ssh")
    ends = SshTransport().run_step(nodes, argv, deadline_s, on_line)
    procs, problems, silent, left_out = [], [], [], []
    for node in nodes:
        end, text = ends[node], "\n".join(lines[node])
        try:
            doc = json.loads(text[text.index("{"):])
            found = [ProcessStack(**p) for p in doc.get("processes", [])]
        except (ValueError, TypeError):
            silent.append(node)
            if end.how == "unreachable":
                problems.append(f"{node}: no report: {end.why.removeprefix(node + ': ')}")
            elif end.how == "silent":
                problems.append(f"{node}: no report within {deadline_s:.0f} s (the host froze, or the dump hung)")
            else:
                said = " | ".join(x.strip() for x in end.stderr_tail.splitlines()[-3:] if x.strip())
                if NOTHING_THERE in said:          # it answered: the job has no process of the caller's there
                    silent.pop()
                    problems.append(f"{node}: none of the job's processes found there ({said[-600:]})")
                    continue
                problems.append(f"{node}: no report (exit {end.code})" + (f"; it said: {said[-400:]}" if said else ""))
            continue
        for p in found:
            p.host = node                       # the connection's host, not the one the node wrote
        procs += found
        left_out += [f"{node}: {line}" for line in doc.get("left_out", [])]
    return procs, problems, silent, left_out
