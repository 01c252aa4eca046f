"""straggler_find on the 4-node namespace cluster (scripts/cluster-local.sh), against a real SLURM job: the gloo
training loop of bench/straggler_workload.py, one rank per node, launched with sbatch + srun. Injected from
outside the job: one node's CPU limited by its cgroup, one rank sleeping in its loader, one node's link shaped
by tc tbf; and the healthy job, which must also finish with the result an unwatched twin (same arguments, run at
the same time) finishes with. Each time: the right rank and reason (or nobody), the job still running afterwards,
nothing of ours left on any node. Bad job ids (missing, pending, someone else's) are answers. Healthy five times
over: bench/straggler_find_bench.py (each of its rounds samples the healthy job once and counts the named).
"""

import json
import os
import pwd
import re
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

import pytest

from tests.multinode_cluster import REPO, multinode_cluster  # noqa: F401  (fixture)
from tools.straggler_find.judge import Rules

pytestmark = [pytest.mark.slurm, pytest.mark.timeout(900)]
WORKLOAD = REPO / "bench" / "straggler_workload.py"


def find(cluster, job: str, *extra: str, user: str | None = None) -> tuple[int, dict | str]:
    """Run the tool as a user would (CLI, JSON); (exit code, result or error text)."""
    env = {**os.environ, "PATH": f"{os.path.dirname(sys.executable)}:{os.environ['PATH']}", "SLURM_CONF": cluster.conf}
    # 10 s at 10 Hz: the 100 samples a rank of the default 20 s at 5 Hz, in half the cluster time.
    cmd = [sys.executable, "-m", "tools.straggler_find", "--slurm-job-id", job, "--window-s", "10", "--rate-hz", "10",
           *extra, "--json"]
    with tempfile.TemporaryDirectory(prefix="sf-home-") as home:
        if user:                                 # its own MLENG_HOME: the test's belongs to root
            os.chown(home, pwd.getpwnam(user).pw_uid, pwd.getpwnam(user).pw_gid)
            as_user = ["runuser", "-u", user, "--", "env", f"PYTHONPATH={sysconfig.get_paths()['purelib']}:{REPO}",
                       f"MLENG_HOME={home}", _system_python()]
            _skip_unless_importable(as_user, user)
            cmd = [*as_user, *cmd[1:]]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=REPO, env=env)
    if "{" in proc.stdout:
        return proc.returncode, json.loads(proc.stdout[proc.stdout.index("{"):])
    return proc.returncode, proc.stdout + proc.stderr


def _skip_unless_importable(as_user: list[str], user: str) -> None:
    """Skip where `user` cannot read the checkout or the venv (a clone in a private folder, e.g. one made by
    `mktemp -d`, mode 0700): the test needs the tool's code to run as that user."""
    probe = subprocess.run([*as_user, "-c", "import tools.straggler_find"], capture_output=True, text=True,
                           timeout=60, cwd="/")
    if probe.returncode:
        pytest.skip(f"user {user} cannot import the tool from {REPO} and this venv (a private folder on the way?): "
                    f"{probe.stderr.strip().splitlines()[-1][:200] if probe.stderr.strip() else probe.returncode}")


def _system_python() -> str:
    """An interpreter another user may run: the venv's lives under /root here. Same minor version, so the
    venv's compiled packages (pydantic_core) load in it."""
    exe = shutil.which(f"python{sys.version_info.major}.{sys.version_info.minor}", path="/usr/bin:/usr/local/bin")
    if not exe or not os.access(exe, os.X_OK) or exe.startswith("/root"):
        pytest.skip(f"no system python{sys.version_info.major}.{sys.version_info.minor} that user nobody can run")
    return exe


class Job:
    """sbatch -N4, one workload rank per node, for `steps` steps (default: until cancelled)."""

    def __init__(self, cluster, out: Path, *args: str, port: int = 29551, steps: int = 1000000):
        self.cluster, self.out = cluster, out
        wrap = f"srun {sys.executable} {WORKLOAD} --master mln1 --port {port} --steps {steps} {' '.join(args)}"
        self.id = cluster.cmd("sbatch", "--parsable", "-N4", "--ntasks-per-node=1", "--time=10",
                              f"--output={out}", "--wrap", wrap).stdout.strip().split(";")[0]
        self.wait_steps(10, 120)

    def steps(self) -> int:
        return len(re.findall(r"^step \d+", self.out.read_text(), re.M)) if self.out.exists() else 0

    def wait_steps(self, count: int, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while self.steps() < count:
            assert time.monotonic() < deadline, f"job {self.id} made no progress: {self.out.read_text()[-1500:] if self.out.exists() else ''}"
            time.sleep(0.5)

    def state(self) -> str:
        return self.cluster.cmd("squeue", "-h", "-j", self.id, "-o", "%T", check=False).stdout.strip()

    def cancel(self) -> None:
        self.cluster.cmd("scancel", self.id, check=False)

    def result(self, timeout_s: float) -> str:
        """The job's final `result <checksum>` line, once it has finished."""
        deadline = time.monotonic() + timeout_s
        while self.state():
            assert time.monotonic() < deadline, f"job {self.id} did not finish in {timeout_s:.0f} s"
            time.sleep(1)
        found = re.findall(r"^result (\S+)$", self.out.read_text(), re.M)
        assert found, f"job {self.id} ended without a result: {self.out.read_text()[-1500:]}"
        return found[-1]


def ours_left(cluster) -> list[str]:
    """py-spy or a node sampler still alive in any node, or a sampler's temp dir."""
    left = []
    for node in cluster.nodes:
        for pid in cluster.node_pids(node):
            try:
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            except OSError:
                continue
            if "py-spy" in cmd or "straggler_find.node" in cmd:
                left.append(f"{node}: {cmd[:120]}")
    return left + [str(p) for p in Path("/tmp").glob("mleng-straggler-*")]


def check_untouched(job: Job) -> None:
    before = job.steps()
    assert job.state() == "RUNNING", "the job must outlive the sampling"
    job.wait_steps(before + 3, 60)                       # and keep stepping


@pytest.fixture
def cluster(multinode_cluster):  # noqa: F811
    yield multinode_cluster
    multinode_cluster.heal()
    for job in multinode_cluster.cmd("squeue", "-h", "-o", "%i", check=False).stdout.split():
        multinode_cluster.cmd("scancel", job, check=False)


def _one(result: dict) -> dict:
    # On a miss, each rank's waiting share per third of the window and its samples: what the rule saw.
    seen = [(r["rank"], r["host"], [round(p.get("collective", 0), 2) for p in r["part_fractions"]], r["part_samples"])
            for r in result.get("ranks", [])]
    assert result["verdict"] == "warn" and len(result["stragglers"]) == 1, (result["findings"], seen)
    return result["stragglers"][0]


def test_cpu_limited_node_is_named_for_cpu(cluster, tmp_path):
    job = Job(cluster, tmp_path / "job.out")
    try:
        cluster.cpu_limit("mln3", 5)      # 5% of a CPU: the shared 2-core box gives every rank ~15%
        job.wait_steps(job.steps() + 3, 120)
        rc, result = find(cluster, job.id)
        check_untouched(job)
    finally:
        job.cancel()
    assert rc in (0, 1), result
    s = _one(result)
    assert (s["host"], s["rank"], s["reason"]) == ("mln3", 2, "cpu"), result["findings"]
    assert "throttled" in " ".join(s["evidence"])
    # The others wait on it in its stacks, or (gloo spins while starved) it is named for its host and says so.
    assert s["others_wait_fraction"] > 0.2 or (not s["apart_in_stacks"] and "its stacks look like the others'"
                                               in result["findings"][0]), (s, result["findings"][0])
    # What to act on is the host, with the quota that caps it (issue 35: the model typed the culprit's kind itself).
    assert (s["culprit_kind"], s["culprit"]["name"], result["culprit_kind"]) == ("node", "mln3", "node"), s
    # the node's cgroup folder is per cluster instance (mln, or i1mln.. under a second xdist worker)
    assert (f"quota 0.05 CPU (/{cluster.cgroups.name}/mln3: cpu.cfs_quota_us 5000 / cpu.cfs_period_us 100000, "
            "written ") in result["findings"][0], result["findings"][0]
    assert sorted(n["host"] for n in result["nodes"]) == ["mln1", "mln2", "mln3", "mln4"]
    assert not ours_left(cluster)


def test_slow_loader_rank_is_named_for_data_loading(cluster, tmp_path):
    job = Job(cluster, tmp_path / "job.out", "--slow-loader-rank", "1", "--loader-sleep-s", "0.3")
    try:
        rc, result = find(cluster, job.id)
        check_untouched(job)
    finally:
        job.cancel()
    s = _one(result)
    assert (s["host"], s["rank"], s["reason"]) == ("mln2", 1, "data_loading"), result["findings"]
    assert "load_batch" in " ".join(s["evidence"])
    assert (s["culprit_kind"], s["culprit"]["rank"]) == ("rank", 1) and "Culprit (rank): rank 1 on mln2" in result["findings"][0]
    # No log_paths given: the step times come from the job's stdout as SLURM records it (model round 10 asked).
    assert result["step_time_lines"] and result["step_time_lines"][-1].startswith("job.out: step "), result["step_time_lines"]
    assert any(f.startswith(f"Step times from the job's stdout ({tmp_path / 'job.out'})") for f in result["findings"])
    # And their trend (model round 11 asked for a series): the job logs a step every ~0.3 s, 12 lines in ~4 s.
    assert [t["log"] for t in result["step_time_trend"]] == ["job.out"], result["step_time_trend"]
    assert any(f.startswith("Step time in job.out (") for f in result["findings"]), result["findings"]
    assert not ours_left(cluster)


def test_shaped_link_is_named_for_the_network(cluster, tmp_path):
    job = Job(cluster, tmp_path / "job.out", "--grad-floats", "1048576")        # 4 MiB per all_reduce
    try:
        cluster.on_node("mln4", "tc", "qdisc", "add", "dev", "eth0", "root", "tbf", "rate", "50mbit",
                        "burst", "32kbit", "latency", "400ms")
        job.wait_steps(job.steps() + 3, 120)
        rc, result = find(cluster, job.id)
        check_untouched(job)
    finally:
        job.cancel()
    s = _one(result)
    assert (s["host"], s["reason"]) == ("mln4", "network"), result["findings"]
    assert "tbf" in " ".join(s["evidence"])
    assert not ours_left(cluster)


def test_healthy_job_names_nobody_and_ends_as_unwatched(cluster, tmp_path):
    # 400 steps: ~40-80 s on this 2-core box with both jobs running, well past the ~15 s the sampling takes.
    twin = Job(cluster, tmp_path / "twin.out", port=29552, steps=400)          # never watched: the reference
    job = Job(cluster, tmp_path / "job.out", steps=400)
    try:
        rc, result = find(cluster, job.id)
        assert isinstance(result, dict), result
        assert job.state() == "RUNNING", "the job must outlive the sampling (raise --steps on a faster machine)"
        assert result["stragglers"] == [], result["findings"]
        assert result["verdict"] in ("ok", "info") and len(result["ranks"]) == 4
        assert result["spread_pct"] is not None
        assert any(f.startswith(("No straggler", "Inconclusive")) for f in result["findings"]), result["findings"]
        if any(f.startswith("Inconclusive") for f in result["findings"]):
            # only with a spread that justifies it, or a lag it says the oversubscribed scheduler explains
            assert (result["threshold_pct"] > 100 * Rules.load().share.widest
                    or any("oversubscribed" in f for f in result["findings"])), result["findings"]
        assert job.result(300) == twin.result(300)          # sampling changed nothing in the job's arithmetic
    finally:
        job.cancel()
        twin.cancel()
    assert not ours_left(cluster)


def test_bad_job_ids_are_answers_and_leave_jobs_alone(cluster, tmp_path):
    rc, text = find(cluster, "999999")
    assert rc != 0 and "no such job" in str(text)
    pending = cluster.cmd("sbatch", "--parsable", "-N5", "--wrap", "sleep 60").stdout.strip()   # 5 nodes of 4: never starts
    rc, text = find(cluster, pending)
    assert rc != 0 and "is PENDING, not RUNNING" in str(text)
    os.chmod(tmp_path, 0o777)
    job = Job(cluster, tmp_path / "job.out")
    try:
        rc, text = find(cluster, job.id, user="nobody")
        assert rc != 0 and "belongs to root, not to you (nobody)" in str(text), text
        assert job.state() == "RUNNING"
    finally:
        job.cancel()
        cluster.cmd("scancel", pending, check=False)
