"""What hang_stack_dump says about grouped stacks (private to it: no SPEC): which groups are the odd ones out,
and the findings, the odd ranks first."""

from .stacks import ProcessStack, StackGroup


def _who(ranks: list[int], pids: list[int]) -> str:
    from ..shared.culprits import rank_list

    if ranks:
        extra = f" (+{len(pids) - len(ranks)} processes without a rank)" if len(pids) > len(ranks) else ""
        return f"rank{'s' if len(ranks) > 1 else ''} {rank_list(ranks)}{extra}"
    return f"pid{'s' if len(pids) > 1 else ''} {', '.join(map(str, pids[:8]))}"


def odd_groups(groups: list[StackGroup]) -> list[StackGroup]:
    """The groups to look at first: outside a collective while others wait in one, else the minority."""
    if len(groups) < 2:
        return []
    waiting = [g for g in groups if g.in_collective]
    elsewhere = [g for g in groups if not g.in_collective]
    if waiting and elsewhere:
        return elsewhere
    if len(groups[0].pids) > len(groups[1].pids):
        return groups[1:]
    return []                              # a tie: no majority to measure the others against


def _place(g: StackGroup) -> str:
    via = f", called from {g.called_from}" if g.called_from and g.called_from != g.where else ""
    return f"{g.where}{via}"


def _one_group(g: StackGroup, motion: str = "still", stopped: tuple[ProcessStack, ...] = ()) -> str:
    """Every process in one place: a stuck collective only when a collective (or a rank) is there and the
    processes were seen not to move (one snapshot of a running job looks the same), and none of them is stopped:
    a rank stopped inside the collective sits in the same frame as the ranks waiting for it, and "the collective
    is stuck (network, NCCL)" under "rank 1 is stopped: the culprit" sent a reader to the network (model round 6)."""
    distributed = bool(g.ranks) or any("torch/distributed/" in frame for frame in g.stack)
    if g.in_collective and stopped:
        who = _who(sorted(p.rank for p in stopped if p.rank is not None), [p.pid for p in stopped])
        what = (f"{who} {'is' if len(stopped) == 1 else 'are'} stopped there and the others wait for "
                f"{'it' if len(stopped) == 1 else 'them'}: nothing else is stuck (resume with SIGCONT, or stop the job)")
    elif g.in_collective and distributed and motion == "one_snapshot":
        what = ("one snapshot cannot tell a stuck collective from a running job's (most ranks of a healthy job are "
                "in one at any instant): if they stay here, the collective is stuck or a rank not dumped here never "
                "arrived (flight_recorder_analyze, nccl_log_analyze)")
    elif g.in_collective and distributed:
        what = ("the collective itself is stuck (network, NCCL, a GPU) or a rank not dumped here (another node?) "
                "never arrived: run flight_recorder_analyze on the dumps, nccl_log_analyze on the log")
    elif g.in_collective:
        what = ("no collective on the stack and no rank: it waits in torch.cuda.synchronize for its own GPU work, "
                "so it is busy on the GPU; a wait that never ends is a slow or stuck kernel (gpu_health, the GPU's "
                "utilisation; py-spy dump --native shows the CUDA call)")
    elif distributed:
        what = "no rank is behind the others at the Python level"
    else:
        what = "no collective on the stack: this is what it is doing (not distributed, so nothing to wait for)"
    who = _who(g.ranks, g.pids)
    head = f"All {len(g.pids)} processes ({who}) sit in the same place" if len(g.pids) > 1 else f"The process ({who}) is in"
    return f"{head}: {_place(g)}; {what}."


def odd_headline(odd: list[StackGroup], groups: list[StackGroup], procs: list[ProcessStack]) -> list[str]:
    """The answer first: which ranks are elsewhere, where they run, and where the others wait."""
    ranks = sorted(r for g in odd for r in g.ranks)
    if not ranks:
        return []
    where = {p.rank: p for p in procs if p.rank is not None}
    named = ", ".join(f"rank {r}" + (f" ({where[r].host}" + (f", local rank {where[r].local_rank})"
                                      if where[r].local_rank is not None else ")") if where[r].host else "")
                      for r in ranks[:8])
    rest = [g for g in groups if g not in odd]
    waiting = f" while {_who(sorted(r for g in rest for r in g.ranks), [p for g in rest for p in g.pids])} " \
              f"{'wait' if rest and rest[0].in_collective else 'are'} in {_place(rest[0])}" if rest else ""
    kind = " Culprit (rank): " + named + "." if len(ranks) == 1 else ""
    return [f"Odd one out: {named} {'is' if len(ranks) == 1 else 'are'} in {_place(odd[0])}{waiting}.{kind}"]


def findings_for(groups: list[StackGroup], odd: list[StackGroup], motion: str = "still",
                 stopped: tuple[ProcessStack, ...] = ()) -> list[str]:
    """stopped: the processes that cannot run (SIGSTOP, a cgroup freezer)."""
    if not groups:
        return []
    if len(groups) == 1:
        return [_one_group(groups[0], motion, stopped)]
    out = []
    for g in groups:
        verb = "wait in" if g.in_collective else "are in"
        if len(g.pids) == 1:
            verb = "waits in" if g.in_collective else "is in"
        tag = " <- the odd one out: look here first" if g in odd else ""
        out.append(f"{_who(g.ranks, g.pids)} {verb} {_place(g)}{tag}.")
    if odd and any(g.in_collective for g in groups):
        out.append(f"The ranks in a collective are waiting for {_who(sorted(r for g in odd for r in g.ranks), [p for g in odd for p in g.pids])}, "
                   "which never reached it.")
    elif not odd:
        out.append("No majority stack: compare the groups' frames side by side.")
    return out


# ---------------------------------------------------------------------------------------------------
# Moving or not: the second look (motion.py)

def compared_ranks(procs: list[ProcessStack]) -> list[ProcessStack]:
    ranked = [p for p in procs if p.role == "rank" and not p.error]
    return ranked or [p for p in procs if not p.error]


def motion_of(procs: list[ProcessStack]) -> str:
    """running: every process that waited in a collective at the first look (every process, when none
    waited) moved since; not_moving: none of the compared processes moved; partly: some did;
    one_snapshot: read once (saved dumps)."""
    seen = compared_ranks(procs)
    if not seen or all(p.moved is None for p in seen):
        return "one_snapshot"
    waiting = [p for p in seen if p.in_collective] or seen
    if not any(p.frozen for p in procs) and all(p.moved for p in waiting):
        return "running"
    return "partly" if any(p.moved for p in seen) else "not_moving"


def _cpu(ps: list[ProcessStack]) -> str:
    used = [p.cpu_s for p in ps if p.cpu_s is not None]
    return f"; CPU used {sum(used):.1f} s in all" if used else ""


def motion_findings(procs: list[ProcessStack], motion: str, groups: list[StackGroup]) -> list[str]:
    """The evidence for moving or not, in one sentence (the headline when the job runs)."""
    seen = compared_ranks(procs)
    watched = max((p.watched_s for p in seen), default=0.0)
    moved = [p for p in seen if p.moved]
    still = [p for p in seen if p.moved is False]
    ids = lambda ps: _who(sorted(p.rank for p in ps if p.rank is not None), [p.pid for p in ps])  # noqa: E731
    if motion == "one_snapshot":
        return []
    if motion == "running":
        first = "; ".join(f"{_who(g.ranks, g.pids)} in {_place(g)}" for g in groups[:3])
        return [f"Running, not hung: {ids(moved)} moved between looks (stack or local variables changed within "
                f"{watched:.1f} s{_cpu(moved)}). One snapshot of a running data-parallel job finds most ranks inside "
                f"a collective; at the first look: {first}. Nothing is blocked; slow steps are straggler_find's question."]
    if motion == "partly":
        return [f"Partly moving: {ids(still)} kept the same stack and local variables for {watched:.1f} s"
                f"{_cpu(still)}; {ids(moved)} moved between looks (busy, not blocked)."]
    return [f"Not moving: {ids(still)} kept the same stack and local variables over {watched:.1f} s of looks"
            f"{_cpu(still)}. A step longer than that would look the same: run again to be sure."]
