"""bisect: when to stop waiting for a second measurement that has measured nothing while groups like it finished.

A group that cannot meet (a link dropped between two of its nodes, a node unreachable) measures nothing and
is ended only by the group deadline: an 8-node bisect on the namespace cluster waited 120 s in each round that
held such a group, 467 s for a dropped link (2026-12-02), and the user waits as long for the verdict.

What a healthy group of this run took is known once one has finished. A group is stopped, and counted as hung,
when it has still measured no size after `slow_factor` x the longest time a healthy group took that was
- at least as large (more nodes start more slowly), and
- from a round at least as full (as many nodes running at once: on shared cores the same group starts slower
  beside others).
A group that has measured any size is never stopped here (bisect asks whether a group finishes, not how
fast: a slow link finishes, and the deadline alone applies to it).

Only second measurements are judged so (`judge_only`): they decide whether a suspect is named, and a node or
link is named only when it fails twice. A search round's failure decides where the search goes next, and one
healthy group stopped there sends it away from the fault: with healthy start-up times spread as on 2 loaded
cores (tests/test_group_pace_noise.py), stopping every group at 3 x missed a dropped link in 96 of 1,000 runs and
named a healthy node in 2; 5 x still missed 1.4%. Start-up time alone is too noisy to steer by.
"""

from __future__ import annotations

import threading
from typing import Callable

from .node_groups import GroupRun

SLOW_FACTOR = 3.0   # as pairwise's (pair_pace.py): 3 x the slowest comparable healthy group, start-up included


def _never(elapsed_s: float, rows: list[dict]) -> None:
    return None


class GroupPace:
    """What the healthy groups of one bisect run took (shared by the rounds' threads)."""

    def __init__(self, slow_factor: float = SLOW_FACTOR):
        self.slow_factor = slow_factor
        self._done: list[tuple[int, int, float]] = []   # (nodes in the group, nodes in its round, wall s), ok groups
        self._judged: set[tuple[int, ...]] = set()      # the groups of this round that may be stopped
        self._lock = threading.Lock()

    def judge_only(self, groups: list[list[int]]) -> None:
        """Before a round: which of its groups may be stopped (bisect's second measurements); the rest wait."""
        with self._lock:
            self._judged = {tuple(g) for g in groups}

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
        return (lambda elapsed_s, rows: self.why_stop(elapsed_s, rows, size, busy)) if self.judges(group) else _never

    def judges(self, group: list[int]) -> bool:
        with self._lock:
            return tuple(group) in self._judged

    def why_stop(self, elapsed_s: float, rows: list[dict], size: int, round_nodes: int) -> str | None:
        if rows:
            return None
        healthy_s = self.healthy_s(size, round_nodes)
        if healthy_s is None or elapsed_s < self.slow_factor * healthy_s:
            return None
        return (f"stopped at {elapsed_s:.0f} s with no size measured, {self.slow_factor:g} x the {healthy_s:.0f} s "
                f"the slowest healthy group of {size}+ nodes took (cut for pace)")
