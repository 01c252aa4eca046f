"""A rank frozen mid-collective (SIGSTOP) is named, not "the communication path" (review 2026-12-01 F3, 5a/5b).

Real gloo runs on this machine: torchrun with 3 ranks; the test stops one rank's process from outside
(SIGSTOP, the signal a cgroup freezer or a debugger's stop amounts to) once the sweep is under way.
A rank's heartbeat thread stops with it while the others keep beating as they wait.
"""

from __future__ import annotations

import os
import signal
import time

import pytest

from tools.collective_bench import CollectiveBenchParams, build_result
from tools.shared.culprits import diagnose
from tools.shared.launch import LaunchOutcome, RankState, launch_ranks, plan_command

JOB = {"backend": "gloo", "timeout_s": 15, "dtype": "float32", "ops": ["all_reduce"], "min_bytes": 1 << 15,
       "max_bytes": 1 << 22, "factor": 2, "iters": 200, "warmup": 1, "blocking": False, "plant_error_rank": None}


def freeze_after_first_row(victim: int):
    """on_event that SIGSTOPs rank `victim` when rank 0 has reported its first measured size."""
    pids, frozen = {}, []

    def on_event(event):
        if event.get("pid"):
            pids[event["rank"]] = event["pid"]
        if event["ev"] == "data" and event.get("kind") == "row" and not frozen and victim in pids:
            os.kill(pids[victim], signal.SIGSTOP)
            frozen.append(pids[victim])

    return on_event, frozen


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_collective_bench_names_the_rank_frozen_mid_sweep():
    on_freeze, frozen = freeze_after_first_row(victim=1)
    peers_failed = []

    def on_event(event):
        on_freeze(event)
        if event["ev"] == "error" and not peers_failed:
            peers_failed.append(time.monotonic())

    outcome = launch_ranks(plan_command("collective_bench.rank", JOB, 3, 1, None), 3, timeout_s=15,
                           stall_s=75, deadline_s=180, on_event=on_event)
    ended = time.monotonic()
    assert frozen, "the sweep ended before the rank could be frozen"
    # The stopped rank cannot act on torchrun's SIGTERM; torchrun would SIGKILL it only 30 s later (fixed),
    # the launcher does once it is the only one left.
    assert peers_failed and ended - peers_failed[0] < 20, f"ended {ended - peers_failed[0]:.1f} s after the peers failed"
    params = CollectiveBenchParams(backend="gloo", nproc_per_node=3, pg_timeout_s=15, plot=False)
    result = build_result(outcome, params, 1, outcome.elapsed_s)
    text = " ".join(result.findings)
    assert result.verdict == "fail" and result.culprit_ranks == [1], result.findings
    assert "frozen" in text and "communication path" not in text
    with pytest.raises(ProcessLookupError):  # SIGKILL reaches a stopped process: nothing left
        os.kill(frozen[0], 0)


def _outcome(*states, failures=None):
    return LaunchOutcome(command=["srun"], world_size=len(states), ranks={s.rank: s for s in states}, data=[],
                         returncode=1, stalled=False, overran=False, elapsed_s=1.0, stderr_tail="", output_tail="",
                         launch_failures=failures or {})


def test_a_rank_that_raised_is_not_called_frozen():
    """Its beats end with its process; the others then wait out their timeout: the error is the reason."""
    raised = RankState(1, host="b", status="error", stage="shape_check", stages_seen=4, error="size mismatch",
                       last_beat=100.0, stage_entered_t=0, end_t=1)
    waiter = RankState(0, host="a", status="error", stage="all_reduce", stages_seen=5, last_beat=130.0,
                       error="Timed out waiting 30000ms", stage_entered_t=0, end_t=31)
    culprits, findings = diagnose(_outcome(waiter, raised), timeout_s=30)
    assert culprits == [1] and "frozen" not in " ".join(findings)


def test_srun_launch_failure_names_the_node_not_the_healthy_ones():
    """Review 5g: a node frozen before the run; srun's own line names it, and it comes first."""
    waiting = [RankState(r, host=f"mln{r + 1}", status="stuck", stage="init") for r in range(3)]
    culprits, findings = diagnose(_outcome(*waiting, failures={"mln5": "Socket timed out on send/recv operation"}),
                                  timeout_s=30)
    assert "node mln5" in findings[0] and "Socket timed out" in findings[0]
    assert not any("mln1" in f or "mln2" in f for f in findings) and culprits == []


def test_a_frozen_rank_thawed_by_slurm_before_the_kill_is_still_named():
    """Namespace cluster: SLURM sends SIGCONT before SIGTERM when it ends a step, so the frozen rank's own wait
    times out at once and it reports the same timeout as the ranks that waited for it; its beats say which."""
    waited = [RankState(r, host=f"mln{r + 1}", status="error", stage="all_reduce 2097152", stages_seen=5,
                        first_beat=0.0, last_beat=53.0, longest_silence=(20.0, 21.3),
                        error="Timed out waiting 30000ms for recv operation to complete")
              for r in (0, 1, 3)]
    frozen = RankState(2, host="mln3", status="error", stage="all_reduce 2097152", stages_seen=5, last_beat=23.4,
                       error="Timed out waiting 30000ms for recv operation to complete")
    culprits, findings = diagnose(_outcome(*waited, frozen), timeout_s=30)
    assert culprits == [2] and "rank 2 (mln3" in findings[0] and "frozen" in findings[0]


def _waiters(last_beat: float, silence=(20.0, 21.3)):
    return [RankState(r, host=f"mln{r + 1}", status="error", stage="all_reduce 2097152", stages_seen=5,
                      first_beat=0.0, last_beat=last_beat, longest_silence=silence,
                      error="Timed out waiting 30000ms for recv operation to complete") for r in (0, 1, 3)]


def test_a_frozen_rank_that_beat_again_once_thawed_is_still_named():
    """Namespace cluster, after the fix above: the thawed rank's beat thread woke first (its sleep was long
    over) and sent a beat at 54 s, so its LAST beat was as new as its peers'; the gap in its beats remains."""
    thawed = RankState(2, host="mln3", status="terminated", stage="all_reduce 2097152", stages_seen=5,
                       first_beat=0.0, last_beat=54.1, longest_silence=(23.4, 54.0))
    culprits, findings = diagnose(_outcome(*_waiters(53.9), thawed), timeout_s=30)
    assert culprits == [2] and "rank 2 (mln3" in findings[0] and "no heartbeat for 31 s" in findings[0], findings
    assert "communication path" not in " ".join(findings)


def test_a_stall_of_the_launcher_that_silenced_every_rank_names_nobody_frozen():
    """Every rank's beats stopped over the same 15 s (the reader was starved, not the ranks): nobody is frozen."""
    waiting = _waiters(53.9, silence=(30.0, 45.0))
    also = RankState(2, host="mln3", status="error", stage="all_reduce 2097152", stages_seen=5, first_beat=0.0,
                     last_beat=53.8, longest_silence=(30.2, 45.1), error="Timed out waiting 30000ms")
    culprits, findings = diagnose(_outcome(*waiting, also), timeout_s=30)
    assert culprits == [] and "frozen" not in " ".join(findings), findings


def test_a_frozen_rank_thawed_after_its_peers_stopped_beating_is_still_named():
    """Namespace cluster under two CPU hogs (2026-12-01; 4 of 5 runs unnamed before the fix): the peers timed
    out and stopped beating 2.3-3.1 s before SLURM's SIGCONT let the frozen rank beat once more, so they did not
    beat 'to the end' of its 32.9 s silence; they beat through 30 s of it. Figures from that run (seconds)."""
    peers = [RankState(r, host=f"mln{r + 1}", status="error", stage="all_reduce 4194304", stages_seen=5,
                       first_beat=0.5, last_beat=last, longest_silence=(2.0, 3.2),
                       error="Timed out waiting 30000ms for recv operation to complete")
             for r, last in ((0, 35.8), (1, 36.6), (3, 36.3))]
    thawed = RankState(2, host="mln3", status="terminated", stage="all_reduce 4194304", stages_seen=5,
                       first_beat=0.0, last_beat=38.9, longest_silence=(6.0, 38.9))
    culprits, findings = diagnose(_outcome(*peers, thawed), timeout_s=30)
    assert culprits == [2] and "rank 2 (mln3" in findings[0] and "frozen" in findings[0], findings
    assert "communication path" not in " ".join(findings)


def test_peers_that_stopped_beating_soon_after_a_silence_began_do_not_make_it_frozen():
    """The other side of the rule: peers that beat only 4 s into the rank's silence (they ended with it, as
    after a crash elsewhere) are not evidence that it alone stopped."""
    peers = [RankState(r, host=f"mln{r + 1}", status="error", stage="all_reduce 4194304", stages_seen=5,
                       first_beat=0.5, last_beat=10.0, longest_silence=(2.0, 3.2),
                       error="Timed out waiting 30000ms for recv operation to complete")
             for r in (0, 1, 3)]
    quiet = RankState(2, host="mln3", status="terminated", stage="all_reduce 4194304", stages_seen=5,
                      first_beat=0.0, last_beat=38.9, longest_silence=(6.0, 38.9))
    culprits, findings = diagnose(_outcome(*peers, quiet), timeout_s=30)
    assert "frozen" not in " ".join(findings), findings


def test_a_frozen_rank_that_found_its_peers_gone_once_thawed_is_still_named():
    """Thawed after its peers timed out and exited, the rank's own wait fails with 'Connection closed by peer',
    not a timeout: that error is a consequence, and its 30 s without a beat says it was frozen."""
    peers = [RankState(r, host=f"mln{r + 1}", status="error", stage="all_reduce 4194304", stages_seen=5,
                       first_beat=0.5, last_beat=36.0, longest_silence=(2.0, 3.2),
                       error="Timed out waiting 30000ms for recv operation to complete")
             for r in (0, 1, 3)]
    thawed = RankState(2, host="mln3", status="error", stage="all_reduce 4194304", stages_seen=5, first_beat=0.0,
                       last_beat=38.0, longest_silence=(6.0, 38.0),
                       error="[../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer [10.213.0.1]:4123")
    culprits, findings = diagnose(_outcome(*peers, thawed), timeout_s=30)
    assert culprits == [2] and "frozen" in findings[0], findings
