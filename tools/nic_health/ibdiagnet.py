"""Pasted `ibdiagnet` output -> which of its checks found errors or warnings (the "Summary" table), and each port
whose error counter rose during ibdiagnet's run, judged by the same counter table as a node's ports.

ibdiagnet (NVIDIA UFM / MLNX_OFED) sweeps the whole fabric, so this is nic_health's only reader whose subjects are
other machines' ports: each is named as ibdiagnet prints it (node description or GUIDs, then port). Formats as
ibdiagnet2 prints them (read 2026-12-01): the Summary table
    -I- Stage                     Warnings   Errors     Comment
    -I- Discovery                 3          0
(kobibar/OpenAI.recipe.old, an NVIDIA deployment recipe) and the per-port counter lines
    r9i1n24/U1/P1 - "port_rcv_remote_physical_errors" increased during the run (difference value=117,difference allowed threshold=1)
(NVIDIA's fabrics as quoted by NCAR/ops_tracking_toolkit opstt/ib_diagnostics.py), under a "-E- " or "-W- " prefix in
the log. "increased during the run" is a change over ibdiagnet's own window, so it is judged as nic_health judges a
counter that rises while it watches (knowledge/data/nic_health.toml [rdma_counter] on_rise).
"""

from __future__ import annotations

import re

from ..engine.spec import Field, Record
from ..shared.actions import HealthFinding
from ..shared.pasted_numbers import count, lines_of

SUMMARY_HEADER = re.compile(r"^\s*-I-\s+Stage\s+Warnings\s+Errors")
STAGE = re.compile(r"^\s*-I-\s+(\S[\w /\-]*?\S)\s{2,}(\d+)\s+(\d+)\s*(.*)$")
ROSE = re.compile(r'^\s*(?:-[EWI]-\s+)?(\S+)\s+-\s+"(\w+)"\s+increased during the run\s+\(difference value=(\d+)'
                  r'(?:,\s*difference allowed threshold=(\d+))?')
MAX_STAGES = 200         # Summary rows: ibdiagnet prints about 15 checks
MAX_ROSE = 10_000        # ports whose counter rose, judged one by one (1.4 s for 8,000 on a loaded 2-core VM)
# ibdiagnet's counter names -> the kernel's names used by the [rdma_counter] table.
COUNTER_NAMES = {"symbol_error_counter": "symbol_error", "link_error_recovery_counter": "link_error_recovery",
                 "link_down_counter": "link_downed", "port_xmit_discard": "port_xmit_discards",
                 "port_xmit_discards": "port_xmit_discards", "vl15_dropped": "VL15_dropped"}



class FabricCheck(Record):
    stage: str = Field(description="ibdiagnet check (Discovery, Links Check, Port Counters, Speed / Width checks ...).")
    warnings: int = Field(description="Warnings the check reported.")
    errors: int = Field(description="Errors the check reported.")
    comment: str = Field("", description="ibdiagnet's comment, if any.")


def parse(text: str) -> tuple[list[FabricCheck], list[tuple[str, str, int]]]:
    """(Summary rows, [(port, counter as the kernel names it, rise)]); both empty when the text is neither.
    BadNumber naming the line for a count ibdiagnet would not print (thousands of digits)."""
    checks, rose, in_summary = [], [], False
    with lines_of(text) as lines:
        for line in lines:
            if SUMMARY_HEADER.match(line):
                in_summary = True
            elif in_summary and (m := STAGE.match(line)):
                if len(checks) == MAX_STAGES:   # judged one by one: 30,000 rows took 17 s
                    raise ValueError(f"more than {MAX_STAGES} rows in ibdiagnet's Summary table (it has one per check)")
                checks.append(FabricCheck(stage=m.group(1), warnings=count(m.group(2), "Warnings"),
                                          errors=count(m.group(3), "Errors"), comment=m.group(4).strip()))
            elif (m := ROSE.match(line)) and len(rose) == MAX_ROSE:
                raise ValueError(f"more than {MAX_ROSE:,} 'increased during the run' lines; paste the -E-/-W- lines of "
                                 "the ports that matter")
            elif m:
                rose.append((m.group(1), COUNTER_NAMES.get(m.group(2), m.group(2)),
                             count(m.group(3), "difference value")))
    return checks, rose


def judge(checks: list[FabricCheck], rose: list[tuple[str, str, int]], counters: dict, stage_rule: dict) -> list[HealthFinding]:
    """A finding per check with errors or warnings, and per port whose counter rose during the run."""
    out = []
    for c in checks:
        if c.errors or c.warnings:
            out.append(HealthFinding(
                subject=f"fabric ({c.stage})", source="ibdiagnet", code="ibdiagnet_stage",
                action=stage_rule["errors_action"] if c.errors else stage_rule["warnings_action"],
                text=f"ibdiagnet's {c.stage} check: {c.errors} error(s), {c.warnings} warning(s)"
                     + (f" ({c.comment})" if c.comment else "")
                     + "; its -E- / -W- lines in ibdiagnet2.log name the ports and nodes"))
    for port, counter, value in rose:
        rule = counters.get(counter)
        out.append(HealthFinding(
            subject=port, source="ibdiagnet", code=f"ib_{counter}", action=rule["on_rise"] if rule else "monitor",
            text=f"{counter} rose by {value} during ibdiagnet's run"
                 + (f": {rule['meaning']}" if rule else " (a counter mleng has no rule for: watch it)")))
    return out
