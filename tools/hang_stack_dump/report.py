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


def _one_group(g: StackGroup) -> str:
    """Every process in one place: a stuck collective only when a collective (or a rank) is there."""
    distributed = bool(g.ranks) or any("torch/distributed/" in frame for frame in g.stack)
    if g.in_collective and distributed:
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


def findings_for(groups: list[StackGroup], odd: list[StackGroup]) -> list[str]:
    if not groups:
        return []
    if len(groups) == 1:
        return [_one_group(groups[0])]
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
