"""pairwise: when to stop waiting for a pair that is far slower than the healthy ones.

A slow (not dead) link still finishes its sizes, only late: at 50 Mbit/s a 4-node pairwise run waited for
the group deadline twice (the round, then the confirmation), 122 s each, to learn what the first sizes had
said at once. What a healthy pair of this run did is known as soon as one has finished: how long it took
and its busbw at every size. A pair still running after that long is judged on the sizes it finished:

- once it has run as long as a healthy pair took (the median of those that finished), it is stopped when
  its busbw at the largest of the (3 or more) sizes it finished is under a tenth of a healthy pair's at that size (the gross
  margin of pair_verdict.py: 2-5x between healthy gloo pairs on shared cores is noise, 45x is a link);
- it is stopped anyway at `slow_factor` x that time.

A stopped pair counts as hung (not ok), with why in its detail, and, like any slow pair, is named only when
the confirmation round finds it slow again. Before any pair has finished there is nothing to judge by:
the group deadline alone applies.
"""

from __future__ import annotations

import statistics
import threading

from .node_groups import GroupRun
from .pair_verdict import GROSS_MARGIN
from .report import human_size

SLOW_FACTOR = 3.0   # a pair not done in 3 x a healthy pair's time is stopped (start-up included in both)
MIN_SIZES = 3       # sizes a pair must have finished to be judged on them: the smallest alone are latency, and a
#                     pair that started late under load has only those (32K read 8x slower on a 50 Mbit/s link)


class Pace:
    """What the healthy pairs of one run took (shared by the rounds' threads)."""

    def __init__(self, slow_factor: float = SLOW_FACTOR):
        self.slow_factor = slow_factor
        self._walls: list[float] = []
        self._busbw_at: dict[int, list[float]] = {}   # bytes -> busbw of the healthy pairs at that size, GB/s
        self._lock = threading.Lock()

    def record(self, run: GroupRun, groups: list[list[int]] | None = None) -> None:
        """A finished group (of the round `groups`, which a pair's pace does not need): an ok one sets the pace."""
        if not run.ok:
            return
        with self._lock:
            self._walls.append(run.wall_s)
            for row in run.rows:
                if row.get("op") == "all_reduce" and row.get("busbw_gbps"):
                    self._busbw_at.setdefault(int(row["bytes"]), []).append(float(row["busbw_gbps"]))

    def healthy_s(self) -> float | None:
        with self._lock:
            return statistics.median(self._walls) if self._walls else None

    def stop_rule(self, group: list[int], groups: list[list[int]]):
        """why_stop(elapsed_s, rows) for one pair of a round (every pair is judged alike)."""
        return self.why_stop

    def why_stop(self, elapsed_s: float, rows: list[dict]) -> str | None:
        """Why a pair running for elapsed_s with these rows so far should stop now, or None."""
        healthy_s = self.healthy_s()
        if healthy_s is None or elapsed_s < healthy_s:
            return None
        with self._lock:
            known = {size: statistics.median(values) for size, values in self._busbw_at.items()}
        done = [r for r in rows if r.get("op") == "all_reduce" and int(r["bytes"]) in known]
        if len(done) >= MIN_SIZES:
            last = max(done, key=lambda r: r["bytes"])
            healthy = known[int(last["bytes"])]
            if last["busbw_gbps"] < (1 - GROSS_MARGIN) * healthy:
                return (f"stopped at {elapsed_s:.0f} s, after a healthy pair's {healthy_s:.0f} s: at "
                        f"{human_size(int(last['bytes']))} its busbw {last['busbw_gbps']:.3g} GB/s is under a tenth "
                        f"of a healthy pair's {healthy:.3g} GB/s ({len(done)} sizes measured)")
        if elapsed_s >= self.slow_factor * healthy_s:
            return (f"stopped at {elapsed_s:.0f} s, {self.slow_factor:g} x the {healthy_s:.0f} s a healthy pair "
                    f"took ({len(done)} sizes measured)")
        return None
