"""slurm_status — partitions, drained/down nodes with reasons, GPU use, and your jobs' pending reasons.

Reads what the SLURM client commands report: `sinfo --json` / `squeue --json` where this SLURM
has them (21.08+), `scontrol show node|partition -o` and `squeue -o` format strings otherwise.
Read-only; needs the SLURM client commands and a reachable slurmctld (SLURM_CONF if not default).

By hand (a login node, or inside a job):
    mleng run slurm_status
    mleng run slurm_status --partition gpu --all-users --json
Local throwaway cluster to try it on: `scripts/slurm-local.sh start`, then
    SLURM_CONF=/tmp/slurm-local/etc/slurm.conf mleng run slurm_status
"""

from __future__ import annotations

import errno
import getpass
import ipaddress
import os
import re
import socket
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime


from .shared import slurm as _slurm
from .engine.spec import SELF_EVIDENT, Field, Params, Record, Result, ToolFailure, ToolSpec

PROBLEM_WORDS = ("DRAIN", "DOWN", "FAIL", "NOT_RESPONDING", "INVAL", "NO_RESPOND", "MAINT", "REBOOT",
                 "POWER_DOWN", "POWERED_DOWN", "UNKNOWN")
# "<reason> [<user>@<time>]" at the end of a node's Reason: searched from each '[' to the next, linear.
SET_BY = re.compile(r"\[([^@\]\[]*)@([^\]\[]*)\]$")


class SlurmStatusParams(Params):
    partition: str | None = Field(None, max_length=200,
                                  json_schema_extra=SELF_EVIDENT, description="Default: every partition.")
    user: str | None = Field(None, max_length=100,
                             description="Default: you.")
    all_users: bool = Field(False, json_schema_extra=SELF_EVIDENT, description="Every user's jobs.")
    max_jobs: int = Field(50, ge=0, le=5000, json_schema_extra=SELF_EVIDENT, description="Jobs listed, at most.")


class PartitionInfo(Record):
    name: str = Field(description="Partition name.")
    state: str = Field(description="UP, DOWN, DRAIN or INACTIVE.")
    default: bool = Field(False, description="The partition jobs go to when none is named.")
    nodes_total: int = Field(0, description="Nodes in the partition.")
    nodes_idle: int = Field(0, description="Nodes with nothing running and no problem flag.")
    nodes_in_use: int = Field(0, description="Nodes running jobs (allocated or mixed).")
    nodes_unavailable: int = Field(0, description="Nodes drained, down, failing or not responding.")
    gpus_total: int = Field(0, description="GPUs on the partition's nodes.")
    gpus_used: int = Field(0, description="GPUs allocated to jobs.")
    gpus_free: int = Field(0, description="GPUs on usable nodes not allocated to any job.")


class NodeProblem(Record):
    node: str = Field(description="Node name.")
    state: str = Field(description="Base state plus flags, e.g. IDLE+DRAIN, DOWN+NOT_RESPONDING.")
    reason: str | None = Field(None, description="The reason SLURM holds for the state.")
    set_by: str | None = Field(None, description="Who set the reason (user name).")
    since: str | None = Field(None, description="When the reason was set (ISO 8601, local time).")
    partitions: list[str] = Field(default_factory=list, description="Partitions the node belongs to.")


class JobInfo(Record):
    job_id: str = Field(description="Job id.")
    name: str = Field("", description="Job name.")
    user: str = Field("", description="Owner.")
    state: str = Field("", description="PENDING, RUNNING, ...")
    partition: str = Field("", description="Partition.")
    nodes: str = Field("", description="Node list (running) or count requested (pending).")
    reason: str = Field("", description="SLURM's pending reason (e.g. Priority, Resources).")
    reason_explained: str = Field("", description="What the pending reason means, in plain words.")
    time_used: str = Field("", description="Run time so far, as squeue prints it.")
    time_limit: str = Field("", description="Time limit, as squeue prints it.")


class SlurmStatusResult(Result):
    slurm_version: str | None = Field(None, description="SLURM version of the client commands.")
    source: str = Field("", description="json (sinfo/squeue --json) or text (format strings).")
    partitions: list[PartitionInfo] = Field(default_factory=list, description="Every partition with node and GPU counts.")
    problem_nodes: list[NodeProblem] = Field(default_factory=list,
                                             description="Drained, down, failing or not-responding nodes.")
    jobs: list[JobInfo] = Field(default_factory=list, description="Jobs of the user (or everyone), pending first.")
    jobs_left_out: int = Field(0, description="Jobs not listed because of max_jobs.")


# ---------------------------------------------------------------------------------------------------
# Nodes: one normalised dict per node from either source

def _number(value):
    """22.05 prints plain numbers; 23.02+ wraps them as {"set": true, "infinite": false, "number": N}."""
    if isinstance(value, dict):
        return value.get("number") if value.get("set", True) and not value.get("infinite") else None
    return value


def gres_count(gres: str | None, name: str = "gpu") -> int:
    """'gpu:h100:8(S:0-1),nic:1' -> 8. Sums every entry of that gres name."""
    total = 0
    for m in re.finditer(rf"(?:^|,){name}(?::[^:,(]+)?:(\d+)", gres or ""):
        total += int(m.group(1))
    return total


def nodes_from_json(doc: dict) -> list[dict]:
    out = []
    for n in doc.get("nodes", []):
        state = n.get("state")
        states = [s.upper() for s in (state if isinstance(state, list) else [state or "UNKNOWN"])]
        states += [f.upper() for f in n.get("state_flags", []) or [] if f.upper() not in states]
        changed = _number(n.get("reason_changed_at"))
        out.append({
            "name": n.get("name", "?"), "state": "+".join(states), "partitions": n.get("partitions") or [],
            "address": n.get("address") or None, "port": _number(n.get("port")),
            "reason": n.get("reason") or None, "set_by": n.get("reason_set_by_user") or None,
            "since": datetime.fromtimestamp(changed).isoformat(timespec="seconds") if changed else None,
            "gpus": gres_count(n.get("gres")), "gpus_used": gres_count(n.get("gres_used")),
            "alloc_cpus": _number(n.get("alloc_cpus")) or 0,
        })
    return out


def nodes_from_scontrol(text: str) -> list[dict]:
    out = []
    for line in text.splitlines():
        if not line.strip().startswith("NodeName="):
            continue
        f = _slurm.parse_kv_line(line)
        reason, set_by, since = f.get("Reason") or None, None, None
        m = SET_BY.search(reason or "")
        if m:
            reason, set_by, since = reason[:m.start()].rstrip(), m.group(1), m.group(2)
        out.append({
            "name": f.get("NodeName", "?"), "state": f.get("State", "UNKNOWN").upper().replace("*", "+NOT_RESPONDING"),
            "partitions": [p for p in f.get("Partitions", "").split(",") if p],
            "address": f.get("NodeAddr") or None, "port": None,   # the port: SlurmdPort of the config
            "reason": reason if reason not in (None, "(null)", "none") else None, "set_by": set_by,
            "since": since, "gpus": gres_count(f.get("Gres")), "gpus_used": gres_count(f.get("GresUsed")),
            "alloc_cpus": int(f.get("CPUAlloc", "0") or 0),
        })
    return out


def is_problem(state: str) -> bool:
    return any(w in state for w in PROBLEM_WORDS)


def summarise_partitions(partition_lines: str, nodes: list[dict]) -> list[PartitionInfo]:
    parts = []
    for line in partition_lines.splitlines():
        if not line.strip().startswith("PartitionName="):
            continue
        f = _slurm.parse_kv_line(line)
        name = f["PartitionName"]
        members = [n for n in nodes if name in n["partitions"]]
        usable = [n for n in members if not is_problem(n["state"])]
        in_use = [n for n in usable if n["alloc_cpus"] or n["gpus_used"]
                  or any(s in n["state"] for s in ("ALLOC", "MIX", "COMPLETING"))]
        parts.append(PartitionInfo(
            name=name, state=f.get("State", "UNKNOWN"), default=f.get("Default") == "YES",
            nodes_total=len(members), nodes_in_use=len(in_use), nodes_idle=len(usable) - len(in_use),
            nodes_unavailable=len(members) - len(usable),
            gpus_total=sum(n["gpus"] for n in members), gpus_used=sum(n["gpus_used"] for n in members),
            gpus_free=sum(max(0, n["gpus"] - n["gpus_used"]) for n in usable)))
    return parts


# ---------------------------------------------------------------------------------------------------
# Jobs

def jobs_from_json(doc: dict, now: float) -> list[JobInfo]:
    jobs = []
    for j in doc.get("jobs", []):
        state = j.get("job_state")
        state = (state[0] if isinstance(state, list) and state else state) or "UNKNOWN"
        start, limit = _number(j.get("start_time")) or 0, _number(j.get("time_limit"))
        used = max(0, now - start) if state == "RUNNING" and start else 0
        task = _number(j.get("array_task_id"))
        jid = f"{j.get('array_job_id')}_{task}" if task is not None and j.get("array_job_id") else str(j.get("job_id"))
        jobs.append(JobInfo(
            job_id=jid, name=j.get("name", ""), user=j.get("user_name", ""), state=state,
            partition=j.get("partition", ""),
            nodes=j.get("nodes") or str(_number(j.get("node_count")) or ""), reason=j.get("state_reason", ""),
            time_used=_slurm.format_duration(used), time_limit=_slurm.format_duration(limit * 60 if limit else None)))
    return jobs


SQUEUE_FORMAT = "%i|%j|%u|%T|%P|%D|%R|%r|%M|%l"


def jobs_from_text(text: str) -> list[JobInfo]:
    jobs = []
    for line in text.splitlines():
        cols = line.split("|")
        if len(cols) != 10:
            continue
        jid, name, user, state, part, count, nodes_or_reason, reason, used, limit = cols
        jobs.append(JobInfo(job_id=jid, name=name, user=user, state=state, partition=part,
                            nodes=count if state == "PENDING" else nodes_or_reason, reason=reason,
                            time_used=used, time_limit=limit))
    return jobs


ACTIVE = ("PENDING", "RUNNING", "CONFIGURING", "COMPLETING", "SUSPENDED", "REQUEUED", "RESIZING")


def _job_findings(jobs: list[JobInfo]) -> tuple[list[str], bool]:
    findings, stuck = [], False
    for j in jobs:
        if j.state == "PENDING":
            j.reason_explained = _slurm.explain_pending_reason(j.reason)
            never = any(w in j.reason for w in ("NeverSatisfied", "PartitionNodeLimit", "PartitionTimeLimit",
                                                "BadConstraints", "Invalid", "HeldAdmin", "PartitionDown"))
            stuck |= never
            findings.append(f"Job {j.job_id} ({j.name}) is PENDING on {j.partition} because of {j.reason}: "
                            f"{j.reason_explained}.")
    return findings, stuck


PROBE_TIMEOUT_S = 2.0
PROBED_MAX = 16   # nodes not responding probed at once, at most (each costs at most PROBE_TIMEOUT_S, in parallel)
HOST = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.\-]{0,252}")


def knock(address: str, port: int, timeout_s: float = PROBE_TIMEOUT_S) -> str:
    """What a TCP connect from here to slurmd's port says of a node slurmctld hears nothing from: "refused" (the
    host's kernel answers and nothing listens: slurmd is not running), "accepted" (something listens: slurmd is up
    but hung, frozen, or cannot reach slurmctld back), "silent" (no answer at all in timeout_s), "unreachable" (the
    route says so at once), or "" when the address is not one to dial."""
    try:
        ipaddress.ip_address(address)
    except ValueError:
        if not HOST.fullmatch(address):
            return ""
    try:
        with socket.create_connection((address, port), timeout=timeout_s):
            return "accepted"
    except ConnectionRefusedError:
        return "refused"
    except (TimeoutError, socket.timeout):
        return "silent"
    except OSError as e:
        return "unreachable" if e.errno in (errno.EHOSTUNREACH, errno.ENETUNREACH, errno.EHOSTDOWN) else ""


KNOCKED = {
    "refused": "refused: the host is up and nothing listens there, so slurmd is not running (start it; its log says "
               "why it stopped)",
    "accepted": "accepted, yet slurmctld hears nothing: slurmd is hung or stopped (a frozen process keeps its "
                "socket), or cannot reach slurmctld back; restart it",
    "silent": "no answer at all: the host is down or cut off from the network (its link, switch port or a "
              "firewall); check its console or BMC",
    "unreachable": "no route from here: the host is down or cut off from the network; check its console or BMC",
}


def slurmd_port() -> int | None:
    m = re.search(r"^SlurmdPort\s*=\s*(\d{1,5})\s*$", _slurm.run_cmd(["scontrol", "show", "config"]), re.M)
    return int(m.group(1)) if m else None


def knock_silent_nodes(nodes: list[dict]) -> dict[str, str]:
    """{node: a sentence} for the nodes slurmctld marks NOT_RESPONDING: what their slurmd port says from here.
    The distinction the user acts on: a dead slurmd (restart it) from a host or link that is down (console, BMC);
    a model had only "IDLE+NOT_RESPONDING, reason (none given)" (round 8, cl-link-down)."""
    silent = [n for n in nodes if "NOT_RESPONDING" in n["state"] and n.get("address")][:PROBED_MAX]
    if not silent:
        return {}
    default_port = None if all(n.get("port") for n in silent) else slurmd_port()
    targets = {n["name"]: (n["address"], n.get("port") or default_port) for n in silent}
    targets = {k: v for k, v in targets.items() if v[1] and 0 < v[1] < 65536}
    with ThreadPoolExecutor(max_workers=max(1, len(targets))) as pool:
        answers = dict(zip(targets, pool.map(lambda t: knock(*t), targets.values())))
    return {name: f"From here, a connection to its slurmd ({targets[name][0]} port {targets[name][1]}) was "
                  f"{KNOCKED[said]}" for name, said in answers.items() if said}


@_slurm.failures_as_tool_failure
def run(params: SlurmStatusParams, progress) -> SlurmStatusResult:
    progress(0.1, "asking slurmctld for nodes")
    version = _slurm.run_cmd(["sinfo", "--version"]).strip().replace("slurm ", "") or None
    node_doc = _slurm.json_or_none(["sinfo"])
    if node_doc is not None:
        nodes, source = nodes_from_json(node_doc), "json"
    else:
        nodes, source = nodes_from_scontrol(_slurm.run_cmd(["scontrol", "show", "node", "-d", "-o"])), "text"
    progress(0.4, "reading partitions")
    parts = summarise_partitions(_slurm.run_cmd(["scontrol", "show", "partition", "-o"]), nodes)
    if params.partition:
        parts = [p for p in parts if p.name == params.partition]
        if not parts:
            raise ToolFailure(f"partition {params.partition!r} does not exist; partitions here: "
                              f"{', '.join(sorted({p for n in nodes for p in n['partitions']})) or 'none'}")
        nodes = [n for n in nodes if params.partition in n["partitions"]]

    progress(0.6, "reading jobs")
    user = params.user or os.environ.get("USER") or getpass.getuser()
    job_doc = _slurm.json_or_none(["squeue"])
    if job_doc is not None:
        jobs = jobs_from_json(job_doc, time.time())
    else:
        argv = ["squeue", "-h", "-o", SQUEUE_FORMAT] + ([] if params.all_users else ["-u", user])
        jobs = jobs_from_text(_slurm.run_cmd(argv))
    jobs = [j for j in jobs if j.state in ACTIVE and (params.all_users or j.user == user)
            and (not params.partition or params.partition in j.partition.split(","))]
    jobs.sort(key=lambda j: (j.state != "PENDING", j.job_id))

    problems = [NodeProblem(node=n["name"], state=n["state"], reason=n["reason"], set_by=n["set_by"],
                            since=n["since"], partitions=n["partitions"]) for n in nodes if is_problem(n["state"])]
    findings = []
    for p in parts:
        gpu = f"; GPUs {p.gpus_free} free of {p.gpus_total} ({p.gpus_used} in use)" if p.gpus_total else ""
        findings.append(f"Partition {p.name} is {p.state}: {p.nodes_total} nodes, {p.nodes_idle} idle, "
                        f"{p.nodes_in_use} in use, {p.nodes_unavailable} unavailable{gpu}.")
    knocked = knock_silent_nodes([n for n in nodes if is_problem(n["state"])]) if problems else {}
    for n in problems:
        who = f", set by {n.set_by}" if n.set_by else ""
        when = f" since {n.since}" if n.since else ""
        findings.append(f"Node {n.node} is {n.state}{when}{who}: reason {n.reason or '(none given)'!r}."
                        + (f" {knocked[n.node]}." if n.node in knocked else ""))
    job_findings, stuck = _job_findings(jobs)
    findings += job_findings
    whose = "all users" if params.all_users else f"user {user}"
    running = sum(j.state == "RUNNING" for j in jobs)
    findings.append(f"{len(jobs)} active jobs for {whose}: {running} running, "
                    f"{sum(j.state == 'PENDING' for j in jobs)} pending.")

    down_parts = [p for p in parts if p.state != "UP"]
    verdict = "warn" if problems or stuck or down_parts else "ok"
    nxt = ["knowledge://orchestration/slurm.md"]
    if problems:
        nxt += ["gpu_health", "knowledge://compute/gpu-faults.md"]
    nxt.append("slurm_job_diagnose")
    left_out = max(0, len(jobs) - params.max_jobs)
    progress(1.0, "done")
    return SlurmStatusResult(verdict=verdict, findings=findings, next=nxt, slurm_version=version, source=source,
                             partitions=parts, problem_nodes=problems, jobs=jobs[:params.max_jobs],
                             jobs_left_out=left_out)


SPEC = ToolSpec(
    name="slurm_status",
    summary="SLURM partitions, drained/down nodes with reasons, GPU use, and your jobs' pending reasons.",
    description=(
        "Look at a SLURM cluster from a login node: every partition's state with idle / in-use / unavailable "
        "node counts and GPUs free and used; nodes that are drained, down, failing or not responding with "
        "the reason, who set it and since when; the user's running and pending jobs with the pending reason "
        "in plain words (Priority, Resources, ReqNodeNotAvail, Dependency, QOS/association limits). Use for "
        "'my job is stuck in PD', 'why is nothing running', 'which nodes are drained', 'are GPUs free'. "
        "Read-only, a few seconds; needs SLURM client commands (sinfo, squeue, scontrol). Not for a job "
        "that already ended (slurm_job_diagnose) or for GPU hardware faults (gpu_health)."),
    Params=SlurmStatusParams, Result=SlurmStatusResult, run=run,
    runs="subprocess", read_only=True, destructive=False, idempotent=True, open_world=True,
    timeout_s=120, store=False,
    doctor=lambda ctx: {} if _slurm.client_configured() else None, doctor_order=60,  # only where SLURM is
    spans_nodes=True,  # reaches the cluster itself: the engine's node= option does not apply
)

if __name__ == "__main__":
    from .engine.cli import tool_main

    tool_main(SPEC)
