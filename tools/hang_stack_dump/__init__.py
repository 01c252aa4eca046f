"""hang_stack_dump — py-spy stacks of a stuck job's processes, grouped, with the odd ranks named.

"It's stuck": dump the Python stack of every rank (py-spy attaches with ptrace; the job is not
stopped or changed), group identical stacks, and name the minority — typically most ranks wait in a
collective and one is somewhere else: "ranks 0-6 wait in all_reduce called from train.py:212;
rank 7 is in the dataloader at data.py:88". Each process's rank comes from its environment
(RANK / LOCAL_RANK / SLURM_PROCID).

By hand (the node the job runs on, as the job's user or root):
    mleng run hang_stack_dump --launcher-pid 12345             # a torchrun pid: all its workers
    mleng run hang_stack_dump --pattern 'train.py'             # processes whose command matches
    mleng run hang_stack_dump --gpu-processes                  # every process holding GPU memory
    mleng run hang_stack_dump --pids 101 102 --native --save-path /tmp/stacks.txt
Saved dumps (the job is gone, or someone else ran py-spy): one `py-spy dump` (text or --json) per rank,
    mleng run hang_stack_dump --dump-paths dumps/            # files, folders per node, globs
Under SLURM (from a login node or inside the allocation; needs this checkout on a shared filesystem):
    mleng run hang_stack_dump --slurm-job-id 4242              # prints the all-nodes srun command
    mleng run hang_stack_dump --slurm-job-id 4242 --all-nodes  # runs it: every node, one report
Without SLURM (torchrun launched over ssh; mleng at the same path on every host):
    mleng run hang_stack_dump --hosts 'gpu-[01-04]' --run-id job42   # every host over ssh (ssh_hosts.py)
"""

import os
import shlex
import socket
import time
from typing import Annotated

from .motion import LOOK_S
from .report import compared_ranks, findings_for, motion_findings, motion_of, odd_groups, odd_headline
from .saved import read_saved
from .stacks import (
    ProcessStack,
    StackGroup,
    assign_roles,
    dump_processes,
    look_again,
    group_stacks,
)
from .slurm_job import dump_job, hint_nodes, job_nodes, job_transport
from .ssh_hosts import dump_hosts, hosts_of
from .step import NOTHING_THERE
from ..shared.process_targets import ALLOW_OTHER_USERS_HELP, Targets, TargetRequest, check_job_name, select
from ..engine.processes import python_module_command
from ..engine.spec import SELF_EVIDENT, Field, Params, Result, ToolFailure, ToolSpec
from ..shared.culprit_kind import CULPRIT_KIND_FIELD, Culprit, CulpritKind, rank_culprit
from ..shared.pyspy import py_spy_path
from ..shared.safe_write import check_output, output_path, write_output

MAX_PROCESSES = 1024


class HangStackDumpParams(Params):
    pids: list[Annotated[int, Field(ge=1)]] = Field(default_factory=list, max_length=MAX_PROCESSES,
                                                    json_schema_extra=SELF_EVIDENT, description="Process ids to dump.")
    launcher_pid: int | None = Field(None, ge=1, description="A launcher's pid (torchrun, deepspeed, srun): its ranks.")
    pattern: str = Field("", max_length=200, description="Regex on the command line ('train.py').")
    gpu_processes: bool = Field(False, description="Every process holding GPU memory.")
    slurm_job_id: str = Field("", max_length=32, pattern=r"^[0-9_]*$", description=(
        "Its processes here (every node with all_nodes)."))
    all_nodes: bool = Field(False, description="Every node of slurm_job_id (srun --overlap).")
    hosts: list[Annotated[str, Field(max_length=4096)]] = Field(default_factory=list, max_length=64, description=(
        "No SLURM: over ssh, with run_id or launcher_match."))
    run_id: str | None = Field(None, max_length=128, json_schema_extra=SELF_EVIDENT, description=(
        "torchrun's --rdzv-id (TORCHELASTIC_RUN_ID in its ranks): its ranks here, or on hosts."))
    launcher_match: str | None = Field(None, max_length=200, json_schema_extra=SELF_EVIDENT, description=(
        "A literal piece of the launcher's command line: its ranks here, or on hosts."))
    allow_other_users: bool = Field(False, description=ALLOW_OTHER_USERS_HELP)
    native: bool = Field(False, description="C/C++ frames too (~1 s per torch process).")
    save_path: str = Field("", max_length=4096, description=(
        (
            "Write full dumps here ('{host}': host name).")))
    overwrite: bool = Field(False, json_schema_extra=SELF_EVIDENT, description="Replace save_path if it exists.")
    max_frames: int = Field(12, ge=1, le=200, json_schema_extra=SELF_EVIDENT, description="Frames kept per stack.")
    max_groups: int = Field(8, ge=1, le=200, json_schema_extra=SELF_EVIDENT, description="Stack groups shown.")
    per_process_timeout_s: float = Field(30.0, gt=0, le=600, json_schema_extra=SELF_EVIDENT, description=(
        "Per py-spy call."))
    detail: bool = Field(False, description="Also each process's stack.")
    dump_paths: list[str] = Field(default_factory=list, max_length=64, description=(
        "Saved py-spy dumps (text, --json): files, folders, globs."))
    dump_text: str | None = Field(None, max_length=20_000_000, description="Pasted py-spy dumps instead.")


class HangStackDumpResult(Result):
    # Every process examined: the groups carry the stacks, ranks and hosts, the findings the odd one out.
    detail_fields = ("processes",)

    groups: list[StackGroup] = Field(default_factory=list, description="Identical main-thread stacks, largest first.")
    odd_ranks: list[int] = Field(default_factory=list, description="Ranks outside the majority stack: look here first.")
    odd_nodes: list[str] = Field(default_factory=list, description=(
        "Hosts of the odd ranks, when the dump spans several hosts (all_nodes)."))
    hosts: list[str] = Field(default_factory=list, description="Hosts whose processes were dumped.")
    processes: list[ProcessStack] = Field(default_factory=list, description="Every process examined.")
    dumped: int = Field(0, description="Processes whose stack was read.")
    failed: int = Field(0, description="Processes that could not be dumped (see processes[].error).")
    slurm_command: str = Field("", description="The srun command that dumps every node of the job.")
    launcher: str = Field("", description="How other hosts were reached: srun or ssh (empty: this node only).")
    saved_to: str = Field("", description="File holding the full dumps, when save_path was given.")
    frozen_ranks: list[int] = Field(default_factory=list, description=(
        "Ranks whose process is stopped (SIGSTOP) or frozen (cgroup freezer): the ones the others wait for."))
    left_out: list[str] = Field(default_factory=list, description=(
        "Processes not dumped: claimed the job but not its user's or cgroup's, or another user's."))
    silent_nodes: list[str] = Field(default_factory=list, description=(
        "all_nodes or hosts: nodes of the job that sent no report (frozen, unreachable, or the dump failed there); why is "
        "in findings."))
    culprit_kind: CulpritKind | None = Field(None, description=CULPRIT_KIND_FIELD)
    culprit: Culprit | None = Field(None, description="The one odd rank, when exactly one is outside the majority.")
    motion: str = Field("one_snapshot", description=(
        "running | not_moving | partly | one_snapshot: whether the ranks moved between looks (processes[].moved)."))


def resolve_targets(params: HangStackDumpParams) -> Targets:
    targets = select(TargetRequest(pids=list(params.pids), launcher_pid=params.launcher_pid, pattern=params.pattern,
                                   gpu_processes=params.gpu_processes, allow_other_users=params.allow_other_users,
                                   job_id=params.slurm_job_id if not params.all_nodes else "",
                                   run_id=params.run_id, launcher_match=params.launcher_match))
    targets.pids = targets.pids[:MAX_PROCESSES]
    return targets


def slurm_all_nodes_command(params: HangStackDumpParams, nodes: list[str]) -> list[str]:
    """The srun command that dumps every node of the job, as a user would run it by hand (labelled output)."""
    return job_transport(params.slurm_job_id).argv(per_node_command(params, "--slurm-job-id", params.slurm_job_id),
                                                   nodes=nodes, label=True)


def per_node_command(params: HangStackDumpParams, *target: str) -> list[str]:
    """The dump each node runs on its own processes (srun or ssh puts it there), printing its report as JSON."""
    # Our package by its installed name (`mleng` from the wheel, `tools` in a checkout), not a fixed `tools`.
    cmd = python_module_command("hang_stack_dump", *target, "--detail", "--max-frames", str(params.max_frames),
                                "--per-process-timeout-s", str(params.per_process_timeout_s), "--json")
    if params.save_path:
        path = params.save_path if "{host}" in params.save_path else params.save_path + ".{host}"
        cmd += ["--save-path", str(output_path(path, "dumps", "unused"))]   # absolute: srun runs elsewhere
        cmd += ["--overwrite"] if params.overwrite else []
    return cmd + (["--native"] if params.native else [])


# ---------------------------------------------------------------------------------------------------
# The tool

def _require_targets(params: HangStackDumpParams) -> None:
    live = (params.pids or params.launcher_pid or params.pattern or params.gpu_processes or params.slurm_job_id
            or params.run_id or params.launcher_match or params.hosts)
    saved = params.dump_paths or params.dump_text
    if live and saved:
        raise ToolFailure("give either live targets (pids, launcher_pid, pattern, gpu_processes, slurm_job_id, "
                          "run_id, launcher_match) or saved dumps (dump_paths, dump_text), not both")
    if params.hosts and params.slurm_job_id:
        raise ToolFailure("give slurm_job_id (a SLURM job: add all_nodes) or hosts (a job launched over ssh, with "
                          "run_id or launcher_match), not both")
    try:
        check_job_name(params, bool(params.hosts))
    except ValueError as e:
        raise ToolFailure(str(e)) from None
    if live or saved:
        return
    job = os.environ.get("SLURM_JOB_ID", "")
    hint = (f" This shell is inside SLURM job {job}: slurm_job_id={job} dumps its processes on this node, "
            "and adding all_nodes=true dumps every node." if job.isdigit() else "")
    raise ToolFailure("say which processes to dump: pids, launcher_pid (torchrun's pid), pattern (e.g. "
                      "'train.py'), gpu_processes=true, slurm_job_id, or hosts with run_id (a job launched over "
                      "ssh, no SLURM)." + hint)


def _save_full_dumps(save_path: str, full: list[str], overwrite: bool) -> str:
    """Where the full dumps went; under all_nodes each node wrote its own file, named per host."""
    if not save_path:
        return ""
    if not full:
        return save_path if "{host}" in save_path else save_path + ".{host}"
    target = output_path(save_path.replace("{host}", socket.gethostname()), "dumps", "unused")
    return str(write_output(target, "\n".join(full), overwrite=overwrite, field="save_path"))


def _uncompared_findings(procs: list[ProcessStack], problems: list[str]) -> list[str]:
    """What was dumped but left out of the comparison, and what could not be dumped at all."""
    out = []
    ranked = any(p.role == "rank" for p in procs)
    helpers = [p for p in procs if p.role == "helper"]
    others = [p for p in procs if p.role in ("launcher", "other")]
    if ranked and helpers:
        out.append(f"{len(helpers)} child process(es) of ranks (dataloader or compile workers) were "
                   "dumped but not compared with the ranks: see processes (detail=true for stacks).")
    if ranked and others:
        out.append(f"{len(others)} process(es) without a rank in their environment (launchers, "
                   "others) were dumped but not compared with the ranks: see processes.")
    errors = [p.error for p in procs if p.error] + problems
    if errors:
        out.append(f"{len(errors)} process(es) not dumped; first: {errors[0]}")
    return out


def _silent_why(problems: list[str]) -> str:
    return "; ".join(problems[:3])[:600] or "no output"


def run(params: HangStackDumpParams, progress) -> HangStackDumpResult:
    _require_targets(params)
    if params.save_path and not (params.all_nodes or params.hosts):   # a bad path fails now, not after every dump
        check_output(output_path(params.save_path.replace("{host}", socket.gethostname()), "dumps", "unused"),
                     overwrite=params.overwrite, field="save_path")
    result = HangStackDumpResult()
    nodes: list[str] = []
    if params.slurm_job_id:     # all_nodes: the job's owner or root, as straggler_find: else a clear refusal
        nodes = job_nodes(params.slurm_job_id) if params.all_nodes else hint_nodes(params.slurm_job_id)
    if nodes:
        result.slurm_command = shlex.join(slurm_all_nodes_command(params, nodes))
    progress(0.05, "finding processes")
    problems, full, derived, left_out = [], [], [], []
    fingerprints: dict[int, str] | None = None
    cpu: dict[int, float | None] = {}
    if params.dump_paths or params.dump_text:
        procs, notes = read_saved(params.dump_paths, params.dump_text, params.max_frames)
        problems = [n for n in notes if n.startswith("not read") or ": not py-spy" in n]
        derived = [n for n in notes if n not in problems]
    elif params.slurm_job_id and params.all_nodes:
        result.launcher = "srun"
        procs, problems, result.silent_nodes, left_out = dump_job(
            params.slurm_job_id, nodes, per_node_command(params, "--slurm-job-id", params.slurm_job_id),
            params.per_process_timeout_s, progress)
    elif params.hosts:
        result.launcher = "ssh"
        # --flag=value: a launcher piece may start with '-' ('--rdzv-id=job42'), which argparse would take for a flag
        target = [f"--run-id={params.run_id}" if params.run_id else f"--launcher-match={params.launcher_match}",
                  *(["--allow-other-users"] if params.allow_other_users else [])]
        procs, problems, result.silent_nodes, left_out = dump_hosts(
            hosts_of(params.hosts), per_node_command(params, *target), params.per_process_timeout_s, progress)
    else:
        targets = resolve_targets(params)
        left_out = targets.refused
        if not targets.pids:
            why = f" Left out: {'; '.join(left_out[:3])}." if left_out else ""
            raise ToolFailure(f"{NOTHING_THERE}: check the pid / pattern / job id on THIS node (ps -ef), or use "
                              "slurm_job_id with all_nodes to reach every node of a SLURM job." + why)
        fingerprints = {}
        procs, full = dump_processes(targets.pids, params.native, params.per_process_timeout_s, params.max_frames,
                                     progress, fingerprints, cpu)
        first_look_done = time.monotonic()
    procs = list({(p.host, p.pid): p for p in procs}.values())   # nodes sharing a host report alike
    procs.sort(key=lambda p: (p.rank if p.rank is not None else 1 << 30, p.host, p.pid))
    result.failed = sum(1 for p in procs if p.error)
    result.dumped = len(procs) - result.failed
    result.saved_to = _save_full_dumps(params.save_path, full, params.overwrite)
    assign_roles(procs)
    if fingerprints is not None:        # live, on this node: look again before calling anything stuck
        look_again(compared_ranks(procs), fingerprints, cpu, first_look_done, params.per_process_timeout_s,
                   py_spy_path(), progress, LOOK_S)
    result.motion = motion_of(procs)
    ranked = [p for p in procs if p.role == "rank"]
    groups = group_stacks(ranked or procs)    # launchers and ranks' own children are not compared with ranks
    # A job whose waiting ranks moved is running: whoever the snapshot caught elsewhere is no culprit.
    odd = odd_groups(groups) if result.motion != "running" else []
    result.groups = (odd + [g for g in groups if g not in odd])[:params.max_groups]
    result.odd_ranks = sorted(r for g in odd for r in g.ranks)
    result.hosts = sorted({p.host for p in procs if p.host})
    if len(result.hosts) > 1:
        result.odd_nodes = sorted({h for g in odd for h in g.hosts})
    shown = procs if (params.detail or len(procs) <= 64) else [p for p in procs if p.error][:64]
    result.processes = shown if params.detail else [p.model_copy(update={"stack": []}) for p in shown]
    moving = motion_findings(procs, result.motion, groups)
    frozen = [p for p in procs if p.frozen]
    shape = ([] if result.motion == "running" else findings_for(groups, odd, result.motion, tuple(frozen)))
    result.findings = moving[:1 if result.motion == "running" else 0] + odd_headline(odd, groups, procs) + shape + \
        moving[1 if result.motion == "running" else 0:] + derived + _uncompared_findings(
        procs, problems) + ([f"{len(left_out)} process(es) left out, not dumped; first: {left_out[0]}"] if left_out else [])
    result.left_out = left_out[:64]
    result.frozen_ranks = sorted({p.rank for p in frozen if p.rank is not None})
    result.findings[:0] = [f"{'rank ' + str(p.rank) if p.rank is not None else 'a process'} on {p.host}: {p.frozen}. "
                           "The other ranks wait for it: this is the culprit (thaw it with SIGCONT, or stop the job "
                           "and look at what froze it)." for p in frozen[:8]]
    # A node that sent nothing while others answered is where to look; when none answered, no node stands apart
    # (model round 11: all four silent, and "that node is where to look first" pointed at nothing).
    silent_apart = result.silent_nodes if result.dumped or frozen else []
    if silent_apart:
        these = "that node is" if len(silent_apart) == 1 else "those nodes are"
        said = [f"No report from {', '.join(silent_apart)} (of the job's nodes): {_silent_why(problems)}. "
                f"Its ranks could not be compared: {these} where to look first."]
    elif result.silent_nodes:
        said = [f"No report from any of the job's nodes ({', '.join(result.silent_nodes)}): {_silent_why(problems)}. "
                "Nothing was compared and no node stands apart: fix what the reasons say, or dump one rank with "
                "pids and node."]
    else:
        said = []
    result.findings[len(frozen[:8]):len(frozen[:8])] = said
    result.odd_ranks = sorted(set(result.odd_ranks) | set(result.frozen_ranks))
    result.odd_nodes = sorted(set(result.odd_nodes) | {p.host for p in frozen} | set(silent_apart))
    if result.odd_nodes and not result.silent_nodes and not frozen:
        rest = [h for h in result.hosts if h not in result.odd_nodes]
        result.findings.insert(1, f"The odd ranks run on {', '.join(result.odd_nodes)}"
                                  + (f"; the others on {', '.join(rest)}." if rest else "."))
    if not result.dumped and not frozen and not result.silent_nodes:
        errors = [p.error for p in procs if p.error] + problems
        raise ToolFailure("no stack could be read. " + "; ".join(dict.fromkeys(errors))[:1500])
    culprits = result.frozen_ranks or result.odd_ranks
    if len(culprits) == 1 and not result.silent_nodes:
        host = next((p.host for p in procs if p.rank == culprits[0]), "")
        result.culprit = rank_culprit(culprits[0], host or None)
        result.culprit_kind = "rank"
    result.verdict = ("warn" if odd or result.failed or problems or left_out or frozen or result.silent_nodes
                      else "info")
    result.next = (["straggler_find", "knowledge://debugging/hangs.md"] if result.motion == "running" else
                   ["knowledge://debugging/hangs.md"] if frozen else    # the cause is known: what stopped it
                   ["flight_recorder_analyze", "log_triage", "knowledge://debugging/hangs.md"] if odd else
                   ["flight_recorder_analyze", "nccl_log_analyze", "knowledge://debugging/hangs.md"])
    progress(1.0, "done")
    return result


SPEC = ToolSpec(
    name="hang_stack_dump",
    summary="py-spy stacks of a hung job's ranks, grouped by identical stack; names the ranks that are elsewhere.",
    description=(
        "For a job that is stuck right now while its processes are still alive ('training hangs at step 300', "
        "'GPU util 0%, no progress', frozen, deadlock, an eval loop, dataloader or torch.save that never "
        "returns, one rank lagging while the others wait, 'where is it stuck'): reads every rank's Python "
        "stack with py-spy without stopping the job, groups identical stacks and names the odd ranks. Targets: pids, a launcher pid, a "
        "command regex, GPU processes, a SLURM job (all_nodes), hosts over ssh. Needs ptrace (says how). "
        "Also saved dumps. The job already died: log_triage or flight_recorder_analyze."),
    Params=HangStackDumpParams, Result=HangStackDumpResult, run=run, runs="subprocess",
    read_only=False, destructive=True, idempotent=True, open_world=False, timeout_s=300, store=False,
)
