"""SLURM tools without a cluster: parsing of real SLURM 22.05 output (tests/fixtures/slurm), the
plain-word explanations, and the launchers that launch_script writes (run through bash with a stub
interpreter, so quoting and per-task expansion are checked for real)."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tools.shared import slurm as _slurm
from tools import launch_script, slurm_job_diagnose as sjd, slurm_status
from tools.engine.spec import ToolFailure

FIX = Path(__file__).parent / "fixtures" / "slurm"


def noop(fraction, message):
    pass


# ---------------------------------------------------------------------------------------------------
# _slurm

@pytest.mark.parametrize("hostlist, expected", [
    ("gpu-[01-03,07],login1", ["gpu-01", "gpu-02", "gpu-03", "gpu-07", "login1"]),
    ("n[1-2]", ["n1", "n2"]),
    ("node9", ["node9"]),
    ("a[08-10]b", ["a08b", "a09b", "a10b"]),
    ("", []),
])
def test_expand_hostlist(hostlist, expected):
    assert _slurm.expand_hostlist(hostlist) == expected


def test_allocation_from_env():
    env = {"SLURM_JOB_ID": "77", "SLURM_JOB_NODELIST": "h[3-4]"}
    assert _slurm.in_allocation(env) and _slurm.allocation_nodes(env) == ["h3", "h4"]
    assert not _slurm.in_allocation({}) and _slurm.allocation_nodes({}) == []


def test_parse_kv_line_keeps_values_with_spaces():
    line = (FIX / "scontrol-show-node.txt").read_text().splitlines()[1]
    f = _slurm.parse_kv_line(line)
    assert f["NodeName"] == "n2" and f["Reason"].startswith("xid 79 on gpu 0 [root@")
    assert f["OS"].startswith("Linux ") and " " in f["OS"] and f["RealMemory"] == "4000"


@pytest.mark.parametrize("text, seconds", [
    ("5", 300), ("03:04", 184), ("02:03:04", 7384), ("1-02:03:04", 93784), ("2-3", 183600),
    ("1-00:30", 86400 + 1800), ("UNLIMITED", None), ("Partition_Limit", None), ("", None), (None, None)])
def test_parse_duration(text, seconds):
    assert _slurm.parse_duration_s(text) == seconds


def test_exit_codes():
    assert _slurm.parse_exit_code("3:0") == (3, 0) and _slurm.parse_exit_code("0:15") == (0, 15)
    assert _slurm.decode_wait_status(768) == (3, 0)      # squeue --json, exit 3
    assert _slurm.decode_wait_status(36608) == (143, 0)  # script's TERM trap exited 143
    assert _slurm.decode_wait_status(15) == (0, 15)      # killed by SIGTERM (TIMEOUT)


def test_pending_reasons_in_plain_words():
    assert "higher priority" in _slurm.explain_pending_reason("Priority")
    assert "busy" in _slurm.explain_pending_reason("Resources")
    long_form = "Nodes_required_for_job_are_DOWN,_DRAINED_or_reserved_for_jobs_in_higher_priority_partitions"
    assert "drained" in _slurm.explain_pending_reason(long_form)
    qos = _slurm.explain_pending_reason("QOSMaxGRESPerUser")
    assert "QOS" in qos and "per-user" in qos
    assert "account" in _slurm.explain_pending_reason("AssocGrpCpuLimit")
    assert "job_reason_codes" in _slurm.explain_pending_reason("SomethingNew")


def _argv_printer(tmp_path: Path) -> str:
    """A fake interpreter that prints the argv it got as JSON (stands in for python on the node)."""
    stub = tmp_path / "py"
    stub.write_text(f"#!{sys.executable}\nimport json, sys\nprint(json.dumps(sys.argv[1:]))\n")
    stub.chmod(0o755)
    return str(stub)


def _run_payload(payload: str, procid: int, **env) -> list[str]:
    out = subprocess.run(["bash", "-c", payload], capture_output=True, text=True, check=True,
                         env={"PATH": os.environ["PATH"], "SLURM_PROCID": str(procid), "SLURM_JOB_ID": "42", **env})
    return json.loads(out.stdout)


def test_srun_torchrun_command_expands_procid_per_task(tmp_path):
    cmd = _slurm.srun_torchrun_command(["tools.dist_smoke_test", "--json", "a b"], nnodes=2, nproc_per_node=4,
                                       rdzv_port=29500, rdzv_host="10.0.0.1", python=_argv_printer(tmp_path),
                                       env={"SLURM_JOB_ID": "42"})
    assert cmd[:2] == ["srun", "--nodes=2"] and "--kill-on-bad-exit=1" in cmd and "--ntasks-per-node=1" in cmd
    assert "$(( SLURM_PROCID == 0 ))" in cmd[-1]  # left for each task's shell, not expanded here
    task0, task1 = _run_payload(cmd[-1], 0), _run_payload(cmd[-1], 1)
    assert "--rdzv-conf=is_host=1" in task0 and "--rdzv-conf=is_host=0" in task1
    assert "--rdzv-endpoint=10.0.0.1:29500" in task0 and "--rdzv-id=42" in task0 and "--nnodes=2" in task0
    assert task0[-4:] == ["-m", "tools.dist_smoke_test", "--json", "a b"]


def test_the_task_on_the_named_node_hosts_the_rendezvous_whatever_its_procid(tmp_path):
    """Review F1: a group listed [mln8, mln3] dials mln8, but SLURM makes mln3 task 0; the host is chosen by name."""
    cmd = _slurm.srun_torchrun_command(["tools.collective_bench.rank", "{}"], nnodes=2, nproc_per_node=1,
                                       rdzv_port=29500, rdzv_host="10.0.0.8", rdzv_node="mln8",
                                       python=_argv_printer(tmp_path), env={"SLURM_JOB_ID": "42"})
    on_mln3 = _run_payload(cmd[-1], 0, SLURMD_NODENAME="mln3")
    on_mln8 = _run_payload(cmd[-1], 1, SLURMD_NODENAME="mln8")
    assert "--rdzv-conf=is_host=0" in on_mln3 and "--rdzv-conf=is_host=1" in on_mln8
    with pytest.raises(ValueError, match="rdzv node"):
        _slurm.rdzv_is_host("mln1; rm -rf /")


def test_each_task_runs_in_a_scratch_tmpdir_removed_after(tmp_path):
    """torchelastic leaves a torchelastic_* folder in TMPDIR per run: the task's own TMPDIR goes with it."""
    stub = tmp_path / "py"
    stub.write_text(f"#!{sys.executable}\nimport os, sys\nos.mkdir(os.path.join(os.environ['TMPDIR'], 'torchelastic_x'))\n"
                    "print(os.environ['TMPDIR']); sys.exit(3)\n")
    stub.chmod(0o755)
    cmd = _slurm.srun_torchrun_command(["m"], nnodes=1, nproc_per_node=1, rdzv_host="h", python=str(stub),
                                       env={"SLURM_JOB_ID": "42"})
    base = tmp_path / "node-tmp"
    base.mkdir()
    out = subprocess.run(["bash", "-c", cmd[-1]], capture_output=True, text=True,
                         env={"PATH": os.environ["PATH"], "SLURM_PROCID": "0", "TMPDIR": str(base)})
    assert out.returncode == 3 and out.stdout.startswith(str(base / "mleng-ranks-run-"))  # exit code kept
    assert list(base.iterdir()) == []


def test_client_configured(tmp_path, monkeypatch):
    conf = tmp_path / "slurm.conf"
    monkeypatch.setattr(_slurm.shutil, "which", lambda name: "/usr/bin/" + name)
    assert not _slurm.client_configured({"SLURM_CONF": str(conf)})  # named but missing
    conf.write_text("ClusterName=x\n")
    assert _slurm.client_configured({"SLURM_CONF": str(conf)})
    monkeypatch.setattr(_slurm.shutil, "which", lambda name: None)
    assert not _slurm.client_configured({"SLURM_CONF": str(conf)})  # no client commands


def test_split_labelled_output():
    assert _slurm.split_labelled_output("0: a\n 1: b\n0: c\nnoise") == {0: "a\nc", 1: "b"}


# ---------------------------------------------------------------------------------------------------
# slurm_status parsing (real 22.05 output: n2 drained, job 10 holds the gpu, 11 waits on it, 12 too big)

def test_nodes_from_sinfo_json():
    nodes = {n["name"]: n for n in slurm_status.nodes_from_json(json.loads((FIX / "sinfo-22.05.json").read_text()))}
    assert nodes["n2"]["state"] == "IDLE+DRAIN" and nodes["n2"]["reason"] == "xid 79 on gpu 0"
    assert nodes["n2"]["set_by"] == "root" and nodes["n2"]["since"]
    assert nodes["n1"]["gpus"] == 1 and nodes["n1"]["gpus_used"] == 1
    assert not slurm_status.is_problem(nodes["n1"]["state"]) and slurm_status.is_problem(nodes["n2"]["state"])


def test_down_not_responding_node_in_both_sources():
    """A node whose slurmd died: DOWN with the NOT_RESPONDING flag, reason set by SLURM itself."""
    js = slurm_status.nodes_from_json(json.loads((FIX / "sinfo-down-22.05.json").read_text()))
    tx = slurm_status.nodes_from_scontrol((FIX / "scontrol-show-node-down.txt").read_text())
    for nodes in (js, tx):
        n2 = next(n for n in nodes if n["name"] == "n2")
        assert n2["state"] == "DOWN+NOT_RESPONDING" and n2["reason"] == "Not responding"
        assert n2["set_by"] == "root" and n2["since"] and slurm_status.is_problem(n2["state"])
        assert not slurm_status.is_problem(next(n for n in nodes if n["name"] == "n1")["state"])


def test_nodes_from_newer_json_shape():
    """23.02+ (openapi v0.0.39+) gives state as a list and wraps numbers as {set, infinite, number}."""
    doc = {"nodes": [{"name": "g1", "state": ["IDLE", "DRAIN"], "reason": "bad", "reason_set_by_user": "ops",
                      "reason_changed_at": {"set": True, "infinite": False, "number": 1700000000},
                      "gres": "gpu:h100:8(S:0-1)", "gres_used": "gpu:h100:0(IDX:N/A)", "partitions": ["p"],
                      "alloc_cpus": {"set": True, "infinite": False, "number": 0}}]}
    (n,) = slurm_status.nodes_from_json(doc)
    assert n["state"] == "IDLE+DRAIN" and n["gpus"] == 8 and n["gpus_used"] == 0 and n["since"]


def test_text_fallback_matches_json():
    text = slurm_status.nodes_from_scontrol((FIX / "scontrol-show-node.txt").read_text())
    js = slurm_status.nodes_from_json(json.loads((FIX / "sinfo-22.05.json").read_text()))
    keys = ("name", "state", "reason", "set_by", "gpus", "gpus_used", "partitions")
    assert [{k: n[k] for k in keys} for n in text] == [{k: n[k] for k in keys} for n in js]


def test_partition_summary_counts_drained_gpus_as_unavailable():
    nodes = slurm_status.nodes_from_json(json.loads((FIX / "sinfo-22.05.json").read_text()))
    parts = {p.name: p for p in slurm_status.summarise_partitions(
        (FIX / "scontrol-show-partition.txt").read_text(), nodes)}
    gpu = parts["gpu"]
    assert (gpu.nodes_total, gpu.nodes_in_use, gpu.nodes_unavailable, gpu.nodes_idle) == (2, 1, 1, 0)
    assert (gpu.gpus_total, gpu.gpus_used, gpu.gpus_free) == (2, 1, 0)
    assert parts["debug"].default and not gpu.default


def test_gres_count():
    assert slurm_status.gres_count("gpu:h100:8(S:0-1),nic:1") == 8
    assert slurm_status.gres_count("gpu:a100:2,gpu:v100:1") == 3
    assert slurm_status.gres_count("(null)") == 0 and slurm_status.gres_count(None) == 0


def test_jobs_from_json_and_text_agree():
    js = {j.job_id: j for j in slurm_status.jobs_from_json(json.loads((FIX / "squeue-22.05.json").read_text()), 0)}
    tx = {j.job_id: j for j in slurm_status.jobs_from_text((FIX / "squeue-format.txt").read_text())}
    for job_id in ("10", "11", "12"):
        assert (js[job_id].state, js[job_id].reason, js[job_id].partition) == \
               (tx[job_id].state, tx[job_id].reason, tx[job_id].partition)
    assert js["11"].reason == "Dependency" and js["12"].reason == "PartitionNodeLimit"
    findings, stuck = slurm_status._job_findings([js["11"], js["12"]])
    assert stuck and "another job" in js["11"].reason_explained and "never start" in findings[1]


def test_status_without_slurm_is_a_clear_failure(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(ToolFailure, match="no SLURM client"):
        slurm_status.run(slurm_status.SlurmStatusParams(), noop)


# ---------------------------------------------------------------------------------------------------
# slurm_job_diagnose pieces

SACCT = """7|7|train|FAILED|3:0|0:0|00:01:02|01:00:00|n[1-2]|debug|/w|sbatch -o logs/%x-%j.out x.sh
7.batch|7.batch|batch|FAILED|3:0||00:01:02||n1||||
7.extern|7.extern|extern|COMPLETED|0:0||00:01:02||n[1-2]||||
7.0|7.0|python|FAILED|1:0||00:01:00||n2||||
6_1|6|wrap|FAILED|1:0|0:0|00:00:00|UNLIMITED|n1|debug|/w|sbatch --array=0-1 --wrap exit 1
"""


def test_parse_sacct_job_steps_and_array_tasks():
    job, steps = sjd.parse_sacct(SACCT, sjd.SACCT_FIELDS, "7")
    assert job["state"] == "FAILED" and job["exit_code"] == 3 and job["elapsed_s"] == 62 and job["time_limit_s"] == 3600
    assert [s.step for s in steps] == ["batch", "extern", "0"] and steps[2].nodes == "n2"
    task, _ = sjd.parse_sacct(SACCT, sjd.SACCT_FIELDS, "6_1")
    assert task["exit_code"] == 1 and task["time_limit_s"] is None


def test_log_file_names():
    assert sjd.log_paths_from_submit_line("sbatch -o logs/%x-%j.out --error=err-%A_%a.txt -N2 x.sh") == \
        ["logs/%x-%j.out", "err-%A_%a.txt"]
    info = {"name": "train", "user": "ana", "batch_host": "n1"}
    assert sjd.expand_log_pattern("logs/%x-%j-%u-%N.out", info, "123") == "logs/train-123-ana-n1.out"
    assert sjd.expand_log_pattern("a-%A_%a-%5j.out", {}, "55_3") == "a-55_3-00055.out"


def test_scan_logs_for_slurms_own_lines(tmp_path):
    log = tmp_path / "x.out"
    log.write_text("torch.OutOfMemoryError: CUDA out of memory.\n"       # the program's words, not SLURM's
                   "srun: error: n2: task 1: Exited with exit code 3\n"
                   "slurmstepd: error: *** JOB 9 ON n1 CANCELLED AT 2026-11-29T16:25:14 DUE TO TIME LIMIT ***\n")
    state, node, evidence = sjd.scan_slurm_lines([log])
    assert state == "TIMEOUT" and node == "n2" and "TIME LIMIT" in evidence
    log.write_text("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB\n")
    assert sjd.scan_slurm_lines([log])[0] is None
    log.write_text("slurmstepd: error: Detected 1 oom_kill event in StepId=5.batch. Some of the step tasks "
                   "have been OOM Killed.\n")
    assert sjd.scan_slurm_lines([log])[0] == "OUT_OF_MEMORY"


@pytest.mark.parametrize("state, log_state, want_state, want_next", [
    ("NODE_FAIL", None, "NODE_FAIL", "gpu_health"),
    ("OUT_OF_MEMORY", None, "OUT_OF_MEMORY", "knowledge://cpu-memory/host-memory.md"),
    ("PREEMPTED", None, "PREEMPTED", "knowledge://orchestration/fault-tolerance.md"),
    ("CANCELLED", "TIMEOUT", "TIMEOUT", "knowledge://training/checkpoints.md"),  # jobcomp said CANCELLED
])
def test_diagnose_states(state, log_state, want_state, want_next):
    info = {"job_id": "5", "name": "t", "state": state, "exit_code": 0, "signal": 9, "elapsed_s": 100,
            "time_limit_s": 3600, "nodes": "gpu-07"}
    verdict, findings, nxt, _, node = sjd.diagnose(info, [], log_state, None, None)
    assert verdict == "fail" and want_state in findings[0] and want_next in nxt
    if state == "NODE_FAIL":
        assert node == "gpu-07" and any("--exclude=gpu-07" in f for f in findings)


def test_diagnose_exit_137_explained():
    info = {"job_id": "5", "state": "FAILED", "exit_code": 137, "signal": 0}
    _, findings, nxt, _, _ = sjd.diagnose(info, [], None, None, None)
    assert any("SIGKILL" in f for f in findings) and "log_triage" in nxt


def test_diagnose_from_logs_only(tmp_path, monkeypatch):
    monkeypatch.setattr(sjd, "from_scontrol", lambda job_id: None)
    monkeypatch.setattr(sjd, "from_sacct", lambda job_id, not_seen: (None, [], None))
    (tmp_path / "slurm-88.out").write_text(
        "slurmstepd: error: *** JOB 88 ON gpu-3 CANCELLED AT 2026-01-01T00:00:00 DUE TO NODE FAILURE ***\n")
    r = sjd.run(sjd.SlurmJobDiagnoseParams(job_id="88", search_dirs=[str(tmp_path)]), noop)
    assert r.state == "NODE_FAIL" and r.failing_node == "gpu-3" and r.verdict == "fail"
    assert r.sources == ["log files"] and "gpu_health" in r.next
    with pytest.raises(ToolFailure, match="nothing is known about job 89"):
        sjd.run(sjd.SlurmJobDiagnoseParams(job_id="89", search_dirs=[str(tmp_path)]), noop)


def test_job_id_validated():
    with pytest.raises(ValueError):
        sjd.SlurmJobDiagnoseParams(job_id="12; rm -rf /")


# ---------------------------------------------------------------------------------------------------
# launch_script

def test_sbatch_script_quoting_and_per_task_expansion(tmp_path, monkeypatch):
    monkeypatch.setenv("NCCL_IB_HCA", "mlx5_0,mlx5_1")
    monkeypatch.setenv("NOT_NCCL", "x")
    p = launch_script.LaunchScriptParams(command="train.py --cfg 'my cfg.yaml' --lr 3e-4", nnodes=4,
                                         gpus_per_node=8, partition="gpu", env={"NCCL_DEBUG": "WARN"},
                                         python=_argv_printer(tmp_path), workdir=str(tmp_path))
    r = launch_script.run(p, noop)
    script = r.script
    assert r.world_size == 32 and not r.submitted and r.script_path is None
    assert "#SBATCH --nodes=4" in script and "#SBATCH --gpus-per-node=8" in script
    assert "#SBATCH --partition=gpu" in script and "--kill-on-bad-exit=1" in script
    assert "export NCCL_IB_HCA=mlx5_0,mlx5_1" in script and "export NCCL_DEBUG=WARN" in script
    assert "NOT_NCCL" not in script
    subprocess.run(["bash", "-n"], input=script, text=True, check=True)
    srun = next(line for line in script.splitlines() if line.startswith("srun "))
    words = shlex.split(srun)
    assert "--output=logs/%x-%j-node%t.out" in words
    payload = words[-1]
    env = {"MASTER_ADDR": "10.1.1.1", "MASTER_PORT": "29500"}
    node0, node3 = _run_payload(payload, 0, **env), _run_payload(payload, 3, **env)
    assert "--rdzv-endpoint=10.1.1.1:29500" in node0 and "--rdzv-id=42" in node0
    assert "--rdzv-conf=is_host=1" in node0 and "--rdzv-conf=is_host=0" in node3
    assert "--log-dir=logs/42/node3" in node3 and "--nproc-per-node=8" in node3
    assert node0[-5:] == ["train.py", "--cfg", "my cfg.yaml", "--lr", "3e-4"]


def test_tool_script_runs_the_tool_once_with_its_json(tmp_path):
    p = launch_script.LaunchScriptParams(tool="collective_bench", tool_args=["--op", "all_reduce"], nnodes=2,
                                         gpus_per_node=8, workdir=str(tmp_path), job_name="cb")
    script = launch_script.run(p, noop).script
    subprocess.run(["bash", "-n"], input=script, text=True, check=True)
    last = script.strip().splitlines()[-1]
    assert "-m tools.collective_bench --nnodes 2 --nproc-per-node 8 --op all_reduce --json" in last
    assert last.endswith('> logs/"$SLURM_JOB_NAME-$SLURM_JOB_ID.json"') and "srun" not in last
    assert "export PYTHONPATH=" in script and "#SBATCH --gpus-per-node=8" in script
    gres = launch_script.run(p.model_copy(update={"gpu_option": "gres"}), noop).script
    assert "#SBATCH --gres=gpu:8" in gres and "--gpus-per-node" not in gres


def test_torchrun_and_srun_modes():
    p = launch_script.LaunchScriptParams(command="train.py", nnodes=3, gpus_per_node=4, mode="torchrun",
                                         rdzv_host="node1", pass_nccl_env=False)
    lines = launch_script.run(p, noop).commands
    assert len(lines) == 3 and all("--rdzv-endpoint=node1:29500" in line for line in lines)
    assert "is_host=1" in lines[0] and "is_host=0" in lines[1] and "is_host=0" in lines[2]
    srun = launch_script.run(p.model_copy(update={"mode": "srun"}), noop).commands[0]
    assert srun.startswith("srun --nodes=3") and "--kill-on-bad-exit=1" in srun and "$(( SLURM_PROCID == 0 ))" in srun


def test_launch_script_refuses_bad_requests():
    with pytest.raises(ToolFailure, match="exactly one"):
        launch_script.run(launch_script.LaunchScriptParams(command="t.py", tool="dist_smoke_test"), noop)
    with pytest.raises(ToolFailure, match="mode='sbatch'"):
        launch_script.run(launch_script.LaunchScriptParams(command="t.py", mode="srun", submit=True), noop)
    with pytest.raises(ValueError):
        launch_script.LaunchScriptParams(command="t.py", job_name="a b")
    with pytest.raises(ValueError):
        launch_script.LaunchScriptParams(command="t.py\nrm -rf /")
    with pytest.raises(ValueError, match="variable names"):
        launch_script.LaunchScriptParams(command="t.py", env={"A B": "1"})


def test_spec_annotations():
    assert launch_script.SPEC.read_only is False and launch_script.SPEC.idempotent is False
    assert slurm_status.SPEC.read_only and sjd.SPEC.read_only and sjd.SPEC.runs == "subprocess"


def test_a_broken_log_triage_does_not_hide_slurms_answer(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "tools.shared.triage.core", None)  # import now fails
    monkeypatch.setattr(sjd, "from_scontrol", lambda job_id: None)
    monkeypatch.setattr(sjd, "from_sacct", lambda job_id, not_seen: (None, [], None))
    (tmp_path / "slurm-7.out").write_text(
        "slurmstepd: error: *** JOB 7 ON n1 CANCELLED AT 2026-01-01T00:00:00 DUE TO TIME LIMIT ***\n")
    r = sjd.run(sjd.SlurmJobDiagnoseParams(job_id="7", search_dirs=[str(tmp_path)]), noop)
    assert r.state == "TIMEOUT" and r.verdict == "fail"
    assert r.log_findings and r.log_findings[0].startswith("log_triage is not usable")


def test_scratch_left_by_killed_tasks_is_removed_by_tag(tmp_path):
    """A SIGKILLed task cannot clean up: the run's tag names its folders for one cleanup step at the end."""
    cmd = _slurm.scratch_cleanup_command(["mln1", "mln2"], "abcd1234")
    assert cmd[0] == "srun" and "--overlap" in cmd and "--nodelist=mln1,mln2" in cmd and "--ntasks-per-node=1" in cmd
    for name in ("mleng-ranks-abcd1234-x1", "mleng-ranks-abcd1234-x2", "mleng-ranks-other99-x3"):
        (tmp_path / name).mkdir()
    subprocess.run(["bash", "-c", cmd[-1]], check=True, env={"PATH": os.environ["PATH"], "TMPDIR": str(tmp_path)})
    assert [p.name for p in tmp_path.iterdir()] == ["mleng-ranks-other99-x3"]
    with pytest.raises(ValueError, match="tag"):
        _slurm.scratch_cleanup_command(["n1"], "x; rm -rf /")


# slurm_status: what a node slurmctld hears nothing from says on slurmd's port (model round 8, cl-link-down: "no
# tool could look at mln6 while SLURM can't reach it")

def test_a_silent_nodes_slurmd_port_tells_a_dead_slurmd_from_a_hung_one(monkeypatch):
    import socket

    listening = socket.socket()
    listening.bind(("127.0.0.1", 0))
    listening.listen(1)                      # a slurmd that is up, or frozen: the kernel still accepts
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    dead_port = closed.getsockname()[1]
    closed.close()                           # nothing listens: the host's kernel refuses
    try:
        assert slurm_status.knock("127.0.0.1", listening.getsockname()[1]) == "accepted"
        assert slurm_status.knock("127.0.0.1", dead_port) == "refused"
        assert slurm_status.knock("-oProxyCommand=x", 22) == ""          # not an address to dial
        nodes = [{"name": "mln2", "state": "IDLE+NOT_RESPONDING", "address": "127.0.0.1", "port": dead_port},
                 {"name": "mln3", "state": "DOWN+NOT_RESPONDING", "address": "127.0.0.1",
                  "port": listening.getsockname()[1]},
                 {"name": "mln4", "state": "IDLE+DRAIN", "address": "127.0.0.1", "port": dead_port}]
        said = slurm_status.knock_silent_nodes(nodes)
    finally:
        listening.close()
    assert set(said) == {"mln2", "mln3"}                                  # a drained node answers slurmctld: not probed
    assert said["mln2"].startswith(f"From here, a connection to its slurmd (127.0.0.1 port {dead_port}) was refused: "
                                   "the host is up and nothing listens there, so slurmd is not running"), said
    assert "was accepted, yet slurmctld hears nothing: slurmd is hung or stopped" in said["mln3"], said


def test_a_node_whose_address_answers_nothing_is_said_down_or_cut_off():
    """A private namespace's address whose link is down on the far side: nothing answers (no route, or silence)."""
    import shutil
    import uuid

    if os.geteuid() != 0 or not shutil.which("ip"):
        pytest.skip("needs root and iproute2")
    ns, here = f"knock{uuid.uuid4().hex[:6]}", f"kn{uuid.uuid4().hex[:6]}"
    ip = lambda *a: subprocess.run(["ip", *a], check=True, capture_output=True, timeout=10)  # noqa: E731
    ip("netns", "add", ns)
    try:
        ip("link", "add", here, "type", "veth", "peer", "name", "far", "netns", ns)
        ip("addr", "add", "10.231.77.1/30", "dev", here)
        ip("link", "set", here, "up")                 # the far end stays down: a node whose link is down
        started = time.monotonic()
        said = slurm_status.knock("10.231.77.2", 6818, timeout_s=1.0)
        assert said in ("silent", "unreachable") and time.monotonic() - started < 5, said
    finally:
        subprocess.run(["ip", "link", "del", here], capture_output=True, timeout=10)
        subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=10)
