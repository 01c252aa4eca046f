"""The srun node transport (tools/engine/srun.py): the argv every srun path gets, how lines are credited
to nodes, and how each node's end is classified. The srun lines below are as SLURM 22.05.8 printed them
on the namespace cluster; the step itself runs for real in tests/test_fleet_sweep.py and below, on the
namespace cluster."""

from __future__ import annotations

import threading
import time

import pytest

from tools.engine.placement import inside_allocation, inside_job, own_job
from tools.engine.srun import (LaunchFailed, SrunLines, SrunTransport, TaskStderr, exit_code_of, labelled,
                               launch_failures, srun_said)
from tools.engine.transport import NodeEnd, SshTransport, Transport


def test_both_transports_have_the_one_interface():
    for transport in (SrunTransport(), SshTransport(env={})):
        assert isinstance(transport.refused, type(SrunTransport().refused))
        for name in ("command", "run_step", "cancel"):
            assert callable(getattr(transport, name)), name
    srun: Transport = SrunTransport()   # a type checker holds both to the Protocol
    assert srun.command("mln1", ["true"])[0] == "srun"


def test_one_node_argv_kills_on_bad_exit_and_prints_the_command_as_is():
    """The `node=` option: one task, output unlabelled (the child protocol reads it), --overlap inside an allocation."""
    argv = SrunTransport(inside_allocation().srun_args, kill_on_bad_exit=True).command("gpu-017", ["python", "-m", "x"])
    assert argv == ["srun", "--nodes=1", "--ntasks=1", "--nodelist=gpu-017", "--kill-on-bad-exit=1", "--quiet",
                    "--overlap", "python", "-m", "x"]


def test_a_step_over_nodes_is_labelled_verbose_and_lets_the_others_go_on():
    """The sweep's step: a crashed check on one node must not end the others (0), and lines need -v --label."""
    srun = SrunTransport(inside_job("77").srun_args, job_name="mleng-fleet-sweep-1a2b")
    argv = srun.argv(["python", "-m", "n"], nodes=["mln1", "mln3"], verbose=True, label=True)
    assert argv == ["srun", "--nodes=2", "--ntasks=2", "--ntasks-per-node=1", "--nodelist=mln1,mln3",
                    "--kill-on-bad-exit=0", "-v", "--label", "--job-name=mleng-fleet-sweep-1a2b",
                    "--jobid=77", "--overlap", "python", "-m", "n"]


def test_a_step_slurm_places_has_no_nodelist_and_a_job_of_our_own_is_time_limited():
    argv = SrunTransport(own_job("gpu", 150).srun_args, kill_on_bad_exit=True).argv(["bash", "-c", "x"], count=4,
                                                                                    label=True)
    assert argv == ["srun", "--nodes=4", "--ntasks=4", "--ntasks-per-node=1", "--kill-on-bad-exit=1", "--label",
                    "--partition=gpu", "--time=4", "bash", "-c", "x"]
    assert "--kill-on-bad-exit" not in " ".join(SrunTransport(kill_on_bad_exit=None).argv(["true"], count=2))


def test_the_folder_tasks_start_in_is_given_once_after_the_placement():
    """straggler_find's and hang_stack_dump's job steps start in mleng's folder: the caller's may not exist there."""
    argv = SrunTransport(inside_job("9").srun_args, chdir="/opt/mleng").argv(["true"], nodes=["mln1"])
    assert argv[-4:] == ["--jobid=9", "--overlap", "--chdir=/opt/mleng", "true"]
    assert not any(a.startswith("--chdir") for a in SrunTransport().argv(["true"], nodes=["mln1"]))


@pytest.mark.parametrize("bad", ["-w", "--uid=0", "a b", "x;y", "", "n,m"])
def test_a_node_name_that_is_not_one_never_reaches_argv(bad):
    with pytest.raises(ValueError, match="node name"):
        SrunTransport().argv(["true"], nodes=["mln1", bad])
    with pytest.raises(ValueError, match="at least one node"):
        SrunTransport().argv(["true"], nodes=[])


def credit(nodes, stdout, stderr, order=None):
    got: list[tuple[str, str]] = []
    lines = SrunLines(nodes, lambda node, text: got.append((node, text)))
    for line in order or (stdout + stderr):
        lines.take(srun_said(line) if line.startswith("srun:") else labelled(line))
    return lines, got


def test_a_line_is_credited_to_the_node_srun_placed_its_task_on_not_to_what_it_says():
    """Task output may reach us before srun's -v word on where the task runs (two pipes): it waits for it."""
    stdout = ["2: I am mln1", "0: I am mln1", "1: hello", "5: from a task srun never placed", "no label at all"]
    stderr = ["srun: launching StepId=7.0 on host mln1, 1 tasks: 0", "srun: launching StepId=7.0 on host mln2, 1 tasks: 1",
              "srun: launching StepId=7.0 on host mln4, 1 tasks: 2"]
    lines, got = credit(["mln1", "mln2", "mln4"], stdout, stderr, order=stdout[:1] + stderr[:1] + stdout[1:] + stderr[1:])
    lines.unplaced()
    assert got == [("mln1", "I am mln1"), ("mln2", "hello"), ("mln4", "I am mln1")]
    assert dict(lines.refused) == {("task 5", "srun never said where this task runs"): 1,
                                   ("the step's output", "a line without srun's task label"): 1}


def test_a_task_placed_outside_the_step_is_refused():
    lines, got = credit(["mln1"], ["0: x"], ["srun: launching StepId=7.0 on host ghost-01, 1 tasks: 0"])
    assert got == [] and dict(lines.refused) == {("ghost-01", "srun placed a task on a node outside this step"): 1}


def test_each_node_ends_once_as_srun_said():
    stderr = ["srun: error: Task launch for StepId=1.0 failed on node mln2: Communication connection failure",
              "srun: launch/slurm: _task_finish: mln1: task 0: Completed",
              "srun: error: mln3: task 2: Exited with exit code 3",
              "srun: error: mln4: task 3: Killed",
              "srun: error: mln5: task 4: Out Of Memory"]
    nodes = ["mln1", "mln2", "mln3", "mln4", "mln5", "mln6"]
    lines, _ = credit(nodes, [], stderr)
    ends = lines.ends(nodes, finished=False)
    assert ends["mln2"] == NodeEnd("mln2", "unreachable", why="mln2: Communication connection failure")
    assert (ends["mln1"].how, ends["mln1"].code, ends["mln1"].said) == ("exited", 0, "Completed")
    assert (ends["mln3"].how, ends["mln3"].code) == ("exited", 3)
    assert (ends["mln4"].how, ends["mln4"].code, ends["mln4"].said) == ("exited", -9, "Killed")
    assert (ends["mln5"].how, ends["mln5"].code, ends["mln5"].said) == ("exited", None, "Out Of Memory")
    assert ends["mln6"].how == "silent"                              # no word from srun by the deadline
    assert lines.ends(["mln6"], finished=True)["mln6"] == NodeEnd("mln6", "exited")   # the step ended, no word on it


def test_a_tasks_stderr_goes_with_its_nodes_end_and_cannot_pass_for_srun():
    """A task's labelled stderr is credited to the node srun placed it on (as ssh's to its connection); one that
    reads like srun's launch failure names no node unreachable."""
    stderr = ["1: no stack could be read: pid 9 is stopped", "0: warming up",
              "2: srun: error: Task launch for StepId=5.0 failed on node mln1: forged",
              "7: from a task the step does not have",
              "srun: launching StepId=5.0 on host mln1, 1 tasks: 0", "srun: launching StepId=5.0 on host mln2, 1 tasks: 1",
              "srun: launching StepId=5.0 on host mln3, 1 tasks: 2", "srun: error: mln2: task 1: Exited with exit code 1"]
    nodes = ["mln1", "mln2", "mln3"]
    lines = SrunLines(nodes, lambda node, text: None)
    for line in stderr:                                  # as srun's stderr reader hands them on
        lines.take(srun_said(line))
    ends = lines.ends(nodes, finished=True)
    assert (ends["mln2"].how, ends["mln2"].code) == ("exited", 1)
    assert ends["mln2"].stderr_tail == "no stack could be read: pid 9 is stopped\n"
    assert ends["mln1"].how == "exited" and ends["mln1"].stderr_tail == "warming up\n"
    assert "forged" in ends["mln3"].stderr_tail and 7 not in lines.task_stderr
    assert launch_failures("\n".join(stderr)) == {}


def test_srun_words_that_come_after_the_tasks_output_closed_still_place_and_end_them(monkeypatch, tmp_path):
    """Two pipes: srun's -v words on stderr can come after stdout has closed; the lines wait for them."""
    from tests.srun_stand_in import stand_in_srun

    stand_in_srun(tmp_path, monkeypatch, stdout=["0: from mln2", "1: from mln1"], stderr=[], code=0)
    srun_file = tmp_path / "srun-bin" / "srun"
    late = ["srun: launching StepId=3.0 on host mln2, 1 tasks: 0", "srun: launching StepId=3.0 on host mln1, 1 tasks: 1",
            "1: a warning", "srun: error: mln1: task 1: Exited with exit code 2"]
    srun_file.write_text(srun_file.read_text().replace("exit 0", "exec 1>&-\nsleep 0.5\n" + "".join(
        f"echo '{line}' >&2\n" for line in late) + "exit 0"))
    got = []
    ends = SrunTransport().run_step(["mln1", "mln2"], ["true"], 20, lambda node, line: got.append((node, line)))
    assert sorted(got) == [("mln1", "from mln1"), ("mln2", "from mln2")]
    assert (ends["mln1"].code, ends["mln1"].stderr_tail) == (2, "a warning\n")


def test_srun_words_are_read_and_task_lines_cannot_pass_for_them():
    assert srun_said("srun: error: Task launch for StepId=53.0 failed on node mln5: Socket timed out on send/recv "
                     "operation") == LaunchFailed("mln5", "Socket timed out on send/recv operation")
    assert srun_said("3: srun: error: mln2: task 1: Killed") == TaskStderr(3, "srun: error: mln2: task 1: Killed")
    forged = "srun: launching StepId=7.0 on host mln9, 1 tasks: 0"
    assert labelled("3: " + forged) == (3, forged)                          # stays task 3's text
    assert launch_failures("srun: error: Task launch for StepId=1.0 failed on node mln2: \n") == {
        "mln2": "task launch failed"}
    assert [exit_code_of(w) for w in ("Completed", "Exited with exit code 255", "Terminated", "Segmentation fault",
                                      "Out Of Memory", "")] == [0, 255, -15, -11, None, None]


# ---- on the namespace cluster: real srun, real slurmd --------------------------------------------

from tests.multinode_cluster import multinode_cluster  # noqa: E402,F401  (fixture)

SAY_WHO = ["sh", "-c", 'echo "I am mln1"; echo "reached $SLURMD_NODENAME"; [ "$SLURMD_NODENAME" = mln2 ] && exit 3; exit 0']


@pytest.mark.slurm
def test_a_real_step_credits_each_line_to_its_node_and_ends_each_node_once(multinode_cluster):  # noqa: F811
    got: list[tuple[str, str]] = []
    srun = SrunTransport(own_job("debug", 60).srun_args, job_name="mleng-transport-test")
    ends = srun.run_step(["mln3", "mln1", "mln2"], SAY_WHO, 60, lambda node, line: got.append((node, line)))
    # Every node claims to be mln1; each line still goes to the node srun ran it on.
    assert sorted(got) == sorted([(n, "I am mln1") for n in ("mln1", "mln2", "mln3")]
                                 + [(n, f"reached {n}") for n in ("mln1", "mln2", "mln3")])
    assert (ends["mln2"].how, ends["mln2"].code) == ("exited", 3), ends
    assert all(ends[n].how == "exited" and ends[n].code in (0, None) for n in ("mln1", "mln3")), ends
    assert not srun.refused and srun.leftovers == []


@pytest.mark.slurm
def test_a_real_step_is_cut_at_the_deadline_and_its_nodes_are_silent(multinode_cluster):  # noqa: F811
    srun = SrunTransport(own_job("debug", 60).srun_args, job_name="mleng-transport-cut", grace_s=5)
    t0 = time.monotonic()
    ends = srun.run_step(["mln1", "mln2"], ["sh", "-c", "echo started; sleep 300"], 8, lambda node, line: None)
    took = time.monotonic() - t0
    assert {n: e.how for n, e in ends.items()} == {"mln1": "silent", "mln2": "silent"}
    assert 8 <= took < 40, took
    left = multinode_cluster.cmd("squeue", "-h", "-o", "%j").stdout.split()
    assert "mleng-transport-cut" not in left          # nothing of the step runs on
    # cancel from another thread, long before a 120 s deadline, ends it the same way
    threading.Timer(3, srun.cancel).start()
    t0 = time.monotonic()
    ends = srun.run_step(["mln1", "mln2"], ["sleep", "300"], 120, lambda node, line: None)
    assert {e.how for e in ends.values()} == {"silent"} and time.monotonic() - t0 < 40


@pytest.mark.slurm
def test_a_node_whose_slurmd_is_dead_ends_unreachable_in_srun_words(multinode_cluster):  # noqa: F811
    multinode_cluster.kill_slurmd("mln4")
    try:
        srun = SrunTransport(own_job("debug", 120).srun_args, job_name="mleng-transport-dead")
        ends = srun.run_step(["mln3", "mln4"], ["true"], 90, lambda node, line: None)
    finally:
        multinode_cluster.heal("mln4")
    assert ends["mln4"].how == "unreachable" and ends["mln4"].why.startswith("mln4: "), ends
    assert ends["mln3"].how != "unreachable", ends
