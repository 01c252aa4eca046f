"""What log_triage says about a tally beyond its match: OOM fragmentation, watchdog SeqNum mismatches,
torchrun's root cause, and the ranks that are silent or went quiet first while others timed out."""

from .match import Hit, ScanState, Tally
from .signatures import describe_exit
from ..logscan import ranks_phrase
from ..log_hosts import device_phrase


def on_rank(rank: int | None) -> str:
    return f" on rank {rank}" if rank is not None else ""


def _watchdog_findings(per_rank: dict) -> list[str]:
    """Per-rank (SeqNum, op) of NCCL watchdog timeouts: ops that differ at one SeqNum, SeqNums that differ."""
    out = []
    by_seq: dict[int, dict[str, list[int]]] = {}
    for rank, (seq, op, _) in per_rank.items():
        by_seq.setdefault(seq, {}).setdefault(op, []).append(rank)
    for seq, ops in sorted(by_seq.items()):
        if len(ops) > 1:
            parts = "; ".join(f"{ranks_phrase(rs)} in {op}" for op, rs in sorted(ops.items()))
            out.append(f"Collective mismatch at SeqNum {seq}: {parts}. The ranks disagree on which collective "
                       "comes next: a rank-dependent code path; flight_recorder_analyze shows the history.")
    if len(by_seq) > 1:
        parts = "; ".join(f"SeqNum {seq} on {ranks_phrase(r for rs in ops.values() for r in rs)}"
                          for seq, ops in sorted(by_seq.items())[:6])
        out.append(f"Ranks time out at different sequence numbers ({parts}): they wait in different collectives "
                   "or different process groups; the ranks furthest behind are the first suspects.")
    return out


TIMEOUT_SIGNATURES = ("nccl_watchdog_timeout", "gloo_timeout", "nccl_watchdog_work_state")


def stopped_by_launcher(state: ScanState) -> set[int]:
    """Ranks torchrun ended with SIGTERM after another rank failed (exitcode -15 in its summary): bystanders."""
    summary = state.tallies["torchrun_child_failed"].extra if "torchrun_child_failed" in state.tallies else {}
    return {r for r, code in summary.get("failures", {}).items() if code in (-15, 143)}


def silent_ranks(state: ScanState, cause: Hit | None = None) -> tuple[list[int], list[str]]:
    """Ranks that timed out waiting vs ranks that said nothing: the silent ones are the suspects, unless a rank's own
    failure (`cause`) already explains them and their launcher stopped them. Returns (suspect ranks, findings)."""
    tallies = state.tallies
    waiting = set().union(*(tallies[i].ranks for i in TIMEOUT_SIGNATURES if i in tallies))
    if not waiting:
        return [], []
    known = set(state.ranks_seen) | waiting
    summary = tallies["torchrun_child_failed"].extra if "torchrun_child_failed" in tallies else {}
    known |= set(summary.get("failures", {})) | ({summary["root"][0]} if "root" in summary else set())
    if len(known) * 2 > max(known) + 1:  # labels look like ranks 0..N-1: ranks missing in between count too
        known |= set(range(max(known) + 1))
    failed_themselves = set().union(*(t.ranks for t in tallies.values()
                                      if t.first_cause is not None and t.sig.severity == "error"))
    silent = sorted(known - waiting - failed_themselves)
    if cause is not None and cause.rank is not None:
        silent = sorted(set(silent) - stopped_by_launcher(state))
    if not silent:
        return [], []
    verb = "reports" if len(silent) == 1 else "report"
    device = device_phrase(state.rank_devices, silent[0]) if len(silent) == 1 else ""
    text = (f"{ranks_phrase(waiting).capitalize()} timed out waiting in a collective; {ranks_phrase(silent)}{device} "
            f"{verb} no error of its own: likely stuck before the collective (data loading, a different code "
            "path) or dead. Dump the stacks of the live ranks (hang_stack_dump) or read the flight recorder.")
    return silent, [text]


QUIET_GAP_S = 60.0


def _clock(ts: tuple) -> str:
    secs = int(ts[2])
    return f"{secs // 3600:02d}:{secs // 60 % 60:02d}:{secs % 60:02d}"


def _seconds(ts: tuple) -> float:
    return ts[0] * 31 * 86400 + ts[1] * 86400 + ts[2]


def quiet_ranks(state: ScanState, cause: Hit | None = None) -> tuple[list[int], list[str]]:
    """A minority of ranks whose output stops well before the others': where a hang usually starts. Not when a
    rank's own failure (`cause`) came first: ranks that stop with it or after were stopped by it (torchrun
    SIGTERMs a failed rank's siblings), and ranks torchrun stopped are bystanders."""
    last = state.rank_last_ts
    if len(last) < 2:
        return [], []
    latest = max(last.values())
    seconds = {r: (latest[0] - ts[0]) * 31 * 86400 + (latest[1] - ts[1]) * 86400 + latest[2] - ts[2]
               for r, ts in last.items()}
    echoes = stopped_by_launcher(state)
    if cause is not None and cause.rank is not None and cause.ts is not None:
        echoes |= {r for r, ts in last.items() if _seconds(ts) >= _seconds(cause.ts) - QUIET_GAP_S}
    quiet = sorted(r for r, gap in seconds.items() if gap > QUIET_GAP_S and r not in echoes)
    if not quiet or len(quiet) * 2 >= len(last):
        return [], []
    first = min(quiet, key=lambda r: last[r])
    text = (f"{ranks_phrase(quiet).capitalize()} stopped writing first: {'its' if len(quiet) == 1 else 'the'} last "
            f"line at {_clock(last[first])}, {seconds[first]:.0f} s before the other ranks' last output "
            f"({_clock(latest)}). The rank that goes quiet first is where a hang usually starts.")
    return quiet, [text]


def special_findings(tally: Tally) -> list[str]:
    """What one signature's parsed figures and aggregates add to its match (a named rank, a fix to try)."""
    sig_id, first = tally.sig.id, tally.first
    d = first.details
    if sig_id == "cuda_oom":
        if "fragmentation" not in d:
            return []
        verdict = ("fragmentation: the cache holds enough free memory, but not in one block; try "
                   "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (PYTORCH_ALLOC_CONF on torch >= 2.9)"
                   if d["fragmentation"] == "yes" else
                   "not fragmentation: the working set does not fit; cut batch / sequence, shard more, or "
                   "checkpoint activations (memory_estimate)")
        free = f", {d['free_gib']} GiB free of {d['total_gib']} GiB" if "free_gib" in d else ""
        text = (f"CUDA OOM{on_rank(first.rank)}: asked for {d['tried_gib']} GiB{free}, "
                f"{d['reserved_unallocated_gib']} GiB reserved but unallocated: {verdict}.")
        return [text]
    if sig_id == "nccl_watchdog_timeout":
        head = (f"NCCL watchdog timeout on {len(tally.ranks) or 'some'} rank(s): first {d.get('op')} "
                f"SeqNum {d.get('seq')} after {int(d.get('timeout_ms', 0)) / 1000:g} s timeout")
        return [head + "."] + _watchdog_findings(tally.extra)
    if sig_id == "torchrun_child_failed" and "root" in tally.extra:
        root_rank, code, host = tally.extra["root"]
        others = tally.extra.get("failures", {})
        killed = sorted(r for r, c in others.items() if c in (-15, 143))
        return [f"torchrun's root cause names rank {root_rank}" + (f" on {host}" if host else "")
                + f" ({describe_exit(code)}): the first rank to exit, not always the one that caused the failure"
                + (f"; {ranks_phrase(killed)} {'was' if len(killed) == 1 else 'were'} stopped with SIGTERM (bystanders, "
                   "or the hung rank)" if killed
                   else "") + "."]
    if sig_id == "monitored_barrier_failed":
        return [(f"monitored_barrier names rank(s) {d['culprit'].strip()} as not arriving within "
                f"{int(d['timeout_ms']) / 1000:g} s: those are the stuck or dead ranks.")]
    if sig_id == "rendezvous_timeout" and "joined" in d:
        missing = int(d["expected"]) - int(d["joined"])
        return [(f"Only {d['joined']} of {d['expected']} processes reached the store in {d['waited_s']} s: {missing} "
                "never started, crashed before init, or cannot reach MASTER_ADDR:MASTER_PORT.")]
    if sig_id == "nccl_duplicate_gpu":
        return [(f"Ranks {d['rank_a']} and {d['rank_b']} both use the GPU at bus id {d['device']}: set the device from "
                "LOCAL_RANK (torch.cuda.set_device) or give each task its own CUDA_VISIBLE_DEVICES.")]
    if sig_id == "xid":
        cause = f" (caused by {d['caused_by']}: act on that one)" if "caused_by" in d else ""
        host = f" on {first.host}" if first.host else ""
        return [f"XID {d['xid']}{host} on GPU at PCI {d['pci']}{cause}: {d.get('xid_meaning', 'see the XID table')} "
                f"[action: {d.get('action', 'monitor')}{host}]."]
    host = f" on {first.host}" if first.host else ""
    if sig_id == "nvswitch_sxid":
        return [f"NVSwitch {d['switch']}{host} SXid {d['sxid']} ({d.get('fatal') or 'severity not printed'}): "
                f"{d.get('sxid_meaning', '')} [action: {d.get('action', 'monitor')}{host}]."]
    if sig_id == "gpu_lost_multiline":
        return [f"GPU {d['pci']}{host}: {d.get('state', '')} (the driver's multi-line message; Xid 79 class) "
                f"[action: {d.get('action', 'drain_node')}{host}]."]
    if sig_id == "nccl_ib_completion_error" and "likely" in d:
        vendor = f", vendor err {d['vendor']} ({d['vendor_hex']})" if "vendor" in d else ""
        # the host that prints a completion error is the victim; the host whose port failed is the headline's
        return [f"IB completion status {d['status']}{vendor}: {d['likely']} "
                f"[action on the host that printed it: {d.get('action', 'monitor')}]."]
    if sig_id == "fp16_overflow_skip" and "min_scale" in tally.extra:
        return [f"{tally.count} overflow-skipped steps; the loss scale fell to {tally.extra['min_scale']:g}"
                + (" (very low: the run is diverging)" if tally.extra["min_scale"] < 1 else "") + "."]
    return []

