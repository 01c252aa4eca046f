"""A running SLURM job's nodes, sampled at once: one light `straggler_find.node` per node via srun --overlap.

The job is checked first (exists, RUNNING, the caller's or the caller is root): a wrong id is an answer,
not an srun that waits for resources. Each node prints one labelled JSON line when its window ends;
those lines stream back as progress. srun is killed (with its step) if it outlives window + 90 s.
"""

import json
import shlex
import subprocess
import threading
import time

from .models import NodeReport
from ..engine.data import IMPORT_ROOT
from ..engine.processes import child_env, kill_tree, python_module_command, spawn_tree
from ..engine.spec import ToolFailure
from ..shared.process_targets import RunningJob, running_job

MAX_NODES = 64


def check_job(job_id: str) -> RunningJob:
    """The running job the caller may read, at most MAX_NODES nodes; ToolFailure naming what is wrong."""
    job = running_job(job_id)
    if job.nodes > MAX_NODES:
        raise ToolFailure(f"slurm_job_id {job_id} spans {job.nodes} nodes; straggler_find samples at most {MAX_NODES} "
                          "at once (the answer must come back in one window).")
    return job


def node_command(job_id: str, nodes: int, spec: dict) -> list[str]:
    return ["srun", "--overlap", f"--jobid={job_id}", f"--nodes={nodes}", f"--ntasks={nodes}",
            "--ntasks-per-node=1", "--label", "--kill-on-bad-exit=0", "--quiet", f"--chdir={IMPORT_ROOT}",
            *python_module_command("straggler_find.node", json.dumps(spec))]


def sample_job(job_id: str, spec: dict, progress) -> tuple[list[NodeReport], list[str]]:
    """Every node's report, and what went wrong on the way (a node without a report, srun's errors)."""
    job = check_job(job_id)
    nodes, nodelist = job.nodes, job.nodelist
    # The nodes keep only processes of the job's user (and cgroup): a SLURM_JOB_ID in an environment is a claim.
    cmd = node_command(job_id, nodes, {**spec, "job_id": job.job_id, "job_uid": job.uid})
    deadline_s = float(spec["window_s"]) + 90
    progress(0.05, f"sampling {nodes} node(s) of job {job_id} ({nodelist}) for {spec['window_s']:.0f} s")
    try:
        proc = spawn_tree(cmd, env=child_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    except FileNotFoundError:
        raise ToolFailure("srun is not on PATH: run straggler_find on a login or compute node of the cluster.") from None
    timer = threading.Timer(deadline_s, lambda: kill_tree(proc.pid, grace_s=3))
    timer.start()
    reports, problems = [], []
    start = time.monotonic()
    pending: dict[str, str] = {}
    try:
        for line in proc.stdout:
            # srun --label cuts a long line into pieces, each with its label: a task's report is whole when
            # its pieces joined parse as JSON.
            task, _, text = line.partition(": ")
            pending[task] = pending.get(task, "") + text.rstrip("\n")
            try:
                report = NodeReport(**json.loads(pending[task]))
            except (ValueError, TypeError):
                continue
            del pending[task]
            reports.append(report)
            progress(0.1 + 0.8 * len(reports) / nodes, f"{report.host}: " + node_line(report))
        stderr = proc.stderr.read()
        proc.wait()
    finally:
        timer.cancel()
    if time.monotonic() - start >= deadline_s:
        problems.append(f"srun did not finish within {deadline_s:.0f} s and was stopped: a node may be unreachable "
                        f"(`scontrol show job {job_id}`, `sinfo -R`)")
    problems += [f"node task {task.strip()}: unreadable output {text[:160]!r}" for task, text in pending.items()]
    if len(reports) < nodes:
        problems.append(f"{nodes - len(reports)} of {nodes} node(s) sent no report; srun exit {proc.returncode}: "
                        f"{stderr.strip()[-400:] or 'no error text'} (command: {shlex.join(cmd[:9])} ...)")
    return reports, problems


def node_line(report: NodeReport) -> str:
    """One progress row per node: each rank's waiting and working shares."""
    parts = []
    for r in report.ranks:
        if r.error:
            parts.append(f"rank {r.rank} not sampled ({r.error[:80]})")
        else:
            f = r.fractions
            parts.append(f"rank {r.rank}: collective {f.get('collective', 0):.0%}, compute {f.get('compute', 0):.0%}, "
                         f"data {f.get('data', 0):.0%} ({r.samples} samples)")
    return "; ".join(parts) or "; ".join(report.node.errors) or "no rank"
