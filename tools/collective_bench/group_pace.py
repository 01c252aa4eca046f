"""bisect: when to stop waiting for a group that has measured nothing while groups like it have finished.

A group that cannot meet (a link dropped between two of its nodes, a node unreachable) measures nothing and
is ended only by the group deadline: an 8-node bisect on the namespace cluster waited 120 s in each round that
held such a group, 467 s for a dropped link (2026-12-02), and the user waits as long for the verdict.

What a healthy group of this run took is known once one has finished. A group is stopped, and counted as hung,
when it has still measured no size after `slow_factor` x the longest time a healthy group took that was
- at least as large (more nodes start more slowly), and
- from a round at least as full (as many nodes running at once: on shared cores the same group starts slower
  beside others).
A group that has measured any size is never stopped here (bisect asks whether a group finishes, not how
fast: a slow link finishes, and the deadline alone applies to it). Before any such group has finished there
is nothing to judge by, so the first round (the whole set) always waits its deadline.

A stopped group is no more than any failing group: a node or link is named only when its second measurement
fails too (pair_schedule.Bisection), and isolation.bisect does not name a set whose failures were only such
stops. Against a false stop of a healthy group, the reference is the longest healthy time, not the median.
"""

from __future__ import annotations

import threading
from typing import Callable

from .node_groups import GroupRun

SLOW_FACTOR = 3.0   # as pairwise's (pair_pace.py): 3 x the slowest comparable healthy group, start-up included


class GroupPace:
    """What the healthy groups of one bisect run took (shared by the rounds' threads)."""

    def __init__(self, slow_factor: float = SLOW_FACTOR):
        self.slow_factor = slow_factor
        self._done: list[tuple[int, int, float]] = []   # (nodes in the group, nodes in its round, wall s), ok groups
        self._lock = threading.Lock()

    def record(self, run: GroupRun, groups: list[list[int]]) -> None:
        """A finished group of the round `groups`: an ok one sets the pace."""
        if run.ok:
            with self._lock:
                self._done.append((len(run.nodes), sum(map(len, groups)), run.wall_s))

    def healthy_s(self, size: int, round_nodes: int) -> float | None:
        """The longest time a healthy group at least this large, in a round at least this full, took."""
        with self._lock:
            walls = [wall for n, busy, wall in self._done if n >= size and busy >= round_nodes]
        return max(walls) if walls else None

    def stop_rule(self, group: list[int], groups: list[list[int]]) -> Callable[[float, list[dict]], str | None]:
        """why_stop(elapsed_s, rows) for one group of the round `groups`."""
        size, busy = len(group), sum(map(len, groups))
        return lambda elapsed_s, rows: self.why_stop(elapsed_s, rows, size, busy)

    def why_stop(self, elapsed_s: float, rows: list[dict], size: int, round_nodes: int) -> str | None:
        if rows:
            return None
        healthy_s = self.healthy_s(size, round_nodes)
        if healthy_s is None or elapsed_s < self.slow_factor * healthy_s:
            return None
        return (f"stopped at {elapsed_s:.0f} s with no size measured, {self.slow_factor:g} x the {healthy_s:.0f} s "
                f"the slowest healthy group of {size}+ nodes took (cut for pace)")
