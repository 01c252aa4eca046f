"""hang_stack_dump against live processes: a gloo torchrun job where one rank sleeps in a known function
while the others wait in all_reduce (the odd rank must be named), single sleepers, non-Python and
vanished processes. Tests that attach with py-spy skip cleanly where ptrace is not allowed.
"""

import json
import os
import re
import socket
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from tests.slurm_cluster import slurm_cluster  # noqa: F401  (session fixture, only started when used)
from tools import hang_stack_dump as hsd
from tools.hang_stack_dump import stacks
from tools.shared import pyspy
from tools.engine.data import IMPORT_ROOT as REPO_ROOT
from tools.engine.spec import ToolFailure
from tools.engine.processes import kill_tree, torchrun_command

WORLD = 3
START_S = 240
JOB = f"stuck_job_{os.getpid()}"   # unique: other test sessions on this machine run the same job
STUCK_JOB = textwrap.dedent("""\
    import datetime, os, time
    import torch, torch.distributed as dist

    def load_batch():
        time.sleep(600)                     # the odd rank sits here

    def main():
        # Every rank keeps a dataloader worker process alive (idle, with the rank's RANK in its env). It is
        # forked before gloo starts its threads: a fork beside running threads can leave the child on a lock
        # no thread will release, and the job would then never start.
        loader = iter(torch.utils.data.DataLoader(range(64), batch_size=4, num_workers=1))
        next(loader)
        dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=600))
        if dist.get_rank() == dist.get_world_size() - 1:
            os.write(1, b"ODD\\n")           # one write(2) a line: see the note under this job
            load_batch()
        os.write(1, b"WAITING\\n")
        dist.all_reduce(torch.ones(10))     # the others wait here

    main()
""")
# The three ranks share torchrun's stdout and print at the same moment. print() under PYTHONUNBUFFERED=1 (set
# where CI runs) writes the text and its newline in two write(2) calls, so two ranks could leave "ODDWAITING\n\n"
# and the fixture never saw three whole lines: the job was in place, the test waited 240 s and failed (CI of stop 46, twice).
# One os.write of a short line into a pipe is atomic.
SLEEPER = "import time\ndef stuck_here():\n    time.sleep(600)\nstuck_here()\n"


def _run(**kw):
    return hsd.run(hsd.HangStackDumpParams(**kw), lambda f, m: None)


def _start_sleeper():
    proc = subprocess.Popen([sys.executable, "-c", SLEEPER])
    time.sleep(0.3)
    return proc


@pytest.fixture(scope="module")
def ptrace_ok():
    try:
        py_spy = pyspy.py_spy_path()
    except ToolFailure as e:
        pytest.skip(str(e))
    proc = _start_sleeper()
    try:
        threads, err = pyspy.dump_one(proc.pid, False, 20, py_spy)
    finally:
        proc.kill()
        proc.wait()
    if threads is None:
        pytest.skip(f"py-spy cannot attach here: {err.strip()[:200]}")


@pytest.fixture(scope="module")
def stuck_job(ptrace_ok, tmp_path_factory):
    """torchrun --standalone, 3 gloo ranks: ranks 0-1 in all_reduce, rank 2 in load_batch()."""
    work = tmp_path_factory.mktemp("stuck")
    (work / f"{JOB}.py").write_text(STUCK_JOB)
    cmd = torchrun_command(JOB, WORLD, [])
    stderr = work / "stderr.txt"
    # TMPDIR: torchrun's torchelastic_* folder, which a killed torchrun leaves behind, goes to the test's folder
    with stderr.open("w") as err:
        proc = subprocess.Popen(cmd, cwd=work, stdout=subprocess.PIPE, stderr=err, text=True, start_new_session=True,
                                env=dict(os.environ, PYTHONPATH=str(work), TMPDIR=str(work)))
    try:
        # 7-10 s on a quiet 2-core box; 120 s was not enough at load ~20 (six Pythons importing torch), where
        # the stacks taken at the deadline showed every rank in place. 240 s leaves the stacks time before the
        # 300 s test timeout.
        started = _lines_within(proc, ("ODD", "WAITING"), WORLD, timeout_s=START_S)
        if len(started) < WORLD:
            # Say why, from the job itself: where each process sits, and what torchrun printed.
            stacks_now = _run(launcher_pid=proc.pid).findings if proc.poll() is None else ["torchrun exited"]
            pytest.fail(f"the job did not start in {START_S} s: {started}; stacks: {stacks_now}; "
                        f"stderr: {stderr.read_text()[-3000:]}")
        time.sleep(1.0)                     # the waiting ranks enter all_reduce
        yield proc
    finally:
        kill_tree(proc.pid)
        proc.wait()


def _lines_within(proc, wanted, count, timeout_s):
    """The first `count` stdout lines of `proc` among `wanted`, read for at most `timeout_s` (a reader thread:
    a readline on a job that prints nothing would block past any deadline)."""
    seen = []

    def read():
        for line in proc.stdout:
            if line.strip() in wanted:
                seen.append(line.strip())
                if len(seen) == count:
                    return

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    reader.join(timeout_s)
    return list(seen)


@pytest.mark.slow
def test_launcher_pid_names_the_odd_rank(stuck_job):
    r = _run(launcher_pid=stuck_job.pid)
    assert r.verdict == "warn" and r.odd_ranks == [WORLD - 1]
    odd, majority = r.groups[0], r.groups[1]
    assert odd.ranks == [2] and odd.where.startswith(f"load_batch ({JOB}.py:5)") and not odd.in_collective
    assert majority.ranks == [0, 1] and majority.in_collective and majority.where.startswith("all_reduce (")
    assert majority.called_from.startswith(f"main ({JOB}.py:18)")
    # The dataloader workers (children of the ranks, same RANK) are dumped but not taken for odd ranks.
    assert len(r.groups) == 2 and sum(p.role == "helper" for p in r.processes) == WORLD
    assert any("child process(es) of ranks" in f for f in r.findings)
    text = " ".join(r.findings)
    assert "ranks 0, 1 wait in all_reduce" in text and f"rank 2 is in load_batch ({JOB}.py:5)" in text


@pytest.mark.slow
def test_pattern_finds_the_ranks_and_leaves_the_launcher_out_of_the_comparison(stuck_job):
    r = _run(pattern=JOB)
    assert r.odd_ranks == [2] and r.dumped == 2 * WORLD + 1      # ranks, their workers, torchrun
    assert any("without a rank" in f for f in r.findings)
    assert sum(len(g.pids) for g in r.groups) == WORLD


@pytest.mark.slow
def test_full_dump_is_saved_with_every_rank(stuck_job, tmp_path):
    out = tmp_path / f"stacks-{socket.gethostname()}.txt"
    r = _run(launcher_pid=stuck_job.pid, save_path=str(tmp_path / "stacks-{host}.txt"))
    text = out.read_text()
    assert r.saved_to == str(out)
    assert sorted(set(re.findall(r"=== pid \d+ rank (\d)", text))) == ["0", "1", "2"]
    assert f"load_batch ({JOB}.py:5)" in text and "Thread" in text


@pytest.mark.slow
def test_cli_json_through_the_harness_child(stuck_job):
    workers = [c.pid for c in __import__("psutil").Process(stuck_job.pid).children(recursive=True)]
    proc = subprocess.run([sys.executable, "-m", "tools.hang_stack_dump", "--pids", *map(str, workers),
                           "--json"], cwd=REPO_ROOT, check=False, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    doc = json.loads(proc.stdout)
    assert doc["odd_ranks"] == [2] and doc["verdict"] == "warn"


@pytest.mark.slow
def test_native_frames_on_request(ptrace_ok):
    proc = _start_sleeper()
    try:
        r = _run(pids=[proc.pid], native=True, detail=True)
    finally:
        proc.kill()
        proc.wait()
    stack = r.processes[0].stack
    assert any(".so" in f for f in stack), stack              # C frames (libc, libpython) are present
    assert r.processes[0].called_from.startswith("stuck_here (<string>:3)")


@pytest.mark.slow
def test_single_process_same_place_is_info(ptrace_ok):
    procs = [_start_sleeper() for _ in range(2)]
    try:
        r = _run(pids=[p.pid for p in procs])
    finally:
        for p in procs:
            p.kill()
            p.wait()
    assert r.verdict == "info" and r.odd_ranks == [] and len(r.groups) == 1
    assert "sit in the same place: stuck_here (<string>:3)" in r.findings[0]


@pytest.mark.slow
def test_non_python_and_vanished_processes_are_explained(ptrace_ok):
    sleeper = subprocess.Popen(["sleep", "600"])
    gone = subprocess.Popen(["true"])
    gone.wait()
    python = _start_sleeper()
    try:
        r = _run(pids=[sleeper.pid, gone.pid, python.pid], detail=True)
    finally:
        for p in (sleeper, python):
            p.kill()
            p.wait()
    errors = {p.pid: p.error for p in r.processes}
    assert "not a Python process" in errors[sleeper.pid] and "gdb -p" in errors[sleeper.pid]
    assert "exited before or during the dump" in errors[gone.pid]
    assert errors[python.pid] == "" and r.dumped == 1 and r.failed == 2 and r.verdict == "warn"


def test_nothing_dumpable_is_a_clear_failure():
    gone = subprocess.Popen(["true"])
    gone.wait()
    with pytest.raises(ToolFailure, match="exited before or during the dump"):
        _run(pids=[gone.pid])


def test_no_target_is_a_clear_failure(monkeypatch):
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    with pytest.raises(ToolFailure, match="say which processes"):
        _run()
    monkeypatch.setenv("SLURM_JOB_ID", "777")
    with pytest.raises(ToolFailure, match="inside SLURM job 777: slurm_job_id=777"):
        _run()


def test_unmatched_pattern_is_a_clear_failure():
    with pytest.raises(ToolFailure, match="no process matched"):
        _run(pattern=r"no-such-command-\d{9}")


def test_ptrace_refusal_says_how_to_fix_it():
    # Text py-spy 0.4.3 printed here when run as `nobody` against a root-owned Python process.
    stderr = ("Permission Denied: Try running again with elevated permissions by going 'sudo env \"PATH=$PATH\" !!'\n"
              "Error: Failed to find python version from target process\n\nStack backtrace:\n   0: anyhow")
    msg = pyspy.explain_py_spy_error(4242, stderr, "python train.py")
    assert "no permission to attach to pid 4242" in msg
    assert "ptrace_scope" in msg and "SYS_PTRACE" in msg and "same" in msg and "Stack backtrace" not in msg


def test_gpu_processes_without_nvml_is_explained():
    from tools.engine.processes import local_gpu_count

    if local_gpu_count():
        pytest.skip("this machine has a GPU driver")
    with pytest.raises(ToolFailure, match="NVML"):
        _run(gpu_processes=True)


def _ps(rank, stack, in_collective=False):
    return hsd.ProcessStack(pid=1000 + rank, host="n1", rank=rank, stack=stack, in_collective=in_collective)


def test_grouping_prefers_the_ranks_outside_a_collective():
    # Seven ranks in the dataloader, one waiting in all_reduce: the seven are behind, not the one.
    procs = [_ps(r, ["next (data.py:88)"]) for r in range(7)] + [_ps(7, ["all_reduce (c10d.py:1)"], True)]
    groups = hsd.group_stacks(procs)
    odd = hsd.odd_groups(groups)
    assert [g.ranks for g in odd] == [[0, 1, 2, 3, 4, 5, 6]]


def test_grouping_tie_has_no_odd_group():
    procs = [_ps(0, ["a (x.py:1)"]), _ps(1, ["b (x.py:2)"])]
    groups = hsd.group_stacks(procs)
    assert hsd.odd_groups(groups) == []
    assert "No majority" in hsd.findings_for(groups, [])[-1]


def test_all_ranks_in_the_same_collective_points_past_python():
    procs = [_ps(r, ["all_reduce (c10d.py:1)"], True) for r in range(4)]
    groups = hsd.group_stacks(procs)
    text = hsd.findings_for(groups, hsd.odd_groups(groups))[0]
    assert "All 4 processes (ranks 0-3)" in text and "flight_recorder_analyze" in text


def test_slurm_all_nodes_command():
    """The command a user runs by hand: srun inside the job, on each of its nodes, from mleng's folder."""
    from tools.engine.data import IMPORT_ROOT

    p = hsd.HangStackDumpParams(slurm_job_id="4242", all_nodes=True, native=True)
    nodes = [f"n{i}" for i in range(16)]
    cmd = hsd.slurm_all_nodes_command(p, nodes)
    assert cmd[0] == "srun" and {"--overlap", "--jobid=4242", "--nodes=16", f"--nodelist={','.join(nodes)}",
                                 "--kill-on-bad-exit=0", f"--chdir={IMPORT_ROOT}"} <= set(cmd)
    assert "--ntasks-per-node=1" in cmd and "--label" in cmd and cmd[-1] == "--native"
    assert cmd[cmd.index("--slurm-job-id") + 1] == "4242" and "--json" in cmd
    p.save_path = "/shared/stacks.txt"
    cmd = hsd.slurm_all_nodes_command(p, nodes)
    assert cmd[cmd.index("--save-path") + 1] == "/shared/stacks.txt.{host}"       # one file per node


def test_bad_params_are_refused():
    from pydantic import ValidationError

    with pytest.raises(ValidationError):
        hsd.HangStackDumpParams(slurm_job_id="42; rm -rf /")
    with pytest.raises(ValidationError):
        hsd.HangStackDumpParams(launcher_pid=0)
    with pytest.raises(ValidationError):
        hsd.HangStackDumpParams(pids=[12, -1])


SLURM_RANKS = textwrap.dedent("""\
    import os, time

    def forward():
        time.sleep(600)

    def save_checkpoint():
        time.sleep(600)                     # SLURM_PROCID 2 is the odd one

    print("UP", os.environ["SLURM_PROCID"], flush=True)
    save_checkpoint() if os.environ["SLURM_PROCID"] == "2" else forward()
""")


@pytest.mark.slurm
def test_slurm_job_dumped_on_every_node(ptrace_ok, slurm_cluster, tmp_path):  # noqa: F811
    (tmp_path / "ranks.py").write_text(SLURM_RANKS)
    job = slurm_cluster.sbatch("-N2", "-n3", "-t", "5", "--wrap", f"srun {sys.executable} {tmp_path}/ranks.py",
                                 cwd=tmp_path)
    try:
        assert slurm_cluster.wait_state(job, {"RUNNING"}, timeout_s=60) == "RUNNING"
        out, deadline = tmp_path / f"slurm-{job}.out", time.monotonic() + 60
        while time.monotonic() < deadline:          # every task printed UP: all three are in their function
            if out.exists() and out.read_text().count("UP") >= 3:
                break
            time.sleep(0.3)
        r = _run(slurm_job_id=job, all_nodes=True, per_process_timeout_s=20)
        assert "--overlap" in r.slurm_command and f"--jobid={job}" in r.slurm_command and "--nodes=2" in r.slurm_command
        assert r.odd_ranks == [2], r.findings
        assert sorted(p.rank for p in r.processes) == [0, 1, 2]
        assert r.groups[0].where.startswith("save_checkpoint (ranks.py:7)")
    finally:
        slurm_cluster.cmd("scancel", job, check=False)


GPU_HOLDER = textwrap.dedent("""\
    import time, torch
    def hold_gpu_memory():
        x = torch.ones(64 << 20, device="cuda")     # 256 MiB
        torch.cuda.synchronize()
        print("HOLDING", flush=True)
        time.sleep(600)
    hold_gpu_memory()
""")


@pytest.mark.gpu
def test_gpu_processes_are_found_through_nvml(ptrace_ok, tmp_path):
    (tmp_path / "holder.py").write_text(GPU_HOLDER)
    proc = subprocess.Popen([sys.executable, str(tmp_path / "holder.py")], stdout=subprocess.PIPE, text=True,
                            env=dict(os.environ, CUDA_VISIBLE_DEVICES=os.environ.get("CUDA_VISIBLE_DEVICES", "0")))
    try:
        assert proc.stdout.readline().strip() == "HOLDING"
        try:
            r = _run(gpu_processes=True, detail=True)
        except ToolFailure as e:
            if "PID namespace" in str(e):
                pytest.skip(str(e))
            raise
        mine = [p for p in r.processes if p.pid == proc.pid]
        assert mine and mine[0].stack and mine[0].stack[0].startswith("hold_gpu_memory (holder.py:6)"), r.processes
    finally:
        proc.kill()
        proc.wait()


def test_rank_blocked_in_cuda_synchronize_counts_as_waiting():
    frames = [{"name": "synchronize", "filename": "/venv/lib/python3.12/site-packages/torch/cuda/__init__.py", "line": 1},
              {"name": "step", "filename": "/job/train.py", "line": 50}]
    s = stacks.summarise_threads([{"os_thread_id": 7, "thread_name": "MainThread", "frames": frames}], 7, 12)
    assert s["in_collective"] and s["called_from"] == "step (/job/train.py:50)"
    launcher = [{"name": "_invoke_run", "filename": "/x/site-packages/torch/distributed/elastic/agent/server/api.py"}]
    assert not stacks.summarise_threads([{"os_thread_id": 8, "frames": launcher}], 8, 12)["in_collective"]


def test_second_tracer_is_explained():
    # Text py-spy 0.4.3 printed here when two py-spy dumps hit the same pid at once.
    stderr = "Error: Failed to suspend process\n\nCaused by:\n    0: Failed to suspend process\n    1: EPERM: Operation not permitted"
    msg = pyspy.explain_py_spy_error(99, stderr, "python train.py")
    assert "another tracer" in msg and "TracerPid /proc/99/status" in msg


@pytest.mark.slow
@pytest.mark.anyio
async def test_through_the_mcp_server(ptrace_ok):
    from mcp import Client

    from tools.engine.mcp_server import build_server

    proc = _start_sleeper()
    try:
        async with Client(build_server()) as c:
            r = await c.call_tool("hang_stack_dump", {"pids": [proc.pid]})
            gone = await c.call_tool("hang_stack_dump", {"pattern": r"no-such-command-\d{9}"})
    finally:
        proc.kill()
        proc.wait()
    assert not r.is_error and r.structured_content["groups"][0]["where"] == "stuck_here (<string>:3)"
    assert gone.is_error and "no process matched" in gone.content[0].text


def test_one_busy_process_without_a_collective_says_what_it_does():
    """A single non-distributed process busy on the GPU is not a stuck collective (issue 17)."""
    from tools.hang_stack_dump import StackGroup, findings_for

    gpu = StackGroup(pids=[4242], where="synchronize (torch/cuda/__init__.py:985)", called_from="step (train.py:40)",
                     in_collective=True, stack=["synchronize (torch/cuda/__init__.py:985)", "step (train.py:40)"])
    text = findings_for([gpu], [])[0]
    assert "stuck" not in text.split(";")[1].split("(")[0] and "busy on the GPU" in text and "train.py:40" in text
    cpu = StackGroup(pids=[4242], where="load (data.py:12)", stack=["load (data.py:12)"])
    assert "this is what it is doing" in findings_for([cpu], [])[0]
    rank = StackGroup(ranks=[0, 1], pids=[1, 2], where="wait (torch/distributed/distributed_c10d.py:4100)",
                      in_collective=True, stack=["wait (torch/distributed/distributed_c10d.py:4100)"])
    assert "the collective itself is stuck" in findings_for([rank], [])[0]


def _stopped(pid: int) -> bool:
    with open(f"/proc/{pid}/stat", "rb") as f:
        return f.read().rsplit(b")", 1)[1].split()[0] in (b"T", b"t")


@pytest.mark.slow
def test_a_stopped_rank_is_named_with_the_true_reason_and_its_stack():
    """Review 5e: a SIGSTOPped rank read as 'another tracer is attached'; it is stopped (state T), and its
    stack is still read (py-spy --nonblocking: a stopped process cannot be paused again)."""
    # 'ready' is printed inside load_next_batch: a line printed before the call reaches us while the child is
    # still in print() on the module's line, and a SIGSTOP landing there leaves it stopped outside the function.
    code = "import time\ndef load_next_batch():\n    print('ready', flush=True)\n    time.sleep(300)\nload_next_batch()\n"
    proc = subprocess.Popen([sys.executable, "-c", code], env={**os.environ, "RANK": "5"}, stdout=subprocess.PIPE)
    try:
        assert proc.stdout.readline().strip() == b"ready"
        os.kill(proc.pid, 19)  # SIGSTOP
        deadline = time.monotonic() + 30
        while not _stopped(proc.pid) and time.monotonic() < deadline:   # delivered, not merely sent
            time.sleep(0.01)
        result = _run(pids=[proc.pid])
    finally:
        proc.kill()
        proc.wait()
    assert result.frozen_ranks == [5] and result.verdict == "warn", result.findings
    assert "rank 5" in result.findings[0] and "stopped (state T" in result.findings[0]
    assert "another tracer" not in " ".join(result.findings)
    assert "load_next_batch" in result.groups[0].where  # read although stopped


def test_every_job_node_without_a_report_is_named_with_what_it_or_srun_said(monkeypatch, tmp_path):
    """Review 5e/5f: a node whose dump failed (stderr only) or that srun could not reach was silently missing.
    Through the srun transport: each process is credited to the node srun placed its task on (not the host it
    names), a node's own stderr is quoted, and srun's launch failure names its node."""
    from tests.srun_stand_in import stand_in_srun
    from tools.hang_stack_dump import slurm_job

    report = json.dumps({"processes": [{"pid": 7, "host": "claims-n9", "rank": 0, "stack": ["f (a.py:1)"]}]})
    stand_in_srun(tmp_path, monkeypatch, stdout=[f"0: {report}"], stderr=[
        "srun: launching StepId=5.0 on host n1, 1 tasks: 0", "srun: launching StepId=5.0 on host n2, 1 tasks: 1",
        "1: no stack could be read: pid 9 is stopped", "srun: error: n2: task 1: Exited with exit code 1",
        "srun: error: Task launch for StepId=5.0 failed on node n3: Socket timed out on send/recv operation"], code=1)
    procs, problems, silent, _ = slurm_job.dump_job("5", ["n1", "n2", "n3"], ["true"], 5, lambda f, m: None)
    assert [p.host for p in procs] == ["n1"] and silent == ["n2", "n3"]
    assert problems == ["n2: no report (exit 1); it said: no stack could be read: pid 9 is stopped",
                        "n3: no report: Socket timed out on send/recv operation"]


def test_the_all_nodes_srun_runs_our_package_by_its_installed_name(monkeypatch):
    """From the wheel the package is `mleng`: a fixed `-m tools.hang_stack_dump` failed on every node."""
    from tools.engine import processes
    from tools.hang_stack_dump import HangStackDumpParams, slurm_all_nodes_command

    monkeypatch.setattr(processes, "PACKAGE", "mleng")
    cmd = slurm_all_nodes_command(HangStackDumpParams(slurm_job_id="123", all_nodes=True), ["n1", "n2"])
    at = cmd.index("-m")
    assert cmd[at - 1] == sys.executable and cmd[at + 1] == "mleng.hang_stack_dump"
    assert "tools.hang_stack_dump" not in cmd


# ---------------------------------------------------------------------------------------------------
# Issue 35: a running job is not called stuck from one snapshot; a second look decides.

HEALTHY_JOB = textwrap.dedent("""\
    import datetime, torch, torch.distributed as dist

    def train_step(step, weight, grad):
        batch = torch.randn(64, 64)
        grad.copy_((batch @ weight).mean(dim=0).repeat(grad.numel() // 64))
        dist.all_reduce(grad)                # most of a step: a snapshot finds most ranks here
        weight -= 1e-4 * grad[:64]

    def main():
        dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=600))
        weight, grad = torch.eye(64), torch.zeros(1 << 16)
        for step in range(10 ** 9):
            train_step(step, weight, grad)
            if step == 20 and dist.get_rank() == 0:
                print("RUNNING", flush=True)

    main()
""")


@pytest.fixture(scope="module")
def healthy_job(ptrace_ok, tmp_path_factory):
    """torchrun --standalone, 3 gloo ranks all_reducing in a loop: nothing wrong with it."""
    work = tmp_path_factory.mktemp("healthy")
    name = f"healthy_job_{os.getpid()}"
    (work / f"{name}.py").write_text(HEALTHY_JOB)
    proc = subprocess.Popen(torchrun_command(name, WORLD, []), cwd=work, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True, start_new_session=True,
                            env=dict(os.environ, PYTHONPATH=str(work), TMPDIR=str(work)))
    try:
        assert proc.stdout.readline().strip() == "RUNNING", "the healthy job did not start"
        yield proc
    finally:
        kill_tree(proc.pid)
        proc.wait()


@pytest.mark.slow
@pytest.mark.parametrize("attempt", range(3))      # a coin flip of one snapshot must not decide: three tries
def test_a_healthy_running_job_is_not_called_stuck_nor_a_rank_named(healthy_job, attempt):
    started = time.monotonic()
    r = _run(launcher_pid=healthy_job.pid)
    took = time.monotonic() - started
    text = " ".join(r.findings)
    assert healthy_job.poll() is None, "the job must keep running"
    # One snapshot said "the collective itself is stuck", or named the rank it caught outside all_reduce.
    assert "stuck" not in text and "never reached" not in text and r.verdict in ("info", "ok"), r.findings
    assert r.odd_ranks == [] and r.culprit is None and r.motion == "running", r.findings
    assert r.findings[0].startswith("Running, not hung: ranks 0-2 moved between looks"), r.findings
    ranks = [p for p in r.processes if p.role == "rank"]
    assert all(p.moved and 0 < p.watched_s <= hsd.LOOK_S + 2 for p in ranks), ranks
    assert r.next[0] == "straggler_find"
    print(f"\nFIGURE hang_stack_dump healthy job attempt {attempt}: running after {took:.1f} s "
          f"(watched {max(p.watched_s for p in ranks):.1f} s), load {os.getloadavg()[0]:.1f}")


@pytest.mark.slow
def test_a_hung_job_is_still_named_after_the_second_look(stuck_job):
    """The stuck job seen twice: nobody moved, the odd rank is still named, and the answer says how long it
    looked."""
    r = _run(launcher_pid=stuck_job.pid)
    assert r.motion == "not_moving" and r.odd_ranks == [2] and r.culprit is not None, r.findings
    ranks = [p for p in r.processes if p.role == "rank"]
    assert all(p.moved is False and p.watched_s >= hsd.LOOK_S - 0.5 for p in ranks), ranks
    still = next(f for f in r.findings if f.startswith("Not moving"))
    assert "ranks 0-2 kept the same stack and local variables over" in still, still


def _moving(rank, in_collective, moved, frozen=""):
    return hsd.ProcessStack(pid=100 + rank, host="n1", rank=rank, stack=["f (x.py:1)"], in_collective=in_collective,
                            moved=moved, watched_s=2.0, frozen=frozen)


def test_motion_rule_on_hand_made_rows():
    from tools.hang_stack_dump.report import motion_of

    waiting = [_moving(r, True, True) for r in range(3)]
    assert motion_of(waiting + [_moving(3, False, False)]) == "running"      # rank 3 caught computing: no culprit
    assert motion_of([_moving(r, True, False) for r in range(3)] + [_moving(3, False, True)]) == "partly"
    assert motion_of([_moving(r, True, False) for r in range(4)]) == "not_moving"
    assert motion_of([_moving(r, True, None) for r in range(4)]) == "one_snapshot"
    assert motion_of(waiting + [_moving(3, False, False, frozen="stopped (state T)")]) == "partly"


def test_a_saved_single_snapshot_does_not_claim_a_stuck_collective():
    rank = hsd.StackGroup(ranks=[0, 1], pids=[1, 2], where="wait (torch/distributed/distributed_c10d.py:4100)",
                          in_collective=True, stack=["wait (torch/distributed/distributed_c10d.py:4100)"])
    text = hsd.findings_for([rank], [], "one_snapshot")[0]
    assert "one snapshot cannot tell" in text and "the collective itself is stuck" not in text


def test_a_rank_stopped_inside_the_collective_is_not_a_stuck_collective():
    """Model round 6 (cl-frozen-rank, cl-ssh-frozen-rank): under "rank 1 on mln2 is stopped: the culprit" the next
    finding said "the collective itself is stuck (network, NCCL, a GPU)" and `next` sent to the NCCL log: the
    stopped rank sits in the same all_reduce frame as the ranks waiting for it."""
    group = hsd.StackGroup(ranks=[0, 1, 2, 3], pids=[1, 2, 3, 4], where="all_reduce (torch/distributed/c10d.py:3252)",
                           in_collective=True, stack=["all_reduce (torch/distributed/c10d.py:3252)"])
    stopped = (_moving(1, True, False, frozen="stopped (state T)"),)
    text = hsd.findings_for([group], [], "partly", stopped)[0]
    assert "the collective itself is stuck" not in text and "rank 1 is stopped there and the others wait for it" in text
    assert "the collective itself is stuck" in hsd.findings_for([group], [], "not_moving")[0]   # no one stopped


def test_the_fingerprint_sees_a_loop_counter_and_not_a_blocked_frame():
    from tools.hang_stack_dump.motion import fingerprint

    def thread(step):
        return [{"os_thread_id": 7, "frames": [
            {"name": "all_reduce", "filename": "/v/torch/distributed/distributed_c10d.py", "line": 2800, "locals": []},
            {"name": "main", "filename": "/job/train.py", "line": 16,
             "locals": [{"name": "step", "addr": 140000 + step % 2, "repr": str(step)}]}]}]

    assert fingerprint(thread(41), 7) != fingerprint(thread(43), 7)    # same stack, same address, new value
    assert fingerprint(thread(41), 7) == fingerprint(thread(41), 7)

    def polling(line, tries):       # a hung wait that polls in a library: its line and counter move, the job does not
        return [{"os_thread_id": 7, "frames": [
            {"name": "wait_done", "filename": "/v/site-packages/fw/comm.py", "line": line,
             "locals": [{"name": "tries", "addr": 5000 + tries, "repr": str(tries)}]},
            {"name": "main", "filename": "/job/train.py", "line": 16,
             "locals": [{"name": "step", "addr": 140000, "repr": "41"}]}]}]

    assert fingerprint(polling(30, 7), 7) == fingerprint(polling(31, 912), 7)
