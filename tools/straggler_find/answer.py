"""The words of straggler_find's answer: one finding per straggler, the spread when none, the next steps."""

from .judge import Judgement
from .models import Straggler

REASON_WORDS = {
    "cpu": "CPU-starved host", "memory": "memory pressure on the host", "data_loading": "data loading",
    "h2d": "host-to-device copies", "gpu": "its GPU (slower, throttled or shared)", "network": "a slow link",
    "unknown": "slower compute with no host cause seen", "compute": "more compute per step on this rank",
}
REASON_TOOLS = {"gpu": ("gpu_health",), "network": ("collective_bench",), "unknown": ("gpu_health",),
                "data_loading": ("hang_stack_dump", "storage_bench")}


def next_tools(s: Straggler) -> tuple[str, ...]:
    """The tools to call next for a straggler; no GPU tool for a rank that holds no GPU."""
    return tuple(t for t in REASON_TOOLS.get(s.reason, ()) if t != "gpu_health" or s.gpu_index is not None)


def _where(s: Straggler) -> str:
    gpu = f", GPU {s.gpu_index} (serial {s.gpu_serial or '?'})" if s.gpu_index is not None else ""
    return f"rank {s.rank if s.rank is not None else '?'} on {s.host} (pid {s.pid}{gpu})"


# What each culprit kind means for the user, said beside it in the headline.
# The node's words name no drain: its causes (a quota, others' processes, steal, memory pressure, a shaper) are the
# host's settings or sharing, and three model plays (rounds 8-9) refused a drain for them.
KIND_WORDS = {"node": "its host, not the rank's code: change what limits it there, or leave the node out of the next launch",
              "rank": "the rank's own process", "gpu": "its GPU"}


def _line(s: Straggler) -> str:
    pace = f"; its own work takes {s.work_ratio:.1f}x the others'" if s.work_ratio else ""
    if not s.apart_in_stacks:
        # A model (round 9) read "the others wait 96% of the time on it" as a measured wait, on a rank that itself
        # read 96% waiting: the host's counters name it, the stacks cannot say how long the others wait on it.
        held = "held back by its host; its stacks look like the others' and cannot say how long they wait on it"
    elif s.others_wait_fraction:
        held = f"the others wait {s.others_wait_fraction:.0%} of the time on it{pace}"
    else:
        held = "it runs slow"
    kind = f" Culprit ({s.culprit.kind}): {s.culprit.name}, {KIND_WORDS[s.culprit.kind]}." if s.culprit else ""
    return (f"Straggler: {_where(s)}: {held}.{kind} Likely reason: {REASON_WORDS.get(s.reason, s.reason)}: "
            f"{'; '.join(s.evidence)}.")


def findings(result, v: Judgement) -> list[str]:
    out = [_line(s) for s in v.stragglers]
    sampled = [r for r in result.ranks if not r.error and r.samples]
    shares = sorted(1 - r.fractions.get("collective", 0) for r in sampled)
    if v.inconclusive and v.apart and not v.stragglers:
        out.append(f"Inconclusive: {'; '.join(v.apart)}; the others' waiting shares spread {v.spread or 0:.0%} "
                   f"(relative). Sample longer (window_s) or when the job is steady.")
    elif v.inconclusive:
        out.append(f"Inconclusive: the ranks' own-work shares spread {v.spread:.0%} (relative), too wide to tell a "
                   f"straggler from noise at the {v.threshold:.0%} threshold; sample longer (window_s) or when the job is steady.")
    elif not v.stragglers and len(sampled) >= 2:
        out.append(f"No straggler: the {len(sampled)} ranks spend {shares[0]:.0%}-{shares[-1]:.0%} of the window on their "
                   f"own work (relative spread {v.spread:.0%}; a rank must exceed the others' median by {v.threshold:.0%}).")
    elif len(sampled) < 2 and not v.stragglers:
        out.append("One rank sampled: nothing to compare it with; the GPU rows and the rank's shares are the evidence.")
    if not result.gpus:
        out.append("No GPU seen through NVML on the sampled nodes: a rank 'computing' may be waiting on its GPU, "
                   "which only NVML would show.")
    return out + v.findings + [f"{n.host}: NCCL RAS: {m}" for n in result.nodes for m in n.nccl_ras]


def next_steps(s: Straggler) -> list[str]:
    drain = (f"if it repeats, drain the node (not run by mleng): scontrol update nodename={s.host} state=drain "
             f"reason=\"straggler_find: {s.reason}\"")
    steps = {
        # No drain here: a quota or another user's processes is a setting of a healthy node, and two models (rounds
        # 8 and 9) rightly refused the drain this line used to advise.
        "cpu": [f"look at what else runs on {s.host} and its CPU limits (top, the job's cgroup cpu.max / cfs_quota)",
                f"free its CPUs (lift the quota, or move or renice the processes named above); {s.host} itself is "
                f"not broken: leave it out of the next launch (--exclude={s.host}) rather than drain it"],
        "memory": [f"check host memory on {s.host} (free -g, /proc/pressure/memory): swapping or page-cache thrash",
                   "knowledge://cpu-memory/host-memory.md"],
        "data_loading": [f"hang_stack_dump native=true on pid {s.pid}: a read in its native frames is storage "
                         "(storage_bench on the data path); a sleep or a lock wait is the loader's own code",
                         "the loader at the frame quoted: more DataLoader workers, prefetch, pinned memory, or "
                         "faster storage"],
        "h2d": ["pin the batches (pin_memory=True) and copy with non_blocking=True; check the GPU's PCIe link (gpu_topology)"],
        "gpu": [f"gpu_health on {s.host} (GPU {s.gpu_index})", drain],
        "network": [f"collective_bench pairwise between {s.host} and a healthy node", "nccl_log_analyze on the job's log", drain],
        "compute": ["compare the rank's share of the work (batch size, sequence lengths, a rank-only branch such "
                    "as logging or eval) with the others'; hang_stack_dump with native=true shows its C++ frames"],
        "unknown": ([f"gpu_health on {s.host}"] if s.gpu_index is not None else []) + [
            "hang_stack_dump with native=true on that rank for C++ frames"],
    }
    return steps.get(s.reason, [])
