"""A launcher that fails on this machine names no node or link (collective_bench pairwise / bisect).

A drill run under a SLURM whose slurm.conf had vanished mid-run named 12 healthy links: srun failed twice in
every pair with only "cannot stat" its configuration, no rank ever started, and each pair's two failures read
as a bad link. Here the real srun runs with an empty configuration
(it says so and exits at once; a missing file makes it retry for 60 s first). Before, 4 nodes gave "Suspect set
mln1 - mln2 - mln3 - mln4 ... fleet-wide" with verdict fail; 8 nodes named links."""

import functools
import os

import pytest

from tools.collective_bench.isolation import pairwise
from tools.collective_bench.node_groups import GroupRun, LauncherFailed, check_launcher, run_round_srun

NAMES = ["mln1", "mln2", "mln3", "mln4"]


def test_srun_failing_on_this_machine_is_the_answer_not_six_bad_links(monkeypatch, tmp_path):
    (tmp_path / "slurm.conf").write_text("")
    monkeypatch.setenv("SLURM_CONF", str(tmp_path / "slurm.conf"))
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    run_round = functools.partial(run_round_srun, names=NAMES, job={"backend": "gloo", "ops": ["all_reduce"]},
                                  nproc=1, deadline_s=30, pg_timeout_s=20, port=29870)
    with pytest.raises(LauncherFailed) as failed:
        pairwise(NAMES, run_round)
    said = str(failed.value)
    assert "no node or link is named" in said and "mln1, mln2, mln3, mln4" in said
    if os.path.exists("/usr/bin/srun") or any(os.access(os.path.join(d, "srun"), os.X_OK)
                                              for d in os.environ.get("PATH", "").split(os.pathsep)):
        assert "configuration file" in said, said    # srun's own words reach the user


def test_a_node_lost_under_a_one_group_round_is_still_the_nodes_to_judge():
    """srun's words when a step asks for a node just lost (bisect's first round, every node in one group): the 8-node
    unreachable-node cluster test was answered "the launcher failed" when any failed group counted."""
    from tools.collective_bench.node_groups import group_run
    from tools.shared.launch import LaunchOutcome
    lost = LaunchOutcome(command=["srun"], world_size=8, ranks={}, data=[], returncode=1, stalled=False, overran=False,
                         elapsed_s=2.0, output_tail="", stderr_tail=(
                             "srun: error: Unable to create step for job 7827002: Requested node configuration is "
                             "not available"))
    run = group_run(list(range(8)), lost, 30, [f"mln{k}" for k in range(1, 9)], 2.0)
    assert run.status == "fail" and not run.nothing_started
    check_launcher([run], NAMES)      # no raise: bisect goes on to the halves
    broken = LaunchOutcome(command=["srun"], world_size=8, ranks={}, data=[], returncode=1, stalled=False,
                           overran=False, elapsed_s=0.1, output_tail="", stderr_tail=(
                               "srun: error: ClusterName needs to be specified\n"
                               "srun: fatal: Unable to process configuration file"))
    assert group_run(list(range(8)), broken, 30, NAMES * 2, 0.1).nothing_started


def _run(nodes, ok=False, nothing=False, said=""):
    return GroupRun(nodes, "ok" if ok else "fail", nothing_started=nothing, launcher_said=said)


def test_one_group_that_ran_keeps_the_round_judged_by_its_pairs():
    check_launcher([_run([0, 1], nothing=True, said="x"), _run([2, 3], ok=True)], NAMES)     # no raise
    check_launcher([_run([0, 1], nothing=True), _run([2, 3])], NAMES)       # a rank started in one: judged
    with pytest.raises(LauncherFailed):
        check_launcher([_run([0, 1], nothing=True, said="x"), _run([2, 3], nothing=True, said="x")], NAMES)


def test_an_allocation_that_ended_mid_run_names_no_node():
    """srun after the allocation's time limit: every step refused with words about the job, none about a node. An
    8-node bisect that outlived its allocation named healthy mln8 "failed with good partners twice" (rounds 7, 8)."""
    from tools.collective_bench.node_groups import group_run
    from tools.shared.launch import LaunchOutcome
    expired = LaunchOutcome(command=["srun"], world_size=2, ranks={}, data=[], returncode=1, stalled=False,
                            overran=False, elapsed_s=0.3, output_tail="", stderr_tail=(
                                "srun: error: Unable to allocate resources: Job/step already completing or completed\n"
                                "srun: Check SLURM_JOB_ID environment variable. Expired or invalid job 7817002"))
    runs = [group_run([2, 7], expired, 30, [f"mln{k}" for k in range(1, 9)], 0.3),
            group_run([0, 5], expired, 30, [f"mln{k}" for k in range(1, 9)], 0.3)]
    assert all(r.nothing_started for r in runs) and "Expired or invalid job 7817002" in runs[0].launcher_said
    with pytest.raises(LauncherFailed, match="no node or link is named"):
        check_launcher(runs, [f"mln{k}" for k in range(1, 9)])
