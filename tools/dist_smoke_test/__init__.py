"""dist_smoke_test — can every rank talk to every other? Names the rank, host and stage that fails or hangs.

Every rank: init the process group (short timeout), barrier, compare tensor sizes, all_reduce known
values checked exactly, a small allocation on its device; reports host, device, versions and seconds
per stage. Each rank writes its stage to a side channel (tools/shared/ranks.py) so a rank that never
joins, dies or stalls is named within the timeout plus a few seconds, and every rank process is
killed afterwards. NCCL on GPUs, gloo on CPU-only machines.

By hand:
    mleng run dist_smoke_test                              # all local GPUs (CPU: 2 gloo ranks)
    mleng run dist_smoke_test --nproc-per-node 4 --pg-timeout-s 30
    salloc -N 2 --gpus-per-node 8 mleng run dist_smoke_test  # srun + torchrun per node (c10d)
    # without SLURM, on each of 2 nodes (same command everywhere, first node's address):
    mleng run dist_smoke_test --nnodes 2 --nproc-per-node 8 --rdzv-endpoint node1:29500
"""

import re
from typing import Literal


from ..shared import slurm as _slurm
from ..shared.culprits import diagnose, rank_list
from ..shared.nccl_env import echo_nccl_env
from ..shared.launch import RankLayout, launch_ranks, layout, manual_start, plan_command
from .rank import FAULTS
from ..engine.spec import SELF_TEST, Field, Record, Result, ToolSpec
from ..engine.processes import local_gpu_count

STAGES = ["import_torch", "init", "barrier", "shape_check", "all_reduce", "verify", "alloc", "destroy", "done"]
VERSION_KEYS = ("torch", "cuda", "nccl", "driver", "python")


class DistSmokeTestParams(RankLayout):
    pg_timeout_s: float = Field(60.0, ge=3, le=240, description=(
        "Per collective; a rank not joined by then is named."))
    numel: int = Field(1 << 20, ge=1, le=1 << 28, description="float32 elements all_reduced and checked.")
    alloc_mib: int = Field(64, ge=1, le=65536, description="MiB each rank allocates and fills.")
    inject_fault: Literal[FAULTS] = Field("none", description=(
        "Self-test: make fault_rank misbehave to see the tool name it (exit_in_init, "
        "sleep_before_all_reduce, wrong_size)."), json_schema_extra=SELF_TEST)
    fault_rank: int = Field(1, ge=0, le=1 << 20, description="Rank that injects the fault.", json_schema_extra=SELF_TEST)
    nccl_diagnostics: bool = Field(False, description=(
        "NCCL_RUN_DIAGNOSTICS=1: NCCL >= 2.31 tests its P2P and network paths at init (a few s more)."))


class RankReport(Record):
    """One row per rank."""

    rank: int = Field(description="Global rank.")
    host: str | None = Field(None, description="Host name.")
    local_rank: int | None = Field(None, description="Rank on its node.")
    device: str | None = Field(None, description="Device it used (cuda:N or cpu) and its name.")
    status: str = Field("not_started", description="done | error | terminated | vanished | stuck | not_started.")
    stage: str = Field("", description="Last stage it reported.")
    seconds: dict[str, float] = Field(default_factory=dict, description="Seconds per stage.")
    error: str | None = Field(None, description="Its error, when it raised one.")
    versions: str | None = Field(None, description="torch / CUDA / NCCL / driver it reported.")


class DistSmokeTestResult(Result):
    nccl_env: dict[str, str] = Field(default_factory=dict, description="NCCL variables this run set (nccl_env).")
    world_size: int = Field(0, description="Ranks expected.")
    nnodes: int = Field(1, description="Nodes.")
    backend: str | None = Field(None, description="Process-group backend the ranks used.")
    ranks_ok: int = Field(0, description="Ranks that passed every stage.")
    culprit_ranks: list[int] = Field(default_factory=list, description="Ranks named as the cause of a failure or hang.")
    hosts: list[str] = Field(default_factory=list, description="Hosts that reported.")
    version_mismatches: list[str] = Field(default_factory=list, description="torch/CUDA/NCCL/driver versions that differ across ranks.")
    ranks: list[RankReport] = Field(default_factory=list, description="Per rank (all of them up to 16 ranks, else the failing ones and rank 0).")
    elapsed_s: float = Field(0.0, description="Wall time of the run, seconds.")
    launch_command: str = Field("", description="The command that started the ranks.")
    per_node_commands: list[str] = Field(default_factory=list, description="When we cannot start other nodes: run this on each.")


def version_mismatches(versions: dict[int, dict], hosts: dict[int, str]) -> list[str]:
    """One sentence per version key whose value differs across ranks, naming ranks and hosts."""
    out = []
    for key in VERSION_KEYS:
        groups: dict[str, list[int]] = {}
        for rank, info in sorted(versions.items()):
            groups.setdefault(str(info.get(key)), []).append(rank)
        if len(groups) > 1:
            parts = [f"{value} on {_ranks_on(ranks, hosts)}" for value, ranks in
                     sorted(groups.items(), key=lambda kv: -len(kv[1]))]
            out.append(f"{key} differs across ranks: " + "; ".join(parts) + ".")
    return out


def _ranks_on(ranks: list[int], hosts: dict[int, str]) -> str:
    names = sorted({hosts.get(r, "?") for r in ranks})
    span = f"rank {ranks[0]}" if len(ranks) == 1 else f"{len(ranks)} ranks ({rank_list(ranks)})"
    return f"{span} on {', '.join(names[:4])}{'...' if len(names) > 4 else ''}"


def run(params: DistSmokeTestParams, progress) -> DistSmokeTestResult:
    nproc, nnodes = layout(params.nproc_per_node, params.nnodes)
    world = nproc * nnodes
    cmd = manual_start("dist_smoke_test", nnodes, nproc, params.rdzv_endpoint)
    if cmd:
        return DistSmokeTestResult(
            verdict="info", world_size=world, nnodes=nnodes, per_node_commands=[cmd] * nnodes,
            findings=[f"{nnodes} nodes asked for outside a SLURM allocation: run this on each node, with the "
                      f"first node's address: {cmd}",
                      "Or run inside salloc/sbatch, where the tool starts one torchrun per node through srun."],
            next=["launch_script", "knowledge://orchestration/launchers.md"])
    job = {"backend": params.backend, "timeout_s": params.pg_timeout_s, "numel": params.numel,
           "alloc_mib": params.alloc_mib, "fault": params.inject_fault, "fault_rank": params.fault_rank,
           "nccl_env": params.nccl_env}
    command = plan_command("dist_smoke_test.rank", job, nproc, nnodes, params.rdzv_endpoint)

    def on_event(event):
        if event["ev"] == "stage" and event["rank"] == 0 and event["stage"] in STAGES:
            progress((STAGES.index(event["stage"]) + 1) / len(STAGES), f"rank 0: {event['stage']}")

    progress(0.0, f"starting {world} ranks")
    outcome = launch_ranks(command, 0 if params.rdzv_endpoint else world, timeout_s=params.pg_timeout_s,
                           stall_s=params.pg_timeout_s + 10,
                           deadline_s=3 * params.pg_timeout_s + 60, on_event=on_event,
                           env={"NCCL_RUN_DIAGNOSTICS": "1"} if params.nccl_diagnostics else None)
    return summarize(outcome, params, nnodes)


def silent_nodes(outcome, nnodes: int) -> list[str]:
    """Nodes of the srun allocation none of whose ranks said a word. When there is exactly one, the ranks
    that never reported ran there (one torchrun per node): they get that host."""
    if not outcome.command or outcome.command[0] != "srun" or nnodes < 2:
        return []
    heard = {s.host.split(".")[0] for s in outcome.ranks.values() if s.host}
    if not heard or outcome.launch_failures:  # nobody spoke, or srun named the node itself: nothing to contrast
        return []
    silent = [n for n in _slurm.allocation_nodes()[:nnodes] if n.split(".")[0] not in heard]
    if len(silent) == 1:
        for state in outcome.ranks.values():
            state.host = state.host or silent[0]
    return silent


def summarize(outcome, params: DistSmokeTestParams, nnodes: int) -> DistSmokeTestResult:
    versions = {e["rank"]: e["versions"] for e in outcome.data if e.get("kind") == "versions"}
    backend = next((e.get("backend") for e in outcome.data if e.get("kind") == "versions"), None)
    silent = silent_nodes(outcome, nnodes)
    hosts = {r: s.host for r, s in outcome.ranks.items() if s.host}
    culprits, findings = diagnose(outcome, params.pg_timeout_s)
    if silent:
        findings.append(f"No rank on {', '.join(silent)} reported anything (the other nodes' ranks did): "
                        f"{'that node is' if len(silent) == 1 else 'those nodes are'} where to look.")
    mismatches = version_mismatches(versions, hosts)
    states = sorted(outcome.ranks.values(), key=lambda s: s.rank)
    ok = [s for s in states if s.status == "done"]
    world = outcome.world_size
    if states and len(ok) == len(states) and (len(states) == world or params.rdzv_endpoint):
        verdict = "warn" if mismatches else "ok"
        stage_max = {}
        for s in ok:
            for stage, sec in s.stage_seconds.items():
                stage_max[stage] = max(stage_max.get(stage, 0.0), sec)
        slow = ", ".join(f"{k} {stage_max[k]:.3f} s" for k in ("init", "barrier", "all_reduce") if k in stage_max)
        findings = [f"All {len(states)} ranks on {len(set(hosts.values()))} host(s) joined, passed the barrier and an "
                    f"exact all_reduce check ({backend}); slowest rank per stage: {slow}."]
        common = _versions_text(next(iter(versions.values()), None))
        if common and not mismatches:
            findings.append(f"Same versions on every rank: {common}.")
        if len(states) < world:
            findings.append(f"This node ran ranks {states[0].rank}..{states[-1].rank} of {world}; the other nodes "
                            "report on their own (run the same command there).")
        if world == 1:
            findings.append("World size 1 checks only this rank's setup: run with at least 2 ranks to test "
                            "communication.")
        nxt = ["collective_bench"]
    else:
        verdict = "fail"
        if outcome.stalled:
            findings.append(f"No rank reported progress for {params.pg_timeout_s + 10:g} s: the run was stopped "
                            "and every rank process killed.")
        findings.insert(0, f"{len(ok)} of {len(states) or world} ranks passed"
                           + (" on this node." if params.rdzv_endpoint else "."))
        nxt = ["hang_stack_dump", "nccl_log_analyze", "knowledge://debugging/hangs.md",
               "knowledge://network/nccl-debugging.md"]
    findings += mismatches
    if getattr(params, "nccl_diagnostics", False):
        findings += diagnostics_findings([str(v.get("nccl")) for v in versions.values() if v.get("nccl")],
                                         outcome.output_tail + "\n" + outcome.stderr_tail, backend)
    if mismatches:
        nxt.append("env_report")
    rows = [RankReport(rank=s.rank, host=s.host, local_rank=s.local_rank,
                       device=_device(versions.get(s.rank)), status=s.status, stage=s.stage,
                       seconds=s.stage_seconds, error=s.error, versions=_versions_text(versions.get(s.rank)))
            for s in states if len(states) <= 16 or s.status != "done" or s.rank == 0]
    return DistSmokeTestResult(
        verdict=verdict, findings=findings, next=nxt, world_size=world, nnodes=nnodes, backend=backend,
        ranks_ok=len(ok), culprit_ranks=culprits, hosts=sorted(set(hosts.values())),
        version_mismatches=mismatches, ranks=rows, elapsed_s=outcome.elapsed_s,
        launch_command=" ".join(outcome.command)[:2000])


DIAGNOSTICS_SINCE = (2, 31)   # NCCL user guide, Troubleshooting > Diagnostics: "As of v2.31, NCCL provides ..."


def diagnostics_findings(nccl_versions: list[str], output: str, backend: str | None = "nccl") -> list[str]:
    """What NCCL_RUN_DIAGNOSTICS gave: its 'NCCL DIAG' report lines, or why there are none."""
    if backend and backend != "nccl":
        return [f"NCCL_RUN_DIAGNOSTICS=1 does not apply: the ranks used {backend}, not NCCL."]
    def as_tuple(v: str) -> tuple[int, ...]:
        return tuple(int(x) for x in re.findall(r"\d+", v)[:2]) or (0,)

    old = sorted({v for v in nccl_versions if as_tuple(v) < DIAGNOSTICS_SINCE})
    if nccl_versions and len(old) == len(set(nccl_versions)):
        return [f"NCCL_RUN_DIAGNOSTICS=1 has no effect with NCCL {', '.join(old)}: NCCL's start-up diagnostics came "
                "in 2.31 (update torch or the NCCL it loads to use them)."]
    lines = [ln.strip() for ln in output.splitlines() if "NCCL DIAG" in ln][:10]
    if not lines:
        return ["NCCL_RUN_DIAGNOSTICS=1 was set, but no 'NCCL DIAG' line is in the output kept (its last 2,000 "
                "characters): rerun the job by hand with NCCL_RUN_DIAGNOSTICS=1 to see the full report."]
    failed = [ln for ln in lines if re.search(r"fail|error|mismatch", ln, re.IGNORECASE)]
    return [("NCCL's start-up diagnostics report problems: " if failed else "NCCL's start-up diagnostics: ")
            + " | ".join((failed or lines)[:5])]


def _versions_text(info: dict | None) -> str | None:
    if not info:
        return None
    return " ".join(f"{k} {info[k]}" for k in VERSION_KEYS if info.get(k))


def _device(info: dict | None) -> str | None:
    if not info:
        return None
    return info["device"] if info.get("device_name") in (None, "cpu") else f"{info['device']} {info['device_name']}"


def _gpus(params: DistSmokeTestParams) -> list[int]:
    gpus = local_gpu_count()
    return list(range(min(params.nproc_per_node or gpus, gpus)))


SPEC = ToolSpec(
    name="dist_smoke_test",
    summary="Can every rank talk to every other? Names the rank, host and stage that fails or hangs.",
    description=(
        "Use first when a multi-GPU or multi-node job hangs at start, dies in init_process_group or one node "
        "seems broken: torchrun ranks (srun per node under SLURM) each do init, barrier, an exact all_reduce "
        "check and an allocation; names the rank, host and stage that fails or hangs, and "
        "torch/CUDA/NCCL/driver mismatches across ranks. Symptoms: stuck at the first barrier, "
        "RendezvousConnectionError, 'The client socket has timed out while trying to connect', TCPStore "
        "hangs, gloo works but nccl never starts, multi-node training hangs at accelerator.prepare or before "
        "step 1, init_process_group hangs on all machines (SLURM, Kubernetes, mpirun, ray). ~5-15 s. Not a "
        "bandwidth test (collective_bench)."),
    Params=DistSmokeTestParams, Result=DistSmokeTestResult, run=echo_nccl_env(run), runs="subprocess", needs_torch=True,
    read_only=True, destructive=False, idempotent=True, open_world=False, timeout_s=900,
    gpu_devices=_gpus, metric=None,
    # doctor: a one-node smoke test, on CPU too (2 gloo ranks, ~6 s): the launcher, torchrun and the
    # rank side channel work here.
    doctor=lambda ctx: {"pg_timeout_s": 30, "numel": 4096, "alloc_mib": 1, "nnodes": 1}, doctor_order=40,
    spans_nodes=True,  # reaches the cluster itself: the engine's node= option does not apply
)
