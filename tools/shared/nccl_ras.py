"""The text report of NCCL's RAS client (`ncclras`, NCCL >= 2.24): who is missing, who is behind.

Reads the 'Job summary', the 'Communicators' table (Group, Comms, Nodes, Ranks..., Status, Errors) and the
Errors / Warnings blocks: INCOMPLETE (ranks or processes that sent no data: dead, hung hard, or unreachable)
and MISMATCH ('30 ranks have launched up to operation 640 / 2 ranks ... 641' then the named ranks). An OK
report does not clear a hang: RAS sees NCCL's state, not a rank stuck outside NCCL (NVIDIA/nccl#1730).
"""

import re

from ..engine.spec import Field, Record
from .logscan import capped_lines

VERSION = re.compile(r"NCCL version (\d+\.\d+\.\d+)")
GROUP_ROW = re.compile(r"^\s*(\d+)\s+(\d+)\s+(\d+)\s+(\d+)\s+(\d+)\s+(\d+)\s+([A-Z]+)\s+([A-Z,]+)\s*$")
BLOCK = re.compile(r"^#(\d+)-(\d+) \(([0-9a-f]+)\) ([A-Z,]+)\s*$")
LAUNCHED = re.compile(r"(?<!\d)(\d+) ranks? ha(?:s|ve) (launched|completed) up to operation (\d+)")
OP_COUNTS = re.compile(r"different (\w+) operation counts")
RANK_LINE = re.compile(r"Rank (\d+) -- GPU (\d+) managed by process (\d+) on node (\S+)")
PROC_LINE = re.compile(r"Process (\d+) on node (\S+) managing GPU (\d+)")
MISSING = re.compile(r"Missing communicator data from (\d+) (rank|job process)")


class RasGroup(Record):
    group: int
    ranks: int = Field(description="Ranks per communicator.")
    status: str = Field(description="RUNNING, NOCOMM, ...")
    errors: str = Field(description="OK, MISMATCH, INCOMPLETE, ... (comma separated).")


class RasReport(Record):
    version: str | None = None
    groups: list[RasGroup] = Field(default_factory=list)
    problems: list[str] = Field(default_factory=list, description="One sentence per error / warning block.")
    named: list[str] = Field(default_factory=list, description="'rank 12 (GPU 4, pid 323032, node 10.137.190.124)'.")


def looks_like_ras(text: str) -> bool:
    return "Communicators" in text and "Job summary" in text and "Group" in text


def parse(text: str) -> RasReport:
    rep = RasReport()
    if m := VERSION.search(text):
        rep.version = m.group(1)
    for line in capped_lines(text, last=True):
        if m := GROUP_ROW.match(line):
            rep.groups.append(RasGroup(group=int(m.group(1)), ranks=int(m.group(5)), status=m.group(7),
                                       errors=m.group(8)))
    for block in _blocks(text):
        rep.problems.append(_describe(block))
        rep.named += [f"rank {r} (GPU {g}, pid {p}, node {n})" for r, g, p, n in RANK_LINE.findall(block)]
        rep.named += [f"process {p} (GPU {g}, node {n})" for p, n, g in PROC_LINE.findall(block)]
    rep.named = list(dict.fromkeys(rep.named))
    return rep


def _blocks(text: str) -> list[str]:
    """Error and warning blocks: from a '#G-C (hash) KIND' or a bare 'INCOMPLETE' line to the next blank line."""
    out, cur = [], []
    for line in capped_lines(text, last=True):
        starts = BLOCK.match(line.strip()) or line.strip() in ("INCOMPLETE", "MISMATCH", "TIMEOUT", "ERROR")
        if starts:
            if cur:
                out.append("\n".join(cur))
            cur = [line.strip()]
        elif cur and line.strip():
            cur.append(line.strip())
        elif cur:
            out.append("\n".join(cur)); cur = []
    if cur:
        out.append("\n".join(cur))
    return out


def _describe(block: str) -> str:
    head = block.splitlines()[0]
    if m := MISSING.search(block):
        who = "ranks" if m.group(2) == "rank" else "processes"
        return (f"{head}: {m.group(1)} {who} sent no state to RAS (dead, hung outside NCCL's reach, or "
                f"unreachable); they are the suspects")
    counts = LAUNCHED.findall(block)
    if counts:
        op = (OP_COUNTS.search(block) or [None, "collective"])[1]
        parts = ", ".join(f"{n} at {kind} op {o}" for n, kind, o in counts)
        lowest = min(int(o) for _, _, o in counts)
        behind = sum(int(n) for n, _, o in counts if int(o) == lowest)
        listed = len(RANK_LINE.findall(block))
        return (f"{head}: {op} counts differ ({parts}); the {behind} rank(s) at op {lowest} are behind: look at "
                f"what they are doing (hang_stack_dump)" + (f"; RAS lists the {listed} rank(s) of the smaller group"
                                                             if listed else ""))
    return f"{head}: " + " ".join(block.splitlines()[1:3])
