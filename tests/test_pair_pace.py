"""pairwise's pace (collective_bench/pair_pace.py): a pair far slower than the healthy ones is stopped once a
healthy pair has finished, judged by the sizes it did, or at 3 x a healthy pair's time; never before a
healthy pair has finished, never a pair as fast as they are. No cluster: the launcher's `cut` hook is
checked with a real process at the end."""

import sys

from tools.collective_bench.node_groups import GroupRun
from tools.collective_bench.pair_pace import Pace
from tools.shared.launch import launch_ranks


def rows(busbw_by_size: dict[int, float]) -> list[dict]:
    return [{"op": "all_reduce", "bytes": size, "busbw_gbps": bw, "time_us": 1.0} for size, bw in busbw_by_size.items()]


HEALTHY = {32 << 10: 0.05, 256 << 10: 0.2, 2 << 20: 0.4}


def paced(*walls: float) -> Pace:
    pace = Pace()
    for wall in walls:
        pace.record(GroupRun([0, 1], "ok", wall_s=wall, rows=rows(HEALTHY)))
    return pace


def test_nothing_is_stopped_before_a_healthy_pair_has_finished():
    pace = Pace()
    assert pace.why_stop(500.0, rows({32 << 10: 0.0001})) is None
    pace.record(GroupRun([0, 1], "hang", wall_s=120.0, rows=rows(HEALTHY)))   # a pair that was not ok sets no pace
    assert pace.healthy_s() is None and pace.why_stop(500.0, []) is None


def test_a_pair_at_a_fiftieth_of_the_healthy_busbw_is_stopped_once_a_healthy_pair_is_done():
    pace = paced(20.0, 22.0)
    slow = rows({32 << 10: 0.004, 256 << 10: 0.004, 2 << 20: 0.005})
    assert pace.why_stop(20.0, slow) is None                     # before the healthy pairs' 21 s
    said = pace.why_stop(21.5, slow)
    assert said and "at 2 MiB its busbw 0.005 GB/s is under a tenth of a healthy pair's 0.4 GB/s (3 sizes" in said
    assert pace.why_stop(21.5, slow[:2]) is None                 # two sizes are too few to judge by


def test_a_pair_as_fast_as_the_healthy_ones_runs_on_and_one_that_never_ends_stops_at_three_times():
    pace = paced(20.0)
    fine = rows({32 << 10: 0.04, 256 << 10: 0.15})               # a bit slower: noise on shared cores
    assert pace.why_stop(59.0, fine) is None
    said = pace.why_stop(60.0, fine)
    assert said and "3 x the 20 s a healthy pair took (2 sizes measured)" in said
    assert pace.why_stop(60.0, []).startswith("stopped at 60 s, 3 x")   # nothing measured at all


def test_launch_ranks_stops_a_run_its_cut_hook_names():
    """The launcher's hook: asked with the run's elapsed time, the run is stopped and the reason kept."""
    outcome = launch_ranks([sys.executable, "-c", "import time; time.sleep(60)"], 0, timeout_s=5, stall_s=100,
                           deadline_s=100, cut=lambda elapsed_s: "too slow" if elapsed_s > 1.0 else None)
    assert outcome.cut == "too slow" and not outcome.overran and outcome.elapsed_s < 10
