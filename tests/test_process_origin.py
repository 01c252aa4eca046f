"""Whose another process is (shared/process_origin.py): the owner read from its cgroup path as SLURM, the kubelet,
container runtimes and systemd lay them out, and its age. Asked for in model rounds 6, 9 and 10: fleet_sweep and
straggler_find named a busy pid and its user, not its job. Path shapes: Slurm's cgroup/v2 and v1 plugins
(https://slurm.schedmd.com/cgroup_v2.html), the kubelet's systemd and cgroupfs drivers, docker, systemd."""

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tools.fleet_sweep.report import holder_text
from tools.shared.occupancy import Holder
from tools.shared.process_origin import age_words, cgroup_paths, origin, owner_of_cgroups

POD_UID = "1a2b3c4d_5e6f_7a8b_9c0d_1e2f3a4b5c6d"
SHAPES = [
    (["/system.slice/slurmstepd.scope/job_1392969/step_0/user/task_0"], "SLURM job 1392969"),
    (["/system.slice/n7_slurmstepd.scope/job_5/step_batch/user/task_special"], "SLURM job 5"),     # several slurmd
    (["/", "/system.slice/slurmd.service", "/slurm/uid_2101171/job_280678/step_0/task_0"], "SLURM job 280678"),   # v1
    ([f"/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{POD_UID}.slice/cri-containerd-{'a' * 64}.scope"],
     "Kubernetes pod 1a2b3c4d-5e6f"),
    ([f"/kubepods.slice/kubepods-pod{POD_UID}.slice/cri-containerd-{'a' * 64}.scope"], "Kubernetes pod 1a2b3c4d-5e6f"),
    ([f"/kubepods/besteffort/pod1a2b3c4d-5e6f-7a8b-9c0d-1e2f3a4b5c6d/{'b' * 64}"], "Kubernetes pod 1a2b3c4d-5e6f"),
    ([f"/system.slice/docker-{'c' * 64}.scope"], "container cccccccccccc"),
    ([f"/docker/{'d' * 64}"], "container dddddddddddd"),
    (["/user.slice/user-1000.slice/session-3.scope"], "login session 3 of uid 1000"),
    (["/system.slice/cron.service"], "systemd service cron.service"),
    (["/", "/i3mln/mln3"], "cgroup /i3mln/mln3"),
    (["/"], "cgroup /"),
]


@pytest.mark.parametrize("paths,words", SHAPES)
def test_the_owner_is_read_from_the_cgroup_layouts_in_use(paths, words):
    assert owner_of_cgroups(paths) == words


def test_a_job_folder_a_user_made_below_their_own_subtree_is_not_a_slurm_job():
    # cgroup v2 delegates a subtree to each user's systemd instance: any folder name can be made there.
    assert owner_of_cgroups(["/user.slice/user-1000.slice/user@1000.service/app.slice/slurmstepd.scope/job_9"]) \
        == "systemd service user@1000.service"
    assert not owner_of_cgroups(["/home/slurm/uid_0/job_1"]).startswith("SLURM")


def test_an_unknown_path_is_cut_and_escaped():
    words = owner_of_cgroups(["/" + "x" * 300 + "\x1b[2J\nrm"])
    assert words.startswith("cgroup /…") and "\x1b" not in words and "\n" not in words and len(words) < 120


def test_ages_read_as_a_person_would_say_them():
    assert [age_words(s) for s in (5, 59.6, 60, 3599, 3600, 3 * 3600 + 5 * 60, 86400, 2 * 86400 + 4 * 3600)] == \
        ["5 s", "60 s", "1 min", "59 min", "1 h", "3 h 5 min", "1 d", "2 d 4 h"]


def test_a_live_process_has_its_cgroup_and_age_and_a_gone_one_has_none():
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        time.sleep(0.5)
        said = origin(child.pid)
        assert said and cgroup_paths(child.pid) and said.endswith("s ago") and "started " in said, said
        assert int(said.rsplit("started ", 1)[1].split()[0]) < 30, said
    finally:
        child.kill()
        child.wait()
    assert origin(child.pid) is None and cgroup_paths(child.pid) == []


V1_CPU = Path("/sys/fs/cgroup/cpu")


@pytest.mark.skipif(os.geteuid() != 0 or not (V1_CPU / "cgroup.procs").is_file(),
                    reason="needs root and the cgroup v1 cpu controller (to place a process in a SLURM-shaped cgroup)")
def test_a_process_in_a_slurm_job_cgroup_is_said_to_be_that_job():
    # The v1 tree slurmstepd makes, under a name of our own (slurm_<name>/uid_N/job_N/step_N), removed after.
    top = V1_CPU / f"slurm_mlengtest{os.getpid()}"
    step = top / "uid_65534" / "job_777" / "step_0"
    step.mkdir(parents=True)
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        (step / "cgroup.procs").write_text(str(child.pid))
        said = origin(child.pid)
        assert said.startswith("SLURM job 777, started "), said
        holder = Holder(pid=child.pid, name="python3", user="nobody", origin=said)
        assert holder.sentence() == f"pid {child.pid} (python3, user nobody, {said})"
        assert holder_text(vars(holder)) == holder.sentence()      # as a sweep's node sends it, as the sweep says it
    finally:
        child.kill()
        child.wait()
        for folder in (step, step.parent, step.parent.parent, top):
            folder.rmdir()
