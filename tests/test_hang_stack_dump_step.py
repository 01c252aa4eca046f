"""The per-node reports of hang_stack_dump's all-nodes step, read as srun hands them over: srun --label cuts a line
longer than 1 kB into labelled pieces (measured on the namespace cluster: a 3,000-byte line came as 1,024 + 1,024
+ 952). Model round 11 (cl-straggler-loader): with native=true every node's report had such a line (a C++ frame),
every node read as "no report (exit 0)", and the headline said "that node is where to look first" of all four."""

from __future__ import annotations

import json

from tools.engine.transport import NodeEnd
from tools.hang_stack_dump.stacks import ProcessStack
from tools.hang_stack_dump.step import dump_nodes

SRUN_PIECE_BYTES = 1024


class SrunLikeTransport:
    """Hands each node's indented JSON report on as srun --label does: lines over 1 kB in pieces."""

    def __init__(self, reports: dict[str, str]):
        self.reports = reports

    def run_step(self, nodes, argv, deadline_s, on_line):
        for node in nodes:
            for line in self.reports[node].split("\n"):
                for at in range(0, max(len(line), 1), SRUN_PIECE_BYTES):
                    on_line(node, line[at:at + SRUN_PIECE_BYTES])
        return {n: NodeEnd(node=n, how="exited", code=0, said="Completed") for n in nodes}


def _report(rank: int) -> str:
    native = "0x7f6d8eca3f16 (libc.so.6) " + "std::__cxx11::basic_string<char>::" * 60     # ~2 kB, one frame
    proc = ProcessStack(pid=100 + rank, host="somewhere-else", rank=rank, command="python -m train" + " --x" * 400,
                        stack=[native, "main (train.py:170)"], called_from="main (train.py:170)")
    return json.dumps({"verdict": "info", "processes": [proc.model_dump()], "left_out": []}, indent=1)


def test_reports_with_lines_over_a_kilobyte_are_read_whole_and_credited_to_the_node_reached():
    transport = SrunLikeTransport({"mln1": _report(0), "mln2": _report(1)})
    procs, problems, silent, left_out = dump_nodes(transport, ["mln1", "mln2"], ["x"], 30.0, lambda *a: None, "by srun")
    assert (problems, silent, left_out) == ([], [], [])
    assert sorted((p.host, p.rank) for p in procs) == [("mln1", 0), ("mln2", 1)]
    assert len(procs[0].stack[0]) > SRUN_PIECE_BYTES and procs[0].command.endswith("--x")
