"""The flight recorder as a second witness: which rank issues its collectives last, and how long they take.

When a job writes PyTorch flight-recorder dumps (its ranks' env names TORCH_FR_DUMP_TEMP_FILE or
TORCH_NCCL_DEBUG_INFO_TEMP_FILE; torch's default prefix otherwise), each node's sampler reads its ranks'
files `<prefix><rank>` if they were written by the running process (not older than it), and keeps the
last MAX_ENTRIES collectives: process group, sequence number, when the rank issued it (time_created_ns,
the host's wall clock) and, where the job set TORCH_NCCL_ENABLE_TIMING=1, how long it ran (duration_ms,
CUDA events). Gloo records no duration.

Lined up by (group, sequence number), the rank the others wait for issues each collective last, and
its own collectives are short while the others' (which include the wait) are long. Hosts' clocks
differ by their NTP/PTP skew, which adds to the lateness read across hosts: said with the figure.
"""

import statistics
from pathlib import Path

from .models import FlightRank
from ..engine.data import load_data
from ..shared.flight_recorder import DEFAULT_PREFIX_ENV, TORCH_DEFAULT_PREFIX, load_dump
from ..shared.process_targets import identity
from ..shared.safe_read import owner_problem

MAX_ENTRIES = 200       # the last 200 collectives: several steps of any job, ~8 KB a rank in the node's report


def _entry(e) -> tuple[str, int, int, float | None] | None:
    """(group, seq, issued ns, duration ms) of one collective entry; None for p2p or malformed entries."""
    if not isinstance(e, dict) or e.get("is_p2p"):
        return None
    seq, created = e.get("collective_seq_id"), e.get("time_created_ns")
    if not isinstance(seq, int) or not isinstance(created, int) or isinstance(seq, bool):
        return None
    pg = e.get("process_group")
    group = str(pg[0])[:64] if isinstance(pg, (list, tuple)) and pg else str(e.get("pg_id", "?"))[:64]
    duration = e.get("duration_ms")
    duration = float(duration) if isinstance(duration, (int, float)) and not isinstance(duration, bool) else None
    return group, seq, created, duration


def read_rank(pid: int, rank: int | None, host: str) -> FlightRank | None:
    """The rank's dump, if its process wrote one; a FlightRank with `error` when one is there but not usable."""
    who = identity(pid) if rank is not None else None
    if who is None:
        return None
    prefix = next((who.environ[v] for v in DEFAULT_PREFIX_ENV if who.environ.get(v)), TORCH_DEFAULT_PREFIX)
    path = Path(who.cwd, f"{prefix}{rank}")         # a relative prefix is the rank's own working directory
    try:
        stat = path.stat()
    except OSError:
        return None
    row = FlightRank(rank=rank, host=host, path=str(path), written_at=stat.st_mtime)
    # Another local user can write a file at torch's default /tmp prefix: only the job's user's counts.
    row.error = owner_problem(stat, {who.uid}, "the job's user") or (
        "older than the rank's process (a previous run's dump): not used" if stat.st_mtime < who.started else "")
    if not row.error:
        try:
            data = load_dump(path)
        except (OSError, ValueError) as e:
            row.error = f"unreadable: {str(e)[:200]}"
            return row
        row.entries = [x for x in map(_entry, data.get("entries") or []) if x][-MAX_ENTRIES:]
    return row


def _median_or_none(values: list[float]) -> float | None:
    return round(statistics.median(values), 2) if values else None


def line_up(flights: list[FlightRank]) -> dict:
    """Per rank over the collectives every usable dump holds: median lateness (ms after the first rank to
    issue it), share of them it issued last, median duration (ms, when recorded). {} below two ranks."""
    usable = [f for f in flights if not f.error and f.entries]
    if len(usable) < 2:
        return {}
    issued = [{(g, s): t for g, s, t, _ in f.entries} for f in usable]
    common = set.intersection(*(set(i) for i in issued))
    if not common:
        return {}
    late = {f.rank: [] for f in usable}
    last = {f.rank: 0 for f in usable}
    for key in common:
        times = [i[key] for i in issued]
        first, latest = min(times), max(times)
        for f, t in zip(usable, times):
            late[f.rank].append((t - first) / 1e6)
            last[f.rank] += t == latest
    out = {"collectives": len(common), "ranks": {}}
    for f in usable:
        durations = [d for (g, s, _, d) in f.entries if d is not None and (g, s) in common]
        out["ranks"][f.rank] = {"late_ms": _median_or_none(late[f.rank]), "last_share": round(last[f.rank] / len(common), 2),
                                "duration_ms": _median_or_none(durations), "host": f.host}
    return out


def evidence(rank: int | None, lined: dict) -> str | None:
    """One evidence line for a named straggler, from the lined-up dumps."""
    me = lined.get("ranks", {}).get(rank)
    if not me:
        return None
    others = [v for r, v in lined["ranks"].items() if r != rank]
    their_late = statistics.median(v["late_ms"] for v in others)
    skew = "; hosts' clock skew adds to figures across hosts" if len({v["host"] for v in lined["ranks"].values()}) > 1 else ""
    text = (f"flight recorder ({lined['collectives']} collectives in every rank's dump): it issued them a median "
            f"{me['late_ms']:.1f} ms after the first rank (the others {their_late:.1f} ms{skew}) and was last in "
            f"{me['last_share']:.0%} of them")
    durations = [v["duration_ms"] for v in others if v["duration_ms"] is not None]
    if me["duration_ms"] is not None and durations:
        text += (f"; its collectives ran a median {me['duration_ms']:.1f} ms, the others' {statistics.median(durations):.1f} ms "
                 "(TORCH_NCCL_ENABLE_TIMING: theirs include the wait for it)")
    return text


def finding(lined: dict, flights: list[FlightRank]) -> list[str]:
    """What the dumps say on their own (they may disagree with the samples: they cover another stretch)."""
    out = [f"flight-recorder dump of rank {f.rank} on {f.host} ({f.path}): {f.error}" for f in flights if f.error][:4]
    if not lined:
        return out
    rule = load_data("straggler_rules")["flight_recorder"]
    ranks = lined["ranks"]
    top = max(ranks, key=lambda r: (ranks[r]["last_share"], ranks[r]["late_ms"] or 0))
    others = statistics.median(v["late_ms"] for r, v in ranks.items() if r != top)
    if ranks[top]["last_share"] >= rule["last_share_min"] and ranks[top]["late_ms"] - others >= rule["late_ms_min"]:
        out.append(f"Flight recorder ({len(ranks)} ranks' dumps, {lined['collectives']} collectives in common): rank "
                   f"{top} issued {ranks[top]['last_share']:.0%} of them last, a median {ranks[top]['late_ms']:.1f} ms "
                   f"after the first rank (the others {others:.1f} ms).")
    else:
        out.append(f"Flight recorder ({len(ranks)} ranks' dumps, {lined['collectives']} collectives in common): no rank "
                   f"issues them last steadily (rank {top}: last in {ranks[top]['last_share']:.0%}, a median "
                   f"{ranks[top]['late_ms']:.1f} ms after the first; the others {others:.1f} ms).")
    return out
