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

After the rounds, a pair that its deadline cut while the sizes it finished read healthy at those sizes
(`not_finished_in_time`) was only not finished in time: isolation.pairwise counts it against neither node.
"""

from __future__ import annotations

import statistics
import threading
from dataclasses import dataclass

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
        seen = self.against_healthy(rows)
        if seen and seen.gross:
            return (f"stopped at {elapsed_s:.0f} s, after a healthy pair's {healthy_s:.0f} s: {seen.text()} is under a "
                    f"tenth of a healthy pair's {seen.healthy_gbps:.3g} GB/s ({seen.sizes} sizes measured)")
        if elapsed_s >= self.slow_factor * healthy_s:
            return (f"stopped at {elapsed_s:.0f} s, {self.slow_factor:g} x the {healthy_s:.0f} s a healthy pair "
                    f"took ({seen.sizes if seen else len(rows)} sizes measured)")
        return None

    def against_healthy(self, rows: list[dict]) -> "AtSize | None":
        """A pair's largest finished size against the healthy pairs' busbw at that size, once it has finished
        MIN_SIZES sizes that healthy pairs measured too; None before (or before any pair was healthy)."""
        with self._lock:
            known = {size: statistics.median(values) for size, values in self._busbw_at.items()}
        done = [r for r in rows if r.get("op") == "all_reduce" and int(r["bytes"]) in known]
        if len(done) < MIN_SIZES:
            return None
        last = max(done, key=lambda r: r["bytes"])
        return AtSize(int(last["bytes"]), float(last["busbw_gbps"]), known[int(last["bytes"])], len(done))


@dataclass(frozen=True)
class AtSize:
    bytes: int
    busbw_gbps: float
    healthy_gbps: float     # the healthy pairs' median at that size
    sizes: int              # sizes finished that healthy pairs measured too

    @property
    def gross(self) -> bool:
        """Under a tenth of a healthy pair at the same size: a fault, not load (module doc)."""
        return self.busbw_gbps < (1 - GROSS_MARGIN) * self.healthy_gbps

    def text(self) -> str:
        return f"at {human_size(self.bytes)} its busbw {self.busbw_gbps:.3g} GB/s"


def not_finished_in_time(run: GroupRun, pace: Pace) -> str | None:
    """Why a pair that its deadline cut (not the pace, not the launcher) while its finished sizes read healthy
    is only "not finished in time", or None. On a loaded host the healthy pairs themselves can need most of the
    deadline (115 of 120 s, cl-slow-link under load 45): such a pair says nothing against either node."""
    if run.status != "hang" or run.cut or run.nothing_started or not run.rows:
        return None
    seen = pace.against_healthy(run.rows)
    if seen is None or seen.gross:
        return None
    return (f"{seen.text()} against a healthy pair's {seen.healthy_gbps:.3g} GB/s at that size "
            f"({seen.sizes} sizes measured), not under a tenth")
