"""Which line is the answer, and who is to blame.

The job's failure window is the time of its first death (a rank's error, a watchdog timeout, torchrun's failure
line). A GPU event that coincides with it (within WINDOW_BEFORE_S before to WINDOW_AFTER_S after) is the
headline, whatever older lines the kernel log holds; a cause older than STALE_S before the crash is history,
not the answer (an application Xid 13 two days earlier). An InfiniBand completion error is printed by the victim:
the host whose port failed ("Got async event : port error") or, failing that, the peer the victims name is the
culprit. The culprit then gets its kind and its name (shared/culprit_kind.py).
"""

from .match import TIMED_CATEGORIES, Hit, ScanState, Tally
from ..actions import worst_action
from ..culprit_kind import Culprit, gpu_culprit, node_culprit, rank_culprit
from ..xid import short_bus

WINDOW_BEFORE_S = 600.0
WINDOW_AFTER_S = 120.0
STALE_S = 3600.0
IB_SIGNATURES = ("nccl_ib_completion_error", "nccl_ib_async_event")


def seconds(ts: tuple) -> float:
    """(month, day, seconds of the day) -> seconds, comparable within a year."""
    return ts[0] * 31 * 86400 + ts[1] * 86400 + ts[2]


def crash_time(tallies: list[Tally]) -> float | None:
    """When the job first died: the earliest time-stamped error of the job's own output (a launcher's failure line,
    a watchdog, an exception). GPU, network and host-memory events (kernel logs of days) are what we weigh against
    it, not part of it."""
    times = [seconds(h.ts) for t in tallies if t.sig.severity == "error"
             for h in (t.first, t.first_cause)
             if h is not None and h.ts is not None and t.sig.category not in TIMED_CATEGORIES]
    return min(times) if times else None


def _near(hit: Hit, crash: float) -> bool:
    return hit.ts is not None and crash - WINDOW_BEFORE_S <= seconds(hit.ts) <= crash + WINDOW_AFTER_S


def weigh(tallies: list[Tally], first: Hit | None) -> tuple[Hit | None, float | None]:
    """The headline hit: a GPU event at the crash, else `first` unless it is history, then the first live cause."""
    crash = crash_time(tallies)
    if crash is None:
        return first, None
    hardware = [h for t in tallies if t.sig.category == "gpu_hardware" and t.sig.severity == "error"
                for h in t.timed if h.role == "cause" and h.details.get("action", t.sig.action) != "none"]
    # the event that names the device (a PCI bus id) first: it says which GPU to act on
    near = sorted((h for h in hardware if _near(h, crash)), key=lambda h: (not h.details.get("pci"), seconds(h.ts), h.order))
    if near:
        return near[0], crash
    # history: a kernel-side event long before the crash (the job's own earlier errors stay its first failure)
    stale = first is not None and first.ts is not None and seconds(first.ts) < crash - STALE_S
    if stale and tally_of(tallies, first).sig.category in TIMED_CATEGORIES:
        live = [h for t in tallies if t.sig.severity == "error"
                for h in (t.first_cause, *t.timed) if h is not None and h.role == "cause"
                and (h.ts is None or seconds(h.ts) >= crash - STALE_S)]
        if live:
            return min(live, key=lambda h: (seconds(h.ts) if h.ts else crash, h.order)), crash
    return first, crash


def coincidence(hit: Hit, crash: float) -> str:
    """How the headline's hardware event sits against the job's first death."""
    gap = crash - seconds(hit.ts)
    when = f"{gap:.0f} s before" if gap >= 1 else f"{-gap:.0f} s after" if gap <= -1 else "at the second of"
    return (f"It happened {when} the job's first death (the failure window): older GPU events in these logs are "
            "history, not this failure's cause.")


def tally_of(tallies: list[Tally], hit: Hit) -> Tally:
    return next(t for t in tallies if hit is t.first or hit is t.first_cause or any(hit is h for h in t.timed))


def window_action(tallies: list[Tally], tally: Tally, hit: Hit, crash: float | None) -> str:
    """The strongest action of the events on the same GPU inside the window (Xid 48 then 64 on one GPU: reboot),
    and of the job's own GPU errors there (a rank's 'uncorrectable ECC error' names no bus: it is that GPU's)."""
    action = hit.details.get("action", tally.sig.action)
    if crash is None or tally.sig.category != "gpu_hardware":
        return action
    bus = short_bus(hit.details.get("pci", ""))
    same = [h.details.get("action", t.sig.action) for t in tallies if t.sig.category == "gpu_hardware"
            for h in t.timed if (_near(h, crash) and h.host == hit.host and short_bus(h.details.get("pci", "")) == bus)
            or (h.rank is not None and not h.details.get("pci"))]    # a rank's own GPU error is the job's death
    return worst_action([action, *same])


# ---------------------------------------------------------------------------------------------------
# The culprit

def _serial(state: ScanState, host: str | None, pci: str) -> tuple[str, str]:
    bus = short_bus(pci)
    for (where, printed), ident in state.gpu_ids.items():
        if short_bus(printed) == bus and (where == host or where is None or host is None):
            return ident[1], ident[0]
    return "", ""


def ib_sides(state: ScanState) -> tuple[list[str], list[str], list[str]]:
    """(hosts whose port failed, hosts the victims name as their peer, victim hosts) from the IB lines."""
    events = state.tallies.get("nccl_ib_async_event")
    completions = state.tallies.get("nccl_ib_completion_error")
    failed = sorted({h.host for h in (events.timed if events else []) if h.host
                     and "port error" in h.details.get("event", "").lower()})
    peers = sorted({state.addresses.get(p, p) for p in
                    (h.details["peer"].split("<")[0].strip("[]") for h in (completions.timed if completions else [])
                     if h.details.get("peer"))})
    victims = sorted((completions.hosts if completions else set()) - set(failed))
    return failed, peers, victims


def ib_action(state: ScanState, action: str) -> str:
    """The action on an IB headline. A port that failed while the job's traffic crossed it (completion errors on
    the hosts talking to it) fails every job placed there until its cable or switch port is fixed: take the node
    out of the scheduler. A port event that broke nothing yet stays the signature's own action (monitor)."""
    failed, _, victims = ib_sides(state)
    return worst_action([action, "drain_node"]) if failed and victims else action


def full_name(host: str, peers: list[str]) -> str:
    """A host printed elided in the log prefix ('...-48', as logs shared in public reports often are) by the name
    a completion error spells in full for the same host ('peer node48'): the one peer ending in the same
    number. Otherwise the host as printed."""
    if not host.startswith("..."):
        return host
    tail = host.rstrip("0123456789")
    number = host[len(tail):]
    same = [p for p in peers if number and p.endswith(number) and not p[:-len(number)][-1:].isdigit()]
    return same[0] if len(same) == 1 else host


def culprit_of(state: ScanState, tally: Tally, hit: Hit) -> Culprit | None:
    """The culprit the headline names, with its kind; None when the line names none (a cascade, no host)."""
    if hit.role != "cause":
        return None
    category = tally.sig.category
    if tally.sig.id in IB_SIGNATURES:
        failed, peers, _ = ib_sides(state)
        hosts = [full_name(h, peers) for h in failed] or peers
        return node_culprit(", ".join(hosts)) if hosts else None
    if category == "gpu_hardware":
        if hit.details.get("action", tally.sig.action) == "none":
            return None        # an application fault (Xid 13, 31, 43) or an echo (Xid 45): no GPU to blame
        pci = hit.details.get("pci", "")
        if pci:
            serial, uuid = _serial(state, hit.host, pci)
            return gpu_culprit(hit.host, pci, serial, uuid)
        if hit.rank is not None:
            return Culprit(kind="gpu", name=f"the GPU of rank {hit.rank}" + (f" on {hit.host}" if hit.host else ""),
                           node=hit.host or "", rank=hit.rank)
        return gpu_culprit(hit.host, "") if hit.host else None
    if category == "host_memory":
        oom_hosts = sorted(state.tallies["srun_task_oom"].hosts) if "srun_task_oom" in state.tallies else []
        host = hit.host or ", ".join(oom_hosts)
        return node_culprit(host) if host else None
    if hit.rank is not None:
        return rank_culprit(hit.rank, hit.host)
    return None


def ib_sentence(state: ScanState) -> str:
    """Who is victim and who culprit in an IB link failure, in words (empty without IB lines)."""
    failed, peers, victims = ib_sides(state)
    if not (failed or peers):
        return ""
    said = []
    if failed:
        named = [h if full_name(h, peers) == h else f"{full_name(h, peers)} (printed as {h})" for h in failed]
        said.append(f"the port failed on {', '.join(named)} (NCCL's 'Got async event : port error' lines there): "
                    "that host is the culprit; check its cable, switch port and `ibstat` / counters")
    if victims:
        said.append(f"{', '.join(victims)} printed the completion errors: "
                    + ("the victim, waiting on" if len(victims) == 1 else "victims, waiting on")
                    + (f" peer {', '.join(peers)}" if peers else " a peer"))
    elif peers:
        said.append(f"the completion errors name peer {', '.join(peers)}")
    return "InfiniBand: " + "; ".join(said) + "."
