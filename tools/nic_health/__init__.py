"""nic_health — is each NIC of this node healthy (RDMA ports, Ethernet/RoCE links), and what to do about it.

Every RDMA device and port under /sys/class/infiniband (state, physical state, rate, link layer, GID table,
the IB error counters and their change over a sampling window); every network interface that carries the
node's traffic (carrier changes, speed, MTU, kernel and `ethtool -S` error counters and their change); the
PCIe path from each GPU to its closest NIC. Each problem carries an action (none / monitor / drain_node);
thresholds and their sources are in knowledge/data/nic_health.toml. What is absent (RDMA devices, ethtool,
perftest, NVML) is a plain "not present" row, never an error. Runs in a child: a wedged driver can hang a
counter read, and the runner's timeout then kills it.

By hand:
    mleng run nic_health                         # this node, 2 s window
    mleng run nic_health --sample-s 30           # watch longer for a flapping link
    srun --ntasks-per-node=1 mleng run nic_health --json > nic-$SLURM_JOB_ID.json   # every node
"""

from __future__ import annotations

import time

from ..engine.figures import Figure, Measured, SweepContract
from ..engine.spec import Field, Params, Result, ToolFailure, ToolSpec, worst
from ..shared.actions import ACTION_FIELD, Action, HealthFinding, by_action, verdict_of, worst_action
from ..shared.tc import SHAPING_KINDS
from . import gids, ibdiagnet, pasted, sample
from .assess import judge_peers, judge_port, judge_totals, rules
from .gids import GidRow
from .ibdiagnet import FabricCheck
from .models import NetdevReading, NicAffinity, PortReading, Presence

__all__ = ["SPEC", "NicHealthParams", "NicHealthResult", "run"]


class NicHealthParams(Params):
    sample_s: float = Field(2.0, ge=0, le=300, description=(
        "Counters and carrier changes compared over this (0: one reading)."))
    text: str | None = Field(None, max_length=1_000_000, description=(
        "Pasted `ibstat`, `ibv_devinfo [-v]`, `show_gids`, `perfquery` or `ibdiagnet` output to judge instead."))


class NicHealthResult(Result):
    action: Action = Field("none", description="The node's action: the worst of its ports' and interfaces'. " + ACTION_FIELD)
    actions: dict[str, list[str]] = Field(default_factory=dict, description="{action: [ports / interfaces]} worst first (for fleet summaries).")
    rdma_ports: list[PortReading] = Field(default_factory=list, description="One reading per RDMA device port.")
    netdevs: list[NetdevReading] = Field(default_factory=list, description="One reading per network interface judged.")
    affinity: list[NicAffinity] = Field(default_factory=list, description="Each GPU's closest NIC and the PCIe path to it.")
    present: list[Presence] = Field(default_factory=list, description="RDMA devices, ethtool, perftest: found or not present.")
    window_s: float = Field(0.0, description="Length of the sampling window, s.")
    fabric_checks: list[FabricCheck] = Field(default_factory=list, description="Pasted ibdiagnet: its Summary rows (check, warnings, errors).")
    fabric: list[HealthFinding] = Field(default_factory=list, description="Pasted ibdiagnet: checks with errors and fabric ports whose counters rose, with an action each.")
    gids: list[GidRow] = Field(default_factory=list, description="Pasted show_gids / ibv_devinfo -v: the RoCE GID tables.")


def run(params: NicHealthParams, progress) -> NicHealthResult:
    if params.text is not None:
        return read_pasted(params.text)
    progress(0.05, "first reading")
    first = sample.snapshot()
    t0 = time.monotonic()
    while time.monotonic() - t0 < params.sample_s:
        time.sleep(min(0.5, max(0.0, params.sample_s - (time.monotonic() - t0))))
        progress(0.1 + 0.8 * min(1.0, (time.monotonic() - t0) / max(params.sample_s, 1e-9)), "sampling")
    second = sample.snapshot(list(first["netdevs"])) if params.sample_s > 0 else first
    window_s = round(time.monotonic() - t0, 2) if params.sample_s > 0 else 0.0
    ports, netdevs = sample.judge(first, second, window_s)
    return summarise(ports, netdevs, sample.affinity(), sample.presence(), window_s)


def read_pasted(text: str) -> NicHealthResult:
    try:
        checks, rose = ibdiagnet.parse(text)
    except ValueError as e:     # a crafted number (named by line), too many lines
        raise ToolFailure(_text_error(e)) from None
    if checks or rose:
        return read_ibdiagnet(checks, rose)
    table = gids.parse(text)
    try:
        kind, raw = pasted.parse(text)
    except ValueError as e:     # not a format read here (a GID table alone is), a crafted number, too many lines
        if table:
            return read_gids(table, text, NicHealthResult())
        raise ToolFailure(_text_error(e)) from None
    ports = [judge_totals(judge_port(p, p, 0.0)) for p in raw]
    judge_peers(ports)
    result = summarise(ports, [], [], [], 0.0)
    result.findings.insert(1, f"Read pasted {kind} output: {len(ports)} port(s); one reading, so totals only.")
    return read_gids(table, text, result) if table else result


def _text_error(e: ValueError) -> str:
    return str(e) if str(e).startswith("text:") else f"text: {e}"


def read_gids(table: list[GidRow], text: str, result: NicHealthResult) -> NicHealthResult:
    """The GID judgement goes first: between racks it is what decides whether RoCE connects at all."""
    verdict, found = gids.judge(table, gids.index_in_use(text))
    result.gids = table
    result.verdict = worst([result.verdict, verdict]) if result.rdma_ports else verdict
    result.findings = found + [f"Read {len(table)} RoCE GID(s)."] + result.findings
    result.next = ["knowledge://network/inter-node.md", "nccl_log_analyze"]
    return result


def read_ibdiagnet(checks: list[FabricCheck], rose: list[tuple[str, str, int]]) -> NicHealthResult:
    """ibdiagnet judges the fabric, not this node: its findings go to `fabric`, the node's ports stay empty."""
    table = rules()
    found = ibdiagnet.judge(checks, rose, table["rdma_counter"], table["ibdiagnet"])
    result = NicHealthResult(fabric_checks=checks, fabric=found, action=worst_action(f.action for f in found),
                             actions=by_action(found))
    result.verdict = worst([verdict_of(f.action) for f in found] or ["ok"])
    failed = [c for c in checks if c.errors]
    result.findings = [f"Read pasted ibdiagnet output: {len(checks)} check(s) in its Summary, "
                       + (f"{len(failed)} with errors ({', '.join(f'{c.stage}: {c.errors}' for c in failed)})"
                          if failed else "none with errors")
                       + f"; {len(rose)} port counter(s) rose during its run; action: {result.action}."]
    result.findings += [f"{f.subject}: {f.text} [{f.action}]." for f in found]
    result.next = ["knowledge://network/link-health.md", "collective_bench"]
    return result


def summarise(ports: list[PortReading], netdevs: list[NetdevReading], affinity: list[NicAffinity],
              present: list[Presence], window_s: float) -> NicHealthResult:
    result = NicHealthResult(rdma_ports=ports, netdevs=netdevs, affinity=affinity, present=present, window_s=window_s)
    every = [p for r in [*ports, *netdevs] for p in r.problems]
    result.action, result.actions = worst_action(f.action for f in every), by_action(every)
    result.verdict = worst([r.verdict for r in [*ports, *netdevs]] or ["ok"])
    up = sum(1 for p in ports if p.state == "ACTIVE")
    census = ((f"{len(ports)} RDMA port(s), {up} active; " if ports else "")
              + f"{len(netdevs)} interface(s) judged ({', '.join(n.name for n in netdevs) or 'none'}); "
              + (f"sampled {window_s:g} s" if window_s else "one reading, no window")
              + f"; action for the node: {result.action}.")
    acted = [f"{f.subject}: {f.text} [{f.action}]." for f in every if f.action != "none"]
    # A shaper is a setting (action "none": nothing to do to the hardware) and still the news: it leads, so the
    # headline is not "action for the node: none" above it (model round 12: three plays called that underselling).
    shaped = [f"{f.subject}: {f.text}." for f in every if f.action == "none" and f.code == "traffic_shaper"]
    quiet = [f"{f.subject}: {f.text}." for f in every if f.action == "none" and f.code != "traffic_shaper"]
    result.findings = acted + shaped + [census] + quiet
    result.findings += [f"{r.subject}: {', '.join(r.resets)} went back during the window (counters cleared, driver "
                        "reloaded or wrapped); not judged." for r in [*ports, *netdevs] if r.resets]
    unshaped = [f"{n.name} ({n.root_qdisc})" for n in netdevs if n.root_qdisc and n.root_qdisc not in SHAPING_KINDS]
    if unshaped:
        result.findings.append(f"tc: no rate limit or delay at the root of {', '.join(unshaped)}: queueing only.")
    result.findings += [f"{p.component}: {p.detail}." for p in present if not p.present]
    result.findings += [f"GPU {a.gpu} -> {a.nic}: {a.path}." for a in affinity if a.path in ("NODE", "SYS")]
    result.next = (["knowledge://network/link-health.md", "collective_bench"] if result.verdict != "ok"
                   else ["collective_bench", "gpu_topology"])
    return result


def _sweep_figures(res: NicHealthResult) -> list[Measured]:
    """The slowest active RDMA port: one degraded rail among 64 nodes stands out against the fleet."""
    rates = [p.rate_gbits for p in res.rdma_ports if p.state == "ACTIVE" and p.rate_gbits]
    return [Measured(MIN_RATE, min(rates))] if rates else []


def _sweep_evidence(res: NicHealthResult) -> list[str]:
    return [f"{f.subject}: {f.text} (action: {f.action})" for r in [*res.rdma_ports, *res.netdevs]
            for f in r.problems if f.action != "none" or f.code == "traffic_shaper"]   # a setting, still the news


SWEEP = SweepContract(figures=(MIN_RATE := Figure("min_rdma_rate_gbits", "Gb/s", "higher"),), read=_sweep_figures,
                      evidence=_sweep_evidence)

SPEC = ToolSpec(
    name="nic_health",
    summary="Per-NIC health and what to do: RDMA port state/rate/GIDs/error counters, link flaps, Ethernet errors.",
    description=(
        "Check whether each network port of this node is healthy and say what to do (an action per problem: none, "
        "monitor, drain_node). RDMA (InfiniBand/RoCE) ports from /sys/class/infiniband: state, physical state, rate "
        "(a port slower than its peers), link layer, GID table (RoCE without a GID), the IB error counters (symbol "
        "errors, link error recovery, link downed, receive errors, discards...) and their change over a sampling "
        "window, saturated counters; network interfaces: carrier changes (link flaps) during the window and since "
        "boot, speed, MTU, kernel and `ethtool -S` error counters; each GPU's closest NIC and PCIe path. Use for a "
        "flapping or degraded link, 'NET/IB : Got completion with error', one node slower in every collective, "
        "before blaming NCCL; pasted ibstat / ibv_devinfo / perfquery / ibdiagnet (text=). ~1 s plus sample_s "
        "(default 2 s), read-only, no GPU needed. Not for bandwidth between nodes (collective_bench) or GPU faults "
        "(gpu_health)."),
    Params=NicHealthParams, Result=NicHealthResult, run=run, runs="subprocess", timeout_s=360,
    doctor=lambda ctx: {"sample_s": 1}, doctor_order=16, sweep=SWEEP,
)
