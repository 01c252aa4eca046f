"""Putting a drill's faults in place and taking every one of them out again.

Every step is written to the drill's state file (state.py) BEFORE it takes effect, and what it produced
(a pid with its start time, a job id) right after, so `mleng drill stop` can undo a start that died half
way: undoing a step that never happened is harmless (each undo tolerates "not there"), and a signal goes
only to a process that is still the one recorded. Faults are injected from outside mleng, the way an
operator's world breaks: tc qdiscs inside a node's network namespace, cgroup CPU quotas, signals to
slurmd, sshd or a rank, a co-tenant process (on a GPU, or busy loops of another user on a node's CPUs).
"""

from __future__ import annotations

import os
import re
import secrets
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

from ...engine.data import PACKAGE_DIR
from ...engine.home import private_dir, write_private
from .cluster import (CLUSTER_DIR, DrillError, address, cluster_nodes, cluster_script, hold_session_lock, lock_is_ours,
                      netns, node_cgroup_tasks, on_node, run, slurmd_pid, sshd_pid, why_no_cluster)
from .scenarios import (FIXTURES_DIR, SSH_RUN_ID, CpuHog, CpuLimit, Fixture, FreezeSlurmd, GpuCotenant, KillSlurmd,
                        KillSshd, LinkDown, RateLimit, Scenario, SlowLink, TrainingJob)
from .stamps import ProcessStamp, start_detached
from .state import DrillState, Step

# The training job: the straggler benchmark's gloo loop (nothing of mleng in it), light enough for 2 cores.
WORKLOAD = PACKAGE_DIR.parent / "bench" / "straggler_workload.py"   # a checkout's, like CLUSTER_SCRIPT
WORKLOAD_SIZE = ("--dim", "128", "--matmuls", "2")


# --------------------------------------------------------------------------------------------------
# The namespace cluster

def bring_up_cluster(state: DrillState, scenario: Scenario, wait_s: float) -> None:
    reason = why_no_cluster()
    if reason:
        raise DrillError(reason)
    if lock_is_ours() and len(cluster_nodes()) >= scenario.nodes:
        return  # a caller holding the lock lent us its running cluster: heal what we touch, keep it up
    if not lock_is_ours():
        hold_session_lock(wait_s, record=lambda stamp: (setattr(state, "holder", stamp), state.save()))
    state.started_cluster = True
    state.save()
    cluster_script("start", str(scenario.nodes), timeout=300)


def bring_up_sshd(scenario: Scenario) -> None:
    """An sshd per node for an SSH drill (cluster-local.sh sshd; stop and heal take them too)."""
    if scenario.transport == "ssh":
        cluster_script("sshd", timeout=300)


# --------------------------------------------------------------------------------------------------
# Faults: apply one (the step is recorded first), undo one

def apply(fault, state: DrillState, scenario: Scenario) -> None:
    step = state.record(Step(fault=fault))
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
    elif isinstance(fault, KillSshd):
        step.pid = ProcessStamp.of(sshd_pid(fault.node))
        state.save()
        step.pid.signal(signal.SIGKILL)
    elif isinstance(fault, (KillSlurmd, FreezeSlurmd)):
        step.pid = ProcessStamp.of(slurmd_pid(fault.node))
        state.save()                                     # the stamp first: `stop` resumes a frozen slurmd
        step.pid.signal(signal.SIGKILL if isinstance(fault, KillSlurmd) else signal.SIGSTOP)
    elif isinstance(fault, Fixture):
        copy_fixtures(fault)
    elif isinstance(fault, TrainingJob):
        start_training_job(fault, state, scenario, step)
    elif isinstance(fault, GpuCotenant):
        start_gpu_cotenant(fault.gpu, record=lambda stamp: (setattr(step, "pid", stamp), state.save()))
    elif isinstance(fault, CpuHog):
        start_cpu_hog(node_cgroup_tasks(fault.node), Path(f"/run/netns/{netns(fault.node)}"), fault.processes, fault.user,
                      record=lambda stamp: (setattr(step, "pid", stamp), state.save()))
    else:  # pragma: no cover - the scenario model admits only the kinds above
        raise DrillError(f"no injector for fault kind {fault.kind!r}")


def copy_fixtures(fault: Fixture) -> None:
    """The fixture files into the drill's work folder, each a new 0600 file (fixtures are a few KB)."""
    for name in fault.files:
        _copy_fixture(FIXTURES_DIR / name, ("drill", "work"))


def _copy_fixture(src: Path, parts: tuple[str, ...]) -> None:
    """A fixture file, or a folder with its subfolders (saved py-spy dumps: a folder per node)."""
    if not src.is_dir():
        write_private(private_dir(*parts) / src.name, src.read_bytes())
        return
    for child in sorted(src.iterdir()):
        _copy_fixture(child, (*parts, src.name))


def undo(step: Step, state: DrillState) -> list[str]:
    """Undo one recorded step; returns what could not be undone (empty when all is well)."""
    fault, problems = step.fault, []
    node = getattr(fault, "node", None)
    try:
        if isinstance(fault, (RateLimit, SlowLink)):
            for n in {node, getattr(fault, "peer", None)} - {None}:
                on_node(n, "tc", "qdisc", "del", "dev", "eth0", "root", check=False)
        elif isinstance(fault, LinkDown):
            on_node(node, "ip", "link", "set", "eth0", "up", check=False)
        elif isinstance(fault, CpuLimit):
            cluster_script("cpu", node, "0", check=False)
        elif isinstance(fault, KillSshd):
            if not state.started_cluster:
                cluster_script("heal", node, check=False)     # restarts its sshd (a lent cluster stays up)
        elif isinstance(fault, (KillSlurmd, FreezeSlurmd)):
            if step.pid:
                step.pid.signal(signal.SIGCONT)          # only if it is still the slurmd we stopped
            if not state.started_cluster:
                cluster_script("heal", node, check=False)
        elif isinstance(fault, TrainingJob):
            for rank in step.frozen:
                rank.signal(signal.SIGCONT)
            if step.launched:
                problems += _stop_ssh_job(step.launched, Path(state.work_dir))
            if step.job_id or step.job_name:
                target = [str(step.job_id)] if step.job_id else [f"--name={step.job_name}"]
                run(["scancel", *target], check=False)
                if step.job_id:
                    _wait_job_gone(step.job_id)
        elif isinstance(fault, (GpuCotenant, CpuHog)) and step.pid:
            step.pid.signal(signal.SIGKILL, group=True)
    except (DrillError, OSError, ValueError) as e:
        problems.append(f"{fault.kind} on {node or '-'}: {e}")
    return problems


# --------------------------------------------------------------------------------------------------
# A training job on the cluster, and a GPU co-tenant

def start_training_job(fault: TrainingJob, state: DrillState, scenario: Scenario, step: Step) -> None:
    if not WORKLOAD.is_file():
        raise DrillError("training-job drills need a checkout of mleng (bench/straggler_workload.py)")
    work = private_dir("drill", "work")
    nodes = scenario.node_names
    args = ["--steps", str(fault.steps), "--pid-dir", str(work), *WORKLOAD_SIZE]
    if fault.slow_rank is not None:
        args += ["--slow-loader-rank", str(fault.slow_rank), "--loader-sleep-s", str(fault.loader_sleep_s),
                 "--loader-sleep-fraction", str(fault.loader_sleep_fraction)]
    if fault.launcher == "ssh":
        start_ssh_job(nodes, args, work, state, step)
        _wait_running(work, len(nodes), [work / f"job-{nodes[0]}.out"], STEP_5_PLAIN, "over ssh")
    else:
        start_sbatch_job(nodes, args, work, state, step)
        _wait_running(work, len(nodes), [work / f"job-{step.job_id}.out"], STEP_5, str(step.job_id))
    if fault.freeze_rank is not None:
        rank = ProcessStamp.of(int((work / f"rank{fault.freeze_rank}.pid").read_text()))
        step.frozen = [rank]
        state.save()
        rank.signal(signal.SIGSTOP)


def _wait_running(work: Path, ranks: int, outputs: list[Path], step_5: re.Pattern, which: str) -> None:
    """Until every rank has written its pid and rank 0 has printed a few steps: the fault lands in a running
    job, past the rendezvous."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        pids = [work / f"rank{r}.pid" for r in range(ranks)]
        if all(p.exists() for p in pids) and any(o.exists() and step_5.search(o.read_text(errors="replace"))
                                                 for o in outputs):
            return
        time.sleep(1)
    raise DrillError(f"the drill's training job ({which}) did not start within 120 s (see {work})")


def start_ssh_job(nodes: list[str], args: list[str], work: Path, state: DrillState, step: Step) -> None:
    """torchrun on every node over ssh, no SLURM: rank K-1 on mlnK (static rendezvous at the first node), each
    under remote_step, so the node's torchrun stops when its ssh client ends (undo ends the clients)."""
    from ...engine.transport import SSH_CONFIG_ENV, SshTransport

    cluster_script("sshd")
    transport = SshTransport({**os.environ, SSH_CONFIG_ENV: f"{CLUSTER_DIR}/ssh/config"})
    for k, node in enumerate(nodes):
        # TMPDIR: torchrun's torchelastic_* folder, which a stopped torchrun leaves, goes to the drill's own folder
        argv = ["env", f"TMPDIR={work}", sys.executable, "-m", "torch.distributed.run", f"--nnodes={len(nodes)}",
                "--nproc-per-node=1", f"--node-rank={k}", f"--master-addr={address(nodes[0])}", "--master-port=29562",
                f"--rdzv-id={SSH_RUN_ID}", "--monitor-interval=0.5", str(WORKLOAD), *args]
        with open(work / f"job-{node}.out", "w") as out:
            proc = subprocess.Popen(transport.command(node, argv), stdout=out, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, start_new_session=True)
        step.launched.append(ProcessStamp.of(proc.pid))
        state.save()


def _stop_ssh_job(clients: list[ProcessStamp], work: Path) -> list[str]:
    """End the ssh clients; remote_step on each node then stops its torchrun, and torchrun its rank. What is
    still running the drill's workload a minute later is reported, not signalled (its pid is not stamped)."""
    for client in clients:
        client.end()
    deadline = time.monotonic() + 60
    while True:
        left = [p.name for p in Path("/proc").iterdir() if p.name.isdigit() and _runs_drill_job(p, work)]
        if not left or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    return [f"training job over ssh: pid(s) {', '.join(left[:8])} outlived their ssh client"] if left else []


def _runs_drill_job(proc: Path, work: Path) -> bool:
    """Whether the process runs the drill's workload (a rank, or its torchrun) with the drill's pid folder."""
    try:
        command = (proc / "cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return any(part.endswith(WORKLOAD.name.encode()) for part in command) and str(work).encode() in command


def start_sbatch_job(nodes: list[str], args: list[str], work: Path, state: DrillState, step: Step) -> None:
    argv = [sys.executable, str(WORKLOAD), "--master", address(nodes[0]), "--port", "29561", *args]
    script = work / "job.sh"
    write_private(script, "#!/bin/bash\numask 077\nexec srun --label " + shlex.join(argv) + "\n", mode=0o700)
    step.job_name = f"drill-train-{secrets.token_hex(6)}"
    state.save()                # the name before sbatch: a start killed before the job id is saved still finds it
    out = run(["sbatch", "--parsable", f"-N{len(nodes)}", f"--nodelist={','.join(nodes)}", "--ntasks-per-node=1",
               f"--output={work}/job-%j.out", f"--job-name={step.job_name}", str(script)]).stdout.strip()
    step.job_id = state.job_id = int(out.split(";")[0])
    state.save()


STEP_5 = re.compile(r"^0: step 5 ", re.MULTILINE)   # srun --label prefixes rank 0's lines with "0: "
STEP_5_PLAIN = re.compile(r"^step 5 ", re.MULTILINE)   # over ssh: rank 0's own lines, through torchrun


def _wait_job_gone(job_id: int, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        out = run(["squeue", "-h", "-j", str(job_id), "-o", "%T"], check=False).stdout.strip()
        if not out:
            return
        time.sleep(0.5)


def start_gpu_cotenant(gpu: int, record) -> None:
    """A process keeping GPU `gpu` busy, in a session of its own; `record` gets its stamp before it starts."""
    code = ("import torch,time\n"
            f"d=torch.device('cuda',{gpu}); a=torch.randn(8192,8192,device=d,dtype=torch.bfloat16)\n"
            "print('busy',flush=True)\n"
            "while True:\n    a@a; torch.cuda.synchronize(d)\n")
    _start_cotenant(code, record, "the GPU co-tenant did not start (no CUDA GPU here?)")


def _start_cotenant(code: str, record, failure: str) -> None:
    """A detached co-tenant whose code prints 'busy' once it runs; DrillError(failure) when it does not."""
    proc, line = start_detached(code, record)
    if line != "busy":
        proc.kill()
        proc.wait()
        raise DrillError(failure)


def start_cpu_hog(tasks: Path, netns: Path | None, processes: int, user: str, record) -> None:
    """`processes` busy loops run by `user`, in the cpu cgroup whose tasks file is `tasks` and the network
    namespace `netns` (None: this one), in a session of their own; `record` gets the leader's stamp first.

    The leader joins the cgroup and namespace as root, drops to `user` and forks the loops, each asking the
    kernel to kill it when the leader goes: killing the leader's process group, or the leader alone, ends
    them all (a loop left behind would skew every later drill on this host)."""
    code = ("import ctypes,os,pwd,signal\n"
            f"who=pwd.getpwnam({user!r})\n"
            "libc=ctypes.CDLL(None,use_errno=True)\n"
            f"open({str(tasks)!r},'w').write(str(os.getpid()))\n"
            + (f"fd=os.open({str(netns)!r},os.O_RDONLY)\n"
               "assert libc.setns(fd,0x40000000)==0,'setns'\nos.close(fd)\n" if netns else "")
            + "os.setgroups([]); os.setgid(who.pw_gid); os.setuid(who.pw_uid)\n"
            "leader=os.getpid()\n"
            f"for _ in range({int(processes)}):\n"
            "    if os.fork()==0:\n"
            "        libc.prctl(1,signal.SIGKILL)\n"          # PR_SET_PDEATHSIG, after setuid (which clears it)
            "        if os.getppid()!=leader: os._exit(0)\n"   # the leader died before prctl took
            "        while True: pass\n"
            "print('busy',flush=True)\n"
            "while True: signal.pause()\n")
    _start_cotenant(code, record, f"the CPU hog did not start (cgroup {tasks}, namespace {netns}, user {user!r})")
