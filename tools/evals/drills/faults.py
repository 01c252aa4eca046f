"""Putting a drill's faults in place and taking every one of them out again.

Every step is written to the drill's state file BEFORE it is taken, so `mleng drill stop` can undo a
start that died half way: undoing a step that never happened is harmless (each undo tolerates "not
there"). Faults are injected from outside mleng, the way an operator's world breaks: tc qdiscs inside a
node's network namespace, cgroup CPU quotas, signals to slurmd or a rank, a co-tenant process.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ...engine.data import PACKAGE_DIR
from ...engine.store import mleng_home
from .cluster import (DrillError, address, cluster_nodes, cluster_script, hold_session_lock, lock_is_ours,
                      on_node, run, signal_quietly, slurmd_pid, why_no_cluster)
from .scenarios import (FIXTURES_DIR, CpuLimit, Fixture, FreezeSlurmd, GpuCotenant, KillSlurmd,
                        LinkDown, RateLimit, Scenario, SlowLink, TrainingJob)

# The training job: the straggler benchmark's gloo loop (nothing of mleng in it), light enough for 2 cores.
WORKLOAD = PACKAGE_DIR.parent / "bench" / "straggler_workload.py"   # a checkout's, like CLUSTER_SCRIPT
WORKLOAD_SIZE = ("--dim", "128", "--matmuls", "2")


def drill_dir() -> Path:
    return mleng_home() / "drill"


def state_file() -> Path:
    return drill_dir() / "state.json"


@dataclass
class DrillState:
    """What a running drill did, step by step (written before each step is taken)."""
    scenario: str
    started_cluster: bool = False       # we started the namespace cluster (stop it) or reused one (heal it)
    holder_pid: int | None = None       # the process holding the cluster's session lock for the drill
    steps: list[dict] = field(default_factory=list)
    work_dir: str = ""
    context: dict = field(default_factory=dict)

    def save(self) -> None:
        drill_dir().mkdir(parents=True, exist_ok=True, mode=0o700)
        os.chmod(drill_dir(), 0o700)
        tmp = state_file().with_suffix(".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump(asdict(self), f, indent=1)
        os.replace(tmp, state_file())

    def record(self, step: dict) -> None:
        self.steps.append(step)
        self.save()

    @classmethod
    def load(cls) -> "DrillState | None":
        try:
            return cls(**json.loads(state_file().read_text()))
        except FileNotFoundError:
            return None
        except (ValueError, TypeError) as e:
            raise DrillError(f"{state_file()} is unreadable ({e}); remove it after checking nothing runs") from None


# --------------------------------------------------------------------------------------------------
# The namespace cluster

def bring_up_cluster(state: DrillState, scenario: Scenario, wait_s: float) -> None:
    reason = why_no_cluster()
    if reason:
        raise DrillError(reason)
    if lock_is_ours() and len(cluster_nodes()) >= scenario.nodes:
        return  # a caller holding the lock lent us its running cluster: heal what we touch, keep it up
    if not lock_is_ours():
        state.holder_pid = hold_session_lock(wait_s)
    state.started_cluster = True
    state.save()
    cluster_script("start", str(scenario.nodes), timeout=300)


# --------------------------------------------------------------------------------------------------
# Faults: apply one (the step is recorded first), undo one

def apply(fault, state: DrillState, scenario: Scenario) -> None:
    step = fault.model_dump()
    state.record(step)
    if isinstance(fault, RateLimit):
        on_node(fault.node, "tc", "qdisc", "add", "dev", "eth0", "root", "tbf", "rate", fault.rate,
                "burst", "32kbit", "latency", "400ms")
    elif isinstance(fault, SlowLink):
        for a, b in ((fault.node, fault.peer), (fault.peer, fault.node)):
            for rule in (["qdisc", "add", "dev", "eth0", "root", "handle", "1:", "htb", "default", "10"],
                         ["class", "add", "dev", "eth0", "parent", "1:", "classid", "1:10", "htb", "rate", "10gbit"],
                         ["class", "add", "dev", "eth0", "parent", "1:", "classid", "1:20", "htb", "rate", fault.rate],
                         ["filter", "add", "dev", "eth0", "parent", "1:", "protocol", "ip", "u32", "match", "ip",
                          "dst", f"{address(b)}/32", "flowid", "1:20"]):
                on_node(a, "tc", *rule)
    elif isinstance(fault, LinkDown):
        on_node(fault.node, "ip", "link", "set", "eth0", "down")
    elif isinstance(fault, CpuLimit):
        cluster_script("cpu", fault.node, str(fault.percent))
    elif isinstance(fault, (KillSlurmd, FreezeSlurmd)):
        pid = slurmd_pid(fault.node)
        os.kill(pid, signal.SIGKILL if isinstance(fault, KillSlurmd) else signal.SIGSTOP)
        step["pid"] = pid
        state.save()
    elif isinstance(fault, Fixture):
        work = Path(state.work_dir)
        for name in fault.files:
            src = FIXTURES_DIR / name
            dst = work / Path(name).name
            if src.is_dir():
                shutil.copytree(src, dst, symlinks=False, copy_function=shutil.copyfile)
            else:
                shutil.copyfile(src, dst)
        for path in [work, *work.rglob("*")]:    # private to their owner, like every file we create
            path.chmod(0o700 if path.is_dir() else 0o600)
    elif isinstance(fault, TrainingJob):
        start_training_job(fault, state, scenario, step)
    elif isinstance(fault, GpuCotenant):
        step["pid"] = start_gpu_cotenant(fault.gpu)
        state.save()
    else:  # pragma: no cover - the scenario model admits only the kinds above
        raise DrillError(f"no injector for fault kind {fault.kind!r}")


def undo(step: dict, state: DrillState) -> list[str]:
    """Undo one recorded step; returns what could not be undone (empty when all is well)."""
    kind, problems = step["kind"], []
    node = step.get("node")
    try:
        if kind in ("rate_limit", "slow_link"):
            for n in {node, step.get("peer")} - {None}:
                on_node(n, "tc", "qdisc", "del", "dev", "eth0", "root", check=False)
        elif kind == "link_down":
            on_node(node, "ip", "link", "set", "eth0", "up", check=False)
        elif kind == "cpu_limit":
            cluster_script("cpu", node, "0", check=False)
        elif kind in ("kill_slurmd", "freeze_slurmd"):
            if step.get("pid"):
                signal_quietly(step["pid"], signal.SIGCONT)
            if not state.started_cluster:
                cluster_script("heal", node, check=False)
        elif kind == "training_job":
            for pid in step.get("frozen_pids", []):
                signal_quietly(pid, signal.SIGCONT)
            if step.get("job_id"):
                run(["scancel", str(step["job_id"])], check=False)
                _wait_job_gone(step["job_id"])
        elif kind == "gpu_cotenant" and step.get("pid"):
            signal_quietly(-step["pid"], signal.SIGKILL)
    except (DrillError, OSError, subprocess.SubprocessError, ValueError) as e:
        problems.append(f"{kind} on {node or '-'}: {e}")
    return problems


# --------------------------------------------------------------------------------------------------
# A training job on the cluster, and a GPU co-tenant

def start_training_job(fault: TrainingJob, state: DrillState, scenario: Scenario, step: dict) -> None:
    if not WORKLOAD.is_file():
        raise DrillError("training-job drills need a checkout of mleng (bench/straggler_workload.py)")
    work = Path(state.work_dir)
    nodes = scenario.node_names
    argv = [sys.executable, str(WORKLOAD), "--master", address(nodes[0]), "--port", "29561",
            "--steps", str(fault.steps), "--pid-dir", str(work), *WORKLOAD_SIZE]
    if fault.slow_rank is not None:
        argv += ["--slow-loader-rank", str(fault.slow_rank), "--loader-sleep-s", str(fault.loader_sleep_s)]
    script = work / "job.sh"
    script.write_text("#!/bin/bash\numask 077\nexec srun --label " + shlex.join(argv) + "\n")
    script.chmod(0o700)
    out = run(["sbatch", "--parsable", f"-N{len(nodes)}", f"--nodelist={','.join(nodes)}", "--ntasks-per-node=1",
               f"--output={work}/job-%j.out", "--job-name=drill-train", str(script)]).stdout.strip()
    step["job_id"] = int(out.split(";")[0])
    state.save()
    state.context["job_id"] = step["job_id"]
    # Wait until every rank has written its pid and rank 0 has printed a few steps: the fault lands in a
    # running job, past the rendezvous.
    output = work / f"job-{step['job_id']}.out"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        pids = [work / f"rank{r}.pid" for r in range(len(nodes))]
        if all(p.exists() for p in pids) and output.exists() and STEP_5.search(output.read_text(errors="replace")):
            break
        time.sleep(1)
    else:
        raise DrillError(f"the drill's training job {step['job_id']} did not start within 120 s (see {work})")
    if fault.freeze_rank is not None:
        pid = int((work / f"rank{fault.freeze_rank}.pid").read_text())
        step["frozen_pids"] = [pid]
        state.save()
        os.kill(pid, signal.SIGSTOP)


STEP_5 = re.compile(r"^0: step 5 ", re.MULTILINE)   # srun --label prefixes rank 0's lines with "0: "


def _wait_job_gone(job_id: int, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        out = run(["squeue", "-h", "-j", str(job_id), "-o", "%T"], check=False).stdout.strip()
        if not out:
            return
        time.sleep(0.5)


def start_gpu_cotenant(gpu: int) -> int:
    code = ("import torch,time\n"
            f"d=torch.device('cuda',{gpu}); a=torch.randn(8192,8192,device=d,dtype=torch.bfloat16)\n"
            "print('busy',flush=True)\n"
            "while True:\n    a@a; torch.cuda.synchronize(d)\n")
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                            stdin=subprocess.DEVNULL, start_new_session=True, text=True)
    if proc.stdout.readline().strip() != "busy":
        proc.kill()
        raise DrillError("the GPU co-tenant did not start (no CUDA GPU here?)")
    proc.stdout.close()
    return proc.pid
