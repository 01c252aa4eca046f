"""collective_bench — algbw and busbw of NCCL/gloo collectives over message sizes, checked, against expected.

all_reduce, all_gather (into a tensor), reduce_scatter (tensor), all_to_all, broadcast; sizes from
min to max by a factor like nccl-tests' -b -e -f; warm-up, then iterations launched back to back and
timed as a batch (CUDA events); busbw with nccl-tests' factors; a correctness check that counts wrong
elements; a table, JSON rows and a PNG plot of busbw against size; the expected busbw for the detected
GPUs and count from knowledge/data/interconnects.toml, with a verdict.

By hand:
    mleng run collective_bench                                     # all local GPUs, all_reduce 32K..1G
    mleng run collective_bench --ops all_reduce all_gather reduce_scatter all_to_all broadcast \\
        --min-bytes 32K --max-bytes 16G --factor 2
    salloc -N 2 --gpus-per-node 8 mleng run collective_bench --max-bytes 8G   # srun + torchrun per node
    mleng run collective_bench --nnodes 2 --nproc-per-node 8 --rdzv-endpoint node1:29500   # on each node
Which node or link is bad (knowledge://network/finding-the-bad-node.md):
    salloc -N 16 mleng run collective_bench --pattern pairwise      # rounds of N/2 two-node runs
    salloc -N 16 mleng run collective_bench --pattern bisect        # halves of a failing set
    MLENG_COORD_SECRET=<the same per-run secret on every node> \
    mleng run collective_bench --pattern pairwise --hosts n1 n2 n3 n4 --node-rank K \
        --rdzv-endpoint n1:29400                                          # outside SLURM, on every node K
    mleng run collective_bench --pattern pairwise --hosts 'gpu-[01-16]'   # no SLURM: over ssh, from here
"""

import re
import time
from typing import ClassVar, Annotated, Literal

from pydantic import BeforeValidator, WithJsonSchema

from .rank import OPS, size_sweep
from ..shared.culprits import diagnose
from ..shared.nccl_env import echo_nccl_env
from ..shared.launch import RankLayout, launch_ranks, layout, manual_start, plan_command, visible_gpus
from .isolation import IsolationReport
from .models import BenchRow, OpSummary
from .patterns import PatternFields, launch_all_ssh, pattern_result, ssh_hosts, take_allocation
from .report import draw_plot, format_table, gbps, human_size, judge, point_at
from ..shared.expected_busbw import expected_busbw
from ..engine.spec import SELF_EVIDENT, SELF_TEST, Field, Result, ToolSpec, worst
from ..engine.processes import local_gpu_count
from ..shared.safe_write import check_output, output_path, unique_name

_UNITS = {"": 1, "B": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def parse_size(value):
    """'32K', '16G', '1M', 1048576 -> bytes (binary units, as nccl-tests reads -b/-e)."""
    if isinstance(value, int) or value is None:
        return value
    m = re.fullmatch(r"\s*(\d+)\s*([KMGT]?)(?:I?B)?\s*", str(value).upper())
    if not m:
        raise ValueError(f"not a size: {value!r} (use bytes or 32K / 256M / 16G)")
    return int(m.group(1)) * _UNITS[m.group(2)]


MIN_SIZE, MAX_SIZE = 8, 1 << 36
# A BeforeValidator hides ge/le from pydantic's schema generator (it would publish non-standard `ge`/`le`),
# so the schema is stated: JSON Schema's own minimum/maximum.
Size = Annotated[int, BeforeValidator(parse_size), Field(ge=MIN_SIZE, le=MAX_SIZE),
                 WithJsonSchema({"type": "integer", "minimum": MIN_SIZE, "maximum": MAX_SIZE})]


class CollectiveBenchParams(RankLayout, PatternFields):
    ops: list[Literal[OPS]] = Field(["all_reduce"], min_length=1, max_length=5,
            json_schema_extra=SELF_EVIDENT, description=(
        "Collectives to measure."))
    dtype: Literal["float32", "bfloat16", "float16"] = Field("float32",
            json_schema_extra=SELF_EVIDENT, description="Element type.")
    min_bytes: Size = Field(32 << 10, description="Bytes, or 32K/1M/1G.")
    max_bytes: Size | None = Field(None, description=(
        "Default 1G on GPUs, 16M on CPU; capped to free memory."))
    factor: int = Field(2, ge=2, le=1024, description="Size multiplier per step (nccl-tests -f).")
    iters: int = Field(20, ge=1, le=10000, json_schema_extra=SELF_EVIDENT, description="Timed iterations per size.")
    warmup: int = Field(5, ge=0, le=1000, json_schema_extra=SELF_EVIDENT, description="Untimed iterations per size.")
    blocking: bool = Field(False, description=(
        "Sync around every call (naive timing)."))
    pg_timeout_s: float = Field(120.0, ge=5, le=600, description="Process-group timeout per collective.")
    plot: bool = Field(True, description="busbw vs size as a PNG (needs matplotlib).")
    plot_path: str | None = Field(None, max_length=4096, description=(
        "PNG path (relative: the caller's cwd); default under $MLENG_HOME/plots/."))
    overwrite: bool = Field(False, json_schema_extra=SELF_EVIDENT, description="Replace plot_path if it exists.")
    plant_error_rank: int | None = Field(None, ge=0, description=(
        "Self-test: this rank corrupts one output element after each checked call; #wrong must count it."),
        json_schema_extra=SELF_TEST)


class CollectiveBenchResult(Result):
    nccl_env: dict[str, str] = Field(default_factory=dict, description="NCCL variables this run set (nccl_env).")
    world_size: int = Field(0, description="Ranks.")
    nnodes: int = Field(1, description="Nodes.")
    backend: str | None = Field(None, description="nccl or gloo.")
    gpu: str | None = Field(None, description="GPU name rank 0 reported.")
    accelerator_id: str | None = Field(None, description="Matched id in knowledge/data/accelerators.toml.")
    busbw_gbps: float | None = Field(None, description="Headline: busbw of the first op at its largest size, GB/s.")
    expected_busbw_gbps: float | None = Field(None, description="Expected busbw for the first op, GB/s.")
    expected_source: str | None = Field(None, description="interconnects.toml record the expectation comes from.")
    wrong_elements: int = Field(0, description="Wrong elements over all sizes and ops.")
    summary: list[OpSummary] = Field(default_factory=list, description="Per op.")
    rows: list[BenchRow] = Field(default_factory=list, description="Per op and size, like nccl-tests -J JSON.")
    skipped: list[str] = Field(default_factory=list, description="Sizes left out because they do not fit in memory.")
    table: str = Field("", description="Human table, nccl-tests style.")
    plot_png: str | None = Field(None, description="PNG of busbw against size.")
    sweep_wall_s: float = Field(0.0, description="Wall time of the whole run including start-up, seconds.")
    culprit_ranks: list[int] = Field(default_factory=list, description="Ranks named when the run failed or hung.")
    isolation: IsolationReport | None = Field(None, description=(
        "pattern pairwise/bisect: rounds, every group's figures, the node x node matrix, suspects and evidence."))
    heatmap_png: str | None = Field(None, description="pattern pairwise: the pair busbw matrix as a heat map.")

    image_fields: ClassVar[tuple[str, ...]] = ("plot_png", "heatmap_png")


def summarize_rows(rows: list[BenchRow], op: str, record: dict | None) -> OpSummary:
    mine = [r for r in rows if r.op == op]
    peak = max(mine, key=lambda r: r.bytes)
    expected = None
    if record:
        point = point_at(record, peak.bytes)
        expected = point["busbw_gbps"] if point else record["busbw_gbps"]
    avg = sum(r.busbw_gbps for r in mine) / len(mine)
    return OpSummary(op=op, avg_busbw_gbps=float(f"{avg:.4g}"),  # significant digits: 0.0023 must not read 0.002
                     peak_busbw_gbps=peak.busbw_gbps, peak_bytes=peak.bytes, expected_busbw_gbps=expected,
                     ratio=round(peak.busbw_gbps / expected, 3) if expected else None)


# ---------------------------------------------------------------------------------------------------

def run(params: CollectiveBenchParams, progress) -> CollectiveBenchResult:
    """Here or, with partition / job_id, inside that allocation (taken for the run, or another job's)."""
    allocation = take_allocation(params, SPEC.timeout_s, progress)
    if allocation is None:
        return measure(params, progress)
    from ..shared.allocation import inside

    with inside(allocation):
        result = measure(params, progress)
    result.findings.append(allocation.sentence() + ".")
    return result


def measure(params: CollectiveBenchParams, progress) -> CollectiveBenchResult:
    if params.plot:
        _plot_target(params)   # a bad plot_path fails now, before any rank starts
    gpus = visible_gpus()
    nproc, nnodes = layout(params.nproc_per_node, params.nnodes)
    hosts = ssh_hosts(params) if params.pattern == "all" else None   # one run over every rank, over ssh
    nnodes = len(hosts) if hosts else nnodes
    world = nproc * nnodes
    cmd = None if hosts else manual_start("collective_bench", nnodes, nproc, params.rdzv_endpoint)
    if cmd and params.pattern == "all":
        return CollectiveBenchResult(verdict="info", world_size=world, nnodes=nnodes, findings=[
            f"{nnodes} nodes asked for outside a SLURM allocation: run this on each node: {cmd}"],
            next=["launch_script"])
    on_gpu = params.backend == "nccl" or (params.backend == "auto" and gpus > 0)
    max_bytes = params.max_bytes or ((1 << 30) if on_gpu else (16 << 20))
    if max_bytes < params.min_bytes:
        from ..engine.spec import ToolFailure
        raise ToolFailure(f"max_bytes ({max_bytes}) is below min_bytes ({params.min_bytes}): give max_bytes >= min_bytes")
    job = {"backend": params.backend, "timeout_s": params.pg_timeout_s, "dtype": params.dtype,
           "ops": params.ops, "min_bytes": params.min_bytes, "max_bytes": max_bytes, "factor": params.factor,
           "iters": params.iters, "warmup": params.warmup, "blocking": params.blocking,
           "plant_error_rank": params.plant_error_rank, "nccl_env": params.nccl_env}
    if params.pattern != "all":
        return pattern_result(params, job, nproc, progress, CollectiveBenchResult)
    steps = len(params.ops) * len(size_sweep(params.min_bytes, max_bytes, params.factor))
    done = [0]

    def on_event(event):
        if event["ev"] == "data" and event.get("kind") == "row":
            done[0] += 1
            progress(min(done[0] / steps, 0.99), f"{event['op']} {human_size(event['bytes'])}: "
                                                  f"{gbps(event['busbw_gbps'])} GB/s busbw")

    progress(0.0, f"starting {world} ranks")
    t0 = time.monotonic()
    if hosts:
        outcome = launch_all_ssh(hosts, job, nproc, stall_s=params.pg_timeout_s + 60, deadline_s=840, on_event=on_event)
    else:
        outcome = launch_ranks(plan_command("collective_bench.rank", job, nproc, nnodes, params.rdzv_endpoint),
                               0 if params.rdzv_endpoint else world,
                               timeout_s=params.pg_timeout_s, stall_s=params.pg_timeout_s + 60,
                               deadline_s=840, on_event=on_event)
    wall = round(time.monotonic() - t0, 2)
    return build_result(outcome, params, nnodes, wall)


def build_result(outcome, params: CollectiveBenchParams, nnodes: int, wall_s: float) -> CollectiveBenchResult:
    from ..shared.accelerators import match_accelerator

    setup = next((e for e in outcome.data if e.get("kind") == "setup"), {})
    rows = [BenchRow(**{k: e[k] for k in BenchRow.model_fields}) for e in outcome.data if e.get("kind") == "row"]
    skipped = [f"{e['op']} {human_size(e['bytes'])} (needs more than {human_size(e['cap_bytes'])} per rank)"
               for e in outcome.data if e.get("kind") == "skipped"]
    world = setup.get("world_size", outcome.world_size)
    gpu = (setup.get("versions") or {}).get("device_name")
    accel = match_accelerator(gpu) if gpu and gpu != "cpu" else None
    accel_id = accel["id"] if accel else ("cpu" if gpu == "cpu" else None)
    result = CollectiveBenchResult(world_size=world, nnodes=nnodes, backend=setup.get("backend"), gpu=gpu,
                                   accelerator_id=accel_id, rows=rows, skipped=skipped, sweep_wall_s=wall_s,
                                   table=format_table(rows) if rows else "")
    culprits, failure = diagnose(outcome, params.pg_timeout_s)
    if failure:
        result.verdict, result.culprit_ranks = "fail", culprits
        result.findings = [f"The benchmark did not finish ({len(rows)} sizes measured)."] + failure
        result.next = ["dist_smoke_test", "hang_stack_dump", "knowledge://network/nccl-debugging.md"]
        if not rows:
            return result
    if not rows and not failure:
        result.findings = ["This node's ranks finished; rank 0 runs on another node and reports the figures there."]
        return result
    summaries, verdicts, findings, records = judge_ops(rows, accel_id, setup.get("local_world_size", world),
                                                       nnodes, world, setup)
    result.summary = summaries
    expected_by_op = {s.op: s.expected_busbw_gbps for s in summaries if s.expected_busbw_gbps}
    if summaries:
        first = summaries[0]
        result.busbw_gbps, result.expected_busbw_gbps = first.peak_busbw_gbps, first.expected_busbw_gbps
        result.expected_source = records[first.op]["id"] if records[first.op] else None
    result.wrong_elements = sum(r.wrong for r in rows)
    if result.wrong_elements:
        bad = sorted({f"{r.op} {human_size(r.bytes)}" for r in rows if r.wrong})
        findings.insert(0, f"{result.wrong_elements} wrong elements: data corruption or a broken transport at "
                           f"{', '.join(bad[:6])}. Results are not trustworthy.")
        verdicts.append("fail")
    if world == 1:
        findings.insert(0, "World size 1: busbw needs at least 2 ranks (the factor is 0 with one rank); the "
                           "times are only the local cost of each call. Run on 2 or more GPUs.")
    if skipped:
        findings.append(f"Left out to fit free memory: {', '.join(skipped[:4])}.")
    if params.blocking:
        findings.append("blocking mode: every call was synchronised on its own, so small sizes read slower "
                        "than a training loop (or nccl-tests) sees them.")
    if failure:
        return result
    result.verdict = worst(verdicts, default="info")
    result.findings = findings
    low = result.verdict in ("warn", "fail")
    if nnodes > 1 and (low or result.expected_busbw_gbps is None):
        findings.append(("busbw is below the expected figure: " if low else "No expected figure to judge against: if "
                         "this is below what these nodes usually reach, ")
                        + "collective_bench pattern=pairwise (or bisect, for a hang) names the node or link.")
    result.next = (["knowledge://network/busbw.md", "knowledge://network/expected-bandwidth.md"]
                   + (["gpu_topology", "p2p_bandwidth", "nccl_log_analyze"] if low else [])
                   # short between nodes: port counters, perftest, link flaps, NCCL's IB settings
                   + (["knowledge://network/fabric-diagnosis.md"] if low and nnodes > 1 else [])
                   + (["knowledge://network/finding-the-bad-node.md"] if nnodes > 1 else []))
    if params.plot and rows:
        result.plot_png = _plot(rows, expected_by_op, world, gpu or "cpu", params)
    return result


def judge_ops(rows: list[BenchRow], accel_id: str | None, gpus_per_node: int, nnodes: int, world: int,
              setup: dict) -> tuple[list[OpSummary], list[str], list[str], dict]:
    """Per op: summary, verdict and sentence against the expected figure (none with one rank)."""
    summaries, verdicts, findings, records = [], [], [], {}
    for op in dict.fromkeys(r.op for r in rows):
        record, note = expected_busbw(accel_id, gpus_per_node, nnodes, op, setup.get("nccl_env"),
                                      setup.get("rdma_ports")) if world > 1 else (None, "")
        records[op] = record
        summary = summarize_rows(rows, op, record)
        summaries.append(summary)
        verdict, text = judge(summary, record, summary.peak_bytes >= 256 << 20 or bool(
            record and point_at(record, summary.peak_bytes)))
        verdicts.append(verdict)
        if text:
            findings.append(text + (f" ({note})" if note else ""))
        elif world > 1:
            findings.append(f"{op}: peak busbw {gbps(summary.peak_busbw_gbps)} GB/s at {human_size(summary.peak_bytes)}, "
                            f"average {gbps(summary.avg_busbw_gbps)} GB/s" + (f"; {note}." if note else "."))
    return summaries, verdicts, findings, records


def _plot_target(params: CollectiveBenchParams):
    name = unique_name("collective_bench")
    return check_output(output_path(params.plot_path, "plots", name), overwrite=params.overwrite, field="plot_path")


def _plot(rows, expected, world, gpu, params: CollectiveBenchParams) -> str | None:
    try:
        return draw_plot(rows, expected, _plot_target(params), f"busbw, {world} ranks, {gpu}", params.overwrite)
    except ImportError:
        return None


def _gpus(params: CollectiveBenchParams) -> list[int]:
    gpus = local_gpu_count()
    return list(range(min(params.nproc_per_node or gpus, gpus)))


SPEC = ToolSpec(
    name="collective_bench",
    summary="algbw and busbw of all_reduce / all_gather / reduce_scatter / all_to_all / broadcast over sizes, "
            "checked, against expected.",
    description=(
        "Use when all-reduce, collectives or data-parallel steps seem slow, to check new nodes, or for "
        "inter-node / InfiniBand bandwidth per GPU lower than NDR or HDR should give: algbw and busbw per "
        "message size (nccl-tests conventions) for all_reduce, all_gather, reduce_scatter, all_to_all (MoE), "
        "broadcast, wrong elements counted, peak busbw vs the expected figure for the hardware. Also whether an NCCL upgrade changed throughput. Which node or link is bad among N: "
        "pattern='pairwise' (node x node matrix: a slow node is slow with every partner, a slow link with "
        "one) or 'bisect' (one bad node in a set that fails or hangs). Seconds to minutes; NCCL on GPUs, gloo "
        "on CPU. Ranks cannot connect: dist_smoke_test first."),
    Params=CollectiveBenchParams, Result=CollectiveBenchResult, run=echo_nccl_env(run), runs="subprocess", needs_torch=True,
    read_only=False, destructive=True, idempotent=True, open_world=True, timeout_s=900,
    gpu_devices=_gpus, metric="busbw_gbps", higher_is_better=True,
    spans_nodes=True,  # reaches the cluster itself: the engine's node= option does not apply
)
