"""Which nodes meet in which round: the pairwise schedule and the bisection planner (pure, stdlib only).

Pairwise (round robin, the circle method): nodes 0..n-1, padded with a "bye" slot when n is odd, so
m = n rounded up to even. Slot m-1 stays fixed; in round r, node i < m-1 meets (2r - i) mod (m-1),
and the node for which that is itself (i == r) meets slot m-1. Over m-1 rounds every pair meets exactly
once, and every round holds floor(n/2) disjoint pairs that can run at the same time. A node's partner
in any round is O(1) arithmetic, so no node (and no launcher) needs the whole schedule in memory.

Bisection: a node set fails (errors or hangs); test its two halves at once, each as its own job under
a deadline, keep the failing half, repeat. A half of one node is padded with a node already proven
good (one collective needs two nodes). When both halves pass, the fault needs nodes from both halves
(a link between them, or the size of the set): the crossed halves are tried next. One bad node among
n is named in ceil(log2 n) rounds after the round that ran the whole set.
"""

from __future__ import annotations

from dataclasses import dataclass, field


def _slots(n: int) -> int:
    if n < 2:
        raise ValueError(f"nodes: need at least 2 for pairs, got {n}")
    return n + (n % 2)


def full_round_count(n: int) -> int:
    """Rounds that cover every pair of n nodes once: n-1 for even n, n for odd n (one node rests)."""
    return _slots(n) - 1


def partner(n: int, round_index: int, node: int) -> int | None:
    """The node that `node` meets in round `round_index`, or None when it rests (odd n)."""
    m = _slots(n)
    if not 0 <= round_index < m - 1:
        raise ValueError(f"round: {round_index} is outside 0..{m - 2} for {n} nodes")
    if not 0 <= node < n:
        raise ValueError(f"node: {node} is outside 0..{n - 1}")
    last = m - 1
    if node == last:
        other = round_index
    elif node == round_index:
        other = last
    else:
        other = (2 * round_index - node) % (m - 1)
    return None if other >= n else other


def round_pairs(n: int, round_index: int) -> list[tuple[int, int]]:
    """The disjoint pairs (low, high) of one round: floor(n/2) of them."""
    pairs = []
    for node in range(n):
        other = partner(n, round_index, node)
        if other is not None and node < other:
            pairs.append((node, other))
    return pairs


def pair_rounds(n: int, rounds: int | None = None):
    """Yield the pairs of rounds 0..rounds-1 (default: all rounds, every pair once), one round at a time."""
    total = full_round_count(n)
    if rounds is not None and not 1 <= rounds <= total:
        raise ValueError(f"rounds: {rounds} is outside 1..{total} for {n} nodes")
    for r in range(rounds or total):
        yield round_pairs(n, r)


# ---------------------------------------------------------------------------------------------------
# Bisection

@dataclass
class _Task:
    nodes: list[int]
    phase: str = "whole"      # whole -> halves -> cross1 -> cross2; single: one node with a good partner;
                              # confirm: a suspect measured again (a node with another good partner, a link alone)
    first_round: int = 0      # confirm: the round the suspect first failed in
    kind: str = "node"        # confirm: what is being confirmed (node | link)
    avoid: int | None = None  # confirm: the good partner of the first failure (another one is taken)
    groups: list[list[int]] = field(default_factory=list)  # tested this round, in order
    padded: list[int | None] = field(default_factory=list)  # the good node added to each group


@dataclass
class Finding:
    kind: str                 # node | link | set
    nodes: list[int]
    evidence: str


class Bisection:
    """Plan the rounds of a bisection. next_round() -> disjoint groups to run at once; record(outcomes)
    with True (passed) or False (failed or hung) per group, in order; repeat until done.

    findings: bad nodes, bad links (a pair that fails while each node passes with a good partner) and
    sets that fail only whole. A node or link is named only when it fails again when measured a second
    time (a node with another good partner where one exists): a flaky measurement on a busy host must
    not drain a node; what failed once and then passed is listed in `unconfirmed`, not named.
    `untested` lists nodes that could not be tested (no good partner)."""

    def __init__(self, nodes: int, known_failing: bool = False):
        if nodes < 2:
            raise ValueError(f"nodes: need at least 2 to bisect, got {nodes}")
        self.n = nodes
        first = _Task(list(range(nodes)), phase="halves" if known_failing else "whole")
        self.open: list[_Task] = [first]
        self.good: set[int] = set()
        self.findings: list[Finding] = []
        self.untested: list[int] = []
        self.unconfirmed: list[Finding] = []
        self.rounds = 0
        self.history: list[list[tuple[list[int], bool]]] = []
        self._running: list[_Task] = []

    @property
    def done(self) -> bool:
        return not self.open

    def next_round(self) -> list[list[int]]:
        busy = {m for task in self.open for m in task.nodes}
        spare = sorted(self.good - busy)  # a padding node is in no other group of this round
        self._running, groups = [], []
        for task in self.open:
            planned = self._plan(task, spare)
            if planned:
                self._running.append(task)
                groups.extend(task.groups)
        if not groups:  # nothing can progress: the rest need a good partner that does not exist
            for task in self.open:
                self.untested.extend(task.nodes)
                # With no group passed at all, a failing part is no more suspect than any other: every group of
                # a 7-node bisect hung at load ~50 and three 2-node "sets" were named (model round 6,
                # cl-link-down) while smoke tests passed on the same nodes. `nothing_passed` says so instead.
                if self.good:
                    self.findings.append(Finding("set", sorted(task.nodes), "fails, and no node is known good to "
                                                 "test its members against"))
            self.open = []
        return groups

    @property
    def nothing_passed(self) -> bool:
        """Every group of every round failed or hung: no node is known good, so none can be told apart."""
        return self.rounds > 0 and not self.good

    def second_measurements(self) -> list[list[int]]:
        """The groups of the round just planned that measure a suspect again (they decide what is named, not where
        the search goes next)."""
        return [g for task in self._running if task.phase == "confirm" for g in task.groups]

    def _plan(self, task: _Task, spare: list[int]) -> bool:
        parts = self._parts(task)
        padded: list[int | None] = []
        for part in parts:
            padded.append(self._pad(spare, task.avoid) if len(part) == 1 and spare else None)
        if any(len(p) == 1 and pad is None for p, pad in zip(parts, padded)):
            spare.extend(p for p in padded if p is not None)  # give back: this task waits
            if task.phase == "halves" and len(task.nodes) >= 3:
                parts, padded = [p for p in parts if len(p) > 1], [None]  # test the larger half alone
            else:
                return False
        # in node order: the first listed node hosts the group's rendezvous, and keeping it the lowest
        # makes that the node SLURM also starts first (the launcher names the host anyway)
        task.groups = [sorted(p + ([pad] if pad is not None else [])) for p, pad in zip(parts, padded)]
        task.padded = padded
        return True

    @staticmethod
    def _pad(spare: list[int], avoid: int | None) -> int:
        """A good node for a single one: the highest spare, another than `avoid` where there is one."""
        pick = next((i for i in range(len(spare) - 1, -1, -1) if spare[i] != avoid), len(spare) - 1)
        return spare.pop(pick)

    @staticmethod
    def _parts(task: _Task) -> list[list[int]]:
        nodes = task.nodes
        if task.phase in ("whole", "single", "confirm"):
            return [list(nodes)]
        half = (len(nodes) + 1) // 2
        a, b = nodes[:half], nodes[half:]
        if task.phase == "halves":
            return [a, b]
        a1, a2, b1, b2 = a[:(len(a) + 1) // 2], a[(len(a) + 1) // 2:], b[:(len(b) + 1) // 2], b[(len(b) + 1) // 2:]
        crossed = [a1 + b1, a2 + b2] if task.phase == "cross1" else [a1 + b2, a2 + b1]
        return [c for c in crossed if c]

    def record(self, outcomes: list[bool]) -> None:
        expected = sum(len(t.groups) for t in self._running)
        if len(outcomes) != expected:
            raise ValueError(f"outcomes: {len(outcomes)} given for {expected} groups")
        self.rounds += 1
        self.history.append([(g, ok) for t in self._running for g, ok in zip(t.groups, outcomes)])
        it = iter(outcomes)
        for task in self._running:
            self._settle(task, [next(it) for _ in task.groups])
        self._running = []

    def _settle(self, task: _Task, outcomes: list[bool]) -> None:
        self.open.remove(task)
        members = [[m for m in g if m != pad] for g, pad in zip(task.groups, task.padded)]
        for part, ok in zip(members, outcomes):
            if ok:
                self.good.update(part)
        failing = [part for part, ok in zip(members, outcomes) if not ok]
        if task.phase == "confirm":
            self._confirmed(task, ok=not failing)
            return
        if len(members) == 1 and task.phase == "halves":  # only the larger half ran
            rest = [m for m in task.nodes if m not in members[0]]
            keep = members[0] if failing else rest
            self.open.append(_Task(keep, phase="single" if len(keep) == 1 else "halves"))
            return
        if task.phase == "whole":
            if failing:
                self.open.append(_Task(task.nodes, phase="halves"))
            return
        if failing:
            for part, pad in [(p, pad) for p, pad, ok in zip(members, task.padded, outcomes) if not ok]:
                self._narrow(part, pad)
        elif task.phase != "single":  # a single node that passed: the failure did not reproduce there
            self._all_passed(task)

    def _narrow(self, part: list[int], pad: int | None = None) -> None:
        if len(part) == 1:
            self.open.append(_Task(part, phase="confirm", first_round=self.rounds, kind="node", avoid=pad))
        else:
            self.open.append(_Task(part, phase="halves"))

    def _all_passed(self, task: _Task) -> None:
        nxt = {"halves": "cross1", "cross1": "cross2"}.get(task.phase)
        if len(task.nodes) == 2:
            self.open.append(_Task(sorted(task.nodes), phase="confirm", first_round=self.rounds, kind="link"))
        elif nxt:
            self.open.append(_Task(task.nodes, phase=nxt))
        else:
            self.findings.append(Finding("set", sorted(task.nodes), "every half and crossed half passes; only the "
                                         "whole set fails (a fault of scale, not of one node)"))

    def _confirmed(self, task: _Task, ok: bool) -> None:
        """A suspect's second measurement: named when it failed again, else listed as unconfirmed."""
        if task.kind == "link":
            text = ("the pair failed twice (rounds {a} and {b}), yet each node passes with a good partner: the "
                    "path between them")
        else:
            text = "failed with good partners twice (rounds {a} and {b})"
        if ok:
            self.unconfirmed.append(Finding(task.kind, sorted(task.nodes), (
                f"failed in round {task.first_round}, passed when measured again in round {self.rounds}: "
                "not named (a busy host or a transient fault)")))
            self.good.update(task.nodes)
        else:
            self.findings.append(Finding(task.kind, sorted(task.nodes), text.format(a=task.first_round, b=self.rounds)))
