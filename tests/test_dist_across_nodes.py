"""dist_smoke_test and hang_stack_dump across the nodes of the namespace cluster, faults from outside.

- a rank frozen by SIGSTOP on one node (from the host, as a hung process looks): dist_smoke_test names it
  and its node;
- one node whose torch reports another version (its own copy of torch/version.py bound over the shared
  one, in that node's mount namespace only): dist_smoke_test names the node in version_mismatches;
- a 4-node job where three nodes wait in all_reduce and one is elsewhere: hang_stack_dump through srun
  (all_nodes) dumps every node and names the odd node.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tests.multinode_cluster import REPO, multinode_cluster  # noqa: F401  (fixture)

pytestmark = [pytest.mark.slurm, pytest.mark.timeout(900)]  # the cluster may be busy: setup waits for it


def tool(cluster, *argv: str, nodes: int = 4, timeout: float = 300) -> dict:
    proc = cluster.cmd("salloc", f"-N{nodes}", "--no-kill", "--time=5", sys.executable, "-m", *argv, "--json",
                       check=False, timeout=timeout)
    assert "{" in proc.stdout, proc.stderr[-2000:]
    return json.loads(proc.stdout[proc.stdout.index("{"):])


def pids_running(cluster, node: str, module: bytes) -> list[int]:
    """Rank processes (`python -m MODULE`) on the node: not torchrun or the shell that name it as an argument."""
    found = []
    for pid in cluster.node_pids(node):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                argv = f.read().split(b"\0")
        except OSError:
            continue
        at = argv.index(b"-m") if b"-m" in argv else -1
        if at >= 0 and argv[at + 1:at + 2] == [module]:  # torchrun's own argv starts -m torch.distributed.run
            found.append(pid)
    return found


def test_dist_smoke_names_the_node_whose_rank_hangs(multinode_cluster):  # noqa: F811
    """Freeze mln3's rank as soon as it starts; the others time out waiting for it."""
    stopped: list[int] = []

    def freeze():
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not stopped:
            for pid in pids_running(multinode_cluster, "mln3", b"tools.dist_smoke_test.rank"):
                os.kill(pid, signal.SIGSTOP)
                stopped.append(pid)
            time.sleep(0.05)

    import threading
    watcher = threading.Thread(target=freeze, daemon=True)
    watcher.start()
    result = tool(multinode_cluster, "tools.dist_smoke_test", "--backend", "gloo", "--nproc-per-node", "1",
                  "--pg-timeout-s", "15")
    watcher.join()
    assert stopped, "mln3's rank never appeared"
    assert result["verdict"] == "fail"
    named = [r for r in result["ranks"] if r["rank"] in result["culprit_ranks"]]
    assert [r["host"] for r in named] == ["mln3"], result["findings"]
    assert "mln3" in " ".join(result["findings"])
    time.sleep(1)
    assert not pids_running(multinode_cluster, "mln3", b"tools.dist_smoke_test.rank")


def test_dist_smoke_names_the_node_whose_torch_differs(multinode_cluster, tmp_path):  # noqa: F811
    import torch

    original = os.path.join(os.path.dirname(torch.__file__), "version.py")
    fake = tmp_path / "version.py"
    fake.write_text(open(original).read().replace(torch.__version__, torch.__version__ + ".node3build"))
    pid = str(multinode_cluster.slurmd_pid("mln3"))
    bind = ["nsenter", "--target", pid, "--mount"]
    subprocess.run([*bind, "mount", "--bind", str(fake), original], check=True)
    try:
        result = tool(multinode_cluster, "tools.dist_smoke_test", "--backend", "gloo", "--nproc-per-node", "1")
    finally:
        subprocess.run([*bind, "umount", original], check=True)
    mismatches = " ".join(result["version_mismatches"])
    assert "node3build on rank 2 (mln3)" in mismatches or ("node3build" in mismatches and "mln3" in mismatches), \
        result["version_mismatches"]
    assert "mln1" in mismatches  # the other value, with the nodes that have it


STUCK_JOB = textwrap.dedent("""
    import os, socket, time, torch, torch.distributed as dist
    rank, world = int(os.environ["SLURM_PROCID"]), int(os.environ["SLURM_NTASKS"])
    os.environ["RANK"] = str(rank)
    dist.init_process_group("gloo", init_method="tcp://MLN1_ADDRESS:29611", rank=rank, world_size=world)

    def load_next_batch():  # the odd node never reaches the collective
        time.sleep(600)

    if socket.gethostname() == "mln3":
        load_next_batch()
    print("ready", rank, flush=True)
    dist.all_reduce(torch.ones(4))
""")


def submit_stuck_job(cluster, tmp_path_factory, name: str):
    """(job id, script, folder) of a 4-node STUCK_JOB, once three ranks wait in all_reduce and mln3's is in
    load_next_batch. Not under tmp_path: its name holds "hang_stack_dump", and the tool never dumps
    processes named so."""
    tmp_path = tmp_path_factory.mktemp(name)
    script = tmp_path / "stuck.py"
    script.write_text(STUCK_JOB.replace("MLN1_ADDRESS", cluster.address("mln1")))
    job = cluster.cmd("sbatch", "--parsable", "-N4", "--ntasks-per-node=1", "--time=5", f"--output={tmp_path}/job.out",
                      "--wrap", f"srun {sys.executable} {script}").stdout.strip().split(";")[0]
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        if os.path.exists(f"{tmp_path}/job.out") and open(f"{tmp_path}/job.out").read().count("ready") == 3:
            break
        time.sleep(0.5)
    return job, script, tmp_path


def test_hang_stack_dump_through_srun_names_the_odd_node(multinode_cluster, tmp_path_factory):  # noqa: F811
    job, script, tmp_path = submit_stuck_job(multinode_cluster, tmp_path_factory, "stuckjob")
    try:
        time.sleep(2)
        env = {**os.environ, "PATH": f"{os.path.dirname(sys.executable)}:{os.environ['PATH']}"}
        proc = subprocess.run([sys.executable, "-m", "tools.hang_stack_dump", "--slurm-job-id", job, "--all-nodes",
                               "--json"], capture_output=True, text=True, timeout=200, cwd=REPO, env=env)
        assert "{" in proc.stdout, (proc.stderr[:3000], open(f"{tmp_path}/job.out").read()[-1500:])
        result = json.loads(proc.stdout[proc.stdout.index("{"):])
    finally:
        multinode_cluster.cmd("scancel", job, check=False)
    assert result["odd_nodes"] == ["mln3"], result["findings"]
    assert "load_next_batch" in " ".join(result["findings"]) and "mln3" in " ".join(result["findings"])
    assert sorted(result["hosts"]) == ["mln1", "mln2", "mln3", "mln4"]


def _gloo_mesh_up(cluster, node: str, pid: int, peers: int) -> bool:
    """The rank's node has `peers` or more established TCP connections to the other nodes (gloo's mesh)."""
    try:
        with open(f"/proc/{pid}/net/tcp") as f:  # the table of the node's network namespace
            rows = [line.split() for line in f.readlines()[1:]]
    except OSError:
        return False
    mine = cluster.address(node)
    me = "".join(f"{int(x):02X}" for x in reversed(mine.split(".")))
    return sum(r[3] == "01" and r[1].startswith(me) and not r[2].startswith(me) for r in rows) >= peers


def freeze_when_meshed(cluster, node: str, module: bytes, stopped: list, settle_s: float = 1.0):
    """A watcher thread: SIGSTOP the node's rank once its collectives run (mesh up), as review case 5b did."""
    import threading

    def watch():
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and not stopped:
            for pid in pids_running(cluster, node, module):
                if _gloo_mesh_up(cluster, node, pid, peers=3):
                    time.sleep(settle_s)
                    os.kill(pid, signal.SIGSTOP)
                    stopped.append(pid)
            time.sleep(0.1)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread


def test_collective_bench_names_the_rank_frozen_mid_sweep(multinode_cluster):  # noqa: F811
    """Review 5b: mln3's rank SIGSTOPped mid-sweep was blamed on 'the communication path' (2 runs of 2)."""
    stopped: list[int] = []
    watcher = freeze_when_meshed(multinode_cluster, "mln3", b"tools.collective_bench.rank", stopped)
    result = tool(multinode_cluster, "tools.collective_bench", "--backend", "gloo", "--nproc-per-node", "1",
                  "--min-bytes", "1M", "--max-bytes", "64M", "--iters", "20", "--pg-timeout-s", "30", "--no-plot",
                  timeout=400)
    watcher.join()
    assert stopped, "mln3's rank never meshed"
    text = " ".join(result["findings"])
    assert result["verdict"] == "fail" and len(result["culprit_ranks"]) == 1, result["findings"]
    assert "(mln3" in text and "frozen" in text and "communication path" not in text, result["findings"]


def test_dist_smoke_names_the_node_srun_could_not_start_a_task_on(multinode_cluster, tmp_path):  # noqa: F811
    """Review 5g: a node frozen before the run (its slurmd stopped here): srun says 'Task launch ... failed on
    node mln3'; the answer quoted srun lines about healthy nodes and said 'No rank on mln1, ..., mln4'.
    The allocation is granted first and the slurmd stopped after: stopped before it, slurmctld may mark mln3 not
    responding before salloc asks, and salloc then waits for it (a clean-clone run beside two drills, 2026-12-04:
    400 s pending, no answer)."""
    go, name = tmp_path / "go", f"mleng-frozen-slurmd-{os.getpid()}"
    smoke = f"{sys.executable} -m tools.dist_smoke_test --backend gloo --nproc-per-node 1 --pg-timeout-s 20 --json"
    salloc = subprocess.Popen(["salloc", "-N4", "--no-kill", "--time=5", f"--job-name={name}", "bash", "-c",
                               f"while [ ! -e {go} ]; do sleep 0.2; done; exec {smoke}"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env={**os.environ, "SLURM_CONF": multinode_cluster.conf})
    slurmd = multinode_cluster.slurmd_pid("mln3")
    try:
        deadline = time.monotonic() + 120
        while not multinode_cluster.cmd("squeue", "-h", "-t", "R", "-n", name, "-o", "%i").stdout.strip():
            assert time.monotonic() < deadline and salloc.poll() is None, "the 4 nodes were never granted"
            time.sleep(0.5)
        os.kill(slurmd, signal.SIGSTOP)
        go.touch()
        out, err = salloc.communicate(timeout=400)
    finally:
        os.kill(slurmd, signal.SIGCONT)
        if salloc.poll() is None:
            salloc.kill()
            salloc.wait()
    assert "{" in out, err[-2000:]
    result = json.loads(out[out.index("{"):])
    text = " ".join(result["findings"])
    assert result["verdict"] == "fail" and "node mln3" in result["findings"][1], result["findings"]
    assert "No rank on mln1" not in text, result["findings"]


def test_hang_stack_dump_reports_the_stopped_rank_and_why(multinode_cluster, tmp_path_factory):  # noqa: F811
    """Review 5e: mln3's rank SIGSTOPped in a running job; the answer was 'info' without mln3, and said
    'another tracer is attached'. Here every rank waits in all_reduce except mln3's, which is stopped."""
    job, script, tmp_path = submit_stuck_job(multinode_cluster, tmp_path_factory, "stoppedjob")
    try:
        victims = [p for p in multinode_cluster.node_pids("mln3")
                   if str(script).encode() in open(f"/proc/{p}/cmdline", "rb").read()]
        for pid in victims:
            os.kill(pid, signal.SIGSTOP)
        env = {**os.environ, "PATH": f"{os.path.dirname(sys.executable)}:{os.environ['PATH']}"}
        proc = subprocess.run([sys.executable, "-m", "tools.hang_stack_dump", "--slurm-job-id", job, "--all-nodes",
                               "--json"], capture_output=True, text=True, timeout=200, cwd=REPO, env=env)
        assert "{" in proc.stdout, proc.stderr[:3000]
        result = json.loads(proc.stdout[proc.stdout.index("{"):])
    finally:
        multinode_cluster.cmd("scancel", job, check=False)
    assert victims
    assert result["verdict"] == "warn" and "mln3" in result["odd_nodes"], result["findings"]
    assert "stopped (state T" in result["findings"][0] and "mln3" in result["findings"][0], result["findings"]
    assert "another tracer" not in " ".join(result["findings"])


SIGKILLED_TASKS = r'''
import json, sys
from tools.shared.launch import launch_ranks
marks = sys.argv[1]
# each task makes a scratch folder with the run's tag, as srun_torchrun_command's wrapper does, marks that it
# ran, then dies by SIGKILL as SLURM kills a task past KillWait: its own EXIT trap never runs
task = ('d="${TMPDIR:-/tmp}/mleng-ranks-${MLENG_SCRATCH_TAG}-probe$SLURM_PROCID"; mkdir "$d" && '
        f'echo "$d" > {marks}/task$SLURM_PROCID && kill -9 $$')
out = launch_ranks(["srun", "--nodes=2", "--ntasks=2", "--ntasks-per-node=1", "bash", "-c", task], 0,
                   timeout_s=20, stall_s=60, deadline_s=90)
print(json.dumps({"returncode": out.returncode}))
'''


def test_a_failed_srun_run_removes_the_scratch_its_sigkilled_tasks_left(multinode_cluster, tmp_path):  # noqa: F811
    """launch_ranks through srun tags its tasks' scratch folders; when the run failed, one cleanup step on the
    allocation's nodes removes what SIGKILLed tasks left (a clean-clone CI run left 3 before 22c75a4)."""
    marks = tmp_path / "marks"
    marks.mkdir()
    proc = multinode_cluster.cmd("salloc", "-N2", "--no-kill", "--time=5", sys.executable, "-c", SIGKILLED_TASKS,
                                 str(marks), check=False, timeout=180)
    assert "{" in proc.stdout, proc.stderr[-2000:]
    assert json.loads(proc.stdout[proc.stdout.index("{"):])["returncode"] != 0
    made = [Path(p.read_text().strip()) for p in sorted(marks.iterdir())]
    assert len(made) == 2 and all("-probe" in p.name for p in made), made    # both tasks made their folder
    left = [p for p in made if p.exists()]
    assert not left, f"scratch left on the nodes: {left}"
