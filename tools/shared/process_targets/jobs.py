"""A SLURM job's processes on this node, proven by uid and cgroup (private to the process_targets door), and the
job itself as squeue reports it: running, whose, on how many nodes."""

import os
from dataclasses import dataclass

from ...engine.spec import ToolFailure
from .kernel import RANK_VARS, is_ours, is_python_proc, ourselves, user_words, env_int, in_job_cgroup


def _claim(pid: int, env: dict, job_id: str) -> str:
    rank = env_int(env, RANK_VARS)
    return f"pid {pid} claims {'rank ' + str(rank) if rank is not None else 'to be a process'} of job {job_id}"


def job_processes(job_id: str, job_uid: int) -> tuple[list[int], list[str]]:
    """(pids of job `job_id` on this node, one line per process that claims the job but is not in it).

    Candidates are Python processes whose environment names the job (on this slurmd's node); each must be the
    job user's, and in `job_<id>`'s cgroup where SLURM's cgroup plugin puts any of them (or us) in one."""
    import psutil

    ours = ourselves()
    node = os.environ.get("SLURMD_NODENAME")      # several slurmd may run on one host: this node's share
    candidates = []
    for p in psutil.process_iter():
        if p.pid in ours:
            continue
        try:
            env = p.environ()
            claims = env.get("SLURM_JOB_ID") == job_id and (node is None or env.get("SLURMD_NODENAME", node) == node)
            if claims and is_python_proc(p) and not is_ours(p.cmdline()):
                candidates.append((p.pid, p.uids().real, env, in_job_cgroup(p.pid, job_id)))
        except (psutil.Error, OSError):
            continue
    cgroup_plugin = in_job_cgroup("self", job_id) or any(c[3] for c in candidates)
    kept, refused = [], []
    for pid, uid, env, in_cgroup in candidates:
        if uid != job_uid:
            refused.append(f"{_claim(pid, env, job_id)} but belongs to {user_words(uid)}, not to the job's user, "
                           f"{user_words(job_uid)}: left out")
        elif cgroup_plugin and not in_cgroup:
            refused.append(f"{_claim(pid, env, job_id)} but is not in job_{job_id}'s cgroup: left out")
        else:
            kept.append(pid)
    return kept, refused


@dataclass(frozen=True)
class RunningJob:
    job_id: str              # SLURM's own id (%A: an array task's raw id), as in SLURM_JOB_ID and job_<id>
    user: str
    uid: int
    nodes: int
    nodelist: str

    def node_names(self, limit: int) -> list[str]:
        """The job's nodes, squeue's list expanded (where a step over every node of the job runs); ToolFailure
        when it is not one, or longer than `limit`."""
        from ..slurm import expand_hostlist

        try:
            names = expand_hostlist(self.nodelist, limit=limit)
        except ValueError as e:
            raise ToolFailure(f"slurm_job_id {self.job_id}: squeue's node list is not one ({e})") from None
        if not names:
            raise ToolFailure(f"slurm_job_id {self.job_id}: squeue lists no node for it (`scontrol show job "
                              f"{self.job_id}`)")
        return names


def running_job(job_id: str) -> RunningJob:
    """The running job `job_id` if the caller may read its processes (its owner, or root); else ToolFailure."""
    from .. import slurm

    try:
        out = slurm.run_cmd(["squeue", "-h", "-j", job_id, "-o", "%T|%u|%D|%N|%U|%A"], timeout_s=20, check=False)
    except slurm.SlurmError as e:
        raise ToolFailure(str(e)) from None
    line = out.strip().splitlines()[0] if out.strip() else ""
    if not line:
        raise ToolFailure(f"slurm_job_id {job_id}: no such job in squeue (wrong id, or it ended more than "
                          "MinJobAge ago): `squeue -u $USER` lists yours.")
    state, user, count, nodelist, uid, raw_id = (line.split("|") + [""] * 6)[:6]
    if state != "RUNNING":
        raise ToolFailure(f"slurm_job_id {job_id} is {state}, not RUNNING: there is nothing to read "
                          f"({slurm.explain_state(state) if state else 'unknown state'}).")
    if not uid.strip().isdigit():
        raise ToolFailure(f"slurm_job_id {job_id}: squeue gave no numeric uid for its user ({uid[:40]!r}): "
                          "its processes cannot be told from other users'.")
    if int(uid) != os.geteuid() and os.geteuid() != 0:
        raise ToolFailure(f"slurm_job_id {job_id} belongs to {user}, not to you ({user_words(os.geteuid(), name_only=True)}): only the "
                          "job's owner or root may read its processes; ask its owner.")
    return RunningJob(job_id=raw_id.strip() if raw_id.strip().isdigit() else job_id, user=user, uid=int(uid),
                      nodes=int(count) if count.isdigit() else 1, nodelist=nodelist)
