"""fleet_sweep's output records: one row per node and check, per GPU, medians, outliers, drift,
nodes not answering, the drain list, and the Result that carries them."""

from __future__ import annotations

from typing import ClassVar

from ..engine.spec import Field, Record, Result


class NodeRow(Record):
    node: str = Field(description="SLURM node name.")
    host: str | None = Field(None, description="Hostname the node process saw.")
    check: str = Field(description="Check.")
    verdict: str = Field(description="The check's own verdict on that node.")
    seconds: float = Field(description="Wall time of the check on the node, s.")
    figures: dict[str, float | None] = Field(default_factory=dict, description="Node-level figures (GPU ones in `gpus`).")
    problems: list[str] = Field(default_factory=list, description="What the check found wrong there.")
    busy: str | None = Field(None, description="Who else used the resource while it measured (its figures are not judged).")
    result_id: int | None = Field(None, description="Its row in the results store (results_history).")


class GpuRow(Record):
    node: str = Field(description="SLURM node name.")
    gpu: int = Field(description="GPU index on the node.")
    check: str = Field(description="Check.")
    figure: str = Field(description="Figure name.")
    value: float | None = Field(None, description="Measured value.")
    unit: str = Field("", description="Unit.")
    expected: float | None = Field(None, description="Expected figure, where the check has one.")
    group: str | None = Field(None, description="GPU model it is compared within.")


class FigureMedian(Record):
    figure: str = Field(description="check.figure")
    group: str = Field("", description="What was compared: GPU model (per-GPU figures) or CPU model and count.")
    median: float | None = Field(None, description="Median over the group's nodes (or GPUs) that were not busy.")
    count: int = Field(description="Values behind it (busy ones excluded).")
    busy_excluded: int = Field(0, description="Values left out because the resource was busy.")
    unit: str = Field("", description="Unit.")
    spread_pct: float = Field(0.0, description="Spread of those values now, 1.4826 x MAD / median, %.")
    threshold_pct: float = Field(0.0, description="Deficit a figure had to exceed: max(margin, k x spread), %.")
    expected: float | None = Field(None, description="Expected figure of the group, where one exists.")
    inconclusive: bool = Field(False, description="The values spread too widely to name an outlier.")


class Outlier(Record):
    node: str = Field(description="Node.")
    gpu: int | None = Field(None, description="GPU, for per-GPU figures.")
    figure: str = Field(description="check.figure")
    value: float = Field(description="Its value.")
    reference: float = Field(description="Fleet median or expected figure it is compared with.")
    against: str = Field(description="'fleet median' or 'expected'.")
    worse_by_pct: float = Field(description="How much worse, %.")
    threshold_pct: float = Field(0.0, description="The deficit it had to exceed, %.")
    group: str = Field("", description="The group it was compared within.")
    status: str = Field("unconfirmed", description="confirmed (a re-run on the node broke the rule again: drained) | "
                        "not repeated (the re-run was within the rule) | unconfirmed (no usable re-run).")
    confirm_value: float | None = Field(None, description="The figure of the re-run on that node.")


class Busy(Record):
    node: str = Field(description="Node.")
    check: str = Field(description="Check whose figures were measured on a busy resource.")
    why: str = Field(description="What was busy, with units.")
    holders: list[str] = Field(default_factory=list, description="Other processes on it: pid, name, user, GPU, memory.")


class BelowExpected(Record):
    figure: str = Field(description="check.figure")
    group: str = Field("", description="Group.")
    median: float = Field(description="The group's median.")
    expected: float = Field(description="The figure a healthy device reaches.")
    worse_by_pct: float = Field(description="How much worse the whole group is, %.")
    count: int = Field(description="Values behind the median.")


class Drift(Record):
    field: str = Field(description="driver, cuda, nccl, torch, python, an NCCL_/TORCH_NCCL_/TORCH_DISTRIBUTED_/CUDA_/FI_/UCX_ "
                       "variable, an inventory count (gpu_count, cpu_count, host_memory_gib, nic_count ...), or a part "
                       "of the network stack (nccl_net_plugin, rdma_core, nic_firmware <dev>, kernel, gpu_vbios, "
                       "container, mtu <interface>).")
    values: dict[str, list[str]] = Field(description="value -> nodes with it ('(unset)' where absent).")
    odd_nodes: list[str] = Field(description="Nodes outside the most common value.")


class Missing(Record):
    node: str = Field(description="Node.")
    reason: str = Field(description="Why it has no complete answer.")


class Drain(Record):
    node: str = Field(description="Node to drain.")
    reasons: list[str] = Field(description="Why.")
    command: str = Field(description="scontrol command to drain it (fleet_sweep never runs it).")


class RefusedEvents(Record):
    source: str = Field(description="The node (as srun placed its task), a task srun never placed, or the step's output.")
    reason: str = Field(description="Why its lines or events were refused.")
    count: int = Field(description="How many.")


class FleetSweepResult(Result):
    # One row per node, GPU and figure: the medians, outliers and drain list say which of them matter.
    detail_fields = ("gpus",)

    target: str = Field("", description="What was swept: allocation, job, partition or hosts, and the node count.")
    nodes_total: int = Field(0, description="Nodes in the target.")
    nodes_complete: int = Field(0, description="Nodes that answered every check they run.")
    rows: list[NodeRow] = Field(default_factory=list, description="One row per node and check.")
    gpus: list[GpuRow] = Field(default_factory=list, description="One row per node, GPU and per-GPU figure.")
    medians: list[FigureMedian] = Field(default_factory=list, description="Fleet median, spread and threshold of every figure per group.")
    outliers: list[Outlier] = Field(default_factory=list, description="Figures breaking the rule, with the re-run's verdict.")
    busy: list[Busy] = Field(default_factory=list, description="Checks measured while others used the resource (not judged).")
    below_expected: list[BelowExpected] = Field(default_factory=list, description="Groups whose median is below the expected figure.")
    rule: str = Field("", description="The outlier rule, as applied.")
    drift: list[Drift] = Field(default_factory=list, description="Versions and collective-changing variables that differ between nodes.")
    inventory_drift: list[Drift] = Field(default_factory=list, description=(
        "GPU, CPU, memory and NIC counts, and the CPU quota over the probe, that differ between nodes."))
    not_answering: list[Missing] = Field(default_factory=list, description="Nodes without a complete answer by the deadline.")
    not_judged: list[Missing] = Field(default_factory=list, description=(
        "Nodes still running when the deadline ended a relaunch around other nodes' failures, or that answered some "
        "checks when most nodes were late too: not drained."))
    drain: list[Drain] = Field(default_factory=list, description="Nodes to drain, with reasons and the command.")
    launch_attempts: int = Field(0, description="srun steps started (2 when nodes refused the first launch).")
    rows_from_attempt: int = Field(0, description="The attempt every row, median and outlier comes from (the last).")
    refused: list[RefusedEvents] = Field(default_factory=list, description=(
        "Node output not believed: malformed lines, events naming another node, unplanned checks, duplicates."))
    wall_s: float = Field(0.0, description="Wall time of the sweep, s.")
    plot_png: str | None = Field(None, description="PNG of every figure per node against the fleet median.")

    image_fields: ClassVar[tuple[str, ...]] = ("plot_png",)
