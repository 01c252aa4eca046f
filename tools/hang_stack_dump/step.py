"""Every node of a stuck job dumped at once through a node transport (engine/transport.py): srun inside a SLURM
job (slurm_job.py) or ssh to a host list (ssh_hosts.py); the step is the same either way.

Each node runs the per-node dump (`hang_stack_dump --slurm-job-id ID --json`, or --run-id / --launcher-match
over ssh), which keeps only the caller's processes of that job on that node (shared/process_targets). Its
answer is read from the node the transport started it on: every process in it is credited to that node,
whatever host name the node wrote.
"""

import json

from .stacks import ProcessStack
from ..engine.transport import Transport

NOTHING_THERE = "no process matched"     # the per-node dump's own failure when no target is found (run())
MAX_REPORT_LINES = 200_000      # a node's JSON report, indented one field a line: far above 1024 processes' worth


def dump_nodes(transport: Transport, nodes: list[str], argv: list[str], per_process_timeout_s: float, progress,
               how: str, silent_hint: str = "") -> tuple[list[ProcessStack], list[str], list[str], list[str]]:
    """(processes, problems, nodes that sent no report, processes the nodes left out). `how`: the transport in
    the progress line ("over ssh"); `silent_hint`: where to look when a node said nothing by the deadline."""
    lines: dict[str, list[str]] = {n: [] for n in nodes}

    def on_line(node: str, line: str) -> None:
        if len(lines[node]) < MAX_REPORT_LINES:
            lines[node].append(line)

    deadline_s = per_process_timeout_s * 4 + 60
    progress(0.1, f"dumping on {len(nodes)} node(s) {how}")
    ends = transport.run_step(nodes, argv, deadline_s, on_line)
    procs, problems, silent, left_out = [], [], [], []
    for node in nodes:
        # Joined with nothing between: srun --label cuts a line at 1 kB into labelled pieces (a native frame's C++
        # name, a long command line: every node "no report (exit 0)" in model round 11), and the newlines of the
        # indented report fall between JSON tokens, where none is needed.
        end, text = ends[node], "".join(lines[node])
        try:
            doc, _ = json.JSONDecoder().raw_decode(text[text.index("{"):])
            found = [ProcessStack(**p) for p in doc.get("processes", [])]
        except (ValueError, TypeError):
            silent.append(node)
            if end.how == "unreachable":
                problems.append(f"{node}: no report: {end.why.removeprefix(node + ': ')}")
            elif end.how == "silent":
                problems.append(f"{node}: no report within {deadline_s:.0f} s (the host froze, or the dump hung)"
                                + (f" ({silent_hint})" if silent_hint else ""))
            else:
                said = " | ".join(x.strip() for x in end.stderr_tail.splitlines()[-3:] if x.strip())
                if NOTHING_THERE in said:          # it answered: the job has no process of the caller's there
                    silent.pop()
                    problems.append(f"{node}: none of the job's processes found there ({said[-600:]})")
                    continue
                status = end.code if end.code is not None else end.said or "unknown"
                problems.append(f"{node}: no report (exit {status})" + (f"; it said: {said[-400:]}" if said else ""))
            continue
        for p in found:
            p.host = node                       # the node the transport reached, not the one the node wrote
        procs += found
        left_out += [f"{node}: {line}" for line in doc.get("left_out", [])]
    return procs, problems, silent, left_out
